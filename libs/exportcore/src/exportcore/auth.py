"""API keys: random, shown once, stored only as a SHA-256 hash, compared in constant time.

A key looks like ``nex_<prefix>_<secret>``; the prefix (``nex_`` + 8 characters) is stored
in clear so operators can tell keys apart without being able to use them. SHA-256 is enough
for 256-bit random secrets (no password stretching is needed against guessing).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from uuid import UUID, uuid4

from exportcore.db import Conn, Row
from exportcore.store import tenants as tenant_store

KEY_PREFIX = "nex_"
SCOPES = ("exports:write", "exports:read", "admin")
DEFAULT_SCOPES = ("exports:write", "exports:read")


@dataclass(frozen=True)
class AuthContext:
    """Who is calling: the tenant, the key id and its scopes."""

    tenant_id: str
    key_id: UUID
    scopes: frozenset[str]

    def has(self, scope: str) -> bool:
        """True if the key carries ``scope``."""
        return scope in self.scopes

    @property
    def is_operator(self) -> bool:
        """True for an operator's key: one that may act across tenants (the ``admin`` scope),
        as the admin API and the console require."""
        return self.has("admin")


def hash_key(key: str) -> bytes:
    """SHA-256 digest (32 bytes) of the full key."""
    return hashlib.sha256(key.encode("utf-8")).digest()


def generate_key() -> tuple[str, str]:
    """A new ``(key, display prefix)``; the key has 256 bits of randomness."""
    public = secrets.token_hex(4)
    key = f"{KEY_PREFIX}{public}_{secrets.token_urlsafe(32)}"
    return key, f"{KEY_PREFIX}{public}"


def validate_scopes(scopes: list[str]) -> list[str]:
    """Return the scopes, sorted and unique; raises ValueError naming an unknown scope."""
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown:
        raise ValueError(f"unknown scope(s) {', '.join(unknown)}; known: {', '.join(SCOPES)}")
    return sorted(set(scopes))


def authenticate(conn: Conn, presented: str) -> AuthContext | None:
    """Resolve a presented key to its tenant, or None (unknown, malformed or revoked)."""
    if not presented.startswith(KEY_PREFIX) or len(presented) > 200:
        return None
    digest = hash_key(presented)
    row = tenant_store.apikey_lookup(conn, key_hash=digest)
    if row is None or not hmac.compare_digest(bytes(row["key_hash"]), digest):
        return None
    return AuthContext(
        tenant_id=row["tenant_id"], key_id=row["id"], scopes=frozenset(row["scopes"])
    )


def create_api_key(
    conn: Conn, *, tenant_id: str, scopes: list[str], label: str = ""
) -> tuple[str, Row]:
    """Create a key for ``tenant_id``; returns ``(the key, its stored public row)``.

    The key itself is returned only here and never stored. Raises ValueError for an
    unknown scope.
    """
    key, prefix = generate_key()
    row = tenant_store.apikey_insert(
        conn,
        key_id=uuid4(),
        tenant_id=tenant_id,
        key_hash=hash_key(key),
        prefix=prefix,
        scopes=validate_scopes(scopes),
        label=label,
    )
    return key, row
