"""An independent review's attacks on ``exportctl verify`` and ``restore --chain`` that broke
the verify and restore of signed file lists (the attacks that held are in the review's report): a JSON
object naming a member twice, a record that is JSON but not UTF-8, a restore served another
export than the one asked for, a note path too long for the file system, a zip member whose
unsigned declared size makes verify decompress gigabytes before the signature is checked,
keys pinned by a restore whose chain then failed, and a folder swapped for a symbolic link
while the restore writes.

Files are rendered by the service's renderers and signed with real Ed25519 keys; the hostile
API is a real HTTP server on loopback (``HostileApi`` of test_verify_attacks).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import stat
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from exportctl.main import app
from tests.unit.test_verify_attacks import (
    EXPORT_ID,
    PUBLIC,
    SIGNER,
    HostileApi,
    forge,
    members,
    note_parts,
    peak_rss_mib,
    render,
    tree,
    verify,
)

assert SIGNER is not None
KEY = SIGNER.private.public_key()

# --- a member named twice in one JSON object -------------------------------------------------


def _json_notes_twice() -> bytes:
    """The json format with a forged ``"notes"`` member before the genuine one (Python's
    parser keeps the last copy, so the forged one was invisible to verify)."""
    data = render("json").decode()
    doc = json.loads(data)
    forged = json.loads(json.dumps(doc["notes"]))
    forged[0]["content"] = "POISON"
    at = data.index('"notes":')
    return (data[:at] + '"notes":' + json.dumps(forged) + "," + data[at:]).encode()


def _record_content_twice() -> bytes:
    data = render("json")
    return data.replace(b'"content":', b'"content":"POISON","content":', 1)


def _ndjson_entries_twice() -> bytes:
    *lines, trailer, end = render("ndjson").split(b"\n")
    return b"\n".join([*lines, trailer.replace(b'"entries":', b'"entries":[],"entries":'), end])


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (_json_notes_twice, "notes"),
        (_record_content_twice, "content"),
        (_ndjson_entries_twice, "entries"),
    ],
)
def test_a_json_object_naming_a_member_twice_does_not_verify(
    tmp_path: Path, make: object, name: str
) -> None:
    code, out = verify(tmp_path, make())  # type: ignore[operator]
    assert code == 1, out
    assert f"names '{name}' twice in one object" in out


def test_a_record_with_a_lone_surrogate_is_a_message_not_a_traceback(tmp_path: Path) -> None:
    """``"\\ud800"`` is valid JSON but no UTF-8: re-encoding the json record raised
    UnicodeEncodeError (a traceback) before."""
    code, out = verify(tmp_path, render("json").replace(b"Groceries", b"\\ud800"))
    assert code == 1, out
    assert "record 1 of 'notes' holds a string that is not Unicode text" in out


# --- restore ---------------------------------------------------------------------------------


@pytest.fixture
def hostile() -> Iterator[HostileApi]:
    api = HostileApi(b"", [])
    yield api
    api.server.shutdown()
    api.server.server_close()


def test_restore_refuses_the_file_of_another_export(tmp_path: Path, hostile: HostileApi) -> None:
    """An intercepting API without the key answers a restore of a newer export with an
    older genuine, signed file (a rollback): it verifies, and was restored (exit 0)."""
    hostile.job = "0e9a1c52-0000-4000-8000-00000000abcd"
    hostile.archive, hostile.keys = render("json"), [KEY]
    done = hostile.restore(tmp_path / "config", tmp_path / "out")
    assert done.returncode == 1, done.stderr
    said = " ".join(done.stderr.split())
    assert f"for export {hostile.job}, the file of export {EXPORT_ID}" in said
    assert "Traceback" not in done.stderr and not (tmp_path / "out").exists()


def test_restore_of_a_chain_that_fails_pins_no_key(tmp_path: Path, hostile: HostileApi) -> None:
    """A first-use restore whose file does not verify leaves no key pinned (the keys were
    pinned before the chain was even downloaded)."""
    hostile.archive, hostile.keys = render("markdown_zip")[:-30], [KEY]
    done = hostile.restore(tmp_path / "config", tmp_path / "out")
    assert done.returncode == 1, done.stderr
    assert "does not verify" in done.stderr and "pinned" not in done.stderr
    assert not (tmp_path / "config" / "exportctl" / "known-manifest-keys.json").exists()
    hostile.archive = render("markdown_zip")
    done = hostile.restore(tmp_path / "config", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    pins = tmp_path / "config" / "exportctl" / "known-manifest-keys.json"
    assert stat.S_IMODE(pins.stat().st_mode) == 0o600
    assert [p.name for p in pins.parent.iterdir()] == [pins.name]


@pytest.mark.parametrize("version", [1, 2])
def test_a_note_name_too_long_is_refused_before_writing(
    tmp_path: Path, hostile: HostileApi, version: int
) -> None:
    """A 300-byte slug (version 1: anyone can rename a genuine archive's members) made the
    restore crash with an OSError traceback halfway through writing."""
    data = render("markdown_zip")
    files, notes = note_parts(data)
    path = "notes/" + "a" * 300 + "-1.md"
    evil = [dict(files[0], path=path), *files[1:]]
    moved = {path: notes[files[0]["path"]], **dict(list(notes.items())[1:])}
    hostile.archive = forge(data, evil, moved, version=version)
    hostile.keys = [KEY]
    done = hostile.restore(tmp_path / "config", tmp_path / "out")
    assert done.returncode == 1, done.stderr
    assert "a name over 255 bytes" in done.stderr and "Traceback" not in done.stderr
    assert tree(tmp_path / "out") == []


def test_a_folder_swapped_for_a_link_while_writing_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``notes`` is a plain folder when checked, then (a local attacker racing the restore)
    renamed away and replaced by a link to a folder outside just before the file is
    created: the file must not land outside (it followed the link before)."""
    from exportctl import restore

    target, outside = tmp_path / "target", tmp_path / "outside"
    target.mkdir()
    outside.mkdir()
    real_open = os.open

    def racing_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & os.O_CREAT and not (target / "notes").is_symlink():
            (target / "notes").rename(target / "moved")
            (target / "notes").symlink_to(outside)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", racing_open)
    with contextlib.suppress(OSError, restore.UnsafePath):
        os.close(restore.open_new_file(target, "notes/a-1.md"))
    assert list(outside.iterdir()) == []


# --- a member's unsigned size ------------------------------------------------------------------


def _resized(data: bytes, mib: int, method: int = zipfile.ZIP_DEFLATED) -> bytes:
    """``data`` (a markdown_zip) with the first note replaced by ``mib`` MiB of zeros and
    manifest.json (not signed) declaring that size: no key needed."""
    files, _ = note_parts(data)
    parts = [(i.filename, b) for i, b in members(data)]
    listing = json.loads(dict(parts)["manifest.json"])
    listing["files"][0]["size"] = mib << 20
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as out:
        for name, body in parts:
            if name == files[0]["path"]:
                with out.open(zipfile.ZipInfo(name), "w", force_zip64=True) as dst:
                    for _ in range(mib):
                        dst.write(bytes(1 << 20))
            elif name == "manifest.json":
                out.writestr(name, json.dumps(listing))
            else:
                out.writestr(zipfile.ZipInfo(name), body, compress_type=method)
    return buf.getvalue()


def test_no_member_is_decompressed_before_the_file_list_checks_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sizes that bound each member come from manifest.json, which nobody signs until
    ``files_sha256`` is compared: anyone could declare 2 GiB for a 2 MiB member of a
    genuine archive and verify decompressed all of it (16 s of CPU per 2 MiB of file,
    every listed member) before saying the file list was wrong. Nothing is decompressed
    until the signature and the file list check out."""
    from exportctl import verify as module

    hashed: list[str] = []
    real = module._hash_member

    def counting(zf: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int) -> tuple[str, bytes]:
        hashed.append(info.filename)
        return real(zf, info, limit)

    monkeypatch.setattr(module, "_hash_member", counting)
    code, out = verify(tmp_path, _resized(render("markdown_zip"), 64))
    assert code == 1, out
    assert "does not hash to the manifest's files_sha256" in out
    assert "the note files were not read" in out
    assert hashed == []
    code, out = verify(tmp_path, render("markdown_zip"))
    assert code == 0 and len(hashed) == 3, out


def test_a_member_compressed_otherwise_than_deflate_is_refused(tmp_path: Path) -> None:
    """bzip2 expands a million to one (deflate at most 1032): a version-1 archive (member
    sizes not signed) with a bzip2 member is refused without decompressing it."""
    data = render("markdown_zip")
    files, notes = note_parts(data)
    v1 = forge(data, files, notes, version=1)
    parts = [(i.filename, b) for i, b in members(v1)]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as out:
        for name, body in parts:
            method = zipfile.ZIP_BZIP2 if name == files[0]["path"] else zipfile.ZIP_DEFLATED
            out.writestr(name, body, compress_type=method)
    code, out = verify(tmp_path, buf.getvalue())
    assert code == 1, out
    assert f"{files[0]['path']}: compression method 12 is not one the service writes" in out


# --- many problems, many records ---------------------------------------------------------------


def test_verify_prints_at_most_a_hundred_problems(tmp_path: Path) -> None:
    """An archive of 3000 unlisted empty members (300 000 took 90 s to print, one rich
    line each); ``--output json`` still lists every one."""
    data = render("markdown_zip")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as out:
        for info, body in members(data):
            out.writestr(info.filename, body)
        for k in range(3000):
            out.writestr(f"x{k}", b"")
    code, out = verify(tmp_path, buf.getvalue())
    assert code == 1
    assert out.count("✗") == 101, out[-300:]
    assert "and 2901 more problems (--output json lists them all)" in out
    path = tmp_path / "many.zip"
    path.write_bytes(buf.getvalue())
    done = CliRunner().invoke(
        app, ["verify", str(path), "--public-key", PUBLIC, "--output", "json"]
    )
    assert len(json.loads(done.stdout)["problems"]) == 3001  # and "the note files were not read"


def test_verify_holds_no_parsed_record_per_ndjson_line(tmp_path: Path) -> None:
    """An ndjson file of 400 000 copies of a record (about 48 MiB): verify kept every
    parsed record (about 10 times the file: 2 GiB for 200 MiB); it keeps only the ids and
    hashes now."""
    records, *rest = render("ndjson").split(b"\n", 1)
    path = tmp_path / "many.ndjson"
    with open(path, "wb") as fh:
        for _ in range(400_000):
            fh.write(records + b"\n")
        fh.write(rest[0])
    code, err, mib = peak_rss_mib("verify", str(path), "--public-key", PUBLIC)
    assert code == 1 and "note 1 appears 400000 times in the file" in " ".join(err.split())
    assert mib < 250, f"verify peaked at {mib:.0f} MiB"


def test_something_appended_after_the_ndjson_manifest_is_named(tmp_path: Path) -> None:
    """The manifest line followed by more: named as such (it said "the id of line 4 is
    not an integer", reading the manifest as a note)."""
    code, out = verify(tmp_path, render("ndjson") + b'{"id":9}\n')
    assert code == 1, out
    assert "line 4 is the manifest, yet more follows it" in out


def test_an_unsigned_chain_restored_on_first_use_pins_no_key(
    tmp_path: Path, hostile: HostileApi
) -> None:
    """``--allow-unsigned`` on first use: the served keys verified nothing, so they are
    not pinned (they were)."""
    hostile.archive, hostile.keys = render("markdown_zip", None), [KEY]
    done = hostile.restore(tmp_path / "config", tmp_path / "out", "--allow-unsigned")
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "config" / "exportctl" / "known-manifest-keys.json").exists()
