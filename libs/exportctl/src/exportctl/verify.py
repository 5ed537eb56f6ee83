"""``exportctl verify FILE``: check an export file against its signed manifest.

What is checked (docs/api.md "Manifests", docs/cli.md "Verify and restore"): the Ed25519
signature of the manifest header by one of the deployment's public keys, the header's
``entries_sha256`` against the entries, its counts, and every item of the file against its
entry (present, same version, same SHA-256 of its bytes); with ``--base``, that the
manifest's base is that file's manifest. Every mismatch is named; exit status 1 when there
is one.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from exportcore import manifests
from exportcore.render.base import _dumps
from exportctl.api import DEFAULT_API_URL, ApiUrl
from exportctl.common import app, err, fail, safe
from exportctl.output import OutputOpt, emit_object, explicit


@dataclass
class Item:
    """One item of an export file: a note (``record``: its json/ndjson record, or for
    markdown_zip its path) or a tombstone, with the SHA-256 of the bytes that represent it."""

    id: int
    version: int
    deleted: bool
    sha256: str | None
    record: dict[str, Any] | None = None
    data: bytes = b""


@dataclass
class Artifact:
    """An export file, parsed: its format, the items, and its manifest."""

    fmt: str
    items: list[Item]
    entries: list[list[Any]]
    manifest: dict[str, Any]
    signature: dict[str, Any] | None
    export: dict[str, Any] = field(default_factory=dict)

    @property
    def manifest_sha256(self) -> str:
        """The identity a delta names this export by."""
        return manifests.manifest_sha256(self.manifest)


class NotAnExport(ValueError):
    """The file is not an export of this service (or is truncated)."""


def _record_item(record: dict[str, Any], data: bytes) -> Item:
    deleted = bool(record.get("deleted"))
    return Item(
        id=int(record["id"]),
        version=int(record.get("version", 1)),
        deleted=deleted,
        sha256=None if deleted else hashlib.sha256(data).hexdigest(),
        record=record,
        data=data,
    )


def read_artifact(data: bytes) -> Artifact:
    """Parse an export file (json, ndjson or markdown_zip, told apart by content). Raises
    ``NotAnExport`` for anything else."""
    if data.startswith(b"PK"):
        return _read_zip(data)
    try:
        if data.startswith(b'{"export":'):
            doc = json.loads(data)
            items = [_record_item(n, _dumps(n)) for n in doc["notes"]]
            items += [_record_item(t, _dumps(t)) for t in doc["tombstones"]]
            return Artifact(
                "json", items, doc["entries"], doc["manifest"], doc["signature"], doc["export"]
            )
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        if not lines:
            raise NotAnExport("the file is empty")
        trailer = json.loads(lines[-1])
        items = [_record_item(json.loads(line), line) for line in lines[:-1]]
        return Artifact(
            "ndjson", items, trailer["entries"], trailer["manifest"], trailer["signature"]
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise NotAnExport(f"not an export file with a manifest ({exc})") from None


def _read_zip(data: bytes) -> Artifact:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            files = json.loads(zf.read("manifest.json"))
            signed = json.loads(zf.read("signed-manifest.json"))
            items = []
            for entry in files["files"]:
                md = zf.read(entry["path"])
                items.append(
                    Item(
                        int(entry["id"]),
                        _md_version(md),
                        False,
                        hashlib.sha256(md).hexdigest(),
                        {"path": entry["path"]},
                        md,
                    )
                )
    except (KeyError, ValueError, zipfile.BadZipFile) as exc:
        raise NotAnExport(f"not a markdown_zip export with a manifest ({exc})") from None
    for entry in signed["entries"]:  # tombstones are only in the manifest of an archive
        if entry[2] is None:
            items.append(Item(int(entry[0]), int(entry[1]), True, None))
    return Artifact(
        "markdown_zip",
        items,
        signed["entries"],
        signed["manifest"],
        signed["signature"],
        files["export"],
    )


def _md_version(md: bytes) -> int:
    """The ``version`` of a note file's front matter (1 when it has none)."""
    head = md.split(b"\n---\n", 1)[0]
    for line in head.split(b"\n"):
        if line.startswith(b"version: "):
            return int(line.split(b": ", 1)[1])
    return 1


def problems(
    art: Artifact,
    keys: dict[str, Any],
    *,
    allow_unsigned: bool = False,
    base: Artifact | None = None,
) -> list[str]:
    """Every way ``art`` does not match its manifest (empty: it verifies). ``keys``:
    ``{key_id: Ed25519 public key}``."""
    out: list[str] = []
    m = art.manifest
    if art.signature is None:
        if not allow_unsigned:
            out.append("the manifest is not signed (--allow-unsigned to check the hashes only)")
    else:
        wrong = manifests.check_signature(m, art.signature, keys)
        if wrong:
            out.append(wrong)
    if manifests.entries_sha256(art.entries) != m.get("entries_sha256"):
        out.append(
            "the entries do not hash to the manifest's entries_sha256 "
            "(an entry was changed, added or removed)"
        )
    notes = sum(1 for e in art.entries if e[2] is not None)
    tombstones = len(art.entries) - notes
    if (notes, tombstones) != (m.get("notes"), m.get("tombstones")):
        out.append(
            f"the manifest counts {m.get('notes')} notes and {m.get('tombstones')} "
            f"tombstones; its entries hold {notes} and {tombstones}"
        )
    if art.export and art.export.get("id") != m.get("export_id"):
        out.append(f"the file is export {art.export.get('id')}, the manifest {m.get('export_id')}")
    listed = {int(e[0]): e for e in art.entries}
    present = {i.id: i for i in art.items}
    for note_id, entry in listed.items():
        item = present.get(note_id)
        what = "tombstone" if entry[2] is None else "note"
        if item is None:
            out.append(f"{what} {note_id} is in the manifest but missing from the file")
        elif item.version != int(entry[1]):
            out.append(
                f"{what} {note_id}: version {item.version} in the file, {entry[1]} in the manifest"
            )
        elif item.sha256 != entry[2]:
            out.append(f"note {note_id}: its bytes do not match its SHA-256 in the manifest")
    for note_id in present.keys() - listed.keys():
        out.append(f"note {note_id} is in the file but not in the manifest")
    if base is not None:
        named = m.get("base") or {}
        if not named:
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


def trusted_keys(api_url: str, keys_file: Path | None, public_key: str | None) -> dict[str, Any]:
    """``{key_id: public key}`` from ``--public-key``, ``--keys FILE`` (a JWK Set) or the
    API's ``/v1/manifest-keys``."""
    if public_key:
        key = manifests.load_public_key(public_key)
        return {manifests.key_id(key): key}
    if keys_file is not None:
        return manifests.keys_from_jwks(json.loads(keys_file.read_text("utf-8")))
    try:
        r = httpx.get(f"{api_url.rstrip('/')}/v1/manifest-keys", timeout=10.0)
    except httpx.TransportError as exc:
        raise fail(
            f"cannot fetch the public keys from {api_url} ({type(exc).__name__}); "
            "pass --keys FILE or --public-key"
        ) from None
    if r.status_code != 200:
        raise fail(f"GET /v1/manifest-keys answered HTTP {r.status_code}")
    return manifests.keys_from_jwks(r.json())


def load(path: Path) -> Artifact:
    """Read and parse ``path`` (a CLI error when it is not an export file)."""
    try:
        return read_artifact(path.read_bytes())
    except OSError as exc:
        raise fail(f"cannot read {path}: {exc.strerror}", 2) from None
    except NotAnExport as exc:
        raise fail(f"{path}: {exc}", 2) from None


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
    api_url: ApiUrl = DEFAULT_API_URL,
    output: OutputOpt = None,
) -> None:
    """Check an export file's signature and every note's hash against its manifest; names
    each mismatch, exit status 1 when there is one. ``--output json`` prints the verdict as
    one object (``verified``, ``problems``, the manifest's counts and key id)."""
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
    }

    def say(_: Any) -> None:
        for p in found:
            err.print(f"[red]✗[/] {safe(p)}")
        if not found:
            err.print(
                f"[green]✓ verified[/] export {safe(m['export_id'])} ({safe(m['kind'])}, "
                f"{m['notes']} notes, {m['tombstones']} tombstones, key "
                f"{safe(m.get('key_id'))}); manifest sha256 {art.manifest_sha256}"
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
