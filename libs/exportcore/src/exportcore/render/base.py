"""Shared shapes of the renderers."""

from __future__ import annotations

import hashlib
import json
import tempfile
import zlib
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from exportcore import manifests
from exportcore.manifests import Signer


@dataclass(frozen=True)
class ExportHeader:
    """What every format says about the export itself. ``created_at`` is the snapshot time
    (the submit's transaction took the snapshot); a delta names its ``base_id`` and the
    base manifest's SHA-256 (docs/api.md "Incremental exports")."""

    id: str
    tenant: str
    created_at: datetime
    format: str
    count: int
    base_id: str | None = None
    base_manifest_sha256: str | None = None

    @classmethod
    def of_job(cls, job: Any) -> ExportHeader:
        """The header of an ``export_jobs`` row: a typed row (``store.jobs.JobRow``) or a
        mapping of its columns."""

        def get(name: str) -> Any:
            return job.get(name) if isinstance(job, Mapping) else getattr(job, name, None)

        base = get("base_job_id")
        return cls(
            id=str(get("id")),
            tenant=get("tenant_id"),
            created_at=get("created_at"),
            format=get("format"),
            count=get("note_count"),
            base_id=str(base) if base else None,
            base_manifest_sha256=get("base_manifest_sha256"),
        )

    def as_json(self) -> dict[str, Any]:
        """The ``export`` object of the JSON format (timestamps in ISO 8601); a delta also
        carries ``base``."""
        out: dict[str, Any] = {
            "id": self.id,
            "tenant": self.tenant,
            "created_at": self.created_at.isoformat(),
            "format": self.format,
            "count": self.count,
        }
        if self.base_id:
            out["base"] = {"id": self.base_id, "manifest_sha256": self.base_manifest_sha256}
        return out


@dataclass(frozen=True)
class NoteRecord:
    """One snapshot item as it appears in an export: a note, or (``deleted``) the tombstone
    of a note deleted since a delta's base (then ``updated_at`` is the deletion time and
    the title and content are empty)."""

    id: int
    title: str
    content: str
    pinned: bool
    updated_at: datetime
    version: int = 1
    deleted: bool = False

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> NoteRecord:
        """Build from an ``export_job_items`` row (``note_id``, ``title``, …)."""
        return cls(
            id=int(row["note_id"]),
            title=row["title"],
            content=row["content"],
            pinned=bool(row["pinned"]),
            updated_at=row["updated_at"],
            version=int(row.get("version", 1)),
            deleted=bool(row.get("deleted", False)),
        )

    def as_json(self) -> dict[str, Any]:
        """A note: ``{id, title, content, pinned, updated_at, version}``; a tombstone:
        ``{id, version, deleted: true, deleted_at}`` (ISO 8601 timestamps)."""
        if self.deleted:
            return {
                "id": self.id,
                "version": self.version,
                "deleted": True,
                "deleted_at": self.updated_at.isoformat(),
            }
        return {
            "id": self.id,
            "title": self.title,
            "content": self.content,
            "pinned": self.pinned,
            "updated_at": self.updated_at.isoformat(),
            "version": self.version,
        }


class Sink(Protocol):
    """Where a renderer writes: anything with ``write(bytes)``, ``tell()`` and ``flush()``."""

    def write(self, data: bytes, /) -> int:
        """Append ``data``; returns the number of bytes written."""
        ...

    def tell(self) -> int:
        """Bytes written so far."""
        ...

    def flush(self) -> None:
        """Push buffered bytes on (zipfile calls it)."""
        ...


class Renderer(ABC):
    """Writes one export to ``out`` incrementally, and its manifest last.

    Driven as ``begin(header)``, ``add(items)`` once per chunk (notes first, then a delta's
    tombstones, each in note id order), ``end()``. Every item gets a manifest entry
    (:mod:`exportcore.manifests`); ``end()`` writes the entries and the header, signed when
    the renderer has a ``signer``.

    Resumable (docs/architecture.md "Checkpoints"): :meth:`checkpoint_state` returns what
    was added since the previous call (the entries and the format's own state, compressed)
    at a chunk boundary; :meth:`resume` rebuilds a renderer from the header and every such
    segment, as if it had rendered those items, without writing a byte — its sink must then
    already hold exactly the bytes those items produced. The output is a function of the
    header and the items only (no clock), so a resumed render is byte-identical.
    """

    def __init__(self, out: Sink, signer: Signer | None = None) -> None:
        self.out = out
        self.signer = signer
        self.rows = 0
        self.tombstones = 0
        self.header: ExportHeader | None = None
        self.manifest: dict[str, Any] | None = None
        self._signature: dict[str, str] | None = None
        self._entries = tempfile.SpooledTemporaryFile(max_size=1 << 20, mode="w+b")  # noqa: SIM115 - closed in end()
        self._entries_sha = hashlib.sha256()
        self._pending: list[list[Any]] = []

    # --- the driving interface ------------------------------------------------------------

    def begin(self, header: ExportHeader) -> None:
        """Write whatever precedes the items."""
        self.header = header
        self._begin(header)

    def add(self, notes: Sequence[NoteRecord]) -> None:
        """Write one chunk of items, in order."""
        parts: list[bytes] = []
        for note in notes:
            if not note.deleted and self.tombstones:
                raise ValueError("a note after a tombstone: notes come first")
            written, record = self._item(note)
            parts.append(written)
            digest = None if note.deleted else hashlib.sha256(record).hexdigest()
            self._entry([note.id, note.version, digest])
            self.rows += 1
            self.tombstones += note.deleted
        if any(parts):
            self.out.write(b"".join(parts))

    def end(self) -> None:
        """Write the manifest (and whatever the format closes with); the sink is not
        closed. ``manifest`` holds the header afterwards."""
        header = self.header
        assert header is not None, "begin() was not called"
        self.manifest = manifests.header(
            export_id=header.id,
            tenant=header.tenant,
            fmt=header.format,
            snapshot_at=header.created_at.isoformat(),
            base_id=header.base_id,
            base_manifest_sha256=header.base_manifest_sha256,
            notes=self.rows - self.tombstones,
            tombstones=self.tombstones,
            digest=self._entries_sha.hexdigest(),
            signer_key_id=self.signer.key_id if self.signer else None,
            files_digest=self._files_digest(),
        )
        self._signature = self.signer.sign(self.manifest) if self.signer else None
        self._end()
        self._entries.close()

    # --- checkpoints -----------------------------------------------------------------------

    def checkpoint_state(self) -> bytes:
        """The state added since the last :meth:`checkpoint_saved` (compressed JSON), to be
        stored with a checkpoint taken at this chunk boundary."""
        state = {"entries": self._pending, **self._format_state()}
        return zlib.compress(_dumps(state), 6)

    def checkpoint_saved(self) -> None:
        """The last :meth:`checkpoint_state` was stored: the next starts after it."""
        self._pending = []
        self._format_saved()

    def resume(self, header: ExportHeader, segments: Sequence[bytes]) -> None:
        """Become the renderer that rendered the items recorded in ``segments`` (the
        :meth:`checkpoint_state` values of one render, in order). Raises ValueError for a
        segment that cannot be read or applied: not zlib, not JSON, or JSON of another shape
        (a member missing, an entry that is not ``[id, version, sha256 or null]``, a format
        state of another version). The caller discards the checkpoint then
        (docs/architecture.md "Checkpoints"): a segment that fails the same way on every
        attempt must not fail the export."""
        self.header = header
        for segment in segments:
            try:
                state = json.loads(zlib.decompress(segment))
                for entry in state["entries"]:
                    self._entry(entry, pending=False)
                    self.rows += 1
                    self.tombstones += entry[2] is None
                self._resume_format(header, state)
            except (zlib.error, ValueError, LookupError, TypeError, AttributeError) as exc:
                raise ValueError(
                    f"unreadable checkpoint segment: {type(exc).__name__}: {exc}"
                ) from None

    # --- for the formats -------------------------------------------------------------------

    @abstractmethod
    def _begin(self, header: ExportHeader) -> None:
        """Write whatever precedes the items."""

    @abstractmethod
    def _item(self, note: NoteRecord) -> tuple[bytes, bytes]:
        """One item: ``(bytes to append to the sink, bytes the manifest hashes for it)``.
        The appended bytes of a chunk are written together (a format may also write
        itself and return ``b""``)."""

    @abstractmethod
    def _end(self) -> None:
        """Write the end, with :meth:`_write_trailer` where the manifest goes."""

    def _write_trailer(self, dst: Any) -> None:
        """Write ``"entries":[…],"manifest":…,"signature":…`` (members of a JSON object,
        without its braces) to ``dst`` (``write(bytes)``), streaming the entries."""
        assert self.manifest is not None
        dst.write(b'"entries":[')
        self._entries.seek(0)
        while chunk := self._entries.read(1 << 16):
            dst.write(chunk)
        dst.write(b'],"manifest":' + manifests.canonical(self.manifest) + b',"signature":')
        dst.write(_dumps(self._signature))

    def _files_digest(self) -> str | None:
        """The header's ``files_sha256`` (a format with a file list: markdown_zip)."""
        return None

    def _format_state(self) -> dict[str, Any]:
        """The format's own state added since the last checkpoint (JSON-serialisable)."""
        return {}

    def _format_saved(self) -> None:  # noqa: B027 - optional hook
        """The format's state up to here was stored."""

    def _resume_format(self, header: ExportHeader, state: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        """Take the format's own state of one segment."""

    def _entry(self, entry: list[Any], pending: bool = True) -> None:
        self._entries.write((b"," if self.rows else b"") + _dumps(entry))
        self._entries_sha.update(manifests.entry_line(entry))
        if pending:
            self._pending.append(entry)


def _dumps(obj: object) -> bytes:
    """Compact JSON as UTF-8 (no ASCII escapes): the bytes of every record in the formats."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
