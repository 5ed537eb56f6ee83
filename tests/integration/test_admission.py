"""Admission control and idempotency keys at the library level, on real PostgreSQL."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from uuid import uuid4

import psycopg
import pytest

from exportcore import faults
from exportcore.admission import CapacityExceeded, QuotaExceeded, admission_usage
from exportcore.artifacts import FileArtifactStore
from exportcore.domain import ExportFormat, ExportRequest, IdempotencyConflict
from exportcore.replays import replay_export
from exportcore.runner import JobRunner
from exportcore.settings import Settings
from exportcore.store.tenants import tenant_set_quota
from exportcore.submit import submit_export
from tests.support import count, tenant_with_notes

TABLES = (
    "export_jobs",
    "export_outbox",
    "export_job_events",
    "export_job_items",
    "export_idempotency_keys",
)


def request(ids: list[int], fmt: str = "json") -> ExportRequest:
    return ExportRequest.build(ExportFormat(fmt), ids, False)


def race(n: int, fn) -> tuple[list, list[Exception]]:
    """Run ``fn`` from ``n`` threads released at once; returns (results, errors)."""
    barrier = threading.Barrier(n)
    results, errors, lock = [], [], threading.Lock()

    def run() -> None:
        barrier.wait()
        try:
            value = fn()
        except Exception as exc:
            with lock:
                errors.append(exc)
        else:
            with lock:
                results.append(value)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, errors


def rows_per_table(pool) -> dict[str, int]:
    return {t: count(pool, f"SELECT count(*) FROM {t}") for t in TABLES}


def test_200_concurrent_submits_against_capacity_50(pool, settings: Settings, tenant) -> None:
    tid, ids = tenant
    limited = settings.model_copy(update={"admission_capacity": 50})
    results, errors = race(
        200, lambda: submit_export(pool, limited, tenant_id=tid, request=request(ids[:2]))
    )
    assert len(results) == 50 and len(errors) == 150
    assert all(
        isinstance(e, CapacityExceeded) and e.retry_after == settings.admission_retry_after_seconds
        for e in errors
    )
    # no orphan rows: exactly the accepted jobs and what belongs to them
    assert rows_per_table(pool) == {
        "export_jobs": 50,
        "export_outbox": 50,
        "export_job_events": 50,
        "export_job_items": 100,
        "export_idempotency_keys": 0,
    }
    with pool.connection() as conn:
        usage = admission_usage(conn, limited)
    assert (usage.active, usage.capacity, usage.tenants[tid][0]) == (50, 50, 50)

    # Jobs finishing frees capacity.
    with pytest.raises(CapacityExceeded):
        submit_export(pool, limited, tenant_id=tid, request=request(ids[:1]))
    runner = JobRunner(limited, pool, FileArtifactStore(settings.artifact_dir))
    for submitted in results:
        assert runner.run(submitted.job["id"], uuid4()).result == "succeeded"
    again = submit_export(pool, limited, tenant_id=tid, request=request(ids[:1]))
    assert again.job["status"] == "queued"


def test_tenant_quota_with_concurrent_submits_and_override(
    pool, settings: Settings, tenant, notes_dir
) -> None:
    tid, ids = tenant
    other, other_ids = tenant_with_notes(pool, notes_dir)
    quota = settings.model_copy(update={"tenant_active_quota": 10})
    results, errors = race(
        40, lambda: submit_export(pool, quota, tenant_id=tid, request=request(ids[:1]))
    )
    assert len(results) == 10 and len(errors) == 30
    assert all(isinstance(e, QuotaExceeded) for e in errors)
    assert count(pool, "SELECT count(*) FROM export_jobs WHERE tenant_id = %s", tid) == 10
    # another tenant is not affected by this tenant's quota
    assert submit_export(pool, quota, tenant_id=other, request=request(other_ids[:1])).job
    # a per-tenant override
    with pool.connection() as conn:
        tenant_set_quota(conn, tenant_id=tid, quota=12)
    for _ in range(2):
        submit_export(pool, quota, tenant_id=tid, request=request(ids[:1]))
    with pytest.raises(QuotaExceeded):
        submit_export(pool, quota, tenant_id=tid, request=request(ids[:1]))
    with pool.connection() as conn:
        assert admission_usage(conn, quota).tenants[tid] == (12, 12)


def test_replay_passes_the_same_admission(
    pool, settings: Settings, tenant, tmp_path, monkeypatch
) -> None:
    from exportcore import faults

    tid, ids = tenant
    fault_file = tmp_path / "faults.json"
    monkeypatch.setenv(faults.ENV, str(fault_file))
    faults.arm(fault_file, "render.chunk", "permanent")
    failed = submit_export(pool, settings, tenant_id=tid, request=request(ids[:1])).job["id"]
    JobRunner(settings, pool, FileArtifactStore(settings.artifact_dir)).run(failed, uuid4())
    submit_export(pool, settings, tenant_id=tid, request=request(ids[:1]))  # one active job
    full = settings.model_copy(update={"admission_capacity": 1})
    with pytest.raises(CapacityExceeded):
        replay_export(pool, full, original_id=failed)
    assert count(pool, "SELECT count(*) FROM export_jobs WHERE replay_of = %s", failed) == 0


def test_idempotency_same_key_same_request_returns_the_original(
    pool, settings: Settings, tenant
) -> None:
    tid, ids = tenant
    first = submit_export(
        pool, settings, tenant_id=tid, request=request([ids[1], ids[0]]), idempotency_key="k-1"
    )
    again = submit_export(
        pool,
        settings,
        tenant_id=tid,
        request=request([ids[0], ids[1], ids[0]]),
        idempotency_key="k-1",
    )
    assert not first.replayed and again.replayed and again.job["id"] == first.job["id"]
    with pytest.raises(IdempotencyConflict):
        submit_export(
            pool, settings, tenant_id=tid, request=request([ids[0]]), idempotency_key="k-1"
        )
    with pytest.raises(IdempotencyConflict):
        submit_export(
            pool, settings, tenant_id=tid, request=request(ids[:2], "ndjson"), idempotency_key="k-1"
        )
    assert count(pool, "SELECT count(*) FROM export_jobs") == 1


def test_idempotency_keys_are_per_tenant_and_expire(
    pool, settings: Settings, tenant, notes_dir
) -> None:
    tid, ids = tenant
    other, other_ids = tenant_with_notes(pool, notes_dir)
    mine = submit_export(
        pool, settings, tenant_id=tid, request=request(ids[:1]), idempotency_key="shared"
    )
    theirs = submit_export(
        pool, settings, tenant_id=other, request=request(other_ids[:1]), idempotency_key="shared"
    )
    assert mine.job["id"] != theirs.job["id"] and not theirs.replayed
    with pool.connection() as conn:
        conn.execute(
            "UPDATE export_idempotency_keys SET expires_at = now() - interval '1 second' WHERE tenant_id = %s",
            (tid,),
        )
    fresh = submit_export(
        pool, settings, tenant_id=tid, request=request(ids[:1]), idempotency_key="shared"
    )
    assert not fresh.replayed and fresh.job["id"] != mine.job["id"]


def test_concurrent_requests_with_one_new_key_create_one_job(
    pool, settings: Settings, tenant
) -> None:
    tid, ids = tenant
    results, errors = race(
        20,
        lambda: submit_export(
            pool, settings, tenant_id=tid, request=request(ids[:3]), idempotency_key="burst"
        ),
    )
    assert errors == []
    assert len({r.job["id"] for r in results}) == 1
    assert sum(not r.replayed for r in results) == 1
    assert count(pool, "SELECT count(*) FROM export_jobs") == 1


def test_a_refused_submit_does_not_burn_its_idempotency_key(
    pool, settings: Settings, tenant
) -> None:
    tid, ids = tenant
    full = settings.model_copy(update={"admission_capacity": 0})
    with pytest.raises(CapacityExceeded):
        submit_export(pool, full, tenant_id=tid, request=request(ids[:1]), idempotency_key="later")
    assert count(pool, "SELECT count(*) FROM export_idempotency_keys") == 0
    ok = submit_export(
        pool, settings, tenant_id=tid, request=request(ids[:1]), idempotency_key="later"
    )
    assert not ok.replayed


def test_a_submit_failing_right_before_commit_leaves_nothing(
    pool, settings: Settings, tenant, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tid, ids = tenant
    fault_file = tmp_path / "faults.json"
    monkeypatch.setenv(faults.ENV, str(fault_file))
    faults.arm(fault_file, "submit.before_commit", "db", times=1)
    with pytest.raises(psycopg.OperationalError):
        submit_export(pool, settings, tenant_id=tid, request=request(ids[:2]), idempotency_key="k1")
    assert faults.hits(fault_file, "submit.before_commit")[0]["pid"] == os.getpid()
    assert all(count(pool, f"SELECT count(*) FROM {t}") == 0 for t in TABLES)
    again = submit_export(
        pool, settings, tenant_id=tid, request=request(ids[:2]), idempotency_key="k1"
    )
    assert not again.replayed
    assert [count(pool, f"SELECT count(*) FROM {t}") for t in TABLES[:2]] == [1, 1]
