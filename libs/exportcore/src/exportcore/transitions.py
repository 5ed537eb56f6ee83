"""Applying a decision to leased jobs: the ONE place where retry / fail / cancel happen.

The worker (a failed attempt, a lost lease) and the recovery-scanner (an expired lease) both
come here with jobs they hold by lease token and a :class:`~exportcore.retry.Decision`
per job; the statements are the guarded batch transitions of ``sql/jobs.sql``:

1. ``retry`` → ``job_requeue_if_leased_many`` (durable backoff, new outbox event);
2. every job not requeued (no attempt or time left after all, a cancel arrived, or the
   decision was not a retry) → ``job_cancel_if_leased_many``, which only matches a job
   whose cancel was requested;
3. every job still not settled, unless its decision was ``cancel`` → ``job_fail_if_leased_many``
   (failed + dead letter).

A job none of them matched lost its lease to someone else (``lease_lost``): recovery owns
it. Each step is one statement for the whole batch, so settling one job or a hundred costs
the same three round trips at most. A statement PostgreSQL rolls back as a deadlock victim
or for a serialization failure runs again (:func:`exportcore.db.retry_rolled_back`), when it
is its own transaction (the worker's pooled connection; the scanner's locked batch is one
transaction, which its next pass runs again).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from uuid import UUID

from exportcore.db import Conn, retry_rolled_back
from exportcore.domain import new_id
from exportcore.retry import Decision
from exportcore.store import jobs as job_store
from exportcore.store.jobs import Fail, JobRow, Requeue


@dataclass(frozen=True, slots=True)
class Settled:
    """What became of one leased job: ``result`` is ``retry``, ``cancelled``, ``failed`` or
    ``lease_lost``; ``row`` is the job after the change (None when the lease was lost);
    ``decision`` is the one applied (a refused retry turns into a ``fail``)."""

    job: JobRow
    decision: Decision
    result: str
    row: JobRow | None


def settle(
    conn: Conn,
    items: Sequence[tuple[JobRow, Decision]],
    *,
    margin_seconds: float,
    expired_only: bool = False,
) -> list[Settled]:
    """Apply each decision to its leased job (see the module docstring); one result per
    item, in the order given.

    ``expired_only`` is the recovery-scanner's mode: every statement also requires the
    lease to have expired, and the history records ``lease_expired`` first. Raises
    ``psycopg.Error`` when the database fails (nothing of the failing statement is written;
    a rolled-back statement outside a transaction block is first run again, up to three
    times).
    """
    done: dict[UUID, Settled] = {}
    jobs = {job.id: job for job, _ in items}
    decisions = {job.id: decision for job, decision in items}
    retries = [(job, d) for job, d in items if d.action == "retry"]
    if retries:
        requeues = [
            Requeue(job.id, job.token, new_id(), d.delay, d.code, d.detail) for job, d in retries
        ]
        rows = retry_rolled_back(
            conn,
            lambda: job_store.job_requeue_if_leased_many(
                conn, requeues, margin_seconds=margin_seconds, expired_only=expired_only
            ),
            what="job_requeue_if_leased_many",
        )
        for row in rows:
            done[row.id] = Settled(jobs[row.id], decisions[row.id], "retry", row)
    rest = [job for job, _ in items if job.id not in done]
    if rest:
        for row in retry_rolled_back(
            conn,
            lambda: job_store.job_cancel_if_leased_many(
                conn, [(job.id, job.token) for job in rest], expired_only=expired_only
            ),
            what="job_cancel_if_leased_many",
        ):
            done[row.id] = Settled(jobs[row.id], decisions[row.id], "cancelled", row)
    failing = [
        (job, _as_failure(decisions[job.id]))
        for job in rest
        if job.id not in done and decisions[job.id].action != "cancel"
    ]
    if failing:
        fails = [Fail(job.id, job.token, d.code, d.detail) for job, d in failing]
        rows = retry_rolled_back(
            conn,
            lambda: job_store.job_fail_if_leased_many(conn, fails, expired_only=expired_only),
            what="job_fail_if_leased_many",
        )
        failures = {job.id: d for job, d in failing}
        for row in rows:
            done[row.id] = Settled(jobs[row.id], failures[row.id], "failed", row)
    return [done.get(job.id) or Settled(job, d, "lease_lost", None) for job, d in items]


def _as_failure(decision: Decision) -> Decision:
    return (
        decision if decision.action == "fail" else Decision("fail", decision.code, decision.detail)
    )
