"""Webhook statements (``sql/webhooks.sql``): endpoints, the message outbox, attempts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from exportcore.db import Conn, Row
from exportcore.sql import q


def endpoint_insert(conn: Conn, **values: Any) -> Row:
    """Insert an endpoint (columns of ``webhook_endpoint_insert``); returns the row."""
    row = conn.execute(q("webhooks", "webhook_endpoint_insert"), values).fetchone()
    assert row is not None
    return row


def tenant_lock(conn: Conn, *, tenant_id: str) -> bool:
    """Lock the tenant row for the rest of the transaction; False if there is no tenant."""
    return (
        conn.execute(q("webhooks", "webhook_tenant_lock"), {"tenant_id": tenant_id}).fetchone()
        is not None
    )


def endpoint_count_for_tenant(conn: Conn, *, tenant_id: str) -> int:
    """How many endpoints the tenant has."""
    row = conn.execute(
        q("webhooks", "webhook_endpoint_count_for_tenant"), {"tenant_id": tenant_id}
    ).fetchone()
    return int(row["n"]) if row else 0


def endpoint_get_for_tenant(conn: Conn, *, endpoint_id: UUID, tenant_id: str) -> Row | None:
    """One endpoint of the tenant with its count of pending messages, or None."""
    return conn.execute(
        q("webhooks", "webhook_endpoint_get_for_tenant"),
        {"endpoint_id": endpoint_id, "tenant_id": tenant_id},
    ).fetchone()


def endpoint_lock_for_tenant(conn: Conn, *, endpoint_id: UUID, tenant_id: str) -> Row | None:
    """One endpoint of the tenant locked ``FOR UPDATE`` (inside a transaction), or None."""
    return conn.execute(
        q("webhooks", "webhook_endpoint_lock_for_tenant"),
        {"endpoint_id": endpoint_id, "tenant_id": tenant_id},
    ).fetchone()


def endpoint_list_for_tenant(conn: Conn, *, tenant_id: str, limit: int) -> list[Row]:
    """The tenant's endpoints, newest first."""
    return conn.execute(
        q("webhooks", "webhook_endpoint_list_for_tenant"), {"tenant_id": tenant_id, "limit": limit}
    ).fetchall()


def endpoint_update(conn: Conn, **values: Any) -> Row | None:
    """Replace the editable fields; None if the tenant has no such endpoint."""
    return conn.execute(q("webhooks", "webhook_endpoint_update"), values).fetchone()


def endpoint_delete(conn: Conn, *, endpoint_id: UUID, tenant_id: str) -> bool:
    """Delete a tenant's endpoint with its messages and attempts; False if there is none."""
    return (
        conn.execute(
            q("webhooks", "webhook_endpoint_delete"),
            {"endpoint_id": endpoint_id, "tenant_id": tenant_id},
        ).fetchone()
        is not None
    )


def endpoint_rotate_secret(
    conn: Conn, *, endpoint_id: UUID, tenant_id: str, secret: str, overlap_seconds: int
) -> Row | None:
    """Install ``secret``; the previous one stays valid ``overlap_seconds``. None if absent."""
    return conn.execute(
        q("webhooks", "webhook_endpoint_rotate_secret"),
        {
            "endpoint_id": endpoint_id,
            "tenant_id": tenant_id,
            "secret": secret,
            "overlap_seconds": overlap_seconds,
        },
    ).fetchone()


def message_insert(
    conn: Conn,
    *,
    message_id: UUID,
    endpoint_id: UUID,
    tenant_id: str,
    event_type: str,
    subject_id: UUID,
    data: dict[str, Any],
) -> Row:
    """Insert a message due now (and NOTIFY the senders); returns it."""
    row = conn.execute(
        q("webhooks", "webhook_message_insert"),
        {
            "message_id": message_id,
            "endpoint_id": endpoint_id,
            "tenant_id": tenant_id,
            "event_type": event_type,
            "subject_id": subject_id,
            "data": Jsonb(data),
        },
    ).fetchone()
    assert row is not None
    return row


def claim_due(
    conn: Conn,
    *,
    claim_token: UUID,
    limit: int,
    claim_seconds: float,
    per_endpoint: int,
    threshold: int,
    endpoints: int = 500,
) -> list[Row]:
    """Claim due messages within every endpoint's concurrency bound (see the statement)."""
    return conn.execute(
        q("webhooks", "webhook_claim_due"),
        {
            "claim_token": claim_token,
            "limit": limit,
            "claim_seconds": claim_seconds,
            "per_endpoint": per_endpoint,
            "threshold": threshold,
            "endpoints": endpoints,
        },
    ).fetchall()


def pass_begin(conn: Conn) -> None:
    """Inside the delivery pass's transaction: commit without waiting for the WAL flush
    (see the statement for why that loses nothing)."""
    conn.execute(q("webhooks", "webhook_pass_begin"))


def endpoints_lock(conn: Conn, *, ids: Sequence[UUID]) -> list[Row]:
    """Lock the endpoints' rows (id order) and read their health and the database clock."""
    return conn.execute(q("webhooks", "webhook_endpoints_lock"), {"ids": list(ids)}).fetchall()


def endpoints_set_health(conn: Conn, rows: Sequence[dict[str, Any]]) -> None:
    """Write decided health, one dict per endpoint (keys as the statement's columns). Does
    not wait for the answer (in pipeline mode it goes out with the next statements)."""
    if not rows:
        return
    keys = (
        "id",
        "enabled",
        "failures",
        "failing_since",
        "open_until",
        "disabled_reason",
        "last_error",
        "last_success_at",
        "last_failure_at",
    )
    conn.execute(
        q("webhooks", "webhook_endpoints_set_health"),
        {("ids" if k == "id" else k): [r[k] for r in rows] for k in keys},
    )


RECORD_KEYS = (
    "message_ids",
    "claim_tokens",
    "endpoint_ids",
    "attempts",
    "redelivery",
    "started_at",
    "outcomes",
    "status_codes",
    "latency_ms",
    "addresses",
    "signatures",
    "errors",
    "next_status",
    "delay_seconds",
    "refund",
)


def record_attempts(conn: Conn, columns: dict[str, list[Any]]) -> None:
    """Insert attempts and settle their messages; ``columns`` holds one list per key of
    :data:`RECORD_KEYS`. Does not wait for the answer (pipeline mode)."""
    conn.execute(q("webhooks", "webhook_record_attempts"), {k: columns[k] for k in RECORD_KEYS})


def attempts_for_endpoint(
    conn: Conn, *, endpoint_id: UUID, limit: int, before_id: int | None = None
) -> list[Row]:
    """An endpoint's attempts, newest first, with their messages."""
    return conn.execute(
        q("webhooks", "webhook_attempts_for_endpoint"),
        {"endpoint_id": endpoint_id, "limit": limit, "before_id": before_id},
    ).fetchall()


def redeliver(conn: Conn, *, attempt_id: int, endpoint_id: UUID, tenant_id: str) -> Row | None:
    """Requeue the message of one attempt (same webhook-id); None if no such attempt."""
    return conn.execute(
        q("webhooks", "webhook_redeliver"),
        {"attempt_id": attempt_id, "endpoint_id": endpoint_id, "tenant_id": tenant_id},
    ).fetchone()


def prune(conn: Conn, *, retention_seconds: float, limit: int) -> int:
    """Delete one batch of messages past retention; returns how many."""
    return len(
        conn.execute(
            q("webhooks", "webhook_prune"), {"seconds": retention_seconds, "limit": limit}
        ).fetchall()
    )


def gauges(conn: Conn) -> Row:
    """The scrape-time webhook gauges (one row)."""
    row = conn.execute(q("webhooks", "webhook_gauges")).fetchone()
    assert row is not None
    return row
