"""Admission statements (``sql/admission.sql``): the capacity and quota counters, their
reconciliation, and the per-tenant refusal ring."""

from __future__ import annotations

from exportcore.db import Conn, Row
from exportcore.sql import q


def admission_admit(conn: Conn, *, tenant_id: str, capacity: int, default_quota: int) -> None:
    """Serialised capacity/quota check; raises ``psycopg.Error`` with SQLSTATE XEX01/XEX02."""
    conn.execute(
        q("admission", "admission_admit"),
        {"tenant_id": tenant_id, "capacity": capacity, "default_quota": default_quota},
    )


def admission_admit_many(
    conn: Conn, *, tenant_id: str, count: int, capacity: int, default_quota: int
) -> None:
    """:func:`admission_admit` for ``count`` new jobs of one tenant at once (migration 0016);
    raises ``psycopg.Error`` with SQLSTATE XEX01/XEX02."""
    conn.execute(
        q("admission", "admission_admit_many"),
        {
            "tenant_id": tenant_id,
            "count": count,
            "capacity": capacity,
            "default_quota": default_quota,
        },
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


def admission_refusal_record(conn: Conn, *, tenant_id: str, code: str) -> int | None:
    """Count one refusal (``quota_exceeded`` or ``capacity_exceeded``) for the tenant in the
    current minute; returns the minute's count so far, None for an unknown tenant."""
    row = conn.execute(
        q("admission", "admission_refusal_record"), {"tenant_id": tenant_id, "code": code}
    ).fetchone()
    return int(row["refused"]) if row else None
