"""The worker protocol (JobRunner) and the recovery-scanner with artifacts in S3: a real
S3 server (moto in server mode), real PostgreSQL, real notes. No client is patched."""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import pytest

from devtools.stack import free_port
from exportcore.artifacts import ArtifactWriter, S3ArtifactStore, artifact_key, open_store
from exportcore.recovery import RecoveryScanner
from exportcore.runner import JobRunner
from exportcore.settings import Settings
from exportcore.store import jobs as job_store
from tests.support import FailingS3, count, events, job, shift_job, submit

MiB = 1024 * 1024


@pytest.fixture
def store(s3_settings: Settings) -> S3ArtifactStore:
    s = open_store(s3_settings)
    assert isinstance(s, S3ArtifactStore)
    return s


def objects(store: S3ArtifactStore) -> list[str]:
    """Every object key in the bucket (whatever its shape)."""
    resp = store.client().list_objects_v2(Bucket=store.config.bucket)
    return sorted(o["Key"] for o in resp.get("Contents", []))


def uploads(store: S3ArtifactStore) -> list[dict]:
    """Every multipart upload in progress in the bucket."""
    return store.client().list_multipart_uploads(Bucket=store.config.bucket).get("Uploads", [])


def read(store: S3ArtifactStore, key: str) -> bytes:
    stream, _ = store.open_reader(key)
    with stream:
        return stream.read()


def test_a_large_export_is_published_as_one_multipart_object_with_its_etag(
    pool, s3_settings: Settings, store: S3ArtifactStore, tenant
) -> None:
    tid, ids = tenant
    row = submit(pool, s3_settings, tid, None)  # every real note: several 5 MiB parts
    outcome = JobRunner(s3_settings, pool, store).run(row["id"], uuid4())
    assert outcome.result == "succeeded"
    done = job(pool, row["id"])
    assert objects(store) == [f"artifacts/{done['result_ref']}"]
    assert uploads(store) == []
    data = read(store, done["result_ref"])
    assert len(data) > 2 * 5 * MiB, "the real notes must span several parts"
    assert hashlib.sha256(data).hexdigest() == done["result_sha256"]
    assert len(data) == done["result_bytes"]
    head = store.client().head_object(
        Bucket=store.config.bucket, Key=store.object_key(done["result_ref"])
    )
    assert done["result_etag"] == head["ETag"].strip('"')
    assert done["result_etag"].endswith(f"-{-(-len(data) // (5 * MiB))}")
    succeeded = [e for e in events(pool, row["id"]) if e["kind"] == "succeeded"]
    assert succeeded[0]["detail"]["etag"] == done["result_etag"]
    assert [n["id"] for n in json.loads(data)["notes"]] == ids


class _LeaseLossStore(S3ArtifactStore):
    """The real S3 store; after the writer's first part reached the server, the worker
    stalls past its lease: the lease expires and the recovery-scanner requeues the job
    (what a real stall, e.g. a frozen node, looks like to everyone else)."""

    def __init__(self, base: S3ArtifactStore, settings: Settings, pool, job_id: UUID) -> None:
        super().__init__(base.config)
        self.settings, self.pool, self.job_id = settings, pool, job_id
        self.seen_on_server: list[dict] = []

    def open_writer(self, key: str) -> ArtifactWriter:
        writer = super().open_writer(key)
        upload_part = writer._upload_part

        def stalled_after_first_part(size: int) -> None:
            upload_part(size)
            if self.seen_on_server:
                return
            [upload] = uploads(self)
            parts = self.client().list_parts(
                Bucket=self.config.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
            )
            self.seen_on_server.append({"key": upload["Key"], "parts": len(parts["Parts"])})
            shift_job(self.pool, self.job_id, lease_expires_at="-1 hour")
            counts = RecoveryScanner(self.settings, self.pool, self).recover_expired_leases()
            assert counts["expired_requeued"] == 1

        writer._upload_part = stalled_after_first_part  # type: ignore[method-assign]
        return writer


def test_a_worker_that_loses_its_lease_mid_upload_leaves_nothing_and_aborts_its_upload(
    pool, s3_settings: Settings, store: S3ArtifactStore, tenant, caplog
) -> None:
    tid, _ = tenant
    row = submit(pool, s3_settings, tid, None)
    stalling = _LeaseLossStore(store, s3_settings, pool, row["id"])
    fast_clock = itertools.count(0, 100).__next__  # every check renews: the loss is seen
    with caplog.at_level(logging.INFO, logger="exportcore.artifacts.s3"):
        first = JobRunner(s3_settings, pool, stalling, clock=fast_clock).run(row["id"], uuid4())
    assert first.result == "lease_lost"
    loser_key = artifact_key(tid, row["id"], first.lease_token, "json")
    # The upload was really in progress on the server when the lease was lost...
    assert stalling.seen_on_server == [{"key": f"artifacts/{loser_key}", "parts": 1}]
    # ...and the worker aborted it: nothing visible under any key, no upload left.
    assert objects(store) == [] and uploads(store) == []
    assert any(
        r.getMessage() == "multipart upload aborted" and r.key == loser_key for r in caplog.records
    )
    queued = job(pool, row["id"])
    assert (queued["status"], queued["attempts"], queued["result_ref"]) == ("queued", 1, None)

    # The requeued job runs again (its backoff waited out) and publishes under the new lease.
    shift_job(pool, row["id"], next_attempt_at="-1 minute")
    second = JobRunner(s3_settings, pool, store).run(row["id"], uuid4())
    assert second.result == "succeeded" and second.lease_token != first.lease_token
    done = job(pool, row["id"])
    assert objects(store) == [f"artifacts/{done['result_ref']}"] and uploads(store) == []
    assert str(second.lease_token) in done["result_ref"]
    assert hashlib.sha256(read(store, done["result_ref"])).hexdigest() == done["result_sha256"]


def _store_at(s3_settings: Settings, endpoint: str) -> S3ArtifactStore:
    s = open_store(
        s3_settings.model_copy(update={"s3_endpoint_url": endpoint, "s3_max_attempts": 1})
    )
    assert isinstance(s, S3ArtifactStore)
    return s


@pytest.mark.parametrize(
    ("failure", "code"),
    [("unreachable", "EndpointConnectionError"), ("throttled", "SlowDown")],
)
def test_storage_unavailable_is_retried_by_the_policy_then_succeeds(
    pool, s3_settings: Settings, store: S3ArtifactStore, tenant, failure: str, code: str
) -> None:
    tid, ids = tenant
    row = submit(pool, s3_settings, tid, ids[:3])
    with FailingS3() as failing:
        if failure == "unreachable":
            endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
        else:
            endpoint = failing(503, "SlowDown")
        outcome = JobRunner(s3_settings, pool, _store_at(s3_settings, endpoint)).run(
            row["id"], uuid4()
        )
    assert (outcome.result, outcome.reason) == ("retry", "storage_unavailable")
    queued = job(pool, row["id"])
    assert (queued["status"], queued["attempts"], queued["error_code"]) == (
        "queued",
        1,
        "storage_unavailable",
    )
    assert code in queued["error_detail"]
    assert count(pool, "SELECT count(*) FROM export_outbox WHERE job_id = %s", row["id"]) == 2
    # The store is back: the retry publishes.
    shift_job(pool, row["id"], next_attempt_at="-1 minute")
    assert JobRunner(s3_settings, pool, store).run(row["id"], uuid4()).result == "succeeded"
    assert job(pool, row["id"])["attempts"] == 2
    assert len(objects(store)) == 1


def test_a_misconfigured_store_fails_the_job_at_once_with_a_dead_letter(
    pool, s3_settings: Settings, tenant
) -> None:
    tid, ids = tenant
    row = submit(pool, s3_settings, tid, ids[:2])
    with FailingS3() as failing:
        denied = _store_at(s3_settings, failing(403, "AccessDenied"))
        outcome = JobRunner(s3_settings, pool, denied).run(row["id"], uuid4())
    assert (outcome.result, outcome.reason) == ("failed", "storage_misconfigured")
    failed = job(pool, row["id"])
    assert (failed["status"], failed["attempts"]) == ("failed", 1)
    assert failed["error_detail"] == "ClientError AccessDenied HTTP 403"
    reason = count(
        pool,
        "SELECT count(*) FROM export_dead_letters WHERE job_id = %s"
        " AND reason = 'storage_misconfigured'",
        row["id"],
    )
    assert reason == 1


def test_orphan_cleanup_removes_losers_objects_and_stale_uploads_on_s3(
    pool, s3_settings: Settings, store: S3ArtifactStore, tenant
) -> None:
    tid, ids = tenant
    done = submit(pool, s3_settings, tid, ids[:2])["id"]
    JobRunner(s3_settings, pool, store).run(done, uuid4())
    winner = job(pool, done)["result_ref"]

    def put(key: str) -> str:
        with store.open_writer(key) as out:
            out.write(b"a losing lease's artifact")
            out.commit()
        return key

    def abandon(key: str) -> str:
        writer = store.open_writer(key)  # a worker killed mid-upload: never aborted
        writer.write(b"\0" * (5 * MiB + 1))
        assert writer.upload_id is not None  # type: ignore[attr-defined]
        return key

    loser = put(artifact_key(tid, done, uuid4(), "json"))
    crashed = abandon(artifact_key(tid, done, uuid4(), "json"))
    gone_job = put(artifact_key(tid, uuid4(), uuid4(), "json"))
    running = submit(pool, s3_settings, tid, ids[:1])["id"]
    with pool.connection() as conn:
        lease = job_store.job_claim(
            conn, job_id=running, message_id=uuid4(), lease_seconds=30
        ).lease_token
    current = abandon(artifact_key(tid, running, lease, "json"))  # still being written
    foreign = "artifacts/acme-reports/summary.csv"
    store.client().put_object(Bucket=store.config.bucket, Key=foreign, Body=b"not ours")

    RecoveryScanner(s3_settings, pool, store).delete_orphans()  # grace: one hour
    # Young losers are kept. (moto dates every multipart upload in 2010, so only complete
    # objects can show the grace period here.)
    assert f"artifacts/{loser}" in objects(store) and f"artifacts/{gone_job}" in objects(store)

    now = s3_settings.model_copy(update={"orphan_grace_seconds": 0.0})
    RecoveryScanner(now, pool, store).delete_orphans()
    assert objects(store) == sorted([f"artifacts/{winner}", foreign])
    assert [u["Key"] for u in uploads(store)] == [f"artifacts/{current}"]
    assert crashed not in {e.key for e in store.entries()}


def test_retention_deletes_the_object_of_a_pruned_job(
    pool, s3_settings: Settings, store: S3ArtifactStore, tenant
) -> None:
    tid, ids = tenant
    old = submit(pool, s3_settings, tid, ids[:1])["id"]
    JobRunner(s3_settings, pool, store).run(old, uuid4())
    assert len(objects(store)) == 1
    with pool.connection() as conn:
        conn.execute(
            "UPDATE export_jobs SET finished_at = now() - interval '31 days' WHERE id = %s",
            (old,),
        )
    assert RecoveryScanner(s3_settings, pool, store).hygiene()["jobs_pruned"] == 1
    assert objects(store) == []


def test_entries_of_a_job_after_a_retry_show_only_the_winner(
    pool, s3_settings: Settings, store: S3ArtifactStore, tenant
) -> None:
    tid, ids = tenant
    row = submit(pool, s3_settings, tid, ids[:2])
    JobRunner(s3_settings, pool, store).run(row["id"], uuid4())
    done = job(pool, row["id"])
    listed = list(store.entries(tid, row["id"]))
    assert [(e.key, e.complete) for e in listed] == [(done["result_ref"], True)]
    assert datetime.now(UTC) - listed[0].modified_at < timedelta(minutes=5)


def test_storage_down_never_slows_lease_recovery(
    pool, s3_settings: Settings, tenant, caplog
) -> None:
    tid, ids = tenant
    job_id = submit(pool, s3_settings, tid, ids[:1])["id"]
    with pool.connection() as conn:
        job_store.job_claim(conn, job_id=job_id, message_id=uuid4(), lease_seconds=30)
    shift_job(pool, job_id, lease_expires_at="-1 hour")
    down = _store_at(s3_settings, f"http://127.0.0.1:{free_port()}")
    scanner = RecoveryScanner(s3_settings, pool, down)
    with caplog.at_level(logging.WARNING, logger="exportcore.recovery"):
        counts = scanner.run_once()  # the first pass also runs hygiene: the store is down
    assert counts["expired_requeued"] == 1 and "orphans_deleted" not in counts
    assert job(pool, job_id)["status"] == "queued"
    assert any(r.getMessage().startswith("hygiene failed") for r in caplog.records)
    assert "orphans_deleted" not in scanner.run_once()  # hygiene waits for its interval
