"""The artifact store contract, run against both backends: a folder, and a bucket on the
session's real S3 server (moto in server mode, reached over HTTP by the ordinary boto3
client). Plus what only S3 has: multipart uploads, ETags, presigned URLs, bounded memory
while streaming, and its failure modes against real (mis)behaving HTTP servers."""

from __future__ import annotations

import hashlib
import random
import tracemalloc
import zipfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import uuid4

import httpx
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from devtools.s3 import MotoServer
from devtools.stack import free_port
from exportcore.artifacts import (
    ArtifactStore,
    FileArtifactStore,
    S3ArtifactStore,
    artifact_key,
    open_store,
)
from exportcore.domain import ArtifactMissing, ExportFormat
from exportcore.failures import classify
from exportcore.settings import Settings
from tests.support import FailingS3

MiB = 1024 * 1024
PART = 5 * MiB


def s3_store(
    server: MotoServer, bucket: str, prefix: str = "artifacts", **extra
) -> S3ArtifactStore:
    store = open_store(
        Settings(
            s3_multipart_threshold=PART,
            s3_multipart_part_size=PART,
            s3_max_attempts=1,
            **server.settings_kwargs(bucket, prefix),
            **extra,
        )
    )
    assert isinstance(store, S3ArtifactStore)
    return store


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ArtifactStore:
    if request.param == "file":
        return FileArtifactStore(tmp_path / "artifacts")
    server: MotoServer = request.getfixturevalue("s3_server")
    return s3_store(server, server.create_bucket(f"c-{uuid4().hex[:20]}"))


def new_key(tenant: str = "acme", ext: str = "json") -> str:
    return artifact_key(tenant, uuid4(), uuid4(), ext)


def put(store: ArtifactStore, key: str, data: bytes) -> None:
    with store.open_writer(key) as out:
        out.write(data)
        out.commit()


def read(store: ArtifactStore, key: str) -> bytes:
    stream, size = store.open_reader(key)
    with stream:
        data = stream.read()
    assert len(data) == size
    return data


def listing(store: ArtifactStore, **kw) -> set[tuple[str, bool]]:
    return {(e.key, e.complete) for e in store.entries(**kw)}


def real_text(size: int) -> bytes:
    """``size`` bytes of real prose: the Markdown documentation shipped on this machine."""
    sources = sorted(Path("/usr/share/doc").rglob("*.md"))
    text = b"".join(p.read_bytes() for p in sources[:50] if p.is_file())
    assert text, "no Markdown documentation under /usr/share/doc"
    return (text * (size // len(text) + 1))[:size]


# --- the contract, both backends ---------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 11, PART - 1, PART + 1, 3 * PART + 12345])
def test_an_artifact_is_invisible_until_commit_then_exactly_what_was_written(
    store: ArtifactStore, size: int
) -> None:
    key = new_key()
    data = real_text(size)
    with store.open_writer(key) as out:
        for start in range(0, size, 300_001):
            out.write(data[start : start + 300_001])
        assert out.tell() == size
        with pytest.raises(ArtifactMissing):
            store.open_reader(key)
        assert (key, True) not in listing(store)
        stored = out.commit()
    assert (stored.ref, stored.size) == (key, size)
    assert stored.sha256 == hashlib.sha256(data).hexdigest()
    assert read(store, key) == data
    assert listing(store) == {(key, True)}
    if isinstance(store, S3ArtifactStore):
        head = store.client().head_object(Bucket=store.config.bucket, Key=store.object_key(key))
        assert stored.etag == head["ETag"].strip('"')
        parts = -(-size // PART) if size > PART else 0
        assert stored.etag.endswith(f"-{parts}") if parts else "-" not in stored.etag
    else:
        assert stored.etag is None


def test_leaving_the_block_without_commit_leaves_nothing(store: ArtifactStore) -> None:
    key = new_key()
    with store.open_writer(key) as out:
        out.write(real_text(2 * PART + 7))  # on S3: a multipart upload with two parts
        assert listing(store) == {(key, False)}  # the unfinished write is listed
    assert listing(store) == set()
    with pytest.raises(ArtifactMissing):
        store.open_reader(key)


def test_an_error_in_the_block_leaves_nothing_and_propagates(store: ArtifactStore) -> None:
    key = new_key()
    with pytest.raises(RuntimeError, match="render failed"), store.open_writer(key) as out:
        out.write(real_text(PART + 1))
        raise RuntimeError("render failed")
    assert listing(store) == set()


def test_delete_removes_complete_and_unfinished_writes(store: ArtifactStore) -> None:
    done, abandoned = new_key(), new_key()
    put(store, done, b"done")
    dead_writer = store.open_writer(abandoned)  # a worker that died mid-write
    dead_writer.write(real_text(PART + 1))
    assert listing(store) == {(done, True), (abandoned, False)}
    assert store.delete(done) is True
    assert store.delete(abandoned) is True
    assert listing(store) == set()
    assert store.delete(done) is False and store.delete(new_key()) is False


def test_list_older_than_covers_complete_and_unfinished(store: ArtifactStore) -> None:
    done, abandoned = new_key(), new_key()
    put(store, done, b"x")
    dead_writer = store.open_writer(abandoned)
    dead_writer.write(real_text(PART + 1))
    later = datetime.now(UTC) + timedelta(minutes=5)
    assert {k for k, _ in store.list_older_than(later)} == {done, abandoned}
    earlier = datetime.now(UTC) - timedelta(hours=1)
    # moto reports a fixed 2010 start time for every multipart upload, so only complete
    # objects can show the age filter here; the filter itself is unit-tested on files.
    assert done not in {k for k, _ in store.list_older_than(earlier)}
    for key, _ in store.list_older_than(later):
        store.delete(key)
    assert listing(store) == set()


def test_entries_filter_by_tenant_and_job(store: ArtifactStore) -> None:
    job = uuid4()
    mine = artifact_key("acme", job, uuid4(), "json")
    sibling = artifact_key("acme", uuid4(), uuid4(), "json")
    other = artifact_key("zeta", job, uuid4(), "ndjson")
    for key in (mine, sibling, other):
        put(store, key, key.encode())
    assert {e.key for e in store.entries("acme", job)} == {mine}
    assert {e.key for e in store.entries("acme")} == {mine, sibling}
    assert {e.key for e in store.entries()} == {mine, sibling, other}


@pytest.mark.parametrize(
    "bad",
    # fixed ids: every xdist worker must collect the same parameters
    [
        "../x.json",
        "acme/0197a4b2-5c3d-7e8f-9a0b-1c2d3e4f5a6b/../../etc/passwd",
        "Acme/0197a4b2-5c3d-7e8f-9a0b-1c2d3e4f5a6b/0197a4b2-5c3d-7e8f-9a0b-1c2d3e4f5a6c.json",
        "",
    ],
)
def test_every_operation_validates_the_key(store: ArtifactStore, bad: str) -> None:
    for call in (store.open_writer, store.open_reader, store.delete):
        with pytest.raises(ValueError):
            call(bad)
    with pytest.raises(ValueError):
        store.presigned_url(bad, expires_in=60, filename="x.json", media_type="application/json")


def test_a_zip_export_streams_into_either_store(store: ArtifactStore) -> None:
    from exportcore.render import ExportHeader, NoteRecord, make_renderer

    now = datetime(2024, 1, 1, tzinfo=UTC)
    key = new_key(ext="zip")
    body = real_text(3 * MiB).decode("utf-8", "replace")
    with store.open_writer(key) as out:
        renderer = make_renderer(ExportFormat.MARKDOWN_ZIP, out)
        renderer.begin(ExportHeader(str(uuid4()), "acme", now, "markdown_zip", 3))
        renderer.add([NoteRecord(i, f"Note {i}", body, False, now) for i in (1, 2, 3)])
        renderer.end()
        stored = out.commit()
    data = read(store, key)
    assert stored.sha256 == hashlib.sha256(data).hexdigest()
    with zipfile.ZipFile(__import__("io").BytesIO(data)) as zf:
        assert zf.testzip() is None
        assert len(zf.namelist()) == 5  # 3 notes, manifest.json, signed-manifest.json


def test_presigned_urls_only_on_s3(store: ArtifactStore) -> None:
    key = new_key(ext="ndjson")
    data = real_text(1000)
    put(store, key, data)
    url = store.presigned_url(
        key, expires_in=60, filename="export-1.ndjson", media_type="application/x-ndjson"
    )
    if isinstance(store, FileArtifactStore):
        assert url is None
        return
    assert url is not None and "X-Amz-Signature=" in url and "X-Amz-Expires=60" in url
    r = httpx.get(url)  # no credentials: the URL carries its own authorisation
    assert r.status_code == 200 and r.content == data
    assert r.headers["content-disposition"] == 'attachment; filename="export-1.ndjson"'
    assert r.headers["content-type"] == "application/x-ndjson"
    with pytest.raises(ArtifactMissing):
        store.presigned_url(
            new_key(), expires_in=60, filename="x.json", media_type="application/json"
        )


# --- S3 only ------------------------------------------------------------------------------------


@pytest.fixture
def s3(s3_server: MotoServer, s3_bucket: str) -> S3ArtifactStore:
    return s3_store(s3_server, s3_bucket)


def test_objects_live_under_the_prefix_and_foreign_objects_are_never_touched(
    s3: S3ArtifactStore,
) -> None:
    client, bucket = s3.client(), s3.config.bucket
    key = new_key()
    put(s3, key, b"mine")
    foreign = [
        "artifacts/README.txt",
        f"artifacts/acme/{uuid4()}/notes.json",
        f"elsewhere/{new_key()}",
        new_key(),  # an artifact-shaped key outside the prefix
    ]
    for k in foreign:
        client.put_object(Bucket=bucket, Key=k, Body=b"not ours")
    client.create_multipart_upload(Bucket=bucket, Key=f"other-app/{new_key()}")
    objects = {o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]}
    assert f"artifacts/{key}" in objects
    assert listing(s3) == {(key, True)}
    for k, _ in s3.list_older_than(datetime.now(UTC) + timedelta(days=1)):
        s3.delete(k)
    left = {o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]}
    assert left == set(foreign)
    assert len(client.list_multipart_uploads(Bucket=bucket)["Uploads"]) == 1


def test_parts_are_uploaded_while_writing_and_nothing_is_visible_before_commit(
    s3: S3ArtifactStore,
) -> None:
    client, bucket = s3.client(), s3.config.bucket
    key = new_key()
    with s3.open_writer(key) as out:
        out.write(real_text(2 * PART + 10))
        [upload] = client.list_multipart_uploads(Bucket=bucket)["Uploads"]
        assert upload["Key"] == s3.object_key(key)
        parts = client.list_parts(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
        assert [p["Size"] for p in parts["Parts"]] == [PART, PART]
        assert "Contents" not in client.list_objects_v2(Bucket=bucket)
        stored = out.commit()
    assert "Uploads" not in client.list_multipart_uploads(Bucket=bucket)
    assert stored.etag is not None and stored.etag.endswith("-3")


def test_writer_memory_stays_bounded_by_the_part_size(s3: S3ArtifactStore) -> None:
    """40 MiB through the writer in uneven writes (and one huge one): the Python heap never
    holds more than a few parts, whatever the artifact's size."""
    rng = random.Random(7)
    chunk = real_text(4 * MiB)
    huge = real_text(8 * MiB)
    total = 0
    s3.client()  # created once per process (loading the service model is not streaming)
    tracemalloc.start()
    try:
        with s3.open_writer(new_key()) as out:
            while total < 32 * MiB:
                n = rng.randint(1, 700_000)
                out.write(memoryview(chunk)[:n])
                total += n
            out.write(huge)  # one write larger than a part
            total += len(huge)
            out.commit()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert total > 40 * MiB
    assert peak < 3 * PART, f"peak {peak / MiB:.1f} MiB while streaming {total / MiB:.0f} MiB"


def test_reading_missing_objects_and_buckets(s3: S3ArtifactStore, s3_server: MotoServer) -> None:
    with pytest.raises(ArtifactMissing):
        s3.open_reader(new_key())
    with pytest.raises(ArtifactMissing):
        s3.presigned_url(new_key(), expires_in=5, filename="a.json", media_type="text/plain")
    gone = s3_store(s3_server, f"never-created-{uuid4().hex[:12]}")
    for call in (
        lambda: gone.open_reader(new_key()),
        lambda: gone.presigned_url(new_key(), expires_in=5, filename="a.json", media_type="x"),
        lambda: put(gone, new_key(), b"x"),
    ):
        with pytest.raises(ClientError) as info:
            call()
        failure = classify(info.value)
        assert (failure.kind, failure.code) == ("permanent", "storage_misconfigured")
        assert "NoSuchBucket" in failure.detail


def test_an_unreachable_store_is_a_transient_storage_error(tmp_path: Path) -> None:
    store = open_store(
        Settings(
            artifact_url="s3://some-bucket/x",
            s3_endpoint_url=f"http://127.0.0.1:{free_port()}",  # nothing listens there
            s3_region="us-east-1",
            s3_access_key_id="k",
            s3_secret_access_key="s",
            s3_max_attempts=1,
            s3_connect_timeout=1,
        )
    )
    with pytest.raises(EndpointConnectionError) as info:
        put(store, new_key(), b"x")
    assert (classify(info.value).kind, classify(info.value).code) == (
        "transient",
        "storage_unavailable",
    )


@pytest.fixture
def misbehaving_s3() -> Iterator[Callable[[int, str], str]]:
    with FailingS3() as start:
        yield start


@pytest.mark.parametrize(
    ("status", "code", "kind", "failure_code"),
    [
        (503, "SlowDown", "transient", "storage_unavailable"),
        (500, "InternalError", "transient", "storage_unavailable"),
        (403, "AccessDenied", "permanent", "storage_misconfigured"),
    ],
)
def test_throttling_and_refusals_from_a_real_http_endpoint_are_classified(
    misbehaving_s3, status: int, code: str, kind: str, failure_code: str
) -> None:
    store = open_store(
        Settings(
            artifact_url="s3://some-bucket/x",
            s3_endpoint_url=misbehaving_s3(status, code),
            s3_region="us-east-1",
            s3_access_key_id="k",
            s3_secret_access_key="s",
            s3_addressing_style="path",
            s3_max_attempts=1,
        )
    )
    with pytest.raises(ClientError) as info:
        put(store, new_key(), b"x")
    failure = classify(info.value)
    assert (failure.kind, failure.code) == (kind, failure_code)
    assert failure.detail == f"ClientError {code} HTTP {status}"
