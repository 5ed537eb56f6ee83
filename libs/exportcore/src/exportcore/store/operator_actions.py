"""The audit trail (``sql/operator_actions.sql``): one row per change, written by
:func:`exportcore.audit.record` in the transaction of the change itself."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from exportcore.db import Conn, Row
from exportcore.sql import q


def operator_action_insert(
    conn: Conn,
    *,
    actor_kind: str,
    key_id: UUID | None,
    actor: str,
    action: str,
    target_kind: str,
    target_id: str | None,
    tenant_id: str | None,
    job_id: UUID | None,
    filter: dict[str, Any] | None,
    count: int | None,
    outcome: str,
    detail: dict[str, Any],
) -> Row:
    """Append one audit row; returns it (``id``, ``at``…)."""
    row = conn.execute(
        q("operator_actions", "operator_action_insert"),
        {
            "actor_kind": actor_kind,
            "key_id": key_id,
            "actor": actor,
            "action": action,
            "target_kind": target_kind,
            "target_id": target_id,
            "tenant_id": tenant_id,
            "job_id": job_id,
            "filter": Jsonb(filter) if filter is not None else None,
            "count": count,
            "outcome": outcome,
            "detail": Jsonb(detail),
        },
    ).fetchone()
    assert row is not None
    return row


def operator_action_set_progress(
    conn: Conn, *, action_id: int, count: int, outcome: str, detail: dict[str, Any]
) -> bool:
    """A bulk action's audit row: its ``count`` so far and ``outcome``; ``detail`` is merged
    into the stored one. False when there is no such row."""
    return (
        conn.execute(
            q("operator_actions", "operator_action_set_progress"),
            {"action_id": action_id, "count": count, "outcome": outcome, "detail": Jsonb(detail)},
        ).fetchone()
        is not None
    )


def operator_action_get(conn: Conn, *, action_id: int) -> Row | None:
    """One audit row, or None."""
    return conn.execute(
        q("operator_actions", "operator_action_get"), {"action_id": action_id}
    ).fetchone()


def operator_actions_page(
    conn: Conn,
    *,
    limit: int,
    before: int | None = None,
    action: str | None = None,
    key_id: UUID | None = None,
    actor_kind: str | None = None,
    tenant_id: str | None = None,
    target_kind: str | None = None,
    target_id: str | None = None,
    job_id: UUID | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[Row]:
    """Up to ``limit`` audit rows with id < ``before``, newest first, filtered by any of
    the arguments (``since`` inclusive, ``until`` exclusive). Run unprepared, so that each
    filter plans onto its index."""
    return conn.execute(
        q("operator_actions", "operator_actions_page"),
        {
            "limit": limit,
            "before": before,
            "action": action,
            "key_id": key_id,
            "actor_kind": actor_kind,
            "tenant_id": tenant_id,
            "target_kind": target_kind,
            "target_id": target_id,
            "job_id": job_id,
            "since": since,
            "until": until,
        },
        prepare=False,
    ).fetchall()


def operator_actions_for_job(conn: Conn, *, job_id: UUID, limit: int) -> list[Row]:
    """What people did to one job, oldest first, at most ``limit`` rows."""
    return conn.execute(
        q("operator_actions", "operator_actions_for_job"), {"job_id": job_id, "limit": limit}
    ).fetchall()


def operator_action_delete_before(conn: Conn, *, retention_seconds: float, limit: int) -> int:
    """Delete up to ``limit`` audit rows older than ``retention_seconds`` (never the row of
    a bulk action still running); returns how many."""
    return len(
        conn.execute(
            q("operator_actions", "operator_action_delete_before"),
            {"retention_seconds": retention_seconds, "limit": limit},
        ).fetchall()
    )
