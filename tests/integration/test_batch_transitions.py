"""The batched transitions of ``sql/jobs.sql`` against real PostgreSQL: every guard of every
``job_*_many`` statement, with several rows in ONE statement, so that a refused row never
changes, never writes history, and never affects its neighbours."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID, uuid4

from exportcore.retry import Decision
from exportcore.store import jobs as job_store
from exportcore.store.jobs import Fail, Finish, JobRow, Requeue
from exportcore.transitions import settle
from tests.support import count, events, job, shift_job, submit

GUARDS = ("wrong_token", "expired_lease", "past_deadline", "cancel_requested", "terminal")


def claimed_jobs(pool, settings, tenant, n: int) -> list[JobRow]:
    """``n`` small jobs claimed together by one statement."""
    tid, ids = tenant
    job_ids = [submit(pool, settings, tid, ids[i : i + 2])["id"] for i in range(n)]
    with pool.connection() as conn:
        rows = job_store.job_claim_many(
            conn, job_ids=job_ids, message_ids=[uuid4() for _ in job_ids], lease_seconds=30
        )
    assert sorted(r.id for r in rows) == sorted(job_ids)
    return sorted(rows, key=lambda r: job_ids.index(r.id))


def break_guard(pool, row: JobRow, guard: str) -> UUID:
    """Make ``guard`` refuse ``row``'s lease holder; returns the token the caller should
    present (a wrong one for ``wrong_token``, the holder's own otherwise)."""
    if guard == "wrong_token":
        return uuid4()
    if guard == "expired_lease":
        shift_job(pool, row.id, lease_expires_at="-1 hour")
    elif guard == "past_deadline":
        shift_job(pool, row.id, deadline_at="-2 hours")
    elif guard == "cancel_requested":
        with pool.connection() as conn:
            conn.execute("UPDATE export_jobs SET cancel_requested = true WHERE id = %s", (row.id,))
    elif guard == "terminal":
        with pool.connection() as conn:
            won = job_store.job_finish_if_leased(
                conn,
                job_id=row.id,
                lease_token=row.token,
                result_ref="first",
                sha256="a",
                nbytes=1,
                rows=2,
            )
        assert won is not None
    else:
        raise AssertionError(guard)
    return row.token


def snapshot(pool, job_id: UUID) -> tuple[dict[str, Any], int, int, int]:
    """The row, its history length, its outbox events and its dead letters."""
    return (
        job(pool, job_id),
        len(events(pool, job_id)),
        count(pool, "SELECT count(*) FROM export_outbox WHERE job_id = %s", job_id),
        count(pool, "SELECT count(*) FROM export_dead_letters WHERE job_id = %s", job_id),
    )


def run_with_guards(
    pool,
    settings,
    tenant,
    apply: Callable[[Any, list[tuple[JobRow, UUID]]], list[JobRow]],
    guards: tuple[str, ...] = GUARDS,
) -> tuple[list[JobRow], list[JobRow]]:
    """Two valid rows and one row per guard, in ONE statement; checks that every refused row
    is exactly as before. Returns (the valid rows, what the statement returned)."""
    rows = claimed_jobs(pool, settings, tenant, len(guards) + 2)
    valid, guarded = rows[:2], rows[2:]
    tokens = {r.id: r.token for r in valid}
    for row, guard in zip(guarded, guards, strict=True):
        tokens[row.id] = break_guard(pool, row, guard)
    before = {r.id: snapshot(pool, r.id) for r in guarded}
    with pool.connection() as conn:
        changed = apply(conn, [(r, tokens[r.id]) for r in rows])
    assert sorted(r.id for r in changed) == sorted(r.id for r in valid)
    for r in guarded:
        assert snapshot(pool, r.id) == before[r.id], f"a refused row changed: {r.id}"
    return valid, changed


def test_finish_many_is_a_compare_and_set_per_row(pool, settings, tenant) -> None:
    def apply(conn, leases):
        return job_store.job_finish_if_leased_many(
            conn,
            [Finish(r.id, token, f"ref-{r.id}", "sha", 10, 2, None) for r, token in leases],
        )

    valid, changed = run_with_guards(pool, settings, tenant, apply)
    for row in valid:
        current = job(pool, row.id)
        assert (current["status"], current["result_ref"]) == ("succeeded", f"ref-{row.id}")
        assert [e["kind"] for e in events(pool, row.id)][-1] == "succeeded"
    assert all(r.status == "succeeded" and r.finished_at is not None for r in changed)


def test_requeue_many_by_the_holder(pool, settings, tenant) -> None:
    """Every guard but the lease expiry: a holder whose lease ran out may still put its job
    back (recovery would do the same; once recovery acted, the job is no longer running)."""

    def apply(conn, leases):
        return job_store.job_requeue_if_leased_many(
            conn,
            [Requeue(r.id, token, uuid4(), 5.0, "storage_unavailable", "x") for r, token in leases],
            margin_seconds=1.0,
        )

    guards = ("wrong_token", "past_deadline", "cancel_requested", "terminal")
    valid, changed = run_with_guards(pool, settings, tenant, apply, guards)
    for row in valid:
        current = job(pool, row.id)
        assert current["status"] == "queued" and current["attempts"] == 1
        assert [e["kind"] for e in events(pool, row.id)][-1] == "retried"
        assert (
            count(
                pool,
                "SELECT count(*) FROM export_outbox WHERE job_id = %s AND reason = 'retry'",
                row.id,
            )
            == 1
        )
    assert all(r.status == "queued" for r in changed)


def test_fail_many_by_the_holder(pool, settings, tenant) -> None:
    """The holder's fail has no lease-expiry or deadline guard (a permanent error or a
    passed deadline is exactly when it fails a job); it still needs the token and a running
    job, and a cancel wins over it through settle (see below)."""
    rows = claimed_jobs(pool, settings, tenant, 4)
    shift_job(pool, rows[1].id, lease_expires_at="-1 hour")  # still the holder's to fail
    with pool.connection() as conn:
        job_store.job_finish_if_leased(
            conn,
            job_id=rows[3].id,
            lease_token=rows[3].token,
            result_ref="r",
            sha256="s",
            nbytes=1,
            rows=2,
        )
        before = [snapshot(pool, r.id) for r in rows[2:]]
        failed = job_store.job_fail_if_leased_many(
            conn,
            [
                Fail(rows[0].id, rows[0].token, "invalid_snapshot", "x"),
                Fail(rows[1].id, rows[1].token, "invalid_snapshot", "x"),
                Fail(rows[2].id, uuid4(), "invalid_snapshot", "x"),  # wrong token
                Fail(rows[3].id, rows[3].token, "invalid_snapshot", "x"),  # terminal
            ],
        )
    assert sorted(r.id for r in failed) == sorted([rows[0].id, rows[1].id])
    assert [snapshot(pool, r.id) for r in rows[2:]] == before
    for r in rows[:2]:
        assert [e["kind"] for e in events(pool, r.id)][-2:] == ["failed", "dead_lettered"]
        assert count(pool, "SELECT count(*) FROM export_dead_letters WHERE job_id = %s", r.id) == 1


def test_expired_only_transitions_refuse_a_valid_lease(pool, settings, tenant) -> None:
    """The recovery-scanner's mode: only rows whose lease HAS expired move, in one batch."""
    rows = claimed_jobs(pool, settings, tenant, 6)
    for r in rows[::2]:
        shift_job(pool, r.id, lease_expires_at="-1 hour")
    with pool.connection() as conn:
        conn.execute(
            "UPDATE export_jobs SET cancel_requested = true WHERE id = ANY(%s)",
            ([rows[2].id, rows[3].id],),
        )
        cancelled = job_store.job_cancel_if_leased_many(
            conn, [(r.id, r.token) for r in rows], expired_only=True
        )
        requeued = job_store.job_requeue_if_leased_many(
            conn,
            [Requeue(r.id, r.token, uuid4(), 1.0, "lease_expired", "x") for r in rows],
            margin_seconds=1.0,
            expired_only=True,
        )
        failed = job_store.job_fail_if_leased_many(
            conn, [Fail(r.id, r.token, "lease_expired", "x") for r in rows], expired_only=True
        )
    assert [r.id for r in cancelled] == [rows[2].id]  # expired AND cancel requested
    assert sorted(r.id for r in requeued) == sorted([rows[0].id, rows[4].id])
    assert failed == []  # every expired row was settled already; the valid leases untouched
    for r in rows[1::2]:
        assert job(pool, r.id)["status"] == "running"
    assert [e["kind"] for e in events(pool, rows[2].id)][-2:] == ["lease_expired", "cancelled"]


def test_cancel_many_only_matches_a_requested_cancel(pool, settings, tenant) -> None:
    rows = claimed_jobs(pool, settings, tenant, 4)
    with pool.connection() as conn:
        conn.execute(
            "UPDATE export_jobs SET cancel_requested = true WHERE id = ANY(%s)",
            ([rows[0].id, rows[1].id, rows[2].id],),
        )
        cancelled = job_store.job_cancel_if_leased_many(
            conn,
            [
                (rows[0].id, rows[0].token),
                (rows[1].id, uuid4()),
                (rows[2].id, rows[2].token),
                (rows[3].id, rows[3].token),
            ],
        )
    assert sorted(r.id for r in cancelled) == sorted([rows[0].id, rows[2].id])
    assert job(pool, rows[1].id)["status"] == "running"  # wrong token
    assert job(pool, rows[3].id)["status"] == "running"  # no cancel requested


def test_claim_many_guards_per_row(pool, settings, tenant) -> None:
    """One claim statement over jobs that are due, not due, cancelled, past deadline, out of
    attempts, already leased and terminal: only the due ones are claimed, each with its own
    message id in its history, and no refused one consumes an attempt."""
    tid, ids = tenant
    make = [submit(pool, settings, tid, ids[i : i + 1])["id"] for i in range(8)]
    due_a, due_b, not_due, cancelled, late, exhausted, leased, terminal = make
    shift_job(pool, not_due, next_attempt_at="+1 hour")
    shift_job(pool, late, deadline_at="-2 hours")
    with pool.connection() as conn:
        conn.execute("UPDATE export_jobs SET cancel_requested = true WHERE id = %s", (cancelled,))
        conn.execute("UPDATE export_jobs SET attempts = max_attempts WHERE id = %s", (exhausted,))
        holder = job_store.job_claim(conn, job_id=leased, message_id=uuid4(), lease_seconds=30)
        done = job_store.job_claim(conn, job_id=terminal, message_id=uuid4(), lease_seconds=30)
        assert holder is not None and done is not None
        job_store.job_finish_if_leased(
            conn,
            job_id=terminal,
            lease_token=done.token,
            result_ref="r",
            sha256="s",
            nbytes=1,
            rows=1,
        )
    before = {j: job(pool, j)["attempts"] for j in make}
    messages = {j: uuid4() for j in make}
    with pool.connection() as conn:
        rows = job_store.job_claim_many(
            conn, job_ids=make, message_ids=[messages[j] for j in make], lease_seconds=30
        )
        refusals = job_store.job_claim_refusal_many(conn, job_ids=make[2:])
    assert sorted(r.id for r in rows) == sorted([due_a, due_b])
    assert len({r.lease_token for r in rows}) == 2
    for r in rows:
        claimed = [e for e in events(pool, r.id) if e["kind"] == "claimed"]
        assert [e["message_id"] for e in claimed] == [messages[r.id]]
    for j in make[2:]:
        assert job(pool, j)["attempts"] == before[j]
    assert job(pool, leased)["lease_token"] == holder.lease_token
    assert set(refusals) == set(make[2:])


def test_claim_many_with_a_duplicate_job_claims_it_once(pool, settings, tenant) -> None:
    tid, ids = tenant
    job_id = submit(pool, settings, tid, ids[:1])["id"]
    with pool.connection() as conn:
        rows = job_store.job_claim_many(
            conn, job_ids=[job_id, job_id], message_ids=[uuid4(), uuid4()], lease_seconds=30
        )
    assert [r.id for r in rows] == [job_id]
    assert [e["kind"] for e in events(pool, job_id)].count("claimed") == 1
    assert job(pool, job_id)["attempts"] == 1


def test_settle_applies_each_decision_to_its_own_row(pool, settings, tenant) -> None:
    """The one transition layer: retry, fail and cancel decisions for one batch, with a
    retry refused for lack of attempts turning into a fail, a cancel winning over a fail,
    and a lost lease reported as such."""
    rows = claimed_jobs(pool, settings, tenant, 5)
    retry, out_of_attempts, fail, cancel_wins, lost = rows
    with pool.connection() as conn:
        conn.execute("UPDATE export_jobs SET max_attempts = 1 WHERE id = %s", (out_of_attempts.id,))
        conn.execute(
            "UPDATE export_jobs SET cancel_requested = true WHERE id = %s", (cancel_wins.id,)
        )
        conn.execute(
            "UPDATE export_jobs SET lease_token = gen_random_uuid() WHERE id = %s", (lost.id,)
        )
        ends = settle(
            conn,
            [
                (retry, Decision("retry", "storage_unavailable", "x", delay=3.0)),
                (out_of_attempts, Decision("retry", "storage_unavailable", "x", delay=3.0)),
                (fail, Decision("fail", "invalid_snapshot", "x")),
                (cancel_wins, Decision("fail", "invalid_snapshot", "x")),
                (lost, Decision("fail", "invalid_snapshot", "x")),
            ],
            margin_seconds=1.0,
        )
    assert [e.result for e in ends] == ["retry", "failed", "failed", "cancelled", "lease_lost"]
    assert ends[1].decision.action == "fail"
    statuses = [job(pool, r.id)["status"] for r in rows]
    assert statuses == ["queued", "failed", "failed", "cancelled", "running"]
