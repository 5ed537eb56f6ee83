"""Tenant API keys (``sql/api_keys.sql``): create, look up by hash, revoke, list."""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

from exportcore.db import Conn, Row
from exportcore.sql import q


def api_key_insert(
    conn: Conn,
    *,
    key_id: UUID,
    tenant_id: str,
    key_hash: bytes,
    prefix: str,
    scopes: Sequence[str],
    label: str,
) -> Row:
    """Store a new key's hash and scopes; returns the public columns."""
    row = conn.execute(
        q("api_keys", "api_key_insert"),
        {
            "key_id": key_id,
            "tenant_id": tenant_id,
            "key_hash": key_hash,
            "prefix": prefix,
            "scopes": list(scopes),
            "label": label,
        },
    ).fetchone()
    assert row is not None
    return row


def api_key_lookup(conn: Conn, *, key_hash: bytes) -> Row | None:
    """The active (unrevoked) key with this hash, or None."""
    return conn.execute(q("api_keys", "api_key_lookup"), {"key_hash": key_hash}).fetchone()


def api_key_revoke(conn: Conn, *, key: str) -> list[Row]:
    """Revoke the active key with this id or display prefix; returns what was revoked
    (nothing when no key, or more than one, matches)."""
    return conn.execute(q("api_keys", "api_key_revoke"), {"key": key}).fetchall()


def api_key_list(conn: Conn, *, tenant_id: str | None = None) -> list[Row]:
    """Keys (public columns only), of one tenant or all."""
    return conn.execute(q("api_keys", "api_key_list"), {"tenant_id": tenant_id}).fetchall()
