"""The recovery-scanner's batch statements (``sql/recovery.sql``)."""

from __future__ import annotations

from uuid import UUID

from exportcore.db import Conn, Row
from exportcore.sql import q


def scan_cancel_queued(conn: Conn, *, limit: int) -> list[Row]:
    """Cancel queued jobs with a cancel request; returns their ids."""
    return conn.execute(q("recovery", "scan_cancel_queued"), {"limit": limit}).fetchall()


def scan_fail_queued(conn: Conn, *, limit: int) -> list[Row]:
    """Fail (and dead-letter) queued jobs past their deadline or out of attempts."""
    return conn.execute(q("recovery", "scan_fail_queued"), {"limit": limit}).fetchall()


def scan_redispatch_lost(
    conn: Conn, *, threshold_seconds: float, max_factor: int, limit: int
) -> list[Row]:
    """New outbox events for queued jobs whose message was lost; returns ``{job_id,
    message_id}`` per job."""
    return conn.execute(
        q("recovery", "scan_redispatch_lost"),
        {"threshold_seconds": threshold_seconds, "max_factor": max_factor, "limit": limit},
    ).fetchall()


def prune_terminal_jobs(conn: Conn, *, retention_days: float, limit: int) -> list[Row]:
    """Delete terminal jobs finished more than ``retention_days`` ago; returns ``{id,
    result_ref}`` so their artifacts can be deleted after commit."""
    return conn.execute(
        q("recovery", "prune_terminal_jobs"), {"retention_days": retention_days, "limit": limit}
    ).fetchall()


def prune_sent_outbox(conn: Conn, *, retention_seconds: float, limit: int) -> int:
    """Delete outbox events sent more than ``retention_seconds`` ago; returns the count."""
    cur = conn.execute(
        q("recovery", "prune_sent_outbox"),
        {"retention_seconds": retention_seconds, "limit": limit},
    )
    return cur.rowcount


def artifact_owners(conn: Conn, *, job_ids: list[UUID]) -> dict[UUID, Row]:
    """``{job id: {status, result_ref, lease_token}}`` for the jobs that still exist."""
    rows = conn.execute(q("recovery", "artifact_owners"), {"job_ids": job_ids}).fetchall()
    return {r["id"]: r for r in rows}
