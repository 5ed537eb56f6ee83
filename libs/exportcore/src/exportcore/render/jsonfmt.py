"""``json``: one document ``{"export": {...}, "notes": [...]}``; ``ndjson``: a note per line."""

from __future__ import annotations

import json
from collections.abc import Sequence

from exportcore.render.base import ExportHeader, NoteRecord, Renderer


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


class JsonRenderer(Renderer):
    """Streams the notes array element by element between a fixed prefix and suffix."""

    def begin(self, header: ExportHeader) -> None:
        self.out.write(b'{"export":' + _dumps(header.as_json()) + b',"notes":[')

    def add(self, notes: Sequence[NoteRecord]) -> None:
        parts = []
        for note in notes:
            parts.append((b"," if self.rows else b"") + _dumps(note.as_json()))
            self.rows += 1
        self.out.write(b"".join(parts))

    def end(self) -> None:
        self.out.write(b"]}\n")


class NdjsonRenderer(Renderer):
    """One JSON object per note, newline-terminated (no header line)."""

    def begin(self, header: ExportHeader) -> None:
        return None

    def add(self, notes: Sequence[NoteRecord]) -> None:
        self.out.write(b"".join(_dumps(n.as_json()) + b"\n" for n in notes))
        self.rows += len(notes)

    def end(self) -> None:
        return None
