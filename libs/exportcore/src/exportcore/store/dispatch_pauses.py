"""Dispatch pauses (``sql/dispatch_pauses.sql``): an operator's stop of a queue, or of one
tenant on a queue, that the fair outbox claim reads."""

from __future__ import annotations

from exportcore.db import Conn, Row
from exportcore.sql import q


def dispatch_pause_insert(
    conn: Conn, *, queue: str, tenant_id: str | None, reason: str, paused_by: str
) -> Row | None:
    """Pause ``queue`` (for ``tenant_id`` only, or every tenant with None); returns the new
    pause (``queue``, ``tenant_id``, ``reason``, ``paused_by``, ``paused_at``), or None when
    that scope is paused already."""
    return conn.execute(
        q("dispatch_pauses", "dispatch_pause_insert"),
        {"queue": queue, "tenant_id": tenant_id, "reason": reason, "paused_by": paused_by},
    ).fetchone()


def dispatch_pause_delete(conn: Conn, *, queue: str, tenant_id: str | None) -> Row | None:
    """Lift the pause of exactly this scope and wake the publishers at COMMIT; returns the
    pause that ended (with ``resumed_at``), or None when the scope was not paused."""
    return conn.execute(
        q("dispatch_pauses", "dispatch_pause_delete"), {"queue": queue, "tenant_id": tenant_id}
    ).fetchone()


def dispatch_pause_get(conn: Conn, *, queue: str, tenant_id: str | None) -> Row | None:
    """The pause in force on exactly this scope, or None."""
    return conn.execute(
        q("dispatch_pauses", "dispatch_pause_get"), {"queue": queue, "tenant_id": tenant_id}
    ).fetchone()


def dispatch_pauses_list(conn: Conn) -> list[Row]:
    """Every pause in force, queue-wide ones first, each with ``paused_seconds`` (how long,
    seconds) and ``waiting`` (its pending outbox events)."""
    return list(conn.execute(q("dispatch_pauses", "dispatch_pauses_list")))


def dispatch_pause_covers(conn: Conn, *, queue: str, tenant_id: str) -> bool:
    """True when a pause holds ``tenant_id``'s dispatch on ``queue`` (its own or the whole
    queue's)."""
    row = conn.execute(
        q("dispatch_pauses", "dispatch_pause_covers"), {"queue": queue, "tenant_id": tenant_id}
    ).fetchone()
    return bool(row and row["paused"])
