"""``exportctl restore --chain ID DIR``: the state a (delta) export stands for, rebuilt from
its chain of artifacts (docs/cli.md "Verify and restore").

The chain is followed through the API from ID back to a full export by each export's
``base``; every artifact is downloaded, verified (signature, hashes) and checked to name its
base's manifest SHA-256; then applied oldest first: a note replaces its earlier version, a
tombstone removes it.

Trust: the signatures are checked against ``--public-key`` / ``--keys FILE`` or, without
them, against the keys pinned for the API URL the first time it was used
(:func:`exportctl.verify.pinned_keys`; pinned only once the chain verified), never
merely against what the server serves now; each file must be the export it was asked
for (its manifest's ``export_id``: no older file replayed).
Writing: every path is checked to stay inside the target folder (relative, no ``..``, no
backslash, drive or NUL, no part over 255 bytes, only ``notes/<slug>-<id>.md`` for a
markdown_zip), created relative to folder descriptors without following a symbolic
link and never over an existing file.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from exportctl.api import DEFAULT_API_URL, ApiKey, ApiUrl, call
from exportctl.common import app, err, fail, safe
from exportctl.encrypted import is_age_file
from exportctl.exports import download
from exportctl.output import OutputOpt, emit_object, explicit
from exportctl.verify import (
    NOTE_PATH,
    Artifact,
    Item,
    given_keys,
    load,
    pinned_keys,
    problems,
)

_DRIVE = re.compile(r"^[A-Za-z]:")


class UnsafePath(ValueError):
    """A path a restore refuses to write: it would not stay inside the target folder."""


def safe_relative(path: str) -> list[str]:
    """The parts of ``path`` when it is a plain relative path that stays inside a folder:
    not empty, not absolute, no ``..`` or ``.`` part, no backslash, drive letter or NUL.
    Raises UnsafePath naming the path."""
    if (
        not path
        or "\0" in path
        or "\\" in path
        or path.startswith("/")
        or _DRIVE.match(path)
        or any(part in ("", ".", "..") for part in path.split("/"))
    ):
        raise UnsafePath(f"refusing to write {path!r}: not a plain path inside the folder")
    return path.split("/")


NAME_MAX = 255
"""The most bytes of one path part (Linux, macOS; checked before anything is written)."""


def open_new_file(target: Path, path: str) -> int:
    """A file descriptor of the new file ``path`` (checked by :func:`safe_relative`) under
    ``target``: each folder is created and opened relative to the one before it (``mkdir``
    and ``open`` with ``dir_fd``) with ``O_NOFOLLOW | O_DIRECTORY``, so none may be a
    symbolic link and one swapped for a link after it was checked is never followed; the
    file is created exclusively (never over an existing file) without following a link.
    Raises UnsafePath or OSError."""
    *folders, name = safe_relative(path)
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    as_dir = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
    here = os.open(target, as_dir)  # the folder the user named (it may be a link they made)
    try:
        for folder in folders:
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder, 0o755, dir_fd=here)
            try:
                below = os.open(folder, as_dir | nofollow, dir_fd=here)
            except (NotADirectoryError, OSError) as exc:  # ELOOP: a link; ENOTDIR: a file
                raise UnsafePath(
                    f"refusing to write {path!r}: {folder} is not a plain folder ({exc.strerror})"
                ) from None
            os.close(here)
            here = below
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | nofollow
        return os.open(name, flags, 0o644, dir_fd=here)
    finally:
        os.close(here)


def copy_member(item: Item, fd: int) -> None:
    """Copy a verified markdown_zip note from its archive into ``fd``, stopping at the size
    the archive declares (verify checked it against the signed file list)."""
    assert item.source is not None and item.record is not None
    with zipfile.ZipFile(item.source) as zf, zf.open(item.record["path"]) as src:
        while chunk := src.read(1 << 20):
            os.write(fd, chunk)


def apply_chain(chain: Sequence[Artifact]) -> dict[int, Item]:
    """``{note id: item}`` after applying ``chain`` (full export first, then its deltas in
    order). Raises ValueError when the chain is not one: the first is not a full export, a
    delta does not name the one before it, or the formats differ."""
    if not chain:
        raise ValueError("an empty chain")
    state: dict[int, Item] = {}
    for n, art in enumerate(chain):
        base = art.manifest.get("base")
        if n == 0 and base is not None:
            raise ValueError(
                f"export {art.manifest.get('export_id')} is a delta, not a full export"
            )
        if n > 0:
            before = chain[n - 1]
            if not isinstance(base, dict) or (
                base.get("export_id"),
                base.get("manifest_sha256"),
            ) != (before.manifest.get("export_id"), before.manifest_sha256):
                raise ValueError(
                    f"export {art.manifest.get('export_id')} does not name export "
                    f"{before.manifest.get('export_id')}'s manifest as its base"
                )
            if art.fmt != before.fmt:
                raise ValueError("a chain is one format")
        if base is None:
            state = {}
        for item in art.items:
            if item.deleted:
                state.pop(item.id, None)
            else:
                state[item.id] = item
    return state


def write_state(chain: Sequence[Artifact], state: dict[int, Item], target: Path) -> dict[str, Any]:
    """Write ``notes.ndjson`` (or ``notes/*.md`` for markdown_zip) and ``chain.json``;
    returns what ``chain.json`` holds (``{"chain": [...], "notes": n}``). A markdown_zip
    note is copied from its archive (still on disk). Raises UnsafePath for a path that
    would leave ``target`` (:func:`open_new_file`)."""
    markdown = chain[-1].fmt == "markdown_zip"
    notes = sorted(state.values(), key=lambda i: i.id)
    if markdown:  # every path is checked before anything is written
        for item in notes:
            assert item.record is not None
            path = str(item.record["path"])
            shape = NOTE_PATH.fullmatch(path)
            if shape is None or int(shape.group(1)) != item.id:
                raise UnsafePath(f"refusing to write {path!r}: not notes/<slug>-{item.id}.md")
            if any(len(part.encode()) > NAME_MAX for part in safe_relative(path)):
                raise UnsafePath(f"refusing to write {path[:80]!r}…: a name over {NAME_MAX} bytes")
    target.mkdir(parents=True, exist_ok=True)
    if markdown:
        for item in notes:
            assert item.record is not None
            fd = open_new_file(target, str(item.record["path"]))
            try:
                copy_member(item, fd)
            finally:
                os.close(fd)
    else:
        with os.fdopen(open_new_file(target, "notes.ndjson"), "wb") as fh:
            for item in notes:
                fh.write(item.data + b"\n")
    summary = {
        "chain": [
            {
                "export_id": a.manifest.get("export_id"),
                "kind": a.manifest.get("kind"),
                "manifest_sha256": a.manifest_sha256,
                "notes": a.manifest.get("notes"),
                "tombstones": a.manifest.get("tombstones"),
            }
            for a in chain
        ],
        "notes": len(state),
    }
    with os.fdopen(open_new_file(target, "chain.json"), "wb") as fh:
        fh.write((json.dumps(summary, indent=2) + "\n").encode())
    return summary


def _job(answer: Any) -> dict[str, Any]:
    """An export as ``GET /v1/exports/{id}`` answers it, its shape checked (a CLI error
    naming what is wrong, never a traceback, whatever the server sends)."""
    base = answer.get("base") if isinstance(answer, dict) else None
    if (
        not isinstance(answer, dict)
        or not isinstance(answer.get("id"), str | int)
        or not isinstance(answer.get("status"), str)
        or not (base is None or (isinstance(base, dict) and isinstance(base.get("id"), str)))
    ):
        raise fail("the API answered an export without the expected id, status and base")
    return answer


@app.command()
def restore(
    chain: Annotated[str, typer.Option("--chain", help="the newest export of the chain")],
    target: Path,
    allow_unsigned: Annotated[
        bool, typer.Option("--allow-unsigned", help="accept manifests without signature")
    ] = False,
    keys: Annotated[
        Path | None, typer.Option("--keys", help="a JWK Set file of the keys to trust")
    ] = None,
    public_key: Annotated[
        str | None, typer.Option("--public-key", help="the one Ed25519 public key to trust")
    ] = None,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
    output: OutputOpt = None,
) -> None:
    """Rebuild the notes an export stands for from its chain (full export + deltas) into
    the folder TARGET (new or empty). Signatures are checked against ``--public-key`` /
    ``--keys``, else against the keys pinned for the API URL on first use
    (``$XDG_CONFIG_HOME/exportctl/known-manifest-keys.json``). ``--output json`` prints
    what ``chain.json`` holds."""
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise fail(f"{target} exists and is not an empty folder", 2)
    ids: list[str] = []
    job = _job(call(api_url, api_key, "GET", f"/v1/exports/{chain}"))
    while True:
        ids.append(str(job["id"]))
        if job["status"] != "succeeded":
            raise fail(f"export {job['id']} of the chain is {job['status']}, not succeeded")
        if not job.get("base"):
            break
        if len(ids) > 10_000:
            raise fail("the chain is longer than 10000 exports")
        job = _job(call(api_url, api_key, "GET", f"/v1/exports/{job['base']['id']}"))
    ids.reverse()
    if str(ids[-1]).lower() != chain.lower():
        raise fail(f"asked for export {chain}, the API answered export {ids[-1]}")
    trusted = given_keys(keys, public_key)
    pin = None
    if trusted is None:
        trusted, pin = pinned_keys(api_url)
    arts: list[Artifact] = []
    with tempfile.TemporaryDirectory(prefix="exportctl-restore-") as tmp:
        for job_id in ids:
            path = Path(tmp) / f"export-{Path(job_id).name}"
            download(job_id, str(path), True, api_url=api_url, api_key=api_key)
            if is_age_file(path):
                raise fail(
                    f"export {job_id} is encrypted (age): restore does not decrypt; "
                    "download each export with --identity instead"
                )
            art = load(path, keep=True)
            wrong = problems(art, trusted, allow_unsigned=allow_unsigned)
            if wrong:
                raise fail(f"export {job_id} does not verify: " + "; ".join(wrong))
            if str(art.manifest.get("export_id")) != job_id:
                raise fail(
                    f"the API served, for export {job_id}, the file of export "
                    f"{safe(art.manifest.get('export_id'))} (an older file replayed?)"
                )
            arts.append(art)
        try:
            state = apply_chain(arts)
        except ValueError as exc:
            raise fail(str(exc)) from None
        if pin is not None and all(a.signature is not None for a in arts):
            pin()  # only once the whole chain verified with those keys (not --allow-unsigned)
        try:
            summary = write_state(arts, state, target)
        except UnsafePath as exc:
            raise fail(f"{exc}; the restore stopped (files already written stay)") from None
        except OSError as exc:
            raise fail(
                f"cannot write into {target}: {exc.strerror or exc} ({safe(exc.filename)}); "
                "the restore stopped (files already written stay)"
            ) from None
    emit_object(
        summary,
        explicit(output),
        default=lambda _: err.print(
            f"[green]restored[/] {len(state)} notes from {len(arts)} exports into {safe(target)}"
        ),
    )
