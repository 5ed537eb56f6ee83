"""I/O of a running job is bounded by the time left to its deadline, and the workers' calls
downstream by the deployment's shared rate: real PostgreSQL (a snapshot read held by a real
lock), a real socket that never answers in place of a stalled object store, real Redis for
the shared buckets (and a closed port for a Redis that is down), moto for S3 calls."""

from __future__ import annotations

import logging
import threading
import time
from uuid import uuid4

import psycopg
import pytest

from devtools.stack import free_port
from devtools.webhook_receiver import TricklingReceiver
from exportcore import metrics
from exportcore.artifacts import FileArtifactStore, S3ArtifactStore, S3Config, artifact_key
from exportcore.artifacts.base import DEADLINE_CHECK_WRITES
from exportcore.db import make_pool
from exportcore.deadlines import Deadline, DeadlineExceeded, statement_timeout
from exportcore.downstream import NOTES_SOURCE, STORAGE, DownstreamLimiter, DownstreamThrottled
from exportcore.ratelimit import RateLimiter
from exportcore.runner import JobRunner
from exportcore.settings import Settings
from tests.support import job, submit


def _decisions(limit: str, backend: str) -> float:
    return float(metrics.RATE_LIMIT_DECISIONS.labels(backend, "allowed", limit)._value.get())


# --- I/O timeouts bounded by the time left to the deadline --------------------------------


def test_a_snapshot_read_near_the_deadline_ends_at_the_deadline(
    pool, settings: Settings, tenant
) -> None:
    """A chunk read blocked behind a lock is cancelled when the job's deadline comes (2 s),
    not when the lock timeout (20 s here) or the lock holder (15 s) ends it: 15.2 s
    measured without the bound."""
    tid, ids = tenant
    slow_db = settings.model_copy(
        update={
            "render_chunk_size": 1,
            "db_lock_timeout_ms": 20_000,
            "db_statement_timeout_ms": 30_000,
        }
    )
    worker_pool = make_pool(slow_db, "tests-worker", min_size=1, max_size=4, open_wait=True)
    row = submit(pool, slow_db, tid, ids[:200])
    with pool.connection() as conn:
        conn.execute(
            "UPDATE export_jobs SET deadline_at = now() + interval '2 seconds' WHERE id = %s",
            (row["id"],),
        )
    locked, release = threading.Event(), threading.Event()

    def lock_the_snapshot() -> None:
        # once the job runs, take the snapshot table away from its next chunk read
        with psycopg.connect(settings.database_dsn, autocommit=True) as conn:
            while conn.execute(
                "SELECT status FROM export_jobs WHERE id = %s", (row["id"],)
            ).fetchone() != ("running",):
                time.sleep(0.002)
            with conn.transaction():
                conn.execute("LOCK TABLE export_job_items IN ACCESS EXCLUSIVE MODE")
                locked.set()
                release.wait(15)

    locker = threading.Thread(target=lock_the_snapshot, daemon=True)
    locker.start()
    t0 = time.monotonic()
    try:
        outcome = JobRunner(slow_db, worker_pool, FileArtifactStore(slow_db.artifact_dir)).run(
            row["id"], uuid4()
        )
    finally:
        release.set()
        locker.join(5)
        worker_pool.close()
    elapsed = time.monotonic() - t0
    assert locked.is_set(), "the render ended before the lock was taken"
    assert outcome.result == "failed", outcome
    assert job(pool, row["id"])["error_code"] == "deadline_exceeded"
    assert elapsed < 6.0, f"the read outlived the 2 s deadline: {elapsed:.1f} s"


def test_the_statement_timeout_is_restored_after_a_bounded_read(pool, settings: Settings) -> None:
    with pool.connection() as conn:
        with (
            statement_timeout(conn, Deadline.after(0.3), settings.db_statement_timeout_ms),
            pytest.raises(psycopg.errors.QueryCanceled),
        ):
            conn.execute("SELECT pg_sleep(5)")
        assert conn.execute("SHOW statement_timeout").fetchone()["statement_timeout"] == "15s"
        # far from its deadline a read costs nothing extra: the session's timeout stays
        with statement_timeout(conn, Deadline.after(3600), settings.db_statement_timeout_ms):
            assert conn.execute("SHOW statement_timeout").fetchone()["statement_timeout"] == "15s"
        with (
            pytest.raises(DeadlineExceeded),
            statement_timeout(conn, Deadline.after(-1), settings.db_statement_timeout_ms),
        ):
            pass


def test_an_object_store_call_near_the_deadline_ends_at_the_deadline() -> None:
    """A store that accepts the connection and never answers: with the configured 60 s
    read timeout and 3 attempts the upload would hang for minutes; bound by a deadline 1.5 s
    away it gives up at the deadline."""
    with TricklingReceiver(interval=3600, limit=120) as silent:
        store = S3ArtifactStore(
            S3Config(
                bucket="exports",
                endpoint_url=silent.url,
                region="us-east-1",
                access_key_id="test",
                secret_access_key="test",
                addressing_style="path",
                read_timeout=60.0,
                max_attempts=3,
            )
        )
        # a worker's clients exist before its deadline nears: build the configured client
        # first (boto3 takes a second or more on a loaded machine), then the bounded one
        store.client()
        store.client(Deadline.after(1.5))
        key = artifact_key("acme", uuid4(), uuid4(), "json")
        writer = store.open_writer(key).bound_by(Deadline.after(1.5))
        writer.write(b'{"notes": []}')
        t0 = time.monotonic()
        with pytest.raises(Exception) as failed:
            writer.commit()
        elapsed = time.monotonic() - t0
        writer.abort()
    assert "timeout" in type(failed.value).__name__.lower() + str(failed.value).lower()
    # the deadline and one tier's timeouts with botocore's 1 s 100-continue wait, plus slack
    # for a loaded machine: far below the 60 s x 3 attempts of the configured client
    assert elapsed < 4.0, f"the PUT outlived the deadline: {elapsed:.1f} s"
    assert silent.connections == 1  # one attempt near the deadline, not three
    # past the deadline nothing is started at all
    late = store.open_writer(key).bound_by(Deadline.after(-1))
    with pytest.raises(DeadlineExceeded):
        late.write(b"x")
    late.abort()


def test_a_file_writer_starts_nothing_past_the_deadline(tmp_path) -> None:
    store = FileArtifactStore(tmp_path)
    key = artifact_key("acme", uuid4(), uuid4(), "json")
    clock = [0.0]
    writer = store.open_writer(key).bound_by(Deadline(at=1.0, clock=lambda: clock[0]))
    writer.write(b"{}")
    clock[0] = 2.0
    with pytest.raises(DeadlineExceeded, match="writing the artifact"):  # checked in steps
        for _ in range(DEADLINE_CHECK_WRITES):
            writer.write(b"more")
    [result] = store.commit_all([writer])
    assert isinstance(result, DeadlineExceeded)
    assert list(tmp_path.rglob("*.json*")) == []  # aborted: no temporary file left


# --- downstream rate limits shared across replicas ----------------------------------------


def _downstream(settings: Settings, **limits: float) -> Settings:
    return settings.model_copy(update=limits)


def test_replicas_share_one_downstream_rate(settings: Settings) -> None:
    """Two worker replicas (two limiters) draw 24 tokens at once from a bucket of 4 refilled
    at 20 per second: together they never go faster than the deployment's rate."""
    limited = _downstream(settings, downstream_storage_rate=20.0, downstream_storage_burst=4)
    replicas = [DownstreamLimiter(limited) for _ in range(2)]
    before = _decisions(STORAGE, "redis")
    waits: list[float] = []

    def burst(limiter: DownstreamLimiter) -> None:
        for _ in range(12):
            waits.append(limiter.acquire(STORAGE))

    t0 = time.monotonic()
    threads = [threading.Thread(target=burst, args=(r,)) for r in replicas for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    for r in replicas:
        r.close()
    assert len(waits) == 48
    assert elapsed >= (48 - 4) / 20 * 0.95, elapsed  # the rate, over both replicas
    assert sum(w > 0 for w in waits) >= 40  # all but the burst waited for their token
    assert _decisions(STORAGE, "redis") - before == 48


def test_while_redis_is_down_each_worker_goes_on_at_its_local_share(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    down = _downstream(
        settings,
        rate_limit_redis_url=f"redis://127.0.0.1:{free_port()}/0",
        rate_limit_local_share=0.5,
        downstream_notes_rate=10.0,
        downstream_notes_burst=8,
        downstream_max_wait_seconds=1.0,
    )
    now = [100.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    limiter = DownstreamLimiter(
        down, RateLimiter(down, clock=lambda: now[0]), clock=lambda: now[0], sleep=sleep
    )
    before = _decisions(NOTES_SOURCE, "local")
    with caplog.at_level(logging.WARNING):
        # half the burst at once, then half the rate: neither unlimited nor stopped
        assert [limiter.acquire(NOTES_SOURCE) for _ in range(4)] == [0.0] * 4
        t0 = now[0]
        for _ in range(5):
            limiter.acquire(NOTES_SOURCE)
        assert 5 / 5.0 <= now[0] - t0 <= 5 / 5.0 * 1.3  # 5 tokens at 5 per second
    assert _decisions(NOTES_SOURCE, "local") - before == 9
    unreachable = [r for r in caplog.records if "rate-limit store unreachable" in r.getMessage()]
    assert len(unreachable) == 1  # once per outage, not per call
    # a wait beyond DOWNSTREAM_MAX_WAIT_SECONDS (or the deadline) is a transient failure
    with pytest.raises(DownstreamThrottled):
        limiter.acquire(
            NOTES_SOURCE, cost=4, deadline=Deadline(at=now[0] + 0.1, clock=lambda: now[0])
        )
    limiter.close()


def test_a_worker_takes_a_token_per_snapshot_read_and_per_storage_call(
    pool, s3_settings: Settings, tenant
) -> None:
    tid, ids = tenant
    limited = _downstream(
        s3_settings,
        render_chunk_size=10,
        downstream_notes_rate=1000.0,
        downstream_storage_rate=1000.0,
    )
    downstream = DownstreamLimiter(limited)
    store = S3ArtifactStore(
        S3Config.from_settings(limited, limited.artifact_location()), downstream
    )
    row = submit(pool, limited, tid, ids[:45])
    notes_before, storage_before = _decisions(NOTES_SOURCE, "redis"), _decisions(STORAGE, "redis")
    outcome = JobRunner(limited, pool, store, downstream=downstream).run(row["id"], uuid4())
    downstream.close()
    assert outcome.result == "succeeded"
    # 45 notes in chunks of 10: the first comes with the claim, four more are read
    assert _decisions(NOTES_SOURCE, "redis") - notes_before == 4
    assert _decisions(STORAGE, "redis") - storage_before == 1  # one PutObject
