"""Admission and idempotency statements (``sql/admission.sql``)."""

from __future__ import annotations

from uuid import UUID

from exportcore.db import Conn, Row
from exportcore.sql import q


def admission_admit(conn: Conn, *, tenant_id: str, capacity: int, default_quota: int) -> None:
    """Serialised capacity/quota check; raises ``psycopg.Error`` with SQLSTATE XEX01/XEX02."""
    conn.execute(
        q("admission", "admission_admit"),
        {"tenant_id": tenant_id, "capacity": capacity, "default_quota": default_quota},
    )


def admission_reconcile(conn: Conn) -> dict[str, int]:
    """Correct the admission counters to the rows (one statement); returns the drift that
    was corrected per scope (``'*'`` = global), empty when none."""
    return {
        r["scope"]: int(r["drift"]) for r in conn.execute(q("admission", "admission_reconcile"))
    }


def admission_counters(conn: Conn) -> dict[str, int]:
    """Active jobs per scope as the counters say (``'*'`` = global)."""
    return {
        r["scope"]: int(r["active"]) for r in conn.execute(q("admission", "admission_counters"))
    }


def admission_usage(conn: Conn, *, default_quota: int) -> list[Row]:
    """``{tenant_id, active, quota}`` per tenant."""
    return conn.execute(
        q("admission", "admission_usage"), {"default_quota": default_quota}
    ).fetchall()


def idempotency_reserve(
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
        q("admission", "idempotency_reserve"),
        {
            "tenant_id": tenant_id,
            "key": key,
            "request_hash": request_hash,
            "job_id": job_id,
            "retention_seconds": retention_seconds,
        },
    ).fetchone()


def idempotency_get(conn: Conn, *, tenant_id: str, key: str) -> Row | None:
    """The stored key, or None."""
    return conn.execute(
        q("admission", "idempotency_get"), {"tenant_id": tenant_id, "key": key}
    ).fetchone()


def idempotency_prune(conn: Conn, *, limit: int) -> int:
    """Delete up to ``limit`` expired keys; returns how many."""
    return conn.execute(q("admission", "idempotency_prune"), {"limit": limit}).rowcount


def admission_refusal_record(conn: Conn, *, tenant_id: str, code: str) -> int | None:
    """Count one refusal (``quota_exceeded`` or ``capacity_exceeded``) for the tenant in the
    current minute; returns the minute's count so far, None for an unknown tenant."""
    row = conn.execute(
        q("admission", "admission_refusal_record"), {"tenant_id": tenant_id, "code": code}
    ).fetchone()
    return int(row["refused"]) if row else None
