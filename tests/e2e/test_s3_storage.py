"""S3 storage on the real processes (gunicorn api, publisher, recovery-scanner, both Celery
workers) against a real S3 server (moto in server mode), with presigned redirect downloads:
the owner follows a 307 to the bucket, another tenant gets 404; a worker frozen mid-upload
loses its lease and its checkpointed multipart upload is taken over by the next holder,
none left behind; a 200 MB export streams through a worker whose peak memory stays far below
the artifact's size."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from devtools.api_client import ApiClient
from exportcore import faults
from exportcore.artifacts import S3ArtifactStore, artifact_key
from tests.e2e.conftest import E2E, FAST_RECOVERY_ENV, exportctl, running_stack
from tests.support import multiply_notes, wait_for

pytestmark = pytest.mark.e2e
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def s3e(servers, template_db, notes_dir, tmp_path_factory, s3_server) -> Iterator[tuple[E2E, Path]]:
    base = tmp_path_factory.mktemp("s3-stack")
    fault_file = base / "faults.json"
    env = {
        faults.ENV: str(fault_file),
        "DOWNLOAD_MODE": "redirect",
        "PRESIGN_SECONDS": "120",
        "S3_MULTIPART_THRESHOLD": str(5 * MiB),
        "S3_MULTIPART_PART_SIZE": str(5 * MiB),
        "LEASE_SECONDS": "6",
        **FAST_RECOVERY_ENV,
        # A render chunk holds its notes in memory (rows + their rendering): 50 notes of
        # these ~60 KB documents are ~3 MB, against ~30 MB for the default 500. The storage
        # side holds at most about two 5 MiB parts whatever the chunk size.
        "RENDER_CHUNK_SIZE": "50",
        # the 200 MB export's snapshot is one INSERT ... SELECT in the submit transaction
        "DB_STATEMENT_TIMEOUT_MS": "180000",
        "API_TIMEOUT": "300",
    }
    with running_stack(servers, template_db, notes_dir, base, env, backend="s3", s3=s3_server) as e:
        assert isinstance(e.store, S3ArtifactStore)
        yield e, fault_file


def submit(api: ApiClient, body: dict) -> str:
    """Submit as ``api``'s tenant (202 expected), waiting up to 300 s for the answer: the
    200 MB export's snapshot is one INSERT ... SELECT in the submit transaction."""
    return replace(api, timeout=300).submit_ok(body)


def bucket_state(e: E2E) -> tuple[list[str], list[dict]]:
    """(object keys, multipart uploads in progress) of the whole bucket."""
    store = e.store
    assert isinstance(store, S3ArtifactStore)
    client, bucket = store.client(), store.config.bucket
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]
    return keys, client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])


def other_tenant(e: E2E, notes_dir: Path | None = None) -> tuple[str, ApiClient]:
    tenant = "other-" + os.urandom(3).hex()
    exportctl(e.stack.env, "tenant", "create", tenant)
    key = exportctl(e.stack.env, "apikey", "create", tenant, "--quiet").strip()
    if notes_dir is not None:
        exportctl(e.stack.env, "notes", "import", str(notes_dir), "--tenant", tenant)
    return tenant, ApiClient(e.stack.api_url, key)


def test_presigned_redirect_serves_the_owner_and_another_tenant_gets_404(
    s3e, tmp_path: Path
) -> None:
    e, _ = s3e
    job_id = submit(e.api, {"all": True, "format": "markdown_zip"})
    done = e.db.wait_terminal(job_id)
    assert done["status"] == "succeeded"
    url = f"{e.stack.api_url}/v1/exports/{job_id}/download"

    r = httpx.get(url, headers=e.api.auth, timeout=10)
    assert r.status_code == 307
    assert r.headers["etag"] == f'"{done["result_sha256"]}"'
    location = r.headers["location"]
    assert "X-Amz-Signature=" in location and "X-Amz-Expires=120" in location
    # Follow it like a browser would: no API key goes to the storage host.
    with httpx.Client(timeout=60) as browser:
        got = browser.get(location)
    assert got.status_code == 200
    assert hashlib.sha256(got.content).hexdigest() == done["result_sha256"]
    assert len(got.content) == done["result_bytes"]
    assert got.headers["content-disposition"] == f'attachment; filename="export-{job_id}.zip"'
    # httpx following the redirect itself strips the Authorization header on the way.
    followed = httpx.get(url, headers=e.api.auth, timeout=60, follow_redirects=True)
    assert followed.status_code == 200 and followed.content == got.content

    _, stranger = other_tenant(e)
    r = httpx.get(url, headers=stranger.auth, timeout=10)
    assert r.status_code == 404 and "location" not in r.headers
    assert r.headers["content-type"].startswith("application/problem+json")

    # The CLI follows the redirect and checks the file against the ETag of the 307.
    env = {**e.stack.env, "API_URL": e.stack.api_url, "API_KEY": e.api.api_key}
    target = tmp_path / "export.zip"
    exportctl(env, "download", job_id, "--output", str(target))
    assert hashlib.sha256(target.read_bytes()).hexdigest() == done["result_sha256"]

    # The store's ETag was recorded with the result.
    head = e.store.client().head_object(
        Bucket=e.store.config.bucket, Key=e.store.object_key(done["result_ref"])
    )
    assert done["result_etag"] == head["ETag"].strip('"')


def test_a_worker_frozen_mid_upload_loses_its_lease_and_its_upload_is_taken_over(s3e) -> None:
    """The bulk worker has uploaded parts of a multipart upload (a checkpoint records them)
    and is about to complete it when its process is frozen (SIGSTOP: a node or VM pause).
    Its lease expires, the recovery-scanner requeues the job; when the process thaws, its
    last lease check fails and it stops without publishing, leaving its checkpointed upload
    to the next holder (docs/architecture.md, "Checkpoints": an attempt that stops with a
    checkpoint does not delete its durable prefix). The second attempt takes the upload over
    (completes it, copies the parts into its own upload, deletes the old object) and
    publishes. If the thawed holder still passed its last check (its own clock had not seen
    the lease end) and completed the upload before its finish was refused, the takeover
    finds the upload gone, discards the checkpoint and starts over. Either way the first key
    never appears and no multipart upload is left in the store."""
    e, fault_file = s3e
    faults.arm(fault_file, "artifact.commit", "sleep:3", times=1)
    job_id = submit(e.api, {"all": True, "format": "json"})  # ~12 MB of real notes: bulk
    wait_for(lambda: faults.remaining(fault_file, "artifact.commit") == 0, what="the commit")
    first = e.db.job(job_id)
    loser = e.store.object_key(artifact_key(e.tenant, first["id"], first["lease_token"], "json"))
    keys, uploads = bucket_state(e)
    [upload] = [u for u in uploads if u["Key"] == loser]
    parts = e.store.client().list_parts(
        Bucket=e.store.config.bucket, Key=loser, UploadId=upload["UploadId"]
    )["Parts"]
    assert len(parts) >= 2 and loser not in keys  # parts uploaded, nothing visible yet

    worker = e.stack.procs["bulk-worker"]
    children = worker.children()
    assert children, "the bulk-worker has no prefork child"
    for pid in children:
        os.kill(pid, signal.SIGSTOP)
    try:
        with e.db.connect() as conn:
            conn.execute(
                "UPDATE export_jobs SET lease_expires_at = now() - interval '1 second'"
                " WHERE id = %s",
                (job_id,),
            )
        wait_for(lambda: e.db.job(job_id)["status"] == "queued", what="the scanner's requeue")
    finally:
        for pid in children:
            os.kill(pid, signal.SIGCONT)

    done = e.db.wait_terminal(job_id)
    assert (done["status"], done["attempts"]) == ("succeeded", 2)
    assert done["lease_token"] != first["lease_token"]
    keys, uploads = bucket_state(e)
    assert loser not in keys and uploads == []
    assert e.store.object_key(done["result_ref"]) in keys
    assert [a.key for a in e.store.entries(e.tenant, done["id"])] == [done["result_ref"]]
    log = worker.log_text()
    stale = [
        line
        for line in log.splitlines()
        if str(first["lease_token"]) in line and "lease lost; stopped without publishing" in line
    ]
    assert stale, "the thawed holder did not stop on its lost lease"
    assert "could not abort a multipart upload" not in log


def _status(pid: int) -> dict[str, int]:
    """VmRSS / VmHWM (peak resident set) of a process, in KiB, from /proc."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0])
    return fields


def test_a_200_mb_export_streams_with_bounded_worker_memory(s3e, notes_dir: Path) -> None:
    e, _ = s3e
    tenant, other = other_tenant(e, notes_dir)
    with e.db.connect() as conn:
        notes, content = multiply_notes(conn, tenant, 200 * MiB)
    assert content >= 200 * MiB and notes <= 100_000

    # A fresh bulk worker, warmed up by one small bulk export (imports done, S3 client
    # built), so that the peak below belongs to the 200 MB export alone.
    e.stack.restart("bulk-worker")
    with e.db.connect() as conn:
        smallest = [
            r["id"]
            for r in conn.execute(
                "SELECT id FROM notes WHERE tenant_id = %s ORDER BY octet_length(content), id"
                " LIMIT 40",
                (tenant,),
            )
        ]
    warm = e.db.wait_terminal(submit(other, {"note_ids": smallest, "format": "ndjson"}))
    assert (warm["status"], warm["queue"]) == ("succeeded", "exports.bulk")
    [child] = e.stack.procs["bulk-worker"].children()
    before = _status(child)
    # Sample the child's RSS during the export: the timeline explains a failure.
    samples: list[tuple[float, int]] = []
    sampling = threading.Event()

    def sample() -> None:
        start = time.monotonic()
        while not sampling.wait(0.1):
            with contextlib.suppress(OSError):
                samples.append((time.monotonic() - start, _status(child)["VmRSS"] // 1024))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        job_id = submit(other, {"all": True, "format": "ndjson"})
        done = e.db.wait_terminal(job_id, timeout=600)
    finally:
        sampling.set()
        sampler.join()
    assert done["status"] == "succeeded", done
    assert e.stack.procs["bulk-worker"].children() == [child], "the worker child was replaced"
    after = _status(child)
    size = done["result_bytes"]
    assert size > 200 * MiB

    # The object is complete and intact: stream it back through the presigned redirect.
    r = httpx.get(f"{e.stack.api_url}/v1/exports/{job_id}/download", headers=other.auth, timeout=10)
    assert r.status_code == 307
    sha = hashlib.sha256()
    with httpx.stream("GET", r.headers["location"], timeout=120) as got:
        assert got.status_code == 200
        for chunk in got.iter_bytes(1 << 20):
            sha.update(chunk)
    assert sha.hexdigest() == done["result_sha256"]
    # A bulk export checkpoints (CHECKPOINT_BYTES): parts of 5 MiB, and at a checkpoint the
    # whole buffer (one to two parts' worth, ending at a chunk boundary) as one part.
    parts = int(done["result_etag"].rsplit("-", 1)[1])
    assert -(-size // (10 * MiB)) <= parts <= -(-size // (5 * MiB)), (parts, size)

    peak_mib = after["VmHWM"] / 1024
    growth_mib = (after["VmHWM"] - before["VmRSS"]) / 1024
    history = e.db.kinds(job_id)
    timeline = " ".join(f"{t:.0f}s:{rss}" for t, rss in samples[:: max(1, len(samples) // 40)])
    report = (
        f"200 MB export: {size / MiB:.0f} MiB artifact, {notes} notes, attempts "
        f"{done['attempts']}; bulk worker child RSS before {before['VmRSS'] / 1024:.0f} MiB, "
        f"peak (VmHWM) {peak_mib:.0f} MiB, growth {growth_mib:.0f} MiB\n"
        f"RSS MiB over time: {timeline}\n"
        f"history: {[k for k in history if k != 'renewed']} + {history.count('renewed')} renewals"
    )
    print("\n" + report)
    # Measured on the reference machine: ~90 MiB before, ~153 MiB peak (+~63 MiB: one
    # render chunk of real documents, up to ~1 MiB each, plus two 5 MiB parts); after the
    # merges of checkpoints, deadline-bound clients and rate limits the warmed-up child
    # starts at ~98 MiB (more code imported) and grows by the same ~66 MiB. The growth is
    # the export's share and is what is bounded; the artifact itself is never held.
    assert growth_mib < 80, report
    assert peak_mib < size / MiB, report
