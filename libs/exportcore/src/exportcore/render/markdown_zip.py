"""``markdown_zip``: one ``.md`` file per note with YAML front matter, plus ``manifest.json``
(the file list: ``{id, path, title, size}`` per note file, ``size`` its uncompressed
bytes, in archive order) and ``signed-manifest.json`` (entries, manifest header, signature).

File names are ``notes/<slug>-<note id>.md``: the slug keeps only ``[a-z0-9-]`` of the title
(at most 60 characters), and the note id makes every name unique, so no title can escape the
folder or collide with another note. The header's ``files_sha256`` (manifest version 2)
binds the file list's ids, paths and sizes to the signature.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import tempfile
import unicodedata
import zipfile
from datetime import UTC, datetime
from typing import Any, BinaryIO, cast

from exportcore import manifests
from exportcore.manifests import Signer
from exportcore.render.base import ExportHeader, NoteRecord, Renderer, Sink, _dumps

_NOT_SLUG = re.compile(r"[^a-z0-9]+")


def slugify(title: str, max_len: int = 60) -> str:
    """ASCII slug of ``title`` (``"note"`` when nothing is left)."""
    ascii_title = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    slug = _NOT_SLUG.sub("-", ascii_title.lower()).strip("-")[:max_len].strip("-")
    return slug or "note"


def note_filename(note: NoteRecord) -> str:
    """The archive path of a note: ``notes/<slug>-<id>.md``."""
    return f"notes/{slugify(note.title)}-{note.id}.md"


# Characters YAML does not allow raw in a stream, or reads as line breaks (YAML 1.2
# section 5.1 and 5.4): escaped inside the double-quoted scalar.
_YAML_UNSAFE = re.compile("[\x7f-\x84\x86-\x9f\x85\u2028\u2029\ufffe\uffff]")


def yaml_string(value: str) -> str:
    """``value`` as a YAML double-quoted scalar. JSON strings are YAML (1.2 is a superset of
    JSON); the few characters YAML forbids raw or treats as breaks are escaped as well.
    About 50x faster than ``yaml.safe_dump`` for a front matter, which dominated the render
    time of a markdown_zip export."""
    return _YAML_UNSAFE.sub(
        lambda m: f"\\u{ord(m.group()):04x}", json.dumps(value, ensure_ascii=False)
    )


def note_markdown(note: NoteRecord) -> bytes:
    """Front matter (id, title, pinned, updated_at, version) followed by the note's
    content."""
    front = (
        f"id: {note.id}\n"
        f"title: {yaml_string(note.title)}\n"
        f"pinned: {'true' if note.pinned else 'false'}\n"
        f"updated_at: {yaml_string(note.updated_at.isoformat())}\n"
        f"version: {note.version}\n"
    )
    body = note.content if note.content.endswith("\n") else note.content + "\n"
    return f"---\n{front}---\n\n{body}".encode()


_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
_ZIP_END = (2107, 12, 31, 23, 59, 58)
_ZIP_FIELDS = (
    "date_time", "compress_type", "_compresslevel", "create_system", "create_version",
    "extract_version", "reserved", "flag_bits", "volume", "internal_attr", "external_attr",
    "header_offset", "CRC", "compress_size", "file_size",
)  # fmt: skip
"""What a checkpoint keeps of each archive entry (with its name, extra and comment), so a
resumed render writes the same central directory."""


def zip_time(at: datetime) -> tuple[int, int, int, int, int, int]:
    """An entry's time from a timestamp (UTC, within 1980..2107: what an MS-DOS date, the
    ZIP format's, can hold), so that archives depend on their notes only, never on the
    clock."""
    t = at.astimezone(UTC).timetuple()[:6]
    return min(max(t, _ZIP_EPOCH), _ZIP_END)


class MarkdownZipRenderer(Renderer):
    """Writes entries as chunks arrive; the file list of ``manifest.json`` is spooled to a
    temp file (not memory) and written last with ``signed-manifest.json`` (the entries,
    the manifest and its signature). Entry times are the notes' ``updated_at`` (the
    export's snapshot time for the two manifests)."""

    def __init__(self, out: Sink, signer: Signer | None = None) -> None:
        super().__init__(out, signer)
        # zipfile only needs write() and tell() when the sink cannot seek (data descriptors).
        self._zip = zipfile.ZipFile(
            cast(BinaryIO, out), "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6
        )
        self._manifest = tempfile.SpooledTemporaryFile(max_size=1 << 20, mode="w+b")  # noqa: SIM115 - closed in end()
        self._files = 0
        self._files_sha = hashlib.sha256()
        self._pending_zip: list[list[Any]] = []

    def _begin(self, header: ExportHeader) -> None:
        return None

    def _item(self, note: NoteRecord) -> tuple[bytes, bytes]:
        if note.deleted:
            return b"", b""
        name = note_filename(note)
        data = note_markdown(note)
        info = zipfile.ZipInfo(name, zip_time(note.updated_at))
        info.external_attr = 0o600 << 16
        self._zip.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=6)
        entry = {"id": note.id, "path": name, "title": note.title, "size": len(data)}
        self._file_entry(entry)
        written = self._zip.filelist[-1]
        self._pending_zip.append(
            [
                entry,
                written.filename,
                base64.b64encode(written.extra).decode(),
                base64.b64encode(written.comment).decode(),
                *(getattr(written, f) for f in _ZIP_FIELDS),
            ]
        )
        return b"", data

    def _file_entry(self, entry: dict[str, Any]) -> None:
        self._manifest.write((b"," if self._files else b"") + _dumps(entry))
        self._files_sha.update(manifests.file_line(entry["id"], entry["path"], entry["size"]))
        self._files += 1

    def _files_digest(self) -> str | None:
        return self._files_sha.hexdigest()

    def _format_state(self) -> dict[str, Any]:
        return {"zip": self._pending_zip}

    def _format_saved(self) -> None:
        self._pending_zip = []

    def _resume_format(self, header: ExportHeader, state: dict[str, Any]) -> None:
        for entry, filename, extra, comment, *fields in state["zip"]:
            info = zipfile.ZipInfo(filename)
            info.extra = base64.b64decode(extra)
            info.comment = base64.b64decode(comment)
            for name, value in zip(_ZIP_FIELDS, fields, strict=True):
                setattr(info, name, tuple(value) if name == "date_time" else value)
            # A checkpoint of an older release holds no size: the member's own is the same.
            entry.setdefault("size", info.file_size)
            self._zip.filelist.append(info)
            self._zip.NameToInfo[info.filename] = info
            self._file_entry(entry)
        self._zip.start_dir = self.out.tell()

    def _end(self) -> None:
        header = self.header
        assert header is not None
        at = zip_time(header.created_at)
        self._manifest.seek(0)
        with self._zip.open(_member("manifest.json", at), "w", force_zip64=True) as dst:
            dst.write(b'{"export":' + _dumps(header.as_json()) + b',"files":[')
            while chunk := self._manifest.read(1 << 16):
                dst.write(chunk)
            dst.write(b"]}\n")
        self._manifest.close()
        with self._zip.open(_member("signed-manifest.json", at), "w", force_zip64=True) as dst:
            dst.write(b"{")
            self._write_trailer(dst)
            dst.write(b"}\n")
        self._zip.close()


def _member(name: str, at: tuple[int, int, int, int, int, int]) -> zipfile.ZipInfo:
    """A deflated archive member with a fixed time."""
    info = zipfile.ZipInfo(name, at)
    info.compress_type = zipfile.ZIP_DEFLATED
    info._compresslevel = 6  # type: ignore[attr-defined]
    return info
