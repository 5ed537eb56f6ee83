"""Cancelling an export at a tenant's or an operator's request (the API and the console).

One statement, ``job_request_cancel_many`` (``sql/jobs.sql``), cancels a queued job at once
and marks a running one ``cancel_requested``; its worker then stops at the next chunk
boundary, or the recovery-scanner cancels it once its lease expired (the state machine in
docs/architecture.md). Who asked is recorded on the job's history (``requested_by``:
``tenant``, ``operator``, or ``schedule`` for a slot that superseded it) and in the audit
trail (``cancel``), in the same transaction.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from psycopg_pool import ConnectionPool

from exportcore import audit
from exportcore.audit import SYSTEM, Actor
from exportcore.db import Conn, Row, transaction
from exportcore.domain import JobNotFound, JobStateConflict, status_words
from exportcore.store import jobs as job_store


def request_cancel(
    pool: ConnectionPool[Conn],
    *,
    tenant_id: str | None,
    job_id: UUID,
    actor: Actor = SYSTEM,
) -> Row:
    """Ask to cancel a job of ``tenant_id`` (None: an operator, any tenant's job); returns
    the job as it is now, with ``previous_status`` when this request changed it.

    A queued job is cancelled in the same transaction; a running job keeps running with
    ``cancel_requested`` until its worker stops at the next chunk boundary (or its lease
    expires) and it becomes ``cancelled``. Asking again is harmless and audited as nothing.
    Raises ``JobNotFound`` (also for another tenant's job) and ``JobStateConflict`` for a
    finished job.
    """
    with transaction(pool) as conn:
        changed = cancel_in_transaction(
            conn,
            tenant_id=tenant_id,
            job_ids=[job_id],
            actor=actor,
            detail={"requested_by": actor.requested_by},
        )
        if changed:
            return changed[0]
        return _unchanged(conn, job_id, tenant_id)


def cancel_in_transaction(
    conn: Conn,
    *,
    tenant_id: str | None,
    job_ids: list[UUID],
    actor: Actor,
    detail: dict[str, Any],
) -> list[Row]:
    """The cancel of :func:`request_cancel` for ``job_ids`` on the caller's transaction
    ``conn``: queued jobs are cancelled, running ones flagged (their workers stop at the next
    chunk boundary), each audited (``cancel`` by ``actor``); ``detail`` goes on their history
    (``requested_by`` and why). Returns the jobs that changed, in id order, each with
    ``previous_status``; a finished job or one whose cancel was already requested is absent.
    Also what a schedule with ``overlap: cancel_other`` does to the export a newer slot
    supersedes (:mod:`exportcore.schedules.ticker`)."""
    changed = job_store.job_request_cancel_many(
        conn, job_ids=job_ids, tenant_id=tenant_id, detail=detail
    )
    for job in changed:
        audit.record(
            conn,
            actor,
            "cancel",
            target_kind="job",
            target_id=job["id"],
            tenant_id=job["tenant_id"],
            job_id=job["id"],
            outcome="cancelled" if job["status"] == "cancelled" else "requested",
            detail={"status_before": job["previous_status"]},
        )
    return changed


def _unchanged(conn: Conn, job_id: UUID, tenant_id: str | None) -> Row:
    job = job_store.job_get(conn, job_id=job_id, tenant_id=tenant_id)
    if job is None:
        raise JobNotFound(f"no export {job_id}")
    if job["status"] in ("succeeded", "failed", "cancelled"):
        raise JobStateConflict(
            f"export {job_id} {status_words(job['status'], already=True)}; only a queued or "
            "running export can be cancelled"
        )
    return job
