"""Outbox transitions (``sql/outbox.sql``): claim a batch, mark sent, release."""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

from exportcore.db import Conn, Row
from exportcore.sql import q


def outbox_claim_due(
    conn: Conn, *, claim_token: UUID, limit: int, claim_seconds: float
) -> list[Row]:
    """Claim up to ``limit`` due events (``FOR UPDATE SKIP LOCKED``) for ``claim_seconds``."""
    return conn.execute(
        q("outbox", "outbox_claim_due"),
        {"claim_token": claim_token, "limit": limit, "claim_seconds": claim_seconds},
    ).fetchall()


def outbox_mark_sent(conn: Conn, *, ids: Sequence[UUID], claim_token: UUID) -> list[Row]:
    """Mark the still-owned events sent and stamp their jobs' dispatch; returns those marked."""
    return conn.execute(
        q("outbox", "outbox_mark_sent"), {"ids": list(ids), "claim_token": claim_token}
    ).fetchall()


def outbox_release(
    conn: Conn, *, event_id: UUID, claim_token: UUID, retry_seconds: float, error: str
) -> Row | None:
    """Return an unpublished event to the pending pool, due again in ``retry_seconds``."""
    return conn.execute(
        q("outbox", "outbox_release"),
        {
            "id": event_id,
            "claim_token": claim_token,
            "retry_seconds": retry_seconds,
            "error": error[:500],
        },
    ).fetchone()


def outbox_next_due_in(conn: Conn) -> float | None:
    """Seconds until the next pending event becomes claimable; None when none is pending."""
    row = conn.execute(q("outbox", "outbox_next_due_in")).fetchone()
    return None if row is None or row["seconds"] is None else float(row["seconds"])
