"""Broker reconciliation reads (``sql/broker.sql``): what PostgreSQL says about the jobs
and outbox events that Redis messages name."""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

from exportcore.db import Conn, Row
from exportcore.sql import q


def broker_jobs_by_id(conn: Conn, *, job_ids: Sequence[UUID]) -> list[Row]:
    """``id``, ``status``, ``queue`` of the jobs among ``job_ids`` that exist."""
    return conn.execute(q("broker", "broker_jobs_by_id"), {"job_ids": list(job_ids)}).fetchall()


def broker_sent_ages(conn: Conn, *, message_ids: Sequence[UUID]) -> list[Row]:
    """``id``, ``age`` (seconds since sent, database clock) of the sent outbox events
    among ``message_ids``."""
    return conn.execute(
        q("broker", "broker_sent_ages"), {"message_ids": list(message_ids)}
    ).fetchall()


def broker_queued_without_pending_event(
    conn: Conn, *, grace_seconds: float, limit: int
) -> list[Row]:
    """Up to ``limit`` queued jobs with no unsent outbox event, dispatched (or created) more
    than ``grace_seconds`` ago, longest waiting first (``waiting`` in seconds)."""
    return conn.execute(
        q("broker", "broker_queued_without_pending_event"),
        {"grace_seconds": grace_seconds, "limit": limit},
    ).fetchall()
