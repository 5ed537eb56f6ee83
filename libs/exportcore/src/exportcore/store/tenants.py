"""Tenants (``sql/tenants.sql``): names, quota and submit-rate overrides."""

from __future__ import annotations

from exportcore.db import Conn, Row
from exportcore.sql import q


def tenant_upsert(conn: Conn, *, tenant_id: str, name: str) -> Row:
    """Create the tenant, or rename it if it exists; returns the row."""
    row = conn.execute(
        q("tenants", "tenant_upsert"), {"tenant_id": tenant_id, "name": name}
    ).fetchone()
    assert row is not None
    return row


def tenant_get(conn: Conn, *, tenant_id: str) -> Row | None:
    """The tenant row, or None."""
    return conn.execute(q("tenants", "tenant_get"), {"tenant_id": tenant_id}).fetchone()


def tenant_set_quota(conn: Conn, *, tenant_id: str, quota: int | None) -> Row | None:
    """Set the tenant's active-job quota (None: back to the default); None if no tenant."""
    return conn.execute(
        q("tenants", "tenant_set_quota"), {"tenant_id": tenant_id, "quota": quota}
    ).fetchone()


def tenant_set_rate(
    conn: Conn, *, tenant_id: str, rate: float | None, burst: int | None
) -> Row | None:
    """Set the tenant's submit rate (per second) and burst (None: back to the defaults);
    None if there is no such tenant."""
    return conn.execute(
        q("tenants", "tenant_set_rate"), {"tenant_id": tenant_id, "rate": rate, "burst": burst}
    ).fetchone()


def tenant_set_in_flight(
    conn: Conn, *, tenant_id: str, bulk: int | None, fast: int | None
) -> Row | None:
    """Set the tenant's in-flight caps (jobs, ≥ 1) on exports.bulk and exports.fast (None:
    back to the default of that queue); None if there is no such tenant."""
    return conn.execute(
        q("tenants", "tenant_set_in_flight"), {"tenant_id": tenant_id, "bulk": bulk, "fast": fast}
    ).fetchone()


def tenant_submit_limit(conn: Conn, *, tenant_id: str) -> Row | None:
    """``{submit_rate, submit_burst}`` overrides of the tenant (NULLs: the defaults), or None."""
    return conn.execute(q("tenants", "tenant_submit_limit"), {"tenant_id": tenant_id}).fetchone()


def tenant_set_recipients(
    conn: Conn, *, tenant_id: str, recipients: list[str] | None
) -> Row | None:
    """Set the tenant's age recipients (validated ``age1…`` keys, :func:`exportcore.
    encryption.parse_recipients`; None: none, its exports are not encrypted unless a request
    names recipients); the row, or None if there is no such tenant."""
    return conn.execute(
        q("tenants", "tenant_set_recipients"),
        {"tenant_id": tenant_id, "recipients": recipients},
    ).fetchone()
