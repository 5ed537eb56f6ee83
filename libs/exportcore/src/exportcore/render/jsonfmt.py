"""``json``: one document ``{"export", "notes", "tombstones", "entries", "manifest",
"signature"}``; ``ndjson``: a note (or tombstone) per line, then one manifest line."""

from __future__ import annotations

from exportcore.render.base import ExportHeader, NoteRecord, Renderer, _dumps


class JsonRenderer(Renderer):
    """Streams the notes array, then the tombstones array, element by element between a
    fixed prefix and the manifest."""

    def _begin(self, header: ExportHeader) -> None:
        self.out.write(b'{"export":' + _dumps(header.as_json()) + b',"notes":[')

    def _item(self, note: NoteRecord) -> tuple[bytes, bytes]:
        data = _dumps(note.as_json())
        if note.deleted:
            sep = b"," if self.tombstones else b'],"tombstones":['
        else:
            sep = b"," if self.rows else b""
        return sep + data, data

    def _end(self) -> None:
        self.out.write(b"]," if self.tombstones else b'],"tombstones":[],')
        self._write_trailer(self.out)
        self.out.write(b"}\n")


class NdjsonRenderer(Renderer):
    """One JSON object per note (then per tombstone), newline-terminated, and a last line
    ``{"entries", "manifest", "signature"}`` (no header line)."""

    def _begin(self, header: ExportHeader) -> None:
        return None

    def _item(self, note: NoteRecord) -> tuple[bytes, bytes]:
        data = _dumps(note.as_json())
        return data + b"\n", data

    def _end(self) -> None:
        self.out.write(b"{")
        self._write_trailer(self.out)
        self.out.write(b"}\n")
