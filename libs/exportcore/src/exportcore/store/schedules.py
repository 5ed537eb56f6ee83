"""Schedule statements (``sql/schedules.sql``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from exportcore.db import Conn, Row
from exportcore.sql import q


def _fields(values: dict[str, Any]) -> dict[str, Any]:
    out = dict(values)
    out["payload"] = Jsonb(out["payload"])
    return out


def schedule_insert(conn: Conn, **values: Any) -> Row:
    """Insert a schedule (all columns of ``schedule_insert``); returns the row."""
    row = conn.execute(q("schedules", "schedule_insert"), _fields(values)).fetchone()
    assert row is not None
    return row


def schedule_tenant_lock(conn: Conn, *, tenant_id: str) -> None:
    """Take the tenant's schedule-creation lock, held to the end of the transaction (a
    concurrent create of the same tenant waits for this one). Must run in a transaction."""
    conn.execute(q("schedules", "schedule_tenant_lock"), {"tenant_id": tenant_id})


def schedule_count_for_tenant(conn: Conn, *, tenant_id: str) -> int:
    """How many schedules the tenant has."""
    row = conn.execute(
        q("schedules", "schedule_count_for_tenant"), {"tenant_id": tenant_id}
    ).fetchone()
    return int(row["n"]) if row else 0


def schedule_get_for_tenant(conn: Conn, *, schedule_id: UUID, tenant_id: str) -> Row | None:
    """One schedule of the tenant, or None."""
    return conn.execute(
        q("schedules", "schedule_get_for_tenant"),
        {"schedule_id": schedule_id, "tenant_id": tenant_id},
    ).fetchone()


def schedule_lock_for_tenant(conn: Conn, *, schedule_id: UUID, tenant_id: str) -> Row | None:
    """One schedule of the tenant locked ``FOR UPDATE`` (waits for a tick or another edit
    holding it), or None. Must run inside a transaction."""
    return conn.execute(
        q("schedules", "schedule_lock_for_tenant"),
        {"schedule_id": schedule_id, "tenant_id": tenant_id},
    ).fetchone()


def schedule_list_for_tenant(conn: Conn, *, tenant_id: str, limit: int) -> list[Row]:
    """The tenant's schedules, newest first."""
    return conn.execute(
        q("schedules", "schedule_list_for_tenant"), {"tenant_id": tenant_id, "limit": limit}
    ).fetchall()


def schedule_update(conn: Conn, **values: Any) -> Row | None:
    """Replace the editable fields; None if no such schedule for the tenant."""
    return conn.execute(q("schedules", "schedule_update"), _fields(values)).fetchone()


def schedule_delete(conn: Conn, *, schedule_id: UUID, tenant_id: str) -> bool:
    """Delete a tenant's schedule (its slots go with it, its jobs stay)."""
    row = conn.execute(
        q("schedules", "schedule_delete"), {"schedule_id": schedule_id, "tenant_id": tenant_id}
    ).fetchone()
    return row is not None


def schedule_due_ids(conn: Conn, *, now: datetime, limit: int) -> list[Row]:
    """``{id, tenant_id}`` of enabled schedules due at ``now`` and not backing off, at most
    ``limit``, round-robin across tenants (each tenant's most overdue first)."""
    return conn.execute(q("schedules", "schedule_due_ids"), {"now": now, "limit": limit}).fetchall()


def schedule_lock_due(conn: Conn, *, schedule_id: UUID, now: datetime) -> Row | None:
    """Lock the schedule if it is still due and nobody else holds it; else None."""
    return conn.execute(
        q("schedules", "schedule_lock_due"), {"schedule_id": schedule_id, "now": now}
    ).fetchone()


def slot_claim(
    conn: Conn,
    *,
    schedule_id: UUID,
    scheduled_at: datetime,
    outcome: str,
    job_id: UUID | None = None,
    detail: str = "",
    trigger: str = "schedule",
    reason: str | None = None,
) -> bool:
    """Record a handled slot (``trigger`` ``schedule`` or ``manual``; a ``skipped`` one with
    its ``reason``, ``catch_up`` or ``overlap``); False when it had already been handled."""
    row = conn.execute(
        q("schedules", "slot_claim"),
        {
            "schedule_id": schedule_id,
            "trigger": trigger,
            "scheduled_at": scheduled_at,
            "outcome": outcome,
            "job_id": job_id,
            "detail": detail[:500],
            "reason": reason,
        },
    ).fetchone()
    return row is not None


def schedule_advance(conn: Conn, *, schedule_id: UUID, next_due_at: datetime) -> Row | None:
    """Move the cursor forward (never back); clears the last refusal and the backoff."""
    return conn.execute(
        q("schedules", "schedule_advance"),
        {"schedule_id": schedule_id, "next_due_at": next_due_at},
    ).fetchone()


def schedule_refuse(
    conn: Conn, *, schedule_id: UUID, retry_at: datetime, last_refusal: dict[str, Any]
) -> Row | None:
    """Record an admission refusal: one more refusal in a row, no tick before ``retry_at``."""
    return conn.execute(
        q("schedules", "schedule_refuse"),
        {"schedule_id": schedule_id, "retry_at": retry_at, "last_refusal": Jsonb(last_refusal)},
    ).fetchone()


def schedule_pause(
    conn: Conn, *, schedule_id: UUID, reason: str, detail: str, now: datetime
) -> Row | None:
    """Pause an enabled schedule with a reason code and a readable detail; None when it was
    already paused."""
    return conn.execute(
        q("schedules", "schedule_pause"),
        {"schedule_id": schedule_id, "reason": reason, "detail": detail[:500], "now": now},
    ).fetchone()


def schedule_tenant_headroom(conn: Conn, *, tenant_id: str, default_quota: int) -> Row | None:
    """``{active, quota}`` of the tenant, or None for an unknown tenant."""
    return conn.execute(
        q("schedules", "schedule_tenant_headroom"),
        {"tenant_id": tenant_id, "default_quota": default_quota},
    ).fetchone()


def schedule_runs(
    conn: Conn, *, schedule_id: UUID, limit: int, before: datetime | None = None
) -> list[Row]:
    """The schedule's slots (newest first) with their jobs' status."""
    return conn.execute(
        q("schedules", "schedule_runs"),
        {"schedule_id": schedule_id, "limit": limit, "before": before},
    ).fetchall()


def schedule_active_job(conn: Conn, *, schedule_id: UUID, window_seconds: float) -> Row | None:
    """``{id, status, scheduled_at}`` of the schedule's oldest export still queued or running
    among those created in the last ``window_seconds``, or None."""
    return conn.execute(
        q("schedules", "schedule_active_job"),
        {"schedule_id": schedule_id, "window_seconds": window_seconds},
    ).fetchone()


def schedule_recent_succeeded(conn: Conn, *, schedule_id: UUID, limit: int) -> list[Row]:
    """The schedule's latest ``limit`` succeeded exports, newest first: ``{id, base_job_id,
    format, created_at}``."""
    return conn.execute(
        q("schedules", "schedule_recent_succeeded"), {"schedule_id": schedule_id, "limit": limit}
    ).fetchall()


def schedule_active_slot_jobs(
    conn: Conn, *, schedule_id: UUID, window_seconds: float, limit: int
) -> list[Row]:
    """``{id, status, scheduled_at}`` of the exports of the schedule's own slots (not manual
    runs, not backfills) still queued or running among those created in the last
    ``window_seconds``, oldest first, at most ``limit``: what ``overlap: cancel_other``
    cancels."""
    return conn.execute(
        q("schedules", "schedule_active_slot_jobs"),
        {"schedule_id": schedule_id, "window_seconds": window_seconds, "limit": limit},
    ).fetchall()


def schedule_lock_for_backfill(conn: Conn, *, schedule_id: UUID) -> Row | None:
    """The schedule row, locked until the transaction ends; None when it is gone."""
    return conn.execute(
        q("schedules", "schedule_lock_for_backfill"), {"schedule_id": schedule_id}
    ).fetchone()


def slot_claim_backfill(
    conn: Conn, *, schedule_id: UUID, scheduled_at: datetime, job_id: UUID, detail: str
) -> bool:
    """Record the rule's slot at ``scheduled_at`` created by a backfill with ``job_id`` (a
    slot recorded skipped or invalid becomes created); False when the slot already created
    an export."""
    row = conn.execute(
        q("schedules", "slot_claim_backfill"),
        {
            "schedule_id": schedule_id,
            "scheduled_at": scheduled_at,
            "job_id": job_id,
            "detail": detail[:300],
        },
    ).fetchone()
    return row is not None


def slot_get(conn: Conn, *, schedule_id: UUID, trigger: str, scheduled_at: datetime) -> Row | None:
    """``{scheduled_at, outcome, job_id, job_status}`` of one slot, or None."""
    return conn.execute(
        q("schedules", "slot_get"),
        {"schedule_id": schedule_id, "trigger": trigger, "scheduled_at": scheduled_at},
    ).fetchone()
