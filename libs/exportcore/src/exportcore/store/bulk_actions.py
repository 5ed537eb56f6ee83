"""Bulk actions by filter (``sql/bulk_actions.sql``): their targets, their runs and leases.
The targets are read unprepared: the filters are optional (``(%(x)s IS NULL OR …)``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, LiteralString
from uuid import UUID

from psycopg.types.json import Jsonb

from exportcore.db import Conn, Row
from exportcore.sql import q

FILTER_KEYS = (
    "status",
    "queue",
    "tenant_id",
    "reason",
    "created_from",
    "created_to",
    "tags",
    "metadata",
)
"""The filter of a bulk action (each optional): what the jobs page filters by. ``tags`` (a
list) and ``metadata`` (an object) are passed as one containment, ``labels``."""


def _match(kind: str, filters: dict[str, Any], as_of: datetime) -> dict[str, Any]:
    params = {k: filters.get(k) for k in FILTER_KEYS}
    labels = {k: v for k in ("metadata", "tags") if (v := params.pop(k))}
    params["labels"] = Jsonb(labels) if labels else None
    params["as_of"] = as_of
    if kind == "cancel":
        params.pop("reason")
    else:
        params.pop("status")
    return params


def _statement(kind: str, what: str) -> LiteralString:
    if kind == "cancel":
        return q(
            "bulk_actions",
            "bulk_action_cancel_count" if what == "count" else "bulk_action_cancel_targets",
        )
    return q(
        "bulk_actions",
        "bulk_action_replay_count" if what == "count" else "bulk_action_replay_targets",
    )


def bulk_action_count(conn: Conn, *, kind: str, filters: dict[str, Any], as_of: datetime) -> int:
    """How many targets a bulk ``kind`` (``cancel`` | ``replay``) of ``filters`` matches at
    ``as_of``: active jobs without a cancel request, or open dead letters."""
    row = conn.execute(
        _statement(kind, "count"), _match(kind, filters, as_of), prepare=False
    ).fetchone()
    return int(row["n"]) if row else 0


def bulk_action_targets(
    conn: Conn,
    *,
    kind: str,
    filters: dict[str, Any],
    as_of: datetime,
    after: str | None,
    limit: int,
) -> list[Row]:
    """The next ``limit`` targets after the cursor ``after``: jobs (``id``, ``tenant_id``) in
    id order for a cancel, dead letters (``id``, ``job_id``, ``tenant_id``) oldest first for
    a replay."""
    params = _match(kind, filters, as_of) | {"after": after, "limit": limit}
    return conn.execute(_statement(kind, "targets"), params, prepare=False).fetchall()


def bulk_action_insert(
    conn: Conn,
    *,
    request_id: UUID,
    kind: str,
    filters: dict[str, Any],
    as_of: datetime,
    confirmed: int,
    audit_id: int,
    actor: str,
    lease_token: UUID | None = None,
    lease_seconds: float = 60.0,
) -> Row | None:
    """A new run; None when ``request_id`` already started one. Without ``lease_token`` it
    waits for the bulk runner (NOTIFY ``bulk_actions`` at COMMIT); with one, it is leased
    to the caller for ``lease_seconds`` from the start."""
    return conn.execute(
        q("bulk_actions", "bulk_action_insert"),
        {
            "request_id": request_id,
            "kind": kind,
            "filter": Jsonb(filters),
            "as_of": as_of,
            "confirmed": confirmed,
            "audit_id": audit_id,
            "actor": actor,
            "lease_token": lease_token,
            "lease_seconds": lease_seconds,
        },
    ).fetchone()


def bulk_action_as_of_future(conn: Conn, *, as_of: datetime) -> Row | None:
    """``future``: whether ``as_of`` lies after the database's ``now`` (also returned)."""
    return conn.execute(q("bulk_actions", "bulk_action_as_of_future"), {"as_of": as_of}).fetchone()


def bulk_action_nudge(conn: Conn, *, bulk_id: int) -> None:
    """NOTIFY ``bulk_actions``: wake the bulk runners (they look for runs nobody holds)."""
    conn.execute(q("bulk_actions", "bulk_action_nudge"), {"bulk_id": bulk_id})


def bulk_action_claim_next(conn: Conn, *, lease_token: UUID, lease_seconds: float) -> Row | None:
    """Lease the oldest run nobody holds (new, or its lease expired) to ``lease_token`` for
    ``lease_seconds``; None when there is none (``FOR UPDATE SKIP LOCKED``: concurrent
    runners never take the same run)."""
    return conn.execute(
        q("bulk_actions", "bulk_action_claim_next"),
        {"lease_token": lease_token, "lease_seconds": lease_seconds},
    ).fetchone()


def bulk_action_release(conn: Conn, *, bulk_id: int, lease_token: UUID) -> bool:
    """End this runner's lease on the run now (it stops between two batches); False when
    the lease was no longer this runner's."""
    row = conn.execute(
        q("bulk_actions", "bulk_action_release"), {"bulk_id": bulk_id, "lease_token": lease_token}
    ).fetchone()
    return row is not None


def bulk_action_get(conn: Conn, *, bulk_id: int) -> Row | None:
    """One run with ``interrupted`` (running, lease expired), or None."""
    return conn.execute(q("bulk_actions", "bulk_action_get"), {"bulk_id": bulk_id}).fetchone()


def bulk_action_get_by_request(conn: Conn, *, request_id: UUID) -> Row | None:
    """The run this request id started, or None."""
    return conn.execute(
        q("bulk_actions", "bulk_action_get_by_request"), {"request_id": request_id}
    ).fetchone()


def bulk_action_claim(
    conn: Conn, *, bulk_id: int, lease_token: UUID, lease_seconds: float
) -> Row | None:
    """Take the run's lease (new, or its runner's lease expired); None otherwise."""
    return conn.execute(
        q("bulk_actions", "bulk_action_claim"),
        {"bulk_id": bulk_id, "lease_token": lease_token, "lease_seconds": lease_seconds},
    ).fetchone()


def bulk_action_advance(
    conn: Conn,
    *,
    bulk_id: int,
    lease_token: UUID,
    cursor: str | None,
    seen: int,
    acted: int,
    skipped: int,
    state: str,
    stop_reason: str | None,
    lease_seconds: float,
) -> Row | None:
    """Record one batch (and, with ``state`` done | stopped, the end); None when the lease
    is no longer this runner's (the caller rolls the batch back)."""
    return conn.execute(
        q("bulk_actions", "bulk_action_advance"),
        {
            "bulk_id": bulk_id,
            "lease_token": lease_token,
            "cursor": cursor,
            "seen": seen,
            "acted": acted,
            "skipped": skipped,
            "state": state,
            "stop_reason": stop_reason,
            "lease_seconds": lease_seconds,
        },
    ).fetchone()


def bulk_actions_running(conn: Conn, *, limit: int) -> list[Row]:
    """Runs whose runner went silent (lease expired), oldest first."""
    return conn.execute(q("bulk_actions", "bulk_action_running"), {"limit": limit}).fetchall()
