"""Cancelling an export at a tenant's or an operator's request (the API and the console).

One statement, ``job_request_cancel_many`` (``sql/jobs.sql``), cancels a queued job at once
and marks a running one ``cancel_requested``; its worker then stops at the next chunk
boundary, or the recovery-scanner cancels it once its lease expired (the state machine in
docs/architecture.md). Who asked is recorded on the job's history (``requested_by``:
``tenant`` or ``operator``) and in the audit trail (``cancel``), in the same transaction.
"""

from __future__ import annotations

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
        job = job_store.job_request_cancel(
            conn,
            job_id=job_id,
            tenant_id=tenant_id,
            detail={"requested_by": actor.requested_by},
        )
        if job is not None:
            audit.record(
                conn,
                actor,
                "cancel",
                target_kind="job",
                target_id=job_id,
                tenant_id=job["tenant_id"],
                job_id=job_id,
                outcome="cancelled" if job["status"] == "cancelled" else "requested",
                detail={"status_before": job["previous_status"]},
            )
            return job
        return _unchanged(conn, job_id, tenant_id)


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
