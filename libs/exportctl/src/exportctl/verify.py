"""``exportctl verify FILE``: check an export file against its signed manifest.

What is checked (docs/api.md "Manifests", docs/cli.md "Verify and restore"): the Ed25519
signature of the manifest header by one of the trusted public keys, the header's
``entries_sha256`` against the entries, its counts, and the file's items against the entries
as an exact sequence of ``(note id, version, sha256)``: every repeated, reordered, missing
or unlisted item and every changed byte is named. A markdown_zip is also checked member by
member: every member is ``manifest.json``, ``signed-manifest.json`` or a listed
``notes/<slug>-<id>.md`` (no other, no name twice, no name that is not UTF-8), its file list
hashes to the header's ``files_sha256`` (manifest version 2), and each member is hashed
while it is decompressed, stopping at the size ``manifest.json`` declares for it (a zip bomb
costs neither memory nor time). With ``--base``, that the manifest's base is that file's
manifest.

Exit status: 0 verified; 1 not verified (a mismatch, or a file that is not a well-formed
export: truncated, malformed, not an export at all); 2 the file cannot be read, or a usage
error (docs/cli.md "Exit codes").
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tempfile
import zipfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Annotated, Any

import httpx
import typer

from exportcore import manifests
from exportcore.domain import count_of
from exportcore.render.base import _dumps
from exportctl.api import DEFAULT_API_URL, ApiUrl
from exportctl.common import app, err, fail, safe
from exportctl.encrypted import (
    ENVELOPE_SUFFIX,
    ciphertext_problems,
    decrypted,
    envelope_binds,
    identities_from,
    is_age_file,
    load_envelope,
)
from exportctl.output import Output, OutputOpt, emit_object, explicit

MANIFEST_MEMBERS = ("manifest.json", "signed-manifest.json")
"""The two members of a markdown_zip that are not note files."""
MANIFEST_MEMBER_LIMIT = 1 << 30
"""The most bytes a markdown_zip's ``manifest.json`` or ``signed-manifest.json`` may expand
to (1 GiB: about ten million notes); more is refused before it is read."""
MANIFEST_MEMBER_RATIO = 100
"""... and at most this many times its compressed size (above 16 MiB): the JSON of a file
list or of entries (hex digests) compresses 2-5 times, a zip bomb a thousand times."""
CHUNK = 1 << 20
"""Bytes read at a time while a member is hashed."""
FRONT_MATTER_LIMIT = 1 << 16
"""The most bytes of a note file searched for the front matter's ``version``."""
NOTE_PATH = re.compile(r"notes/[a-z0-9]+(?:-[a-z0-9]+)*-([0-9]+)\.md")
"""The only member names of a note file (``markdown_zip.note_filename``): the slug, then the
note's id."""
SHOWN_PROBLEMS = 100
"""The most problems ``verify`` prints one by one (a hostile file can hold millions: an
archive of empty members took 90 s to print 300 000 lines); ``--output json`` has all."""
UTF8_FLAG = 0x800
"""General purpose bit 11 of a ZIP entry (APPNOTE 4.4.4): its name is UTF-8."""


@dataclass(slots=True)
class Item:
    """One item of an export file: a note (``record``: its json/ndjson record, or for
    markdown_zip ``{"path": member name}``) or a tombstone, with the SHA-256 of the bytes
    that represent it. ``data``: those bytes for a json/ndjson note when kept for a restore
    (never for markdown_zip: :func:`copy_member` streams a member from the archive)."""

    id: int
    version: int
    deleted: bool
    sha256: str | None
    record: dict[str, Any] | None = None
    data: bytes = b""
    source: Path | None = None
    """A markdown_zip note's archive (set by :func:`read_path`)."""


@dataclass
class Artifact:
    """An export file, parsed: its format, the items (in file order), the entries and its
    manifest. ``files``: a markdown_zip's file list as ``(id, path, size)``; ``found``:
    what reading the file already found wrong (an unlisted member, a duplicate name…);
    ``path``: the file (a restore copies markdown_zip members from it)."""

    fmt: str
    items: list[Item]
    entries: list[list[Any]]
    manifest: dict[str, Any]
    signature: dict[str, Any] | None
    export: dict[str, Any] = field(default_factory=dict)
    files: list[tuple[int, str, int]] = field(default_factory=list)
    found: list[str] = field(default_factory=list)
    path: Path | None = None
    pending: list[tuple[int, zipfile.ZipInfo]] | None = None
    """A markdown_zip read by :func:`read_path`: its note members ``(note id, member)`` not
    hashed yet. :func:`problems` hashes them only once the signature (and the file list's
    ``files_sha256``) checked out, so a member's size that nobody signed never makes verify
    decompress gigabytes."""

    @property
    def manifest_sha256(self) -> str:
        """The identity a delta names this export by."""
        return manifests.manifest_sha256(self.manifest)


class NotAnExport(ValueError):
    """The file is not a well-formed export of this service (truncated, malformed, or
    something else altogether)."""


# --- shapes ---------------------------------------------------------------------------------


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's members, refusing a name given twice: Python keeps the last copy, other
    parsers the first, so a file holding both (a forged ``notes`` before the genuine one)
    would mean two things (RFC 8259 4: names SHOULD be unique; RFC 7493 I-JSON: MUST)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _json(data: bytes | str, what: str) -> Any:
    try:
        return json.loads(data, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise NotAnExport(f"{what} is nested too deeply to be an export") from None
    except _DuplicateKey as exc:
        raise NotAnExport(
            f"{what} names {exc.args[0]!r} twice in one object (which copy counts depends "
            "on the reader)"
        ) from None
    except ValueError as exc:
        raise NotAnExport(f"{what} is not JSON (truncated?): {exc}") from None


def _int(value: Any, what: str) -> int:
    if type(value) is not int:
        raise NotAnExport(f"{what} is not an integer")
    return value


def _dict(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise NotAnExport(f"{what} is not a JSON object")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise NotAnExport(f"{what} is not a list")
    return value


_HEX64 = re.compile(r"[0-9a-f]{64}")


def _entries(value: Any) -> list[list[Any]]:
    for n, entry in enumerate(_list(value, "the manifest's entries")):
        what = f"entry {n + 1} of the manifest"
        if not isinstance(entry, list) or len(entry) != 3:
            raise NotAnExport(f"{what} is not a list [note id, version, sha256 or null]")
        _int(entry[0], f"the note id of {what}")
        _int(entry[1], f"the version of {what}")
        if entry[2] is not None and not (isinstance(entry[2], str) and _HEX64.fullmatch(entry[2])):
            raise NotAnExport(f"the sha256 of {what} is not 64 hex digits or null")
    return value  # type: ignore[no-any-return]


def _trailer(doc: dict[str, Any]) -> tuple[list[list[Any]], dict[str, Any], dict[str, Any] | None]:
    """``(entries, header, signature)`` of a manifest trailer, their shapes checked."""
    missing = [k for k in ("entries", "manifest", "signature") if k not in doc]
    if missing:
        raise NotAnExport(f"no manifest: the file has no {', '.join(missing)}")
    entries = _entries(doc["entries"])
    header = _dict(doc["manifest"], "the manifest")
    try:
        manifests.canonical(header)
    except Exception:
        raise NotAnExport("the manifest holds values canonical JSON cannot represent") from None
    signature = doc["signature"]
    if signature is not None:
        signature = _dict(signature, "the signature")
    return entries, header, signature


def _record_item(record: Any, data: bytes, keep: bool, what: str) -> Item:
    record = _dict(record, what)
    deleted = record.get("deleted") is True
    return Item(
        id=_int(record.get("id"), f"the id of {what}"),
        version=_int(record.get("version", 1), f"the version of {what}"),
        deleted=deleted,
        sha256=None if deleted else hashlib.sha256(data).hexdigest(),
        record=record if keep else None,  # verify streams: nothing held per record
        data=data if keep else b"",
    )


# --- reading --------------------------------------------------------------------------------


def read_artifact(data: bytes, *, keep: bool = True) -> Artifact:
    """Parse an export file held in memory (json, ndjson or markdown_zip, told apart by
    content). Raises ``NotAnExport``. :func:`read_path` reads a file without holding it."""
    if data.startswith(b"PK"):
        return _read_zip(io.BytesIO(data))
    if data.startswith(b'{"export":'):
        return _read_json(data, keep)
    return _read_ndjson(iter(io.BytesIO(data)), keep)


def read_path(path: Path, *, keep: bool = False) -> Artifact:
    """Parse the export file at ``path``: a markdown_zip and an ndjson file are streamed (a
    member or a line at a time), a json file is read whole. ``keep``: hold the json/ndjson
    records' bytes (a restore writes them). Raises ``NotAnExport`` or ``OSError``."""
    with open(path, "rb") as fh:
        magic = fh.read(10)
        fh.seek(0)
        if magic.startswith(b"PK"):
            art = _read_zip(fh, defer=True)
        elif magic.startswith(b'{"export":'):
            art = _read_json(fh.read(), keep)
        else:
            art = _read_ndjson(iter(fh), keep)
    art.path = path
    if art.fmt == "markdown_zip":
        for item in art.items:
            item.source = path
    return art


def _read_json(data: bytes, keep: bool) -> Artifact:
    doc = _dict(_json(data, "the file"), "the file")
    entries, header, signature = _trailer(doc)
    items = []
    for key in ("notes", "tombstones"):
        for n, record in enumerate(_list(doc.get(key), f"the file's {key!r}")):
            what = f"record {n + 1} of {key!r}"
            try:
                data = _dumps(record)
            except ValueError:  # a lone surrogate (\ud800) is JSON but not UTF-8
                raise NotAnExport(f"{what} holds a string that is not Unicode text") from None
            items.append(_record_item(record, data, keep, what))
    export = _dict(doc.get("export"), "the file's 'export'")
    return Artifact("json", items, entries, header, signature, export)


def _read_ndjson(lines: Iterator[bytes], keep: bool) -> Artifact:
    items: list[Item] = []
    previous: bytes | None = None
    for n, raw in enumerate(lines):
        if previous is not None:
            record = _json(previous, f"line {n}")
            if isinstance(record, dict) and "entries" in record and "manifest" in record:
                raise NotAnExport(
                    f"line {n} is the manifest, yet more follows it: the manifest is the "
                    "last line (something was appended?)"
                )
            items.append(_record_item(record, previous, keep, f"line {n}"))
        previous = raw[:-1] if raw.endswith(b"\n") else raw
    if previous is None:
        raise NotAnExport("the file is empty")
    trailer = _dict(_json(previous, "the last line (the manifest)"), "the last line")
    entries, header, signature = _trailer(trailer)
    return Artifact("ndjson", items, entries, header, signature)


def _name_is_utf8(info: zipfile.ZipInfo) -> bool:
    """A name either flagged UTF-8 or plain ASCII (anything else is read as CP437 and is
    not the name that was written)."""
    return bool(info.flag_bits & UTF8_FLAG) or info.filename.isascii()


def _member_json(zf: zipfile.ZipFile, name: str) -> Any:
    info = zf.getinfo(name)
    limit = min(MANIFEST_MEMBER_LIMIT, max(16 << 20, MANIFEST_MEMBER_RATIO * info.compress_size))
    if info.file_size > limit:
        raise NotAnExport(
            f"{name} declares {info.file_size} bytes from {info.compress_size} compressed: "
            "more than a manifest holds (a zip bomb?)"
        )
    try:
        with zf.open(info) as fh:
            data = fh.read(limit + 1)
    except (NotImplementedError, RuntimeError) as exc:  # an unknown method, encrypted
        raise NotAnExport(f"{name} cannot be read: {exc}") from None
    if len(data) > limit:
        raise NotAnExport(f"{name} expands beyond {limit} bytes")
    return _json(data, name)


def _hash_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int) -> tuple[str, bytes]:
    """``(sha256 hex, the file's first bytes)`` of a member, read in chunks; raises
    NotAnExport when it expands beyond ``limit`` bytes or does not decompress."""
    digest = hashlib.sha256()
    head = b""
    total = 0
    with zf.open(info) as fh:
        while chunk := fh.read(CHUNK):
            total += len(chunk)
            if total > limit:
                raise NotAnExport(f"{info.filename} expands beyond the {limit} bytes declared")
            digest.update(chunk)
            if len(head) < FRONT_MATTER_LIMIT:
                head += chunk[: FRONT_MATTER_LIMIT - len(head)]
    return digest.hexdigest(), head


def _read_zip(src: IO[bytes], *, defer: bool = False) -> Artifact:
    """A markdown_zip: its listing checked member by member; each note member is hashed
    now, or with ``defer`` left in ``Artifact.pending`` for :func:`hash_pending`."""
    found: list[str] = []
    pending: list[tuple[int, zipfile.ZipInfo]] = []
    items: list[Item] = []
    files: list[tuple[int, str, int]] = []
    try:
        with zipfile.ZipFile(src) as zf:
            infos = zf.infolist()
            for name, count in sorted(Counter(i.filename for i in infos).items()):
                if count > 1:
                    found.append(f"the archive holds {count} members named {name!r}")
            for info in infos:
                if not _name_is_utf8(info):
                    found.append(
                        f"the member name {info.filename!r} is not UTF-8 (bit 11 unset, "
                        "not ASCII): it is not a name the service writes"
                    )
            for name in MANIFEST_MEMBERS:
                if name not in zf.NameToInfo:
                    raise NotAnExport(f"the archive has no {name}")
            doc = _dict(_member_json(zf, "manifest.json"), "manifest.json")
            listing = _list(doc.get("files"), "manifest.json's 'files'")
            export = _dict(doc.get("export"), "manifest.json's 'export'")
            signed = _dict(_member_json(zf, "signed-manifest.json"), "signed-manifest.json")
            entries, header, signature = _trailer(signed)
            v2 = header.get("manifest_version", 1) != 1
            for n, entry in enumerate(listing):
                what = f"file {n + 1} of manifest.json"
                entry = _dict(entry, what)
                note_id = _int(entry.get("id"), f"the id of {what}")
                path = entry.get("path")
                if not isinstance(path, str):
                    raise NotAnExport(f"the path of {what} is not a string")
                size = _int(entry.get("size"), f"the size of {what}") if v2 else -1
                files.append((note_id, path, size))
                shape = NOTE_PATH.fullmatch(path)
                if shape is None or int(shape.group(1)) != note_id:
                    found.append(
                        f"manifest.json names note {note_id} {path!r}: a note file is "
                        f"notes/<slug>-{note_id}.md"
                    )
                    continue
                member = zf.NameToInfo.get(path)
                if member is None:
                    found.append(f"{path} is listed in manifest.json but not in the archive")
                    continue
                if v2 and member.file_size != size:
                    found.append(
                        f"{path}: the archive declares {member.file_size} bytes, "
                        f"manifest.json {size}"
                    )
                    continue
                if member.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                    found.append(  # bzip2 and lzma expand far more than deflate's 1032:1
                        f"{path}: compression method {member.compress_type} is not one the "
                        "service writes (stored or deflate)"
                    )
                    continue
                pending.append((note_id, member))
            if not defer:
                items += _hash_members(zf, pending, found)
            listed = {p for _, p, _ in files}
            for name in sorted({i.filename for i in infos} - listed - set(MANIFEST_MEMBERS)):
                found.append(f"the member {name!r} is not listed in manifest.json")
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError) as exc:
        raise NotAnExport(f"not a readable zip archive (truncated?): {exc}") from None
    for entry in entries:  # tombstones are only in the manifest of an archive
        if entry[2] is None:
            items.append(Item(entry[0], entry[1], True, None))
    return Artifact(
        "markdown_zip",
        items,
        entries,
        header,
        signature,
        export,
        files=files,
        found=found,
        pending=pending if defer else None,
    )


def _hash_members(
    zf: zipfile.ZipFile, pending: list[tuple[int, zipfile.ZipInfo]], found: list[str]
) -> list[Item]:
    """The note items of ``pending`` members, each hashed while it is decompressed and
    bounded by its declared size; what goes wrong is added to ``found``."""
    items = []
    for note_id, member in pending:
        path = member.filename
        try:
            digest, head = _hash_member(zf, member, member.file_size)
        except (
            NotAnExport,
            zipfile.BadZipFile,
            EOFError,
            OSError,
            ValueError,
            NotImplementedError,  # a compression method zipfile does not know
            RuntimeError,  # an encrypted member
        ) as exc:
            found.append(f"{path}: {exc}")
            continue
        version = _md_version(head)
        if version is None:
            found.append(f"{path}: its front matter has no version")
            version = -1
        items.append(Item(note_id, version, False, digest, {"path": path}, source=None))
    return items


def hash_pending(art: Artifact) -> list[str]:
    """Hash the note members :func:`read_path` left pending (:attr:`Artifact.pending`),
    putting their items before the tombstones; returns what went wrong."""
    if art.pending is None:
        return []
    assert art.path is not None
    found: list[str] = []
    try:
        with zipfile.ZipFile(art.path) as zf:
            notes = _hash_members(zf, art.pending, found)
    except (zipfile.BadZipFile, EOFError, OSError) as exc:
        found.append(f"not a readable zip archive any more: {exc}")
        notes = []
    for item in notes:
        item.source = art.path
    art.items[:0] = notes
    art.pending = None
    return found


def _md_version(head: bytes) -> int | None:
    """The ``version`` of a note file's front matter, from its first bytes (None when
    there is none)."""
    front = head.split(b"\n---\n", 1)[0]
    for line in front.split(b"\n"):
        if line.startswith(b"version: "):
            text = line.split(b": ", 1)[1]
            return int(text) if text.isdigit() and len(text) < 19 else None
    return None


# --- checking -------------------------------------------------------------------------------


def _listing(ids: list[int], limit: int = 20) -> str:
    shown = ", ".join(str(i) for i in ids[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


def sequence_problems(art: Artifact) -> list[str]:
    """Every way the file's items differ from the entries as a sequence of ``(id, version,
    sha256)``: repeated (in the file or the manifest), missing, unlisted, changed (version
    or bytes) and reordered items, each named."""
    out: list[str] = []
    kinds = {e[0]: ("tombstone" if e[2] is None else "note") for e in art.entries}
    in_manifest = Counter(e[0] for e in art.entries)
    in_file = Counter(i.id for i in art.items)
    for note_id, count in in_manifest.items():
        if count > 1:
            out.append(f"the manifest lists {kinds[note_id]} {note_id} {count} times")
    for note_id, count in in_file.items():
        if count > 1:
            out.append(f"{kinds.get(note_id, 'note')} {note_id} appears {count} times in the file")
    first = {e[0]: e for e in reversed(art.entries)}
    for note_id in in_manifest:
        if note_id not in in_file:
            out.append(f"{kinds[note_id]} {note_id} is in the manifest but missing from the file")
    for note_id in in_file:
        if note_id not in in_manifest:
            out.append(f"note {note_id} is in the file but not in the manifest")
    copies: Counter[int] = Counter()
    for item in art.items:
        entry = first.get(item.id)
        if entry is None:
            continue
        copies[item.id] += 1
        what = f"{kinds[item.id]} {item.id}"
        if in_file[item.id] > 1:
            what += f" (copy {copies[item.id]} of {in_file[item.id]})"
        if item.deleted != (entry[2] is None):
            out.append(f"{what}: a tombstone on one side, a note on the other")
        elif item.version != entry[1]:
            out.append(f"{what}: version {item.version} in the file, {entry[1]} in the manifest")
        elif item.sha256 != entry[2]:
            out.append(f"{what}: its bytes do not match its SHA-256 in the manifest")
    both = set(in_manifest) & set(in_file)
    file_order = list(dict.fromkeys(i.id for i in art.items if i.id in both))
    manifest_order = list(dict.fromkeys(e[0] for e in art.entries if e[0] in both))
    if file_order != manifest_order:
        moved = [a for a, b in zip(file_order, manifest_order, strict=True) if a != b]
        out.append(
            f"the file's items are not in the manifest's order: {_listing(moved)} "
            "stand where the manifest lists another item"
        )
    return out


def problems(
    art: Artifact,
    keys: dict[str, Any],
    *,
    allow_unsigned: bool = False,
    base: Artifact | None = None,
) -> list[str]:
    """Every way ``art`` does not match its manifest (empty: it verifies). ``keys``:
    ``{key_id: Ed25519 public key}``."""
    out: list[str] = list(art.found)
    m = art.manifest
    if art.signature is None:
        if not allow_unsigned:
            out.append("the manifest is not signed (--allow-unsigned to check the hashes only)")
    else:
        wrong = manifests.check_signature(m, art.signature, keys)
        if wrong:
            out.append(wrong)
    if m.get("format", art.fmt) != art.fmt:
        out.append(f"the file is {art.fmt}, the manifest says {m.get('format')}")
    if manifests.entries_sha256(art.entries) != m.get("entries_sha256"):
        out.append(
            "the entries do not hash to the manifest's entries_sha256 "
            "(an entry was changed, added or removed)"
        )
    covered = art.fmt == "markdown_zip" and m.get("manifest_version", 1) != 1
    if covered and manifests.files_sha256(art.files) != m.get("files_sha256"):
        out.append(
            "manifest.json's file list (ids, paths, sizes) does not hash to the "
            "manifest's files_sha256 (a file was renamed, added, removed or resized)"
        )
    if art.pending is not None:
        if out and (art.signature is not None or not allow_unsigned):
            out.append(
                "the note files were not read: a file whose signature, file list or "
                "members are wrong (above) is not decompressed further"
            )
            return out
        out += hash_pending(art)
    notes = sum(1 for e in art.entries if e[2] is not None)
    tombstones = len(art.entries) - notes
    if (notes, tombstones) != (m.get("notes"), m.get("tombstones")):
        out.append(
            f"the manifest counts {m.get('notes')} notes and {m.get('tombstones')} "
            f"tombstones; its entries hold {notes} and {tombstones}"
        )
    if art.export and art.export.get("id") != m.get("export_id"):
        out.append(f"the file is export {art.export.get('id')}, the manifest {m.get('export_id')}")
    out += sequence_problems(art)
    if base is not None:
        named = m.get("base") or {}
        if not isinstance(named, dict) or not named:
            out.append("the manifest names no base (a full export), yet --base was given")
        elif (named.get("export_id"), named.get("manifest_sha256")) != (
            base.manifest.get("export_id"),
            base.manifest_sha256,
        ):
            out.append(
                f"the manifest's base is export {named.get('export_id')} with manifest "
                f"{named.get('manifest_sha256')}; the base file is export "
                f"{base.manifest.get('export_id')} with manifest {base.manifest_sha256}"
            )
    return out


def _keys_document(text: str, where: str) -> dict[str, Any]:
    try:
        return manifests.keys_from_jwks(_json(text, where))
    except (NotAnExport, ValueError, TypeError, KeyError) as exc:
        raise fail(f"{where} is not a JWK Set of Ed25519 keys: {exc}", 2) from None


def given_keys(keys_file: Path | None, public_key: str | None) -> dict[str, Any] | None:
    """``{key_id: public key}`` from ``--public-key`` or ``--keys FILE`` (a JWK Set, as
    ``GET /v1/manifest-keys`` serves it); None when neither is given. A key that does not
    load is a usage error (exit 2)."""
    if public_key:
        try:
            key = manifests.load_public_key(public_key)
        except ValueError as exc:
            raise fail(f"--public-key: {exc}", 2) from None
        return {manifests.key_id(key): key}
    if keys_file is not None:
        try:
            text = keys_file.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise fail(f"cannot read --keys {keys_file}: {exc}", 2) from None
        return _keys_document(text, str(keys_file))
    return None


def served_keys(api_url: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The API's ``GET /v1/manifest-keys``: ``({key_id: key}, the JWKs)``."""
    try:
        r = httpx.get(f"{api_url.rstrip('/')}/v1/manifest-keys", timeout=10.0)
    except httpx.TransportError as exc:
        raise fail(
            f"cannot fetch the public keys from {api_url} ({type(exc).__name__}); "
            "pass --keys FILE or --public-key",
            7,
        ) from None
    if r.status_code != 200:
        raise fail(f"GET /v1/manifest-keys answered HTTP {r.status_code}")
    keys = _keys_document(r.text, "the API's /v1/manifest-keys")
    return keys, [manifests.jwk(k) for k in keys.values()]


def trusted_keys(api_url: str, keys_file: Path | None, public_key: str | None) -> dict[str, Any]:
    """``{key_id: public key}`` from ``--public-key``, ``--keys FILE`` (a JWK Set) or the
    API's ``/v1/manifest-keys`` (``verify``: the file was downloaded separately; a restore
    uses :func:`pinned_keys` instead)."""
    given = given_keys(keys_file, public_key)
    return given if given is not None else served_keys(api_url)[0]


def known_keys_path() -> Path:
    """``$XDG_CONFIG_HOME/exportctl/known-manifest-keys.json`` (``~/.config`` when unset):
    the manifest keys a restore pinned, per API URL."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "exportctl" / "known-manifest-keys.json"


def pinned_keys(api_url: str) -> tuple[dict[str, Any], Callable[[], None] | None]:
    """The keys a restore from ``api_url`` trusts when neither ``--keys`` nor
    ``--public-key`` is given: trust on first use, like SSH's known_hosts. ``(keys, pin)``:
    the first time, ``keys`` are the ones the API serves and ``pin`` writes them into
    :func:`known_keys_path` (said on stderr, with their ids to check) — the restore calls
    it only once its whole chain verified with them, so a chain that fails pins nothing;
    afterwards ``keys`` are the pinned ones (``pin`` None), and an API that serves a key
    not pinned is refused (exit 1) with what to do."""
    url = api_url.rstrip("/")
    store = known_keys_path()

    def read() -> dict[str, Any]:
        if not store.exists():
            return {}
        try:
            return _dict(_json(store.read_text("utf-8"), str(store)), str(store))
        except (OSError, UnicodeDecodeError, NotAnExport) as exc:
            raise fail(f"cannot read the pinned keys {store}: {exc}; fix or remove it", 2) from None

    known = read()
    served, jwks = served_keys(url)
    if url not in known:
        if not served:
            raise fail(f"the API at {url} serves no manifest keys: its exports are not signed")

        def pin() -> None:
            now = read()  # another restore may have pinned meanwhile: keep its entries
            now.setdefault(url, jwks)
            store.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=store.name + ".", dir=store.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:  # mkstemp: mode 0600, O_EXCL
                fh.write(json.dumps(now, indent=2) + "\n")
            os.replace(tmp, store)
            err.print(
                f"[yellow]pinned[/] the manifest keys of {safe(url)} for the first time: "
                f"{', '.join(sorted(served))} (in {safe(store)}). Check these key ids with the "
                "deployment's operators; later restores trust only them."
            )

        return served, pin
    pinned = _keys_document(json.dumps({"keys": known[url]}), str(store))
    new = sorted(served.keys() - pinned.keys())
    if new:
        raise fail(
            f"the API at {url} now serves manifest key {', '.join(new)}, which is not pinned "
            f"in {store} (pinned: {', '.join(sorted(pinned)) or 'none'}). If the deployment "
            "rotated its key, check the new key id with its operators, then pass "
            "--public-key KEY or --keys FILE, or remove the entry for this URL from that "
            "file to pin the keys it serves now."
        )
    return pinned, None


def load(path: Path, *, keep: bool = False) -> Artifact:
    """Read and parse ``path``: exit 2 when it cannot be read, 1 when it is not a
    well-formed export (truncated, malformed: it does not verify)."""
    try:
        return read_path(path, keep=keep)
    except OSError as exc:
        raise fail(f"cannot read {path}: {exc.strerror or exc}", 2) from None
    except NotAnExport as exc:
        raise fail(
            f"{path} does not verify: not an export file with a manifest ({exc})", 1
        ) from None


@app.command()
def verify(
    file: Path,
    base: Annotated[
        Path | None, typer.Option("--base", help="the base export's file, to check the link")
    ] = None,
    keys: Annotated[
        Path | None, typer.Option("--keys", help="a JWK Set file instead of the API's keys")
    ] = None,
    public_key: Annotated[
        str | None, typer.Option("--public-key", help="one Ed25519 public key (base64)")
    ] = None,
    allow_unsigned: Annotated[
        bool, typer.Option("--allow-unsigned", help="accept a manifest without signature")
    ] = False,
    identity: Annotated[
        Path | None,
        typer.Option(
            "--identity", "-i", help="an age file: its identity, to check the contents too"
        ),
    ] = None,
    envelope: Annotated[
        Path | None,
        typer.Option("--envelope", help="an age file's envelope (default: FILE.envelope.json)"),
    ] = None,
    api_url: ApiUrl = DEFAULT_API_URL,
    output: OutputOpt = None,
) -> None:
    """Check an export file's signature and every item against its manifest (the exact
    sequence of notes, a markdown_zip's exact member list); names each mismatch, exit
    status 1 when there is one or the file is not a well-formed export, 2 when it cannot
    be read. ``--output json`` prints the verdict as
    one object (``verified``, ``problems``, the manifest's counts and key id).

    An encrypted export (an age file): checked against its signed envelope without any key
    (signature, SHA-256, size, recipients); with ``--identity FILE`` also decrypted into a
    private temporary file and its contents checked as above, and bound to the envelope."""
    sealed: dict[str, Any] | None = None
    try:
        encrypted = is_age_file(file)
    except OSError as exc:
        raise fail(f"cannot read {file}: {exc.strerror or exc}", 2) from None
    if identity is not None and not encrypted:
        raise fail(f"{file} is not an age file: verify it without --identity", 2)
    if encrypted:
        doc = load_envelope(envelope or Path(f"{file}{ENVELOPE_SUFFIX}"))
        sealed = doc["envelope"]
        trusted = trusted_keys(api_url, keys, public_key)
        found = ciphertext_problems(file, doc, trusted, allow_unsigned=allow_unsigned)
        if identity is None:
            _say_sealed(file, sealed, found, output)
            return
        identities = identities_from(identity)
        with decrypted(file, identities) as plain:
            art = load(plain)
            found += problems(
                art,
                trusted,
                allow_unsigned=allow_unsigned,
                base=load(base) if base is not None else None,
            )
            found += envelope_binds(sealed, art.manifest)
    else:
        art = load(file)
        found = problems(
            art,
            trusted_keys(api_url, keys, public_key),
            allow_unsigned=allow_unsigned,
            base=load(base) if base is not None else None,
        )
    m = art.manifest
    verdict = {
        "file": str(file),
        "verified": not found,
        "problems": found,
        "export_id": m.get("export_id"),
        "kind": m.get("kind"),
        "notes": m.get("notes"),
        "tombstones": m.get("tombstones"),
        "key_id": m.get("key_id"),
        "manifest_sha256": art.manifest_sha256,
        "encrypted": encrypted,
        "contents_checked": True,
    }

    def say(_: Any) -> None:
        print_problems(found)
        if not found:
            kid = m.get("key_id") if art.signature is not None else None
            signed_by = f"key {kid}" if kid else "unsigned: hashes only"
            err.print(
                f"[green]✓ verified[/] export {safe(m.get('export_id'))} "
                f"({safe(m.get('kind'))}, {safe(count_of(m.get('notes'), 'note'))}, "
                f"{safe(count_of(m.get('tombstones'), 'tombstone'))}, "
                f"{signed_by}); manifest sha256 {art.manifest_sha256}"
            )

    emit_object(verdict, explicit(output), default=say)
    if found:
        raise typer.Exit(1)


def print_problems(found: list[str]) -> None:
    """Each problem on stderr, at most ``SHOWN_PROBLEMS``, then how many more."""
    for p in found[:SHOWN_PROBLEMS]:
        err.print(f"[red]✗[/] {safe(p)}")
    if len(found) > SHOWN_PROBLEMS:
        err.print(
            f"[red]✗[/] and {len(found) - SHOWN_PROBLEMS} more problems "
            "(--output json lists them all)"
        )


def _say_sealed(
    file: Path, sealed: dict[str, Any], found: list[str], output: Output | None
) -> None:
    """The verdict on an age file checked without its key: the ciphertext only."""
    verdict = {
        "file": str(file),
        "verified": not found,
        "problems": found,
        "export_id": sealed.get("export_id"),
        "notes": sealed.get("notes"),
        "tombstones": sealed.get("tombstones"),
        "key_id": sealed.get("key_id"),
        "manifest_sha256": sealed.get("manifest_sha256"),
        "encrypted": True,
        "contents_checked": False,
    }

    def say(_: Any) -> None:
        print_problems(found)
        if not found:
            err.print(
                f"[green]✓ verified[/] the ciphertext of export {safe(sealed.get('export_id'))} "
                f"({safe(count_of(sealed.get('notes'), 'note'))}, "
                f"{safe(count_of(len(sealed.get('recipients') or []), 'recipient'))}, "
                f"key {safe(sealed.get('key_id'))}); contents not checked: pass --identity"
            )

    emit_object(verdict, explicit(output), default=say)
    if found:
        raise typer.Exit(1)


manifest_key_app = typer.Typer(help="Manifest signing keys.", no_args_is_help=True)
app.add_typer(manifest_key_app, name="manifest-key")


@manifest_key_app.command("new")
def manifest_key_new(output: OutputOpt = None) -> None:
    """Print a new Ed25519 key pair: the private key (for MANIFEST_SIGNING_KEY, a Secret)
    on stdout, the public key on stderr (``--output json``: one object with both and the key
    id on stdout). Nothing is stored."""
    private, public = manifests.new_private_key_text()
    kid = manifests.key_id(manifests.load_public_key(public))

    def say(_: Any) -> None:
        print(private)
        err.print(f"public key {public} (key id {kid})")

    emit_object(
        {"private_key": private, "public_key": public, "key_id": kid},
        explicit(output),
        default=say,
    )
