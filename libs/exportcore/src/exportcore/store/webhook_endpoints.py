"""Webhook endpoints (``sql/webhook_endpoints.sql``): a tenant's receivers and their health."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from exportcore.db import Conn, Row
from exportcore.sql import q


def endpoint_insert(conn: Conn, **values: Any) -> Row:
    """Insert an endpoint (columns of ``webhook_endpoint_insert``); returns the row."""
    row = conn.execute(q("webhook_endpoints", "webhook_endpoint_insert"), values).fetchone()
    assert row is not None
    return row


def tenant_lock(conn: Conn, *, tenant_id: str) -> bool:
    """Lock the tenant row for the rest of the transaction; False if there is no tenant."""
    return (
        conn.execute(
            q("webhook_endpoints", "webhook_tenant_lock"), {"tenant_id": tenant_id}
        ).fetchone()
        is not None
    )


def endpoint_count_for_tenant(conn: Conn, *, tenant_id: str) -> int:
    """How many endpoints the tenant has."""
    row = conn.execute(
        q("webhook_endpoints", "webhook_endpoint_count_for_tenant"), {"tenant_id": tenant_id}
    ).fetchone()
    return int(row["n"]) if row else 0


def endpoint_get_for_tenant(conn: Conn, *, endpoint_id: UUID, tenant_id: str) -> Row | None:
    """One endpoint of the tenant with its count of pending messages, or None."""
    return conn.execute(
        q("webhook_endpoints", "webhook_endpoint_get_for_tenant"),
        {"endpoint_id": endpoint_id, "tenant_id": tenant_id},
    ).fetchone()


def endpoint_lock_for_tenant(conn: Conn, *, endpoint_id: UUID, tenant_id: str) -> Row | None:
    """One endpoint of the tenant locked ``FOR UPDATE`` (inside a transaction), or None."""
    return conn.execute(
        q("webhook_endpoints", "webhook_endpoint_lock_for_tenant"),
        {"endpoint_id": endpoint_id, "tenant_id": tenant_id},
    ).fetchone()


def endpoint_list_for_tenant(conn: Conn, *, tenant_id: str, limit: int) -> list[Row]:
    """The tenant's endpoints, newest first."""
    return conn.execute(
        q("webhook_endpoints", "webhook_endpoint_list_for_tenant"),
        {"tenant_id": tenant_id, "limit": limit},
    ).fetchall()


def endpoint_update(conn: Conn, **values: Any) -> Row | None:
    """Replace the editable fields; None if the tenant has no such endpoint."""
    return conn.execute(q("webhook_endpoints", "webhook_endpoint_update"), values).fetchone()


def endpoint_delete(conn: Conn, *, endpoint_id: UUID, tenant_id: str) -> bool:
    """Delete a tenant's endpoint with its messages and attempts; False if there is none."""
    return (
        conn.execute(
            q("webhook_endpoints", "webhook_endpoint_delete"),
            {"endpoint_id": endpoint_id, "tenant_id": tenant_id},
        ).fetchone()
        is not None
    )


def endpoint_rotate_secret(
    conn: Conn,
    *,
    endpoint_id: UUID,
    tenant_id: str,
    secret_ciphertext: str,
    secret_key_id: str,
    secret_hint: str,
    overlap_seconds: int,
) -> Row | None:
    """Install a new (encrypted) secret; the previous one stays valid ``overlap_seconds``.
    None if absent."""
    return conn.execute(
        q("webhook_endpoints", "webhook_endpoint_rotate_secret"),
        {
            "endpoint_id": endpoint_id,
            "tenant_id": tenant_id,
            "secret_ciphertext": secret_ciphertext,
            "secret_key_id": secret_key_id,
            "secret_hint": secret_hint,
            "overlap_seconds": overlap_seconds,
        },
    ).fetchone()


def secret_key_census(conn: Conn) -> dict[str, int]:
    """Key id -> how many stored secrets (current, and previous still signing) it encrypted."""
    rows = conn.execute(q("webhook_endpoints", "webhook_endpoint_secret_key_census")).fetchall()
    return {r["key_id"]: int(r["secrets"]) for r in rows}


def secrets_to_reencrypt(conn: Conn, *, current_key_id: str, limit: int) -> list[Row]:
    """Up to ``limit`` endpoints (locked, skipping locked ones) whose secrets are not all
    encrypted with ``current_key_id`` or that keep an expired previous secret."""
    return conn.execute(
        q("webhook_endpoints", "webhook_endpoint_secrets_to_reencrypt"),
        {"current_key_id": current_key_id, "limit": limit},
    ).fetchall()


def secrets_reencrypted(conn: Conn, rows: Sequence[dict[str, Any]]) -> None:
    """Store re-encrypted secrets: dicts of ``id``, ``ciphertext``, ``key_id``,
    ``previous_ciphertext``, ``previous_key_id`` (None: no previous secret any more)."""
    conn.execute(
        q("webhook_endpoints", "webhook_endpoint_secrets_reencrypted"),
        {
            "ids": [r["id"] for r in rows],
            "ciphertexts": [r["ciphertext"] for r in rows],
            "key_ids": [r["key_id"] for r in rows],
            "previous_ciphertexts": [r["previous_ciphertext"] for r in rows],
            "previous_key_ids": [r["previous_key_id"] for r in rows],
        },
    )


def endpoints_lock(conn: Conn, *, ids: Sequence[UUID]) -> list[Row]:
    """Lock the endpoints' rows (id order) and read their health and the database clock."""
    return conn.execute(
        q("webhook_endpoints", "webhook_endpoints_lock"), {"ids": list(ids)}
    ).fetchall()


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
        q("webhook_endpoints", "webhook_endpoints_set_health"),
        {("ids" if k == "id" else k): [r[k] for r in rows] for k in keys},
    )
