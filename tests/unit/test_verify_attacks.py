"""``exportctl verify`` and ``restore --chain`` against the attacks a review found:
files tampered with after signing (markdown_zip members unlisted, duplicated, renamed or
named in another encoding; json/ndjson records swapped, repeated, forged before the genuine
one), a zip bomb, malformed files (each a clear message and the documented exit code, never
a traceback), and a hostile API serving a restore a signed archive that names paths outside
the target folder, or keys other than the ones pinned on first use.

The files are rendered by the service's own renderers and signed with a real Ed25519 key;
the hostile API is a real HTTP server on loopback; ``exportctl`` runs as a subprocess where
its memory or its files are measured.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from exportcore import manifests
from exportcore.domain import ExportFormat
from exportcore.manifests import Signer
from exportcore.render import ExportHeader, NoteRecord, make_renderer
from exportcore.render.base import _dumps
from exportctl.main import app
from tests.unit.helpers import Sink

EXPORTCTL = str(Path(sys.executable).parent / "exportctl")
EXPORT_ID = "7d4f3b0e-0000-4000-8000-000000000001"
NOTES = [
    NoteRecord(1, "Groceries", "milk\neggs", True, datetime(2024, 1, 2, tzinfo=UTC), version=2),
    NoteRecord(2, "Plans", "# plans\n\nsoon", False, datetime(2024, 1, 3, tzinfo=UTC)),
    NoteRecord(3, "Ünïcødé ✓", "— done", False, datetime(2023, 12, 31, tzinfo=UTC)),
]
PRIVATE, PUBLIC = manifests.new_private_key_text()
SIGNER = Signer.from_texts(PRIVATE)
assert SIGNER is not None


def render(fmt: str, signer: Signer | None = SIGNER, notes: list[NoteRecord] = NOTES) -> bytes:
    """An export of ``notes`` in ``fmt``, signed by ``signer``."""
    out = Sink()
    renderer = make_renderer(ExportFormat(fmt), out, signer)
    renderer.begin(
        ExportHeader(EXPORT_ID, "acme", datetime(2024, 5, 6, tzinfo=UTC), fmt, len(notes))
    )
    renderer.add(notes)
    renderer.end()
    return bytes(out.data)


def verify(tmp_path: Path, data: bytes, name: str = "file") -> tuple[int, str]:
    """``exportctl verify FILE --public-key`` (the signer's) on ``data``: (exit, output)."""
    path = tmp_path / name
    path.write_bytes(data)
    done = CliRunner().invoke(app, ["verify", str(path), "--public-key", PUBLIC])
    assert done.exception is None or isinstance(done.exception, SystemExit), done.exception
    return done.exit_code, " ".join(done.output.split())


def members(data: bytes) -> list[tuple[zipfile.ZipInfo, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return [(i, zf.read(i)) for i in zf.infolist()]


def rezip(parts: list[tuple[str | zipfile.ZipInfo, bytes]]) -> bytes:
    """An archive of ``parts`` in order (duplicate names allowed)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in parts:
            with pytest.warns(UserWarning) if _seen(zf, name) else _nothing():
                zf.writestr(name, data)
    return buf.getvalue()


def _seen(zf: zipfile.ZipFile, name: str | zipfile.ZipInfo) -> bool:
    return (name.filename if isinstance(name, zipfile.ZipInfo) else name) in zf.NameToInfo


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: object) -> None:
        return None


def forge(
    data: bytes,
    files: list[dict[str, Any]],
    notes: dict[str, bytes],
    signer: Signer = SIGNER,  # type: ignore[assignment]
    version: int = 2,
) -> bytes:
    """A markdown_zip re-made from ``data`` with another file list and note members, its
    header's ``files_sha256`` recomputed and signed again by ``signer``: what a hostile
    server holding a signing key can serve."""
    parts = dict((i.filename, b) for i, b in members(data))
    signed = json.loads(parts["signed-manifest.json"])
    header = signed["manifest"]
    header["key_id"] = signer.key_id
    if version == 1:
        header["manifest_version"] = 1
        header.pop("files_sha256", None)
        files = [{k: v for k, v in f.items() if k != "size"} for f in files]
    else:
        header["files_sha256"] = manifests.files_sha256(
            (f["id"], f["path"], f["size"]) for f in files
        )
    signed["signature"] = signer.sign(header)
    listing = json.loads(parts["manifest.json"])
    listing["files"] = files
    return rezip(
        [
            *notes.items(),
            ("manifest.json", json.dumps(listing).encode()),
            ("signed-manifest.json", json.dumps(signed).encode()),
        ]
    )


def note_parts(data: bytes) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
    """(manifest.json's file list, {path: bytes}) of a markdown_zip."""
    parts = dict((i.filename, b) for i, b in members(data))
    files = json.loads(parts["manifest.json"])["files"]
    return files, {f["path"]: parts[f["path"]] for f in files}


# --- good files -----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["json", "ndjson", "markdown_zip"])
def test_a_good_file_verifies(tmp_path: Path, fmt: str) -> None:
    code, out = verify(tmp_path, render(fmt))
    assert code == 0, out
    assert f"verified export {EXPORT_ID} (full, 3 notes, 0 tombstones" in out


def test_the_signature_covers_a_markdown_zip_file_list() -> None:
    """The header names ``files_sha256`` of the lines ``<id> <path> <size>``, and
    manifest.json gives every member's size (manifest version 2)."""
    data = render("markdown_zip")
    files, notes = note_parts(data)
    assert [f["size"] for f in files] == [len(notes[f["path"]]) for f in files]
    header = json.loads(dict((i.filename, b) for i, b in members(data))["signed-manifest.json"])
    assert header["manifest"]["manifest_version"] == 2
    lines = "".join(f"{f['id']} {f['path']} {f['size']}\n" for f in files).encode()
    assert header["manifest"]["files_sha256"] == hashlib.sha256(lines).hexdigest()
    assert render("ndjson").rsplit(b"\n", 2)[1].count(b'"files_sha256":null') == 1


def test_a_version_1_archive_still_verifies(tmp_path: Path) -> None:
    """An archive of an older release (manifest version 1: no files_sha256, no sizes)
    verifies; its file list is not covered, so only the renderer's names are accepted."""
    data = render("markdown_zip")
    files, notes = note_parts(data)
    code, out = verify(tmp_path, forge(data, files, notes, version=1))
    assert code == 0, out
    renamed = [dict(files[0], path="notes/../groceries-1.md"), *files[1:]]
    moved = {renamed[0]["path"]: notes[files[0]["path"]], **dict(list(notes.items())[1:])}
    code, out = verify(tmp_path, forge(data, renamed, moved, version=1))
    assert code == 1
    assert "manifest.json names note 1 'notes/../groceries-1.md'" in out


# --- markdown_zip tampering -----------------------------------------------------------------


def test_markdown_zip_members_the_manifest_does_not_list_are_named(tmp_path: Path) -> None:
    data = render("markdown_zip")
    parts = [(i.filename, b) for i, b in members(data)]
    extra = rezip([*parts, ("notes/zz-evil-9.md", b"evil"), ("../outside.sh", b"rm -rf")])
    code, out = verify(tmp_path, extra)
    assert code == 1
    assert "the member 'notes/zz-evil-9.md' is not listed in manifest.json" in out
    assert "the member '../outside.sh' is not listed in manifest.json" in out


def test_a_duplicate_member_whose_first_copy_is_forged_is_named(tmp_path: Path) -> None:
    data = render("markdown_zip")
    parts = [(i.filename, b) for i, b in members(data)]
    name, genuine = parts[0]
    code, out = verify(tmp_path, rezip([(name, genuine.replace(b"milk", b"poison")), *parts]))
    assert code == 1
    assert f"the archive holds 2 members named '{name}'" in out


def test_a_member_name_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    data = render("markdown_zip")
    parts = [(i.filename, b) for i, b in members(data)]
    raw = rezip([*parts, ("notes/zz-evXl-9.md", b"evil")])
    raw = raw.replace(b"notes/zz-evXl-9.md", b"notes/zz-ev\xe9l-9.md")  # CP437, flag unset
    code, out = verify(tmp_path, raw)
    assert code == 1
    assert "is not UTF-8 (bit 11 unset, not ASCII)" in out


def test_a_renamed_or_resized_member_breaks_the_signature(tmp_path: Path) -> None:
    """manifest.json changed consistently with the archive (a renamed member; a member
    with other bytes and its size) no longer hashes to the signed files_sha256."""
    data = render("markdown_zip")
    files, notes = note_parts(data)
    parts = dict((i.filename, b) for i, b in members(data))
    first = files[0]["path"]
    renamed_files = [dict(files[0], path="notes/other-1.md"), *files[1:]]
    listing = json.loads(parts["manifest.json"])
    listing["files"] = renamed_files
    renamed = rezip(
        [
            ("notes/other-1.md", notes[first]),
            *((p, b) for p, b in notes.items() if p != first),
            ("manifest.json", json.dumps(listing).encode()),
            ("signed-manifest.json", parts["signed-manifest.json"]),
        ]
    )
    code, out = verify(tmp_path, renamed)
    assert code == 1
    assert "does not hash to the manifest's files_sha256" in out


# --- json / ndjson tampering ----------------------------------------------------------------


def tamper(fmt: str, change: Any) -> bytes:
    """``fmt``'s file with its list of note records (bytes) changed by ``change``."""
    data = render(fmt)
    if fmt == "ndjson":
        *records, trailer, end = data.split(b"\n")
        return b"\n".join([*change(records), trailer, end])
    doc = json.loads(data)
    doc["notes"] = [json.loads(r) for r in change([_dumps(n) for n in doc["notes"]])]
    return _dumps(doc) + b"\n"


def forged(records: list[bytes]) -> list[bytes]:
    fake = json.loads(records[1])
    fake["content"] = "forged"
    return [records[0], _dumps(fake), *records[1:]]


@pytest.mark.parametrize("fmt", ["json", "ndjson"])
@pytest.mark.parametrize(
    ("attack", "change", "named"),
    [
        (
            "swapped",
            lambda r: [r[1], r[0], r[2]],
            ["the file's items are not in the manifest's order: 2, 1 stand where"],
        ),
        ("repeated", lambda r: [r[0], r[1], r[1], r[2]], ["note 2 appears 2 times in the file"]),
        (
            "forged before",
            forged,
            [
                "note 2 appears 2 times in the file",
                "note 2 (copy 1 of 2): its bytes do not match its SHA-256",
            ],
        ),
        ("missing", lambda r: [r[0], r[2]], ["note 2 is in the manifest but missing"]),
    ],
)
def test_records_swapped_repeated_or_forged_are_named(
    tmp_path: Path, fmt: str, attack: str, change: Any, named: list[str]
) -> None:
    code, out = verify(tmp_path, tamper(fmt, change))
    assert code == 1, attack
    for text in named:
        assert text in out, (attack, out)


# --- the zip bomb ---------------------------------------------------------------------------


def peak_rss_mib(*args: str) -> tuple[int, str, float]:
    """Run ``exportctl ARGS`` from a fresh interpreter and measure its peak RSS
    (``getrusage(RUSAGE_CHILDREN)`` of that interpreter: this process's other children do
    not count): (exit code, stderr, MiB)."""
    probe = (
        "import resource, subprocess, sys, json\n"
        "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
        "print(json.dumps([done.returncode, done.stderr, peak / 1024]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, EXPORTCTL, *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    code, err, mib = json.loads(done.stdout)
    return int(code), str(err), float(mib)


def bomb(path: Path, data: bytes, mib: int, version: int) -> None:
    """``data`` with the first note's member replaced by ``mib`` MiB of zeros (a few
    hundred KiB compressed), its file list otherwise as signed."""
    files, notes = note_parts(data)
    archive = forge(data, files, notes, version=version)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as out:
        for info, body in members(archive):
            if info.filename == files[0]["path"]:
                with out.open(info.filename, "w", force_zip64=True) as dst:
                    head = notes[info.filename]
                    dst.write(head)
                    zeros = bytes(1 << 20)
                    for _ in range(mib):
                        dst.write(zeros)
            else:
                out.writestr(info.filename, body)
    assert path.stat().st_size < 4 << 20


@pytest.mark.parametrize("version", [2, 1])
def test_a_zip_bomb_is_refused_with_bounded_memory(tmp_path: Path, version: int) -> None:
    """A markdown_zip whose note expands to 768 MiB (version 2: manifest.json declares
    the note's real size; version 1: no size declared, the member is hashed while it is
    decompressed) fails to verify naming the member, and verify's peak RSS stays under
    150 MiB (it held the whole member before: more than 768 MiB)."""
    path = tmp_path / "bomb.zip"
    bomb(path, render("markdown_zip"), 768, version)
    code, err, mib = peak_rss_mib("verify", str(path), "--public-key", PUBLIC)
    assert code == 1, err
    named = "notes/groceries-1.md: the archive declares" if version == 2 else "note 1: its bytes"
    assert named in err and "Traceback" not in err
    assert mib < 150, f"verify peaked at {mib:.0f} MiB"


# --- malformed files ------------------------------------------------------------------------


def ndjson_trailer(change: Any) -> bytes:
    *records, trailer, end = render("ndjson").split(b"\n")
    doc = json.loads(trailer)
    change(doc)
    return b"\n".join([*records, json.dumps(doc).encode(), end])


def zip_member(name: str, body: bytes) -> bytes:
    parts = [(i.filename, b) for i, b in members(render("markdown_zip"))]
    return rezip([(n, body if n == name else b) for n, b in parts])


def set_key(key: str, value: Any) -> Any:
    return lambda doc: doc.__setitem__(key, value)


MALFORMED: dict[str, Any] = {
    "deep nesting": lambda: render("ndjson").rsplit(b"\n", 2)[0] + b"\n" + b"[" * 200_000,
    "a string note id": lambda: render("ndjson").replace(b'{"id":1,', b'{"id":"1",', 1),
    "entries that are not lists": lambda: ndjson_trailer(set_key("entries", [1, 2, 3])),
    "entries not a list": lambda: ndjson_trailer(set_key("entries", {"a": 1})),
    "a manifest that is a list": lambda: ndjson_trailer(set_key("manifest", [1])),
    "a signature that is a string": lambda: ndjson_trailer(set_key("signature", "x")),
    "files not a list": lambda: zip_member("manifest.json", b'{"export":{},"files":7}'),
    "manifest.json a list": lambda: zip_member("manifest.json", b"[]"),
    "a truncated ndjson file": lambda: render("ndjson")[:-40],
    "a truncated json file": lambda: render("json")[:-40],
    "a truncated zip": lambda: render("markdown_zip")[:-100],
    "an empty file": lambda: b"",
    "not an export": lambda: b"hello\n",
    "a json record that is a string": lambda: render("json").replace(
        b'"notes":[{', b'"notes":["x",{', 1
    ),
}


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_a_malformed_file_is_a_clear_message_and_exit_1(tmp_path: Path, kind: str) -> None:
    """Each exits 1 (docs/cli.md: not verified) with a message naming the file, never a
    traceback."""
    path = tmp_path / "bad"
    path.write_bytes(MALFORMED[kind]())
    done = CliRunner().invoke(app, ["verify", str(path), "--public-key", PUBLIC])
    out = " ".join(done.output.split())
    assert done.exit_code == 1, (kind, out, done.exception)
    assert isinstance(done.exception, SystemExit), (kind, done.exception)
    assert f"{path} does not verify" in out or "✗" in out, (kind, out)


def test_a_file_that_cannot_be_read_exits_2(tmp_path: Path) -> None:
    done = CliRunner().invoke(app, ["verify", str(tmp_path / "nope"), "--public-key", PUBLIC])
    assert done.exit_code == 2 and "cannot read" in done.output


# --- restore: paths and trust ---------------------------------------------------------------


def test_safe_relative_refuses_every_path_that_could_leave_the_folder() -> None:
    from exportctl.restore import UnsafePath, safe_relative

    for bad in ["", "/etc/x", "../x", "notes/../../x", "a//b", "./a", "a\\b", "C:x", "a\0b"]:
        with pytest.raises(UnsafePath):
            safe_relative(bad)
    assert safe_relative("notes/a-1.md") == ["notes", "a-1.md"]


def test_open_new_file_writes_through_no_symlink_and_over_no_file(tmp_path: Path) -> None:
    from exportctl.restore import UnsafePath, open_new_file

    target, outside = tmp_path / "target", tmp_path / "outside"
    target.mkdir()
    outside.mkdir()
    (target / "notes").symlink_to(outside)
    with pytest.raises(UnsafePath, match="not a plain folder"):
        open_new_file(target, "notes/a-1.md")
    (target / "link.md").symlink_to(outside / "x.md")
    with pytest.raises((OSError, UnsafePath)):
        open_new_file(target, "link.md")
    os.close(open_new_file(target, "plain.md"))
    with pytest.raises(FileExistsError):
        open_new_file(target, "plain.md")
    assert list(outside.iterdir()) == []


class HostileApi:
    """A real HTTP server on loopback answering a restore like the API: one succeeded
    export ``job`` (the renderer's ``EXPORT_ID`` unless changed) whose file is ``archive``,
    and ``keys`` at ``/v1/manifest-keys``."""

    def __init__(self, archive: bytes, keys: list[Any]) -> None:
        self.archive, self.keys, self.job = archive, keys, EXPORT_ID
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/v1/manifest-keys":
                    body = json.dumps({"keys": [manifests.jwk(k) for k in api.keys]}).encode()
                elif self.path == f"/v1/exports/{api.job}":
                    job = {"id": api.job, "status": "succeeded", "base": None}
                    body = json.dumps({**job, "format": "markdown_zip"}).encode()
                elif self.path == f"/v1/exports/{api.job}/download":
                    body = api.archive
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def restore(self, home: Path, target: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        """``exportctl restore --chain job TARGET`` as a user whose config is in ``home``."""
        env = {**os.environ, "XDG_CONFIG_HOME": str(home), "COLUMNS": "250"}
        env.update(API_URL=self.url, API_KEY="k")
        return subprocess.run(
            [EXPORTCTL, "restore", "--chain", self.job, str(target), *extra],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )


@pytest.fixture
def hostile() -> Iterator[HostileApi]:
    api = HostileApi(b"", [])
    yield api
    api.server.shutdown()
    api.server.server_close()


def tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("path", ["../../x.md", "/ABS/x.md", "notes/../../x.md"])
@pytest.mark.parametrize("version", [2, 1])
def test_a_hostile_api_cannot_make_restore_write_outside_its_folder(
    tmp_path: Path, hostile: HostileApi, path: str, version: int
) -> None:
    """The server signs, with its own key (pinned on this first use), an archive whose
    file list names a path outside the target; the restore refuses it and writes
    nothing, neither outside nor in the target."""
    attacker = Signer.from_texts(manifests.new_private_key_text()[0])
    assert attacker is not None
    work = tmp_path / "work"
    work.mkdir()
    path = path.replace("/ABS", str(tmp_path))
    data = render("markdown_zip", attacker)
    files, notes = note_parts(data)
    evil = [dict(files[0], path=path), *files[1:]]
    moved = {path: notes[files[0]["path"]], **dict(list(notes.items())[1:])}
    hostile.archive = forge(data, evil, moved, attacker, version)
    hostile.keys = [attacker.private.public_key()]
    before = tree(tmp_path)
    done = hostile.restore(tmp_path / "config", work / "a" / "restored")
    assert done.returncode == 1, done.stderr
    assert "does not verify" in done.stderr and "a note file is notes/<slug>-1.md" in done.stderr
    assert "Traceback" not in done.stderr
    after = [p for p in tree(tmp_path) if not p.startswith("config")]
    assert after == [p for p in before if not p.startswith("config")]


def test_restore_pins_the_keys_on_first_use_and_refuses_other_keys(
    tmp_path: Path, hostile: HostileApi
) -> None:
    """First use pins the served key (said on stderr) and restores a good markdown_zip
    chain; when the server then serves another key, the restore refuses naming the pin
    file and what to do; ``--public-key`` of the right key still restores."""
    config = tmp_path / "config"
    data = render("markdown_zip")
    hostile.archive = data
    hostile.keys = [SIGNER.private.public_key()]
    first = hostile.restore(config, tmp_path / "one")
    assert first.returncode == 0, first.stderr
    assert f"pinned the manifest keys of {hostile.url} for the first time: {SIGNER.key_id}" in (
        " ".join(first.stderr.split())
    )
    _, notes = note_parts(data)
    for name, body in notes.items():
        assert (tmp_path / "one" / name).read_bytes() == body
    assert json.loads((config / "exportctl" / "known-manifest-keys.json").read_text())[hostile.url][
        0
    ]["kid"] == (SIGNER.key_id)

    other = Signer.from_texts(manifests.new_private_key_text()[0])
    assert other is not None
    hostile.archive = render("markdown_zip", other)
    hostile.keys = [other.private.public_key()]
    refused = hostile.restore(config, tmp_path / "two")
    said = " ".join(refused.stderr.split())
    assert refused.returncode == 1, refused.stderr
    assert f"now serves manifest key {other.key_id}, which is not pinned" in said
    assert "known-manifest-keys.json" in said and "--public-key" in said
    assert not (tmp_path / "two").exists()
    again = hostile.restore(config, tmp_path / "two", "--public-key", PUBLIC)
    assert again.returncode == 1 and "not among the trusted keys" in again.stderr
    hostile.archive = data
    good = hostile.restore(config, tmp_path / "three", "--public-key", PUBLIC)
    assert good.returncode == 0, good.stderr


def test_a_manifest_json_bomb_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """manifest.json padded with 512 MiB of JSON whitespace (valid JSON, about 500 KiB
    compressed) is refused from its declared size against its compressed size, with
    bounded memory."""
    path = tmp_path / "bomb.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as out:
        for info, body in members(render("markdown_zip")):
            if info.filename != "manifest.json":
                out.writestr(info.filename, body)
                continue
            with out.open("manifest.json", "w", force_zip64=True) as dst:
                dst.write(body)
                spaces = b" " * (1 << 20)
                for _ in range(512):
                    dst.write(spaces)
    code, err, mib = peak_rss_mib("verify", str(path), "--public-key", PUBLIC)
    assert code == 1, err
    assert "manifest.json declares" in " ".join(err.split()) and "Traceback" not in err
    assert mib < 150, f"verify peaked at {mib:.0f} MiB"


def test_the_verdict_counts_in_words_and_names_an_unsigned_manifest(tmp_path: Path) -> None:
    """The verdict in words: "1 note", not "1 notes"; an unsigned manifest (accepted with
    --allow-unsigned) says so instead of "key None"."""
    path = tmp_path / "one.ndjson"
    path.write_bytes(render("ndjson", None, NOTES[:1]))
    done = CliRunner().invoke(
        app, ["verify", str(path), "--allow-unsigned", "--public-key", PUBLIC]
    )
    said = " ".join(done.output.split())
    assert done.exit_code == 0, said
    assert "1 note, 0 tombstones, unsigned: hashes only" in said
    assert "None" not in said and "1 notes" not in said
    code, said = verify(tmp_path, render("ndjson"))
    assert code == 0 and f"3 notes, 0 tombstones, key {SIGNER.key_id}" in said, said
