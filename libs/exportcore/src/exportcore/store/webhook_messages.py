"""Webhook messages (``sql/webhook_messages.sql``): the message outbox and delivery attempts."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from exportcore.db import Conn, Row
from exportcore.sql import q

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
        q("webhook_messages", "webhook_message_insert"),
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
    per_tenant: int,
    threshold: int,
    key_ids: Sequence[str],
    endpoints: int = 500,
) -> list[Row]:
    """Claim due messages within every endpoint's concurrency bound and every tenant's
    share of the senders, round robin across tenants (see the statement), of the endpoints
    whose secrets ``key_ids`` (the ``WEBHOOK_SECRET_KEYS`` held) decrypt; after
    :func:`claim_lock` in the same transaction."""
    return conn.execute(
        q("webhook_messages", "webhook_message_claim_due"),
        {
            "claim_token": claim_token,
            "limit": limit,
            "claim_seconds": claim_seconds,
            "per_endpoint": per_endpoint,
            "per_tenant": per_tenant,
            "threshold": threshold,
            "key_ids": list(key_ids),
            "endpoints": endpoints,
        },
    ).fetchall()


def claim_lock(conn: Conn) -> None:
    """Serialise the claims of every delivery process until this transaction's COMMIT (see
    the statement). Does not wait for the answer (pipeline mode)."""
    conn.execute(q("webhook_messages", "webhook_message_claim_lock"))


def extend_claims(
    conn: Conn,
    *,
    message_ids: list[UUID],
    claim_tokens: list[UUID],
    claim_seconds: float,
    within_seconds: float,
) -> None:
    """Keep the claims of attempts still running: those of ``message_ids`` (still owned
    through ``claim_tokens``, pairwise) that expire within ``within_seconds`` now expire
    ``claim_seconds`` from now. Does not wait for the answer (pipeline mode)."""
    conn.execute(
        q("webhook_messages", "webhook_message_extend_claims"),
        {
            "message_ids": message_ids,
            "claim_tokens": claim_tokens,
            "claim_seconds": claim_seconds,
            "within_seconds": within_seconds,
        },
    )


def pass_begin(conn: Conn) -> None:
    """Inside the delivery pass's transaction: commit without waiting for the WAL flush
    (see the statement for why that loses nothing)."""
    conn.execute(q("webhook_messages", "webhook_message_pass_begin"))


def record_attempts(conn: Conn, columns: dict[str, list[Any]]) -> None:
    """Insert attempts and settle their messages; ``columns`` holds one list per key of
    :data:`RECORD_KEYS`. Does not wait for the answer (pipeline mode)."""
    conn.execute(
        q("webhook_messages", "webhook_message_record_attempts"),
        {k: columns[k] for k in RECORD_KEYS},
    )


def attempts_for_endpoint(
    conn: Conn,
    *,
    endpoint_id: UUID,
    limit: int,
    before_id: int | None = None,
    outcome: str | None = None,
    since: datetime | None = None,
) -> list[Row]:
    """An endpoint's attempts, newest first, with their messages; only one ``outcome`` and
    those started at or after ``since`` when given."""
    return conn.execute(
        q("webhook_messages", "webhook_attempts_for_endpoint"),
        {
            "endpoint_id": endpoint_id,
            "limit": limit,
            "before_id": before_id,
            "outcome": outcome,
            "since": since,
        },
        prepare=False,
    ).fetchall()


def recover_since(conn: Conn, *, endpoint_id: UUID, tenant_id: str, since: datetime) -> int:
    """Queue again every failed message of the endpoint written at or after ``since``
    (same webhook-id, a fresh budget); returns how many."""
    row = conn.execute(
        q("webhook_messages", "webhook_message_recover_since"),
        {"endpoint_id": endpoint_id, "tenant_id": tenant_id, "since": since},
    ).fetchone()
    return int(row.get("recovered") or 0) if row else 0


def redeliver(conn: Conn, *, attempt_id: int, endpoint_id: UUID, tenant_id: str) -> Row | None:
    """Requeue the message of one attempt (same webhook-id); None if no such attempt."""
    return conn.execute(
        q("webhook_messages", "webhook_message_redeliver"),
        {"attempt_id": attempt_id, "endpoint_id": endpoint_id, "tenant_id": tenant_id},
    ).fetchone()


def prune(conn: Conn, *, retention_seconds: float, limit: int) -> int:
    """Delete one batch of messages past retention; returns how many."""
    return len(
        conn.execute(
            q("webhook_messages", "webhook_message_delete_before"),
            {"seconds": retention_seconds, "limit": limit},
        ).fetchall()
    )


def gauges(conn: Conn) -> Row:
    """The scrape-time webhook gauges (one row)."""
    row = conn.execute(q("webhook_messages", "webhook_message_gauges")).fetchone()
    assert row is not None
    return row
