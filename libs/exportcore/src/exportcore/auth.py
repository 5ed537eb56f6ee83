"""API keys: random, shown once, stored only as a SHA-256 hash, compared in constant time.

Two kinds: tenant keys (``api_keys``: one tenant, scopes ``exports:read`` / ``exports:write``)
and operator keys (``operator_keys``: no tenant, the cross-tenant ``/v1/admin`` API, created
only with database access by ``exportctl operator-key create``). A tenant key never holds a
cross-tenant scope.

A key looks like ``nex_<prefix>_<secret>`` (operators: ``nex_op_<prefix>_<secret>``); the
display prefix is stored in clear so operators can tell keys apart without being able to use
them. SHA-256 is enough for 256-bit random secrets (no password stretching is needed against
guessing).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal
from uuid import UUID, uuid4

from exportcore.db import Conn, Row
from exportcore.domain import ExportError
from exportcore.store import api_keys as api_key_store
from exportcore.store import operator_keys as operator_store

KEY_PREFIX = "nex_"
OPERATOR_KEY_PREFIX = "nex_op_"
"""Operator keys look like ``nex_op_<8 hex>_<secret>``: the same ``nex_`` family (secret
scanners and the log redaction filter know it), and never a tenant key's shape (a tenant
key's public part is hex, which has no ``o``)."""

TENANT_SCOPES = ("exports:write", "exports:read")
"""What a tenant key may carry; none of them reaches beyond the key's own tenant."""
SCOPES = TENANT_SCOPES
DEFAULT_SCOPES = ("exports:write", "exports:read")
OPERATOR_SCOPE = "admin"
"""The scope every operator key carries: ``/v1/admin`` across tenants. Tenant keys never
hold it (revision 0007 stripped it from them; a CHECK constraint keeps it out)."""

KeyKind = Literal["tenant", "operator"]
Role = Literal["viewer", "admin"]
ROLES: tuple[Role, ...] = ("viewer", "admin")
"""The roles of an operator key: ``viewer`` reads everything and changes nothing, ``admin``
may take every operator action (:data:`OPERATOR_ACTIONS`)."""

OPERATOR_ACTIONS: dict[str, Role] = {
    "replay": "admin",
    "resolve": "admin",
    "cancel": "admin",
    "pause": "admin",
    "resume": "admin",
    "run_now": "admin",
    "queue_pause": "admin",
    "queue_resume": "admin",
    "backfill": "admin",
    "bulk_cancel": "admin",
    "bulk_replay": "admin",
    "bulk_resume": "admin",
    "webhook_redeliver": "admin",
    "webhook_recover": "admin",
    "download": "viewer",
}
"""Every action an operator key can take through the admin API or the console, and the
least role it needs: the one table :func:`authorize` reads for both. Reads (lists, pages,
timelines, the audit trail) need no more than ``viewer``."""


@dataclass(frozen=True)
class AuthContext:
    """Who is calling.

    ``kind`` is ``"tenant"`` (a key of one tenant: ``tenant_id`` is set, scopes among
    :data:`TENANT_SCOPES`) or ``"operator"`` (an operator key: ``tenant_id`` is None, the
    only scope is :data:`OPERATOR_SCOPE`, and ``role`` is one of :data:`ROLES`). ``prefix``
    and ``label`` identify the key to people (never the secret). Raises ValueError when kind,
    tenant and role disagree.
    """

    tenant_id: str | None
    key_id: UUID
    scopes: frozenset[str]
    kind: KeyKind = "tenant"
    prefix: str = ""
    label: str = ""
    role: Role | None = None

    def __post_init__(self) -> None:
        if (self.kind == "tenant") != (self.tenant_id is not None):
            raise ValueError("a tenant key has a tenant; an operator key has none")
        if (self.kind == "operator") != (self.role is not None):
            raise ValueError("an operator key has a role; a tenant key has none")

    def may(self, action: str) -> bool:
        """True when this caller may take the operator ``action`` (:data:`OPERATOR_ACTIONS`;
        an unknown action needs ``admin``): an operator key whose role ranks at least the
        action's. Tenant keys take no operator action."""
        if self.role is None:
            return False
        needed = OPERATOR_ACTIONS.get(action, "admin")
        return ROLES.index(self.role) >= ROLES.index(needed)

    @property
    def is_operator(self) -> bool:
        """True for an operator key (cross-tenant ``/v1/admin`` access)."""
        return self.kind == "operator"

    @property
    def actor(self) -> str:
        """How records name this caller (who resolved or replayed a dead letter): the
        key's display prefix and label, e.g. ``nex_op_1a2b3c4d (alice)``; never the secret."""
        return f"{self.prefix} ({self.label})" if self.label else self.prefix

    def has(self, scope: str) -> bool:
        """True if the key carries ``scope``."""
        return scope in self.scopes


@dataclass(frozen=True)
class TenantContext(AuthContext):
    """An :class:`AuthContext` of kind ``"tenant"``: ``tenant_id`` is always a string.
    What the tenant-scoped routes receive."""

    tenant_id: str


class RoleRefused(ExportError):
    """An operator key whose role does not allow the action (a viewer asking for a change):
    403, and nothing happened."""

    code = "role_insufficient"
    title = "Insufficient role"
    kind = "forbidden"


def authorize(ctx: AuthContext, action: str) -> None:
    """The one role check of the admin API and the console: return when ``ctx`` may take
    ``action`` (:meth:`AuthContext.may`), else raise :class:`RoleRefused` naming the key,
    its role and the role needed."""
    if ctx.may(action):
        return
    needed = OPERATOR_ACTIONS.get(action, "admin")
    raise RoleRefused(
        f"{ctx.actor} is a {ctx.role or 'tenant'} key: '{action}' changes state and needs an "
        f"{needed} operator key (exportctl operator-key set-role KEY {needed})",
        action=action,
        role=ctx.role,
        required_role=needed,
    )


def hash_key(key: str) -> bytes:
    """SHA-256 digest (32 bytes) of the full key."""
    return hashlib.sha256(key.encode("utf-8")).digest()


def generate_key(*, operator: bool = False) -> tuple[str, str]:
    """A new ``(key, display prefix)``; the key has 256 bits of randomness.

    Tenant keys are ``nex_<8 hex>_<secret>``, operator keys ``nex_op_<8 hex>_<secret>``.
    """
    public = secrets.token_hex(4)
    prefix = f"{OPERATOR_KEY_PREFIX if operator else KEY_PREFIX}{public}"
    return f"{prefix}_{secrets.token_urlsafe(32)}", prefix


def validate_scopes(scopes: list[str]) -> list[str]:
    """Return the tenant scopes, sorted and unique.

    Raises ValueError naming an unknown scope, or explaining that ``admin`` is not a
    tenant scope (operators get keys of their own: ``exportctl operator-key create``).
    """
    if OPERATOR_SCOPE in scopes:
        raise ValueError(
            "'admin' is not a tenant scope: a tenant key never reaches other tenants; "
            "create an operator key with `exportctl operator-key create --label NAME`"
        )
    unknown = sorted(set(scopes) - set(TENANT_SCOPES))
    if unknown:
        raise ValueError(
            f"unknown scope(s) {', '.join(unknown)}; known: {', '.join(TENANT_SCOPES)}"
        )
    return sorted(set(scopes))


def authenticate(conn: Conn, presented: str) -> AuthContext | None:
    """Resolve a presented key to who holds it, or None (unknown, malformed or revoked).

    A tenant key gives a :class:`TenantContext`; an operator key an :class:`AuthContext`
    with ``kind="operator"``, no tenant and the :data:`OPERATOR_SCOPE`. The stored SHA-256
    is compared in constant time (``hmac.compare_digest``).
    """
    if not presented.startswith(KEY_PREFIX) or len(presented) > 200:
        return None
    digest = hash_key(presented)
    if presented.startswith(OPERATOR_KEY_PREFIX):
        op_row = operator_store.operator_key_lookup(conn, key_hash=digest)
        if op_row is None or not hmac.compare_digest(bytes(op_row["key_hash"]), digest):
            return None
        return operator_context(op_row)
    row = api_key_store.api_key_lookup(conn, key_hash=digest)
    if row is None or not hmac.compare_digest(bytes(row["key_hash"]), digest):
        return None
    return TenantContext(
        tenant_id=row["tenant_id"],
        key_id=row["id"],
        # a cross-tenant scope never counts on a tenant key, whatever the row says
        scopes=frozenset(row["scopes"]) - {OPERATOR_SCOPE},
        kind="tenant",
        prefix=row.get("prefix", ""),
        label=row.get("label", ""),
    )


class ApiKeyCache:
    """Who holds a presented key, as :func:`authenticate` last said, kept ``ttl`` seconds per
    process (``API_KEY_CACHE_SECONDS``, at most 1): most requests then skip the key lookup,
    and a revoked, re-scoped or re-roled key is refused within ``ttl`` of the change. Entries are
    kept under the key's SHA-256, never the key; an unknown key is never cached (a new key
    works at once, and guesses do not fill the cache). At most ``max_entries`` keys (the
    oldest half is dropped past that). ``clock`` returns monotonic seconds. Thread-safe."""

    def __init__(
        self,
        ttl: float,
        max_entries: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self.clock = clock
        self._entries: dict[bytes, tuple[float, AuthContext]] = {}
        self._lock = threading.Lock()

    def authenticate(
        self, presented: str, lookup: Callable[[str], AuthContext | None]
    ) -> AuthContext | None:
        """The caller of ``presented``: from the cache while its entry is younger than
        ``ttl``, else from ``lookup`` (e.g. :func:`authenticate` on a connection)."""
        if self.ttl <= 0:
            return lookup(presented)
        digest = hash_key(presented)
        now = self.clock()
        with self._lock:
            cached = self._entries.get(digest)
        if cached is not None and now - cached[0] < self.ttl:
            return cached[1]
        ctx = lookup(presented)
        with self._lock:
            if ctx is None:
                self._entries.pop(digest, None)
                return None
            if len(self._entries) >= self.max_entries:
                for old in list(self._entries)[: self.max_entries // 2]:
                    del self._entries[old]
            self._entries[digest] = (now, ctx)
        return ctx


def create_api_key(
    conn: Conn, *, tenant_id: str, scopes: list[str], label: str = ""
) -> tuple[str, Row]:
    """Create a key for ``tenant_id``; returns ``(the key, its stored public row)``.

    The key itself is returned only here and never stored. Raises ValueError for an
    unknown scope or for ``admin`` (not a tenant scope).
    """
    key, prefix = generate_key()
    row = api_key_store.api_key_insert(
        conn,
        key_id=uuid4(),
        tenant_id=tenant_id,
        key_hash=hash_key(key),
        prefix=prefix,
        scopes=validate_scopes(scopes),
        label=label,
    )
    return key, row


def operator_context(row: Row) -> AuthContext:
    """The :class:`AuthContext` of an operator key's row (``id`` or ``key_id``, ``prefix``,
    ``label``, ``role``): the admin API's callers and the console's signed-in operators."""
    return AuthContext(
        tenant_id=None,
        key_id=row["id"] if "id" in row else row["key_id"],
        scopes=frozenset({OPERATOR_SCOPE}),
        kind="operator",
        prefix=str(row["prefix"]),
        label=str(row["label"] or ""),
        role=validate_role(str(row["role"])),
    )


def validate_role(role: str) -> Role:
    """``role`` as a :data:`Role`; raises ValueError naming the roles for anything else."""
    for known in ROLES:
        if role == known:
            return known
    raise ValueError(f"unknown role {role!r}; one of {', '.join(ROLES)}")


def create_operator_key(conn: Conn, *, label: str, role: str = "admin") -> tuple[str, Row]:
    """Create an operator key (cross-tenant ``/v1/admin``); returns ``(the key, its row)``.

    Only ``exportctl operator-key create`` calls this: there is no HTTP way to make one.
    ``label`` names the person or system holding it (1-100 characters, recorded as who
    replayed or resolved a dead letter); ``role`` is ``viewer`` or ``admin``. Raises
    ValueError for an empty or long label or an unknown role.
    """
    label = label.strip()
    if not 1 <= len(label) <= 100:
        raise ValueError("an operator key needs a --label of 1 to 100 characters (who holds it)")
    checked = validate_role(role)
    key, prefix = generate_key(operator=True)
    row = operator_store.operator_key_insert(
        conn, key_id=uuid4(), key_hash=hash_key(key), prefix=prefix, label=label, role=checked
    )
    return key, row
