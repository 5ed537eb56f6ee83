"""Operator keys (``sql/operator_keys.sql``): cross-tenant keys tied to no tenant."""

from __future__ import annotations

from uuid import UUID

from exportcore.db import Conn, Row
from exportcore.sql import q


def operator_key_insert(
    conn: Conn, *, key_id: UUID, key_hash: bytes, prefix: str, label: str, role: str
) -> Row:
    """Store a new operator key's hash with its ``role`` (``viewer`` | ``admin``); returns
    the public columns."""
    row = conn.execute(
        q("operator_keys", "operator_key_insert"),
        {"key_id": key_id, "key_hash": key_hash, "prefix": prefix, "label": label, "role": role},
    ).fetchone()
    assert row is not None
    return row


def operator_key_lookup(conn: Conn, *, key_hash: bytes) -> Row | None:
    """The active (unrevoked) operator key with this hash, or None."""
    return conn.execute(
        q("operator_keys", "operator_key_lookup"), {"key_hash": key_hash}
    ).fetchone()


def operator_key_list(conn: Conn) -> list[Row]:
    """Every operator key (public columns only), oldest first."""
    return conn.execute(q("operator_keys", "operator_key_list")).fetchall()


def operator_key_revoke(conn: Conn, *, key: str) -> list[Row]:
    """Revoke the active operator key with this id or display prefix; returns what was
    revoked (nothing when no key, or more than one, matches)."""
    return conn.execute(q("operator_keys", "operator_key_revoke"), {"key": key}).fetchall()


def operator_key_set_role(conn: Conn, *, key: str, role: str) -> list[Row]:
    """Give the active operator key with this id or display prefix the ``role``; returns
    what changed (nothing when no key, or more than one, matches)."""
    return conn.execute(
        q("operator_keys", "operator_key_set_role"), {"key": key, "role": role}
    ).fetchall()
