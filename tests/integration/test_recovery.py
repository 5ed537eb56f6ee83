"""The recovery-scanner's rules against real PostgreSQL: one test per rule plus the drills
that move one job's timestamps instead of waiting for real leases to expire."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import uuid4

import pytest

from exportcore.artifacts import FileArtifactStore, artifact_key
from exportcore.recovery import RecoveryScanner
from exportcore.runner import JobRunner
from exportcore.settings import Settings
from exportcore.store import jobs as job_store
from tests.support import assert_attempts_exhausted, count, job, kinds, shift_job, submit


@pytest.fixture
def store(settings: Settings) -> FileArtifactStore:
    return FileArtifactStore(settings.artifact_dir)


def scanner(settings: Settings, pool, store) -> RecoveryScanner:
    return RecoveryScanner(settings, pool, store)


def claim(pool, job_id, lease: float = 30.0):
    with pool.connection() as conn:
        return job_store.job_claim(conn, job_id=job_id, message_id=uuid4(), lease_seconds=lease)


def expire(pool, job_id) -> None:
    shift_job(pool, job_id, lease_expires_at="-1 hour")


def test_expired_lease_is_requeued_with_backoff_then_claimed_again(
    pool, settings, store, tenant
) -> None:
    tid, ids = tenant
    job_id = submit(pool, settings, tid, ids[:2])["id"]
    first = claim(pool, job_id)
    expire(pool, job_id)
    counts = scanner(settings, pool, store).run_once()
    assert counts["expired_requeued"] == 1
    row = job(pool, job_id)
    assert (
        row["status"] == "queued" and row["attempts"] == 1 and row["error_code"] == "lease_expired"
    )
    assert row["next_attempt_at"] <= row["deadline_at"] - timedelta(
        seconds=settings.retry_deadline_margin_seconds
    )
    with pool.connection() as conn:
        [event] = conn.execute(
            "SELECT * FROM export_outbox WHERE job_id = %s AND reason = 'recovery'", (job_id,)
        ).fetchall()
    assert event["available_at"] == row["next_attempt_at"] and event["sent_at"] is None
    assert kinds(pool, job_id)[-1] == "lease_expired"

    # A duplicate of the old message during the backoff: refused, attempts unchanged.
    shift_job(pool, job_id, next_attempt_at="+1 hour")
    assert claim(pool, job_id) is None
    assert job(pool, job_id)["attempts"] == 1
    shift_job(pool, job_id, next_attempt_at="-2 hours")
    second = claim(pool, job_id)
    assert second is not None and second.attempts == 2
    with pool.connection() as conn:
        assert (
            job_store.job_finish_if_leased(
                conn,
                job_id=job_id,
                lease_token=first.lease_token,
                result_ref="old",
                sha256="x",
                nbytes=1,
                rows=2,
            )
            is None
        )


def test_a_lease_that_has_not_expired_is_never_touched(pool, settings, store, tenant) -> None:
    tid, ids = tenant
    job_id = submit(pool, settings, tid, ids[:1])["id"]
    claimed = claim(pool, job_id)
    shift_job(pool, job_id, created_at="-1 day")
    counts = scanner(settings, pool, store).run_once()
    assert sum(counts[k] for k in ("expired_requeued", "expired_failed", "expired_cancelled")) == 0
    row = job(pool, job_id)
    assert (row["status"], row["lease_token"], row["lease_expires_at"]) == (
        "running",
        claimed.lease_token,
        claimed.lease_expires_at,
    )


def test_expired_lease_with_cancel_request_is_cancelled(pool, settings, store, tenant) -> None:
    tid, ids = tenant
    job_id = submit(pool, settings, tid, ids[:1])["id"]
    claim(pool, job_id)
    with pool.connection() as conn:
        conn.execute("UPDATE export_jobs SET cancel_requested = true WHERE id = %s", (job_id,))
    expire(pool, job_id)
    assert scanner(settings, pool, store).run_once()["expired_cancelled"] == 1
    assert job(pool, job_id)["status"] == "cancelled"
    assert kinds(pool, job_id)[-2:] == ["lease_expired", "cancelled"]


def test_three_lease_expiries_end_failed_with_a_dead_letter_and_no_fourth_claim(
    pool, settings, store, tenant
) -> None:
    tid, ids = tenant
    job_id = submit(pool, settings, tid, ids[:1])["id"]
    scan = scanner(settings, pool, store)
    for attempt in (1, 2, 3):
        shift_job(pool, job_id, next_attempt_at="-1 hour")
        assert claim(pool, job_id).attempts == attempt
        expire(pool, job_id)
        scan.run_once()
    dead = assert_attempts_exhausted(pool, job_id, attempts=3)
    assert dead["reason"] == "attempts_exhausted" and dead["attempts"] == 3
    assert "lease_expired" in dead["detail"]
    shift_job(pool, job_id, next_attempt_at="-1 hour")
    assert claim(pool, job_id) is None
    assert kinds(pool, job_id)[-3:] == ["lease_expired", "failed", "dead_lettered"]


def test_expired_lease_past_deadline_fails(pool, settings, store, tenant) -> None:
    tid, ids = tenant
    job_id = submit(pool, settings, tid, ids[:1])["id"]
    claim(pool, job_id)
    shift_job(pool, job_id, lease_expires_at="-2 hours", deadline_at="-2 hours")
    assert scanner(settings, pool, store).run_once()["expired_failed"] == 1
    row = job(pool, job_id)
    assert (row["status"], row["error_code"]) == ("failed", "deadline_exceeded")


def test_queued_with_cancel_request_is_cancelled(pool, settings, store, tenant) -> None:
    tid, ids = tenant
    job_id = submit(pool, settings, tid, ids[:1])["id"]
    with pool.connection() as conn:
        conn.execute("UPDATE export_jobs SET cancel_requested = true WHERE id = %s", (job_id,))
    assert scanner(settings, pool, store).run_once()["queued_cancelled"] == 1
    assert job(pool, job_id)["status"] == "cancelled"
    assert kinds(pool, job_id)[-1] == "cancelled"


def test_queued_past_deadline_or_out_of_attempts_fails_with_dead_letter(
    pool, settings, store, tenant
) -> None:
    tid, ids = tenant
    late = submit(pool, settings, tid, ids[:1])["id"]
    shift_job(pool, late, deadline_at="-2 hours")
    spent = submit(pool, settings, tid, ids[:1])["id"]
    with pool.connection() as conn:
        conn.execute("UPDATE export_jobs SET attempts = max_attempts WHERE id = %s", (spent,))
    assert scanner(settings, pool, store).run_once()["queued_failed"] == 2
    assert (job(pool, late)["error_code"], job(pool, spent)["error_code"]) == (
        "deadline_exceeded",
        "attempts_exhausted",
    )
    assert count(pool, "SELECT count(*) FROM export_dead_letters") == 2


def _mark_sent_long_ago(pool, job_id) -> None:
    """The publisher sent the message and the broker lost it: sent, but never claimed."""
    with pool.connection() as conn:
        conn.execute(
            "UPDATE export_outbox SET sent_at = now() - interval '10 minutes' WHERE job_id = %s",
            (job_id,),
        )
        conn.execute(
            "UPDATE export_jobs SET last_dispatched_at = now() - interval '10 minutes', dispatch_count = 1,"
            " created_at = now() - interval '10 minutes' WHERE id = %s",
            (job_id,),
        )


def test_sent_but_never_claimed_is_redispatched_once_not_once_per_scan(
    pool, settings, store, tenant
) -> None:
    tid, ids = tenant
    job_id = submit(pool, settings, tid, ids[:1])["id"]
    _mark_sent_long_ago(pool, job_id)
    scan = scanner(settings, pool, store)
    assert scan.run_once()["redispatched"] == 1
    assert scan.run_once()["redispatched"] == 0  # the new event is still pending
    assert scan.run_once()["redispatched"] == 0
    with pool.connection() as conn:
        pending = conn.execute(
            "SELECT reason FROM export_outbox WHERE job_id = %s AND sent_at IS NULL", (job_id,)
        ).fetchall()
    assert [p["reason"] for p in pending] == ["redispatch"]
    row = job(pool, job_id)
    assert row["attempts"] == 0 and row["status"] == "queued"
    assert kinds(pool, job_id)[-1] == "redispatched"


def test_recently_dispatched_or_not_due_jobs_are_not_redispatched(
    pool, settings, store, tenant
) -> None:
    tid, ids = tenant
    fresh = submit(pool, settings, tid, ids[:1])["id"]
    with pool.connection() as conn:
        conn.execute("UPDATE export_outbox SET sent_at = now() WHERE job_id = %s", (fresh,))
    later = submit(pool, settings, tid, ids[:1])["id"]
    _mark_sent_long_ago(pool, later)
    shift_job(pool, later, next_attempt_at="+1 hour")
    assert scanner(settings, pool, store).run_once()["redispatched"] == 0


def test_the_dispatch_threshold_doubles_with_each_dispatch(pool, settings, store, tenant) -> None:
    tid, ids = tenant
    job_id = submit(pool, settings, tid, ids[:1])["id"]
    with pool.connection() as conn:
        conn.execute("UPDATE export_outbox SET sent_at = now() WHERE job_id = %s", (job_id,))
        # dispatched 3 times already: the threshold is 60 s * 4 = 240 s
        conn.execute(
            "UPDATE export_jobs SET dispatch_count = 3, last_dispatched_at = now() - interval '200 seconds'"
            " WHERE id = %s",
            (job_id,),
        )
    scan = scanner(settings, pool, store)
    assert scan.run_once()["redispatched"] == 0
    shift_job(pool, job_id, last_dispatched_at="-60 seconds")
    assert scan.run_once()["redispatched"] == 1


def test_two_scanners_at_once_act_on_each_job_once(pool, settings, store, tenant) -> None:
    tid, ids = tenant
    jobs = [submit(pool, settings, tid, ids[:1])["id"] for _ in range(40)]
    for job_id in jobs:
        claim(pool, job_id)
        expire(pool, job_id)
    small = settings.model_copy(update={"scanner_batch_size": 7})
    scanners = [scanner(small, pool, store) for _ in range(2)]
    barrier = threading.Barrier(2)
    totals: list[int] = []

    def drain(s: RecoveryScanner) -> None:
        barrier.wait()
        n = 0
        while got := s.recover_expired_leases()["expired_requeued"]:
            n += got
        totals.append(n)

    threads = [threading.Thread(target=drain, args=(s,)) for s in scanners]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(totals) == len(jobs)
    assert count(pool, "SELECT count(*) FROM export_outbox WHERE reason = 'recovery'") == len(jobs)
    assert count(
        pool, "SELECT count(*) FROM export_job_events WHERE kind = 'lease_expired'"
    ) == len(jobs)


def _write(
    store: FileArtifactStore, key: str, data: bytes = b"x", age_hours: float = 2, temp: bool = False
) -> Path:
    path = store.root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    if temp:
        path = path.with_name(path.name + ".tmp")
    path.write_bytes(data)
    old = (datetime.now(UTC) - timedelta(hours=age_hours)).timestamp()
    import os

    os.utime(path, (old, old))
    return path


def test_orphan_artifacts_are_deleted_and_the_winner_kept(pool, settings, store, tenant) -> None:
    tid, ids = tenant
    done = submit(pool, settings, tid, ids[:2])["id"]
    JobRunner(settings, pool, store).run(done, uuid4())
    winner = job(pool, done)["result_ref"]
    loser = _write(store, artifact_key(tid, done, uuid4(), "json"))
    crashed_tmp = _write(store, artifact_key(tid, done, uuid4(), "json"), temp=True)
    gone_job = _write(store, artifact_key(tid, uuid4(), uuid4(), "json"))
    running = submit(pool, settings, tid, ids[:1])["id"]
    lease = claim(pool, running).lease_token
    current_tmp = _write(store, artifact_key(tid, running, lease, "json"), temp=True)
    young_loser = _write(store, artifact_key(tid, done, uuid4(), "json"), age_hours=0)
    os_winner = store.root / winner
    old = (datetime.now(UTC) - timedelta(hours=2)).timestamp()
    import os

    os.utime(os_winner, (old, old))

    deleted = scanner(settings, pool, store).delete_orphans()
    assert deleted == 3
    assert not loser.exists() and not crashed_tmp.exists() and not gone_job.exists()
    assert os_winner.exists() and current_tmp.exists() and young_loser.exists()


def test_retention_prunes_old_terminal_jobs_their_files_and_sent_outbox(
    pool, settings, store, tenant
) -> None:
    tid, ids = tenant
    old = submit(pool, settings, tid, ids[:1])["id"]
    JobRunner(settings, pool, store).run(old, uuid4())
    recent = submit(pool, settings, tid, ids[:1])["id"]
    JobRunner(settings, pool, store).run(recent, uuid4())
    old_file = store.root / job(pool, old)["result_ref"]
    with pool.connection() as conn:
        conn.execute(
            "UPDATE export_jobs SET finished_at = now() - interval '31 days' WHERE id = %s", (old,)
        )
        conn.execute(
            "UPDATE export_outbox SET sent_at = now() - interval '2 days' WHERE job_id = %s",
            (recent,),
        )
    with pool.connection() as conn:
        conn.execute(
            "INSERT INTO export_idempotency_keys (tenant_id, key, request_hash, job_id, expires_at)"
            " VALUES (%s, 'old-key', 'h', %s, now() - interval '1 hour')",
            (tid, recent),
        )
    counts = scanner(settings, pool, store).hygiene()
    assert counts["jobs_pruned"] == 1 and counts["outbox_pruned"] == 1
    assert counts["idempotency_keys_pruned"] == 1
    assert count(pool, "SELECT count(*) FROM export_jobs WHERE id = %s", old) == 0
    assert count(pool, "SELECT count(*) FROM export_job_events WHERE job_id = %s", old) == 0
    assert count(pool, "SELECT count(*) FROM export_job_items WHERE job_id = %s", old) == 0
    assert not old_file.exists()
    assert job(pool, recent)["status"] == "succeeded"
