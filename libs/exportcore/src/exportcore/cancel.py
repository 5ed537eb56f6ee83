"""Cancelling an export at a tenant's request (the API and the console).

One statement, ``job_request_cancel`` (``sql/jobs.sql``), cancels a queued job at once and
marks a running one ``cancel_requested``; its worker then stops at the next chunk boundary, or
the recovery-scanner cancels it once its lease expired (the state machine in
docs/architecture.md).
"""

from __future__ import annotations

from uuid import UUID

from psycopg_pool import ConnectionPool

from exportcore.db import Conn, Row
from exportcore.domain import JobNotFound, JobStateConflict
from exportcore.store import jobs as job_store


def request_cancel(pool: ConnectionPool[Conn], *, tenant_id: str, job_id: UUID) -> Row:
    """Ask to cancel a job of ``tenant_id``; returns the job as it is now.

    A queued job is cancelled in the same transaction; a running job keeps running with
    ``cancel_requested`` until its worker stops at the next chunk boundary (or its lease
    expires) and it becomes ``cancelled``. Asking again is harmless. Raises ``JobNotFound``
    (also for another tenant's job) and ``JobStateConflict`` for a finished job.
    """
    with pool.connection() as conn:
        job = job_store.job_request_cancel(conn, job_id=job_id, tenant_id=tenant_id)
        if job is None:
            job = job_store.job_get(conn, job_id=job_id, tenant_id=tenant_id)
            if job is None:
                raise JobNotFound(f"no export {job_id}")
            if job["status"] in ("succeeded", "failed", "cancelled"):
                raise JobStateConflict(f"export {job_id} is already {job['status']}")
    return job
