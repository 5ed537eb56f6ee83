"""Artifact keys, ARTIFACT_URL parsing, store selection and the filesystem artifact store
(atomic visibility, hashes, listing, cleanup). The S3 backend against a real S3 server is
in tests/integration/test_artifact_stores.py."""

from __future__ import annotations

import hashlib
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import UUID, uuid4

import pytest

from exportcore.artifacts import (
    FileArtifactStore,
    artifact_key,
    key_prefix,
    missing_counts,
    open_store,
    parse_artifact_url,
    record_missing,
    validate_key,
)
from exportcore.domain import ArtifactMissing
from exportcore.settings import Settings

JOB = UUID("0b6f1c2e-3d4a-4b5c-8d6e-7f8091a2b3c4")
LEASE = UUID("c4b3a291-807f-4e6d-9c5b-4a3d2e1c6f0b")
KEY = f"acme/{JOB}/{LEASE}.json"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No settings variable from the outer environment, and no ``.env`` in the cwd."""
    for name in Settings.model_fields:
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.chdir(tmp_path)


def new_key(ext: str = "json") -> str:
    return artifact_key("acme", uuid4(), uuid4(), ext)


# --- keys --------------------------------------------------------------------------------


def test_artifact_key_shape() -> None:
    assert artifact_key("acme", JOB, LEASE, "json") == KEY
    assert artifact_key("t-1", JOB, LEASE, "zip") == f"t-1/{JOB}/{LEASE}.zip"
    assert validate_key(KEY) == KEY


def test_artifact_key_normalises_uuid_strings() -> None:
    key = artifact_key("acme", str(JOB).upper(), str(LEASE), "json")  # type: ignore[arg-type]
    assert key == KEY


@pytest.mark.parametrize(
    "tenant", ["", "Acme", "-acme", "acme/other", "../acme", "ac me", "acme.", "a" * 64, "ä"]
)
def test_artifact_key_rejects_bad_tenants(tenant: str) -> None:
    with pytest.raises(ValueError, match="tenant"):
        artifact_key(tenant, JOB, LEASE, "json")


@pytest.mark.parametrize("ext", ["", "JSON", ".json", "tar.gz", "j/son", "toolongxx", "../x"])
def test_artifact_key_rejects_bad_extensions(ext: str) -> None:
    with pytest.raises(ValueError, match="extension"):
        artifact_key("acme", JOB, LEASE, ext)


@pytest.mark.parametrize("bad", ["not-a-uuid", "../../../etc/passwd", ""])
def test_artifact_key_rejects_non_uuids(bad: str) -> None:
    with pytest.raises(ValueError):
        artifact_key("acme", bad, LEASE, "json")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        artifact_key("acme", JOB, bad, "json")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "key",
    [
        "",
        "../x",
        f"../{JOB}/{LEASE}.json",
        f"acme/../{LEASE}.json",
        f"acme/{JOB}/../../../etc/passwd",
        f"/acme/{JOB}/{LEASE}.json",
        f"acme/{JOB}/{LEASE}.json/..",
        f"acme\\{JOB}\\{LEASE}.json",
        f"acme/{JOB}/{LEASE}",
        f"acme/{JOB}/{LEASE}.json.tmp",
        f"acme/{JOB}/{LEASE}/x.json",
        f"Acme/{JOB}/{LEASE}.json",
    ],
)
def test_validate_key_rejects_anything_else(key: str) -> None:
    with pytest.raises(ValueError, match="not an artifact key"):
        validate_key(key)


@pytest.mark.parametrize("where", ["key", "tenant", "ext"])
def test_trailing_newline_is_rejected(where: str) -> None:
    with pytest.raises(ValueError):
        if where == "key":
            validate_key(KEY + "\n")
        elif where == "tenant":
            artifact_key("acme\n", JOB, LEASE, "json")
        else:
            artifact_key("acme", JOB, LEASE, "json\n")


# --- FileArtifactStore ----------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> FileArtifactStore:
    return FileArtifactStore(tmp_path / "artifacts")


def files_under(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_key_is_invisible_until_commit(store: FileArtifactStore) -> None:
    chunks = [b"{", b'"a":1', b"}\n" * 1000]
    with store.open_writer(KEY) as out:
        for chunk in chunks:
            assert out.write(chunk) == len(chunk)
        assert out.tell() == sum(map(len, chunks))
        with pytest.raises(ArtifactMissing):
            store.open_reader(KEY)
        assert files_under(store.root) == [KEY + ".tmp"]
        stored = out.commit()
    data = b"".join(chunks)
    assert stored.ref == KEY
    assert stored.sha256 == hashlib.sha256(data).hexdigest()
    assert stored.size == len(data)
    fh, size = store.open_reader(KEY)
    with fh:
        assert fh.read() == data
    assert size == len(data)
    assert files_under(store.root) == [KEY]


def test_empty_artifact(store: FileArtifactStore) -> None:
    with store.open_writer(KEY) as out:
        stored = out.commit()
    assert (stored.size, stored.sha256) == (0, hashlib.sha256(b"").hexdigest())
    fh, size = store.open_reader(KEY)
    fh.close()
    assert size == 0


def test_leaving_the_block_without_commit_discards_the_temp_file(store: FileArtifactStore) -> None:
    with store.open_writer(KEY) as out:
        out.write(b"partial")
    assert files_under(store.root) == []
    with pytest.raises(ArtifactMissing):
        store.open_reader(KEY)


def test_an_error_in_the_block_discards_the_temp_file_and_propagates(
    store: FileArtifactStore,
) -> None:
    with pytest.raises(RuntimeError, match="render failed"), store.open_writer(KEY) as out:
        out.write(b"partial")
        raise RuntimeError("render failed")
    assert files_under(store.root) == []


def test_abort_after_commit_keeps_the_artifact(store: FileArtifactStore) -> None:
    with store.open_writer(KEY) as out:
        out.write(b"done")
        out.commit()
        out.abort()
    fh, _ = store.open_reader(KEY)
    with fh:
        assert fh.read() == b"done"


def test_a_second_writer_for_another_lease_does_not_touch_the_first(
    store: FileArtifactStore,
) -> None:
    other = f"acme/{JOB}/{uuid4()}.json"
    with store.open_writer(KEY) as first:
        first.write(b"first")
        first.commit()
    with store.open_writer(other) as second:
        second.write(b"second")
    fh, _ = store.open_reader(KEY)
    with fh:
        assert fh.read() == b"first"
    with pytest.raises(ArtifactMissing):
        store.open_reader(other)


def test_store_methods_validate_keys(store: FileArtifactStore) -> None:
    bad = f"acme/{JOB}/../../../escape.json"
    for call in (store.open_writer, store.open_reader, store.delete):
        with pytest.raises(ValueError):
            call(bad)
    assert not store.root.exists()


def test_delete_returns_whether_something_was_removed(store: FileArtifactStore) -> None:
    with store.open_writer(KEY) as out:
        out.write(b"x")
        out.commit()
    assert store.delete(KEY) is True
    assert store.delete(KEY) is False
    assert store.delete(new_key()) is False
    with pytest.raises(ArtifactMissing):
        store.open_reader(KEY)


def commit(store: FileArtifactStore, key: str, mtime: float | None = None) -> Path:
    with store.open_writer(key) as out:
        out.write(key.encode())
        out.commit()
    path = store.root / key
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def test_list_older_than_returns_only_old_artifacts(store: FileArtifactStore) -> None:
    now = datetime.now(UTC)
    old_time = (now - timedelta(days=10)).timestamp()
    old, also_old, fresh = new_key(), new_key("zip"), new_key()
    commit(store, old, old_time)
    commit(store, also_old, old_time - 3600)
    commit(store, fresh)
    (store.root / "acme" / "README").write_text("not an artifact")
    os.utime(store.root / "acme" / "README", (old_time, old_time))

    listed = dict(store.list_older_than(now - timedelta(days=1)))
    assert set(listed) == {old, also_old}
    assert listed[old] == datetime.fromtimestamp(old_time, tz=UTC)
    assert listed[old].tzinfo is UTC
    assert dict(store.list_older_than(now - timedelta(days=30))) == {}


def test_list_older_than_includes_stale_temporaries(store: FileArtifactStore) -> None:
    writer = store.open_writer(KEY)
    writer.write(b"abandoned by a dead worker")
    old = (datetime.now(UTC) - timedelta(hours=2)).timestamp()
    os.utime(store.root / (KEY + ".tmp"), (old, old))
    try:
        # listed under its key: delete(KEY) removes the half-written temporary too
        assert [ref for ref, _ in store.list_older_than(datetime.now(UTC))] == [KEY]
    finally:
        writer.abort()


def test_everything_listed_can_be_deleted(store: FileArtifactStore) -> None:
    writer = store.open_writer(KEY)
    writer.write(b"abandoned")
    try:
        for ref, _ in store.list_older_than(datetime.now(UTC) + timedelta(seconds=5)):
            assert store.delete(ref)
        assert files_under(store.root) == []
    finally:
        writer.abort()


def test_list_older_than_on_a_missing_root(tmp_path: Path) -> None:
    assert list(FileArtifactStore(tmp_path / "nowhere").list_older_than(datetime.now(UTC))) == []


def test_open_store_is_a_file_store_by_default(tmp_path: Path) -> None:
    store = open_store(Settings(artifact_dir=tmp_path))
    assert isinstance(store, FileArtifactStore)
    assert store.root == tmp_path.resolve()
    assert store.backend == "file"


def test_open_store_follows_a_file_url_over_the_folder(tmp_path: Path) -> None:
    store = open_store(
        Settings(artifact_dir=tmp_path / "ignored", artifact_url=f"file://{tmp_path}/there")
    )
    assert isinstance(store, FileArtifactStore)
    assert store.root == (tmp_path / "there").resolve()


def test_open_store_builds_an_s3_store_without_touching_the_network() -> None:
    from exportcore.artifacts import S3ArtifactStore

    store = open_store(
        Settings(
            artifact_url="s3://exports-bucket/prod/v1/",
            s3_endpoint_url="http://127.0.0.1:1",
            s3_region="eu-west-1",
            s3_access_key_id="AKIAEXAMPLE",
            s3_secret_access_key="very-secret",
            s3_addressing_style="path",
            s3_multipart_part_size=6 * 1024 * 1024,
        )
    )
    assert isinstance(store, S3ArtifactStore) and store.backend == "s3"
    cfg = store.config
    assert (cfg.bucket, cfg.prefix, cfg.region, cfg.addressing_style) == (
        "exports-bucket",
        "prod/v1",
        "eu-west-1",
        "path",
    )
    assert (cfg.endpoint_url, cfg.presign_endpoint_url) == ("http://127.0.0.1:1", None)
    assert cfg.part_size == 6 * 1024 * 1024 and cfg.secret_access_key == "very-secret"
    assert "very-secret" not in repr(cfg) and "very-secret" not in repr(store)
    assert store.object_key(KEY) == f"prod/v1/{KEY}"
    with pytest.raises(ValueError, match="not an artifact key"):
        store.object_key(f"acme/{JOB}/../x.json")


def test_s3_store_without_prefix_uses_bare_keys() -> None:
    from exportcore.artifacts import S3ArtifactStore, S3Config

    assert S3ArtifactStore(S3Config(bucket="b-1")).object_key(KEY) == KEY


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"bucket": "Bad_Bucket"}, "bucket"),
        ({"bucket": "ok-bucket", "prefix": "/lead"}, "not normalised"),
        ({"bucket": "ok-bucket", "part_size": 1024}, "part size"),
        ({"bucket": "ok-bucket", "multipart_threshold": -1}, "threshold"),
        ({"bucket": "ok-bucket", "access_key_id": "x"}, "both"),
    ],
)
def test_s3_config_validates(kwargs: dict[str, object], match: str) -> None:
    from exportcore.artifacts import S3Config

    with pytest.raises(ValueError, match=match):
        S3Config(**kwargs)  # type: ignore[arg-type]


# --- ARTIFACT_URL parsing -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("file:///var/lib/notes-exports/artifacts", ("file", "/var/lib/notes-exports/artifacts")),
        ("FILE:///srv/a", ("file", "/srv/a")),
        ("file://localhost/srv/a", ("file", "/srv/a")),
        ("file:relative/dir", ("file", "relative/dir")),
        ("file:///srv/with%20space", ("file", "/srv/with space")),
        ("s3://bucket-1", ("s3", "bucket-1", "")),
        ("s3://bucket-1/", ("s3", "bucket-1", "")),
        ("s3://my.bucket.example/exports", ("s3", "my.bucket.example", "exports")),
        ("s3://b12/a/b_c/d-e.f/", ("s3", "b12", "a/b_c/d-e.f")),
        ("  s3://b12/x  ", ("s3", "b12", "x")),
    ],
)
def test_parse_artifact_url(url: str, expected: tuple[str, ...]) -> None:
    loc = parse_artifact_url(url)
    if expected[0] == "file":
        assert (loc.scheme, str(loc.path)) == expected
    else:
        assert (loc.scheme, loc.bucket, loc.prefix) == expected


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("", "scheme"),
        ("/var/lib/x", "scheme"),
        ("http://bucket/x", "scheme"),
        ("gs://bucket/x", "scheme"),
        ("s3://", "bucket"),
        ("s3://ab", "bucket"),
        ("s3://Bucket", "bucket"),
        ("s3://under_score", "bucket"),
        ("s3://-lead", "bucket"),
        ("s3://trail-", "bucket"),
        ("s3://a..b", "adjacent"),
        ("s3://a.-b", "adjacent"),
        ("s3://192.168.1.10", "IP address"),
        ("s3://xn--bucket", "reserved"),
        ("s3://bucket-s3alias", "reserved"),
        ("s3://" + "a" * 64, "bucket"),
        ("s3://key:secret@bucket/x", "credentials"),
        ("s3://bucket:9000/x", "host and port"),
        ("s3://bucket/x?versionId=1", "query"),
        ("s3://bucket/x#frag", "query"),
        ("s3://bucket/a//b", "prefix"),
        ("s3://bucket/a/../b", "prefix"),
        ("s3://bucket/a/./b", "prefix"),
        ("s3://bucket/a b", "prefix"),
        ("s3://bucket/a%2F..", "prefix"),
        ("s3://bucket/ä", "prefix"),
        ("s3://bucket/x\\y", "backslash"),
        ("s3://bucket/x\ty", "control"),
        ("s3://bucket/x\ny", "control"),
        ("file://otherhost/srv", "remote host"),
        ("file://", "no path"),
    ],
)
def test_parse_artifact_url_rejects(url: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_artifact_url(url)


def test_locations_print_without_secrets() -> None:
    assert str(parse_artifact_url("s3://bucket-1/exports")) == "s3://bucket-1/exports"
    assert str(parse_artifact_url("s3://bucket-1")) == "s3://bucket-1"
    assert str(parse_artifact_url("file:///srv/a")) == "file:///srv/a"


# --- key prefixes and listing -----------------------------------------------------------------


def test_key_prefix() -> None:
    assert key_prefix() == ""
    assert key_prefix("acme") == "acme/"
    assert key_prefix("acme", JOB) == f"acme/{JOB}/"
    assert key_prefix("acme", str(JOB).upper()) == f"acme/{JOB}/"  # type: ignore[arg-type]
    for bad in ("../acme", "Acme", "acme/x", ""):
        with pytest.raises(ValueError, match="tenant"):
            key_prefix(bad)
    with pytest.raises(ValueError, match="tenant"):
        key_prefix(None, JOB)
    with pytest.raises(ValueError):
        key_prefix("acme", "../../x")  # type: ignore[arg-type]


def test_entries_lists_complete_and_unfinished_artifacts_per_tenant_and_job(
    store: FileArtifactStore,
) -> None:
    job_a, job_b = uuid4(), uuid4()
    done_a = artifact_key("acme", job_a, uuid4(), "json")
    done_b = artifact_key("acme", job_b, uuid4(), "zip")
    other = artifact_key("other", job_a, uuid4(), "json")
    for key in (done_a, done_b, other):
        commit(store, key)
    unfinished = store.open_writer(artifact_key("acme", job_a, uuid4(), "json"))
    unfinished.write(b"half")
    (store.root / "acme" / "notes.txt").write_text("not an artifact")
    try:
        everything = {(e.key, e.complete) for e in store.entries()}
        assert everything == {
            (done_a, True),
            (done_b, True),
            (other, True),
            (unfinished.key, False),
        }
        assert {e.key for e in store.entries("acme")} == {done_a, done_b, unfinished.key}
        assert {(e.key, e.complete) for e in store.entries("acme", job_a)} == {
            (done_a, True),
            (unfinished.key, False),
        }
        assert list(store.entries("nobody")) == []
        assert all(e.modified_at.tzinfo is UTC for e in store.entries())
    finally:
        unfinished.abort()


def test_the_missing_artifact_counter_counts_per_backend() -> None:
    before = missing_counts()
    record_missing("file")
    record_missing("s3")
    record_missing("s3")
    after = missing_counts()
    assert after.get("file", 0) - before.get("file", 0) == 1
    assert after.get("s3", 0) - before.get("s3", 0) == 2


def test_a_zip_export_streams_into_a_writer(store: FileArtifactStore) -> None:
    import zipfile

    from exportcore.domain import ExportFormat
    from exportcore.render import ExportHeader, NoteRecord, make_renderer

    now = datetime(2024, 1, 1, tzinfo=UTC)
    key = new_key("zip")
    with store.open_writer(key) as out:
        renderer = make_renderer(ExportFormat.MARKDOWN_ZIP, out)
        renderer.begin(ExportHeader(str(JOB), "acme", now, "markdown_zip", 1))
        renderer.add([NoteRecord(1, "One", "body", False, now)])
        renderer.end()
        stored = out.commit()
    data = (store.root / key).read_bytes()
    assert stored.sha256 == hashlib.sha256(data).hexdigest()
    assert stored.size == len(data)
    with zipfile.ZipFile(store.root / key) as zf:
        assert zf.testzip() is None
        assert zf.namelist() == ["notes/one-1.md", "manifest.json", "signed-manifest.json"]


def _failing_disk(out: object) -> None:
    """Point a file writer's buffered file at /dev/full: every flush fails with ENOSPC
    (the temporary file stays where the store created it)."""
    out._fh.close()  # type: ignore[attr-defined]
    out._fh = open("/dev/full", "wb")  # type: ignore[attr-defined]  # noqa: SIM115


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_at_commit_leaves_no_temp_file(store: FileArtifactStore) -> None:
    with pytest.raises(OSError) as failed, store.open_writer(KEY) as out:
        _failing_disk(out)
        out.write(b"x" * 100)  # buffered: the disk is hit at commit
        out.commit()
    assert failed.value.errno == 28  # ENOSPC, the error of the commit, not of the cleanup
    assert files_under(store.root) == []


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_while_aborting_leaves_no_temp_file(store: FileArtifactStore) -> None:
    with pytest.raises(RuntimeError, match="render failed"), store.open_writer(KEY) as out:
        _failing_disk(out)
        out.write(b"x" * 100)
        raise RuntimeError("render failed")
    assert files_under(store.root) == []
