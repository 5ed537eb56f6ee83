"""The admission counters (migration 0008) against real PostgreSQL: kept exact by the
transitions themselves, repaired by the recovery-scanner's reconciliation after writes that
bypass admission, and never letting concurrent submits past the capacity."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from uuid import uuid4

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from exportcore.admission import AdmissionRefused
from exportcore.artifacts import FileArtifactStore
from exportcore.cancel import request_cancel
from exportcore.domain import ExportFormat, ExportRequest
from exportcore.recovery import RecoveryScanner
from exportcore.runner import JobRunner
from exportcore.settings import Settings
from exportcore.store import admission as admission_store
from exportcore.store import jobs as job_store
from exportcore.store.tenants import tenant_set_quota
from exportcore.submit import submit_export
from tests.support import count, create_tenant, tenant_with_notes

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.integers(0, 2)),
        st.tuples(st.just("claim"), st.integers(0, 50)),
        st.tuples(st.just("finish"), st.integers(0, 50)),
        st.tuples(st.just("cancel"), st.integers(0, 50)),
        st.tuples(st.just("expire_and_recover"), st.integers(0, 50)),
        st.tuples(st.just("write_around_admission"), st.integers(0, 2)),
        st.tuples(st.just("delete_around_admission"), st.integers(0, 50)),
        st.just(("reconcile", 0)),
    ),
    min_size=1,
    max_size=25,
)


def actual(pool) -> dict[str, int]:
    """Active jobs per scope from the rows ('*' = all)."""
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT tenant_id, count(*) AS n FROM export_jobs"
            " WHERE status IN ('queued', 'running') GROUP BY tenant_id"
        ).fetchall()
    per = {r["tenant_id"]: int(r["n"]) for r in rows}
    return {"*": sum(per.values()), **per}


def counted(pool) -> dict[str, int]:
    """Active jobs per scope as the counters say, scopes at zero left out."""
    with pool.connection() as conn:
        return {k: v for k, v in admission_store.admission_counters(conn).items() if v}


def nonzero(d: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in d.items() if v}


def reset(pool) -> None:
    with pool.connection() as conn:
        conn.execute(
            "TRUNCATE export_jobs, export_admission_counters, export_admission_releases CASCADE"
        )


@pytest.fixture
def world(pool, settings: Settings, notes_dir: Path):
    tenants = [tenant_with_notes(pool, notes_dir) for _ in range(3)]
    limited = settings.model_copy(update={"admission_capacity": 6, "tenant_active_quota": 3})
    return tenants, limited


@hsettings(
    max_examples=25,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=OPS)
def test_counters_agree_with_the_rows_after_any_interleaving(pool, world, ops) -> None:
    """Submits (refused when full), claims, finishes, cancels, lease expiries recovered by
    the scanner, and writes that bypass admission, in any order: the counters match the rows
    whenever nothing bypassed admission, always after the scanner's reconciliation, and
    admission never lets the rows exceed the capacity or a quota."""
    tenants, s = world
    reset(pool)
    store = FileArtifactStore(s.artifact_dir)
    runner = JobRunner(s, pool, store)
    scanner = RecoveryScanner(s, pool, store)
    bypassed, written_around = False, 0
    for op, arg in ops:
        with pool.connection() as conn:
            queued = [
                r["id"]
                for r in conn.execute(
                    "SELECT id FROM export_jobs WHERE status = 'queued' ORDER BY id"
                )
            ]
            running = conn.execute(
                "SELECT id, lease_token FROM export_jobs WHERE status = 'running' ORDER BY id"
            ).fetchall()
        if op == "submit":
            tid, ids = tenants[arg]
            with contextlib.suppress(AdmissionRefused):
                submit_export(
                    pool,
                    s,
                    tenant_id=tid,
                    request=ExportRequest.build(ExportFormat.JSON, ids[:2], False),
                )
        elif op == "claim" and queued:
            with pool.connection() as conn:
                job_store.job_claim(
                    conn, job_id=queued[arg % len(queued)], message_id=uuid4(), lease_seconds=30
                )
        elif op == "finish" and (queued or running):
            target = (queued + [r["id"] for r in running])[arg % (len(queued) + len(running))]
            runner.run(target, uuid4())  # runs a queued one; a running one is refused
        elif op == "cancel" and (queued or running):
            target = (queued + [r["id"] for r in running])[arg % (len(queued) + len(running))]
            with pool.connection() as conn:
                tid = conn.execute(
                    "SELECT tenant_id FROM export_jobs WHERE id = %s", (target,)
                ).fetchone()["tenant_id"]
            request_cancel(pool, tenant_id=tid, job_id=target)
            scanner.cancel_queued()
        elif op == "expire_and_recover" and running:
            target = running[arg % len(running)]["id"]
            with pool.connection() as conn:
                conn.execute(
                    "UPDATE export_jobs SET lease_expires_at = now() - interval '1 s',"
                    " attempts = CASE WHEN %s THEN max_attempts ELSE attempts END WHERE id = %s",
                    (arg % 2 == 0, target),
                )
            scanner.recover_expired_leases()  # requeued, or failed when out of attempts
        elif op == "write_around_admission":
            tid, _ = tenants[arg]
            with pool.connection() as conn:  # manual SQL: a queued job admission never saw
                conn.execute(
                    "INSERT INTO export_jobs (id, tenant_id, status, queue, format, payload,"
                    " note_count, request_hash, max_attempts, deadline_at)"
                    " VALUES (%s, %s, 'queued', 'exports.fast', 'json', '{}', 0, 'h', 3,"
                    " now() + interval '1 hour')",
                    (uuid4(), tid),
                )
            bypassed, written_around = True, written_around + 1
        elif op == "delete_around_admission" and queued:
            with pool.connection() as conn:  # an operator deleting a queued job by hand
                conn.execute("DELETE FROM export_jobs WHERE id = %s", (queued[arg % len(queued)],))
        elif op == "reconcile":
            with pool.connection() as conn:
                admission_store.admission_reconcile(conn)
            bypassed = False
        rows = actual(pool)
        if not bypassed:
            assert counted(pool) == nonzero(rows), f"after {op}"
        assert rows["*"] <= s.admission_capacity + written_around
        for tid, _ in tenants:
            assert rows.get(tid, 0) <= s.tenant_active_quota + written_around
    scanner._last_reconcile = None  # due now
    scanner.reconcile_admission()
    assert counted(pool) == nonzero(actual(pool))


def test_reconcile_corrects_a_scope_that_only_has_releases(pool, world) -> None:
    """A job written around admission (manual SQL) ends: its tenant then has a release and
    no counter row; the reconciliation corrects that scope too, so the tenant's next submit
    is counted (the interleaving property found it: write around, finish, reconcile,
    submit)."""
    tenants, s = world
    reset(pool)
    tid, ids = tenants[0]
    job_id = uuid4()
    with pool.connection() as conn:
        conn.execute(
            "INSERT INTO export_jobs (id, tenant_id, status, queue, format, payload,"
            " note_count, request_hash, max_attempts, deadline_at)"
            " VALUES (%s, %s, 'queued', 'exports.fast', 'json', '{}', 0, 'h', 3,"
            " now() + interval '1 hour')",
            (job_id, tid),
        )
    JobRunner(s, pool, FileArtifactStore(s.artifact_dir)).run(job_id, uuid4())
    with pool.connection() as conn:
        admission_store.admission_reconcile(conn)
    assert counted(pool) == {}
    request = ExportRequest.build(ExportFormat.JSON, ids[:1], False)
    submit_export(pool, s, tenant_id=tid, request=request)
    assert counted(pool) == nonzero(actual(pool)) == {"*": 1, tid: 1}


def test_concurrent_submits_and_finishes_never_exceed_capacity(
    pool, settings: Settings, notes_dir: Path
) -> None:
    """Capacity 10, full; then 20 clients keep submitting (retrying each refusal) while 10
    jobs finish (each release lets one more in) and a reconciliation runs: at no commit can
    the active jobs exceed 10 (a deferred trigger checks every insert), and once every
    finish is done exactly 10 more were accepted."""
    tid, ids = tenant_with_notes(pool, notes_dir)
    s = settings.model_copy(update={"admission_capacity": 10, "tenant_active_quota": 1000})
    req = ExportRequest.build(ExportFormat.JSON, ids[:2], False)
    first = [submit_export(pool, s, tenant_id=tid, request=req).job["id"] for _ in range(10)]
    with pytest.raises(AdmissionRefused):
        submit_export(pool, s, tenant_id=tid, request=req)
    with pool.connection() as conn:  # the database itself checks: never more than capacity
        conn.execute(
            """
            CREATE FUNCTION t_capacity_watch() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF (SELECT count(*) FROM export_jobs
                    WHERE status IN ('queued', 'running')) > 10 THEN
                    RAISE EXCEPTION 'capacity overshot';
                END IF;
                RETURN NULL;
            END $$;
            CREATE CONSTRAINT TRIGGER t_capacity_watch AFTER INSERT ON export_jobs
                DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION t_capacity_watch();
            """
        )
    runner = JobRunner(s, pool, FileArtifactStore(s.artifact_dir))
    barrier = threading.Barrier(31)
    finished = threading.Event()
    accepted: list[object] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def submitter() -> None:
        barrier.wait()
        while True:
            done = finished.is_set()  # read before trying: a last try after every release
            try:
                job = submit_export(pool, s, tenant_id=tid, request=req).job
            except AdmissionRefused:
                if done:
                    return
                continue
            except BaseException as exc:  # an overshoot would surface here
                with lock:
                    errors.append(exc)
                return
            with lock:
                accepted.append(job["id"])
            return

    def finisher(job_id: object) -> None:
        barrier.wait()
        assert runner.run(job_id, uuid4()).result == "succeeded"  # type: ignore[arg-type]

    def reconciler() -> None:
        barrier.wait()
        with pool.connection() as conn:
            admission_store.admission_reconcile(conn)

    submitters = [threading.Thread(target=submitter) for _ in range(20)]
    others = [threading.Thread(target=finisher, args=(j,)) for j in first]
    others.append(threading.Thread(target=reconciler))
    for t in [*submitters, *others]:
        t.start()
    for t in others:
        t.join()
    finished.set()
    for t in submitters:
        t.join()
    assert errors == []
    assert len(accepted) == 10
    assert (
        count(pool, "SELECT count(*) FROM export_jobs WHERE status IN ('queued', 'running')") <= 10
    )
    assert counted(pool) == nonzero(actual(pool))


def test_quota_override_and_the_cheap_refusal_write_nothing(
    pool, settings: Settings, notes_dir: Path
) -> None:
    tid, ids = tenant_with_notes(pool, notes_dir)
    other = create_tenant(pool)
    with pool.connection() as conn:
        tenant_set_quota(conn, tenant_id=tid, quota=2)
    req = ExportRequest.build(ExportFormat.JSON, ids[:3], False)
    for _ in range(2):
        submit_export(pool, settings, tenant_id=tid, request=req)
    before = count(pool, "SELECT count(*) FROM export_job_items")
    with pytest.raises(AdmissionRefused) as refused:
        submit_export(pool, settings, tenant_id=tid, request=req)
    assert refused.value.code == "quota_exceeded"
    assert count(pool, "SELECT count(*) FROM export_job_items") == before  # nothing copied
    assert counted(pool) == {"*": 2, tid: 2}
    assert other not in counted(pool)
