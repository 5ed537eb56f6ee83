"""Idempotency keys (``sql/idempotency_keys.sql``): reserve, read, expire."""

from __future__ import annotations

from uuid import UUID

from exportcore.db import Conn, Row
from exportcore.sql import q


def idempotency_key_reserve(
    conn: Conn,
    *,
    tenant_id: str,
    key: str,
    request_hash: str,
    job_id: UUID,
    retention_seconds: float,
) -> Row | None:
    """Reserve the key for ``job_id``; None when a live key already exists."""
    return conn.execute(
        q("idempotency_keys", "idempotency_key_reserve"),
        {
            "tenant_id": tenant_id,
            "key": key,
            "request_hash": request_hash,
            "job_id": job_id,
            "retention_seconds": retention_seconds,
        },
    ).fetchone()


def idempotency_key_get(conn: Conn, *, tenant_id: str, key: str) -> Row | None:
    """The stored key, or None."""
    return conn.execute(
        q("idempotency_keys", "idempotency_key_get"), {"tenant_id": tenant_id, "key": key}
    ).fetchone()


def idempotency_key_delete_expired(conn: Conn, *, limit: int) -> int:
    """Delete up to ``limit`` expired keys; returns how many."""
    return conn.execute(
        q("idempotency_keys", "idempotency_key_delete_expired"), {"limit": limit}
    ).rowcount
