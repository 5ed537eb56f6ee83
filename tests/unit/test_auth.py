"""API keys: generation, hashing, scopes, key kinds, and authentication against stubbed
lookups (the database side is in tests/integration/test_operations.py)."""

from __future__ import annotations

import hashlib
import re
from typing import Any
from uuid import uuid4

import pytest

from exportcore import auth
from exportcore.auth import (
    DEFAULT_SCOPES,
    SCOPES,
    AuthContext,
    TenantContext,
    authenticate,
    generate_key,
    hash_key,
    validate_scopes,
)

KEY_SHAPE = re.compile(r"nex_([0-9a-f]{8})_([A-Za-z0-9_-]{43})")
OPERATOR_KEY_SHAPE = re.compile(r"nex_op_([0-9a-f]{8})_([A-Za-z0-9_-]{43})")


def test_generate_key_format() -> None:
    key, prefix = generate_key()
    m = KEY_SHAPE.fullmatch(key)
    assert m, key
    assert prefix == f"nex_{m.group(1)}"
    assert key.startswith(prefix + "_")
    assert len(prefix) == 12


def test_generated_keys_are_unique() -> None:
    keys = [generate_key() for _ in range(200)]
    assert len({k for k, _ in keys}) == 200
    assert len({p for _, p in keys}) > 190  # 32-bit prefixes: a collision is very unlikely


def test_hash_key_is_a_deterministic_sha256_digest() -> None:
    key, _ = generate_key()
    digest = hash_key(key)
    assert isinstance(digest, bytes)
    assert len(digest) == 32
    assert digest == hash_key(key) == hashlib.sha256(key.encode()).digest()
    assert hash_key(key + "x") != digest
    assert hash_key("nex_ü") == hashlib.sha256("nex_ü".encode()).digest()


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (["exports:read", "exports:write", "exports:read"], ["exports:read", "exports:write"]),
        ([], []),
        (list(SCOPES) * 2, sorted(SCOPES)),
    ],
)
def test_validate_scopes_sorts_and_dedupes(given: list[str], expected: list[str]) -> None:
    assert validate_scopes(given) == expected


def test_admin_is_not_a_tenant_scope() -> None:
    """A tenant key never holds a cross-tenant scope: operators get keys of their own."""
    assert "admin" not in SCOPES
    with pytest.raises(ValueError, match="operator-key create"):
        validate_scopes(["exports:read", "admin"])


def test_operator_keys_have_their_own_shape() -> None:
    key, prefix = generate_key(operator=True)
    m = OPERATOR_KEY_SHAPE.fullmatch(key)
    assert m, key
    assert prefix == f"nex_op_{m.group(1)}" and key.startswith(prefix + "_")
    # a tenant key's public part is hex: it can never look like an operator key
    assert not any(generate_key()[0].startswith("nex_op_") for _ in range(200))


def test_validate_scopes_names_every_unknown_scope() -> None:
    with pytest.raises(ValueError) as info:
        validate_scopes(["exports:read", "root", "Admin"])
    message = str(info.value)
    assert "Admin, root" in message
    assert "exports:read" in message.split("known:")[1]


def test_default_scopes_are_valid() -> None:
    assert validate_scopes(list(DEFAULT_SCOPES)) == sorted(DEFAULT_SCOPES)


def test_auth_context_has() -> None:
    ctx = AuthContext("acme", uuid4(), frozenset({"exports:read"}))
    assert ctx.has("exports:read")
    assert not ctx.has("admin")
    assert ctx.kind == "tenant" and not ctx.is_operator


def test_auth_context_kind_and_tenant_agree() -> None:
    operator = AuthContext(
        None, uuid4(), frozenset({"admin"}), "operator", "nex_op_1", "ops", role="admin"
    )
    assert operator.is_operator and operator.tenant_id is None
    assert operator.actor == "nex_op_1 (ops)"
    with pytest.raises(ValueError):
        AuthContext(None, uuid4(), frozenset(), "tenant")
    with pytest.raises(ValueError):
        AuthContext("acme", uuid4(), frozenset(), "operator", role="admin")
    with pytest.raises(ValueError, match="role"):
        AuthContext(None, uuid4(), frozenset(), "operator")  # an operator key has a role
    with pytest.raises(ValueError, match="role"):
        AuthContext("acme", uuid4(), frozenset(), role="viewer")  # a tenant key has none


def test_roles_are_checked_in_one_place_from_one_table() -> None:
    viewer = AuthContext(None, uuid4(), frozenset({"admin"}), "operator", "nex_op_v", "v", "viewer")
    admin = AuthContext(None, uuid4(), frozenset({"admin"}), "operator", "nex_op_a", "a", "admin")
    tenant = AuthContext("acme", uuid4(), frozenset({"exports:write"}))
    changes = [a for a, role in auth.OPERATOR_ACTIONS.items() if role == "admin"]
    assert {"replay", "resolve", "cancel", "pause", "resume", "run_now", "bulk_replay"} <= set(
        changes
    )
    for action in changes:
        assert admin.may(action) and not viewer.may(action) and not tenant.may(action)
        auth.authorize(admin, action)
        with pytest.raises(auth.RoleRefused, match="viewer") as refused:
            auth.authorize(viewer, action)
        assert refused.value.kind == "forbidden" and refused.value.extra["required_role"] == "admin"
    assert viewer.may("download") and not viewer.may("an_action_nobody_listed")
    assert auth.validate_role("viewer") == "viewer"
    with pytest.raises(ValueError, match="viewer, admin"):
        auth.validate_role("root")


@pytest.mark.parametrize("presented", ["", "Bearer nex_abc", "abc_nex_x", "nex_" + "a" * 300])
def test_malformed_keys_are_refused_without_a_lookup(presented: str) -> None:
    assert authenticate(None, presented) is None  # type: ignore[arg-type]


@pytest.fixture
def stored_key(monkeypatch: pytest.MonkeyPatch) -> tuple[str, dict[str, Any]]:
    """One key in a stubbed ``api_keys`` table keyed by hash."""
    key, _ = generate_key()
    row = {
        "id": uuid4(),
        "tenant_id": "acme",
        "key_hash": hash_key(key),
        "scopes": ["exports:read", "admin"],
        "prefix": key[:12],
        "label": "",
    }
    table = {row["key_hash"]: row}
    monkeypatch.setattr(
        auth.api_key_store, "api_key_lookup", lambda conn, *, key_hash: table.get(key_hash)
    )
    return key, row


def test_authenticate_resolves_a_known_key(stored_key: tuple[str, dict[str, Any]]) -> None:
    key, row = stored_key
    ctx = authenticate(None, key)  # type: ignore[arg-type]
    assert isinstance(ctx, TenantContext)
    # a row that still says "admin" (it cannot since revision 0007) grants no admin power
    assert ctx == TenantContext("acme", row["id"], frozenset({"exports:read"}), "tenant", key[:12])
    assert not ctx.is_operator and not ctx.has("admin")


def test_authenticate_resolves_an_operator_key(monkeypatch: pytest.MonkeyPatch) -> None:
    key, prefix = generate_key(operator=True)
    row = {
        "id": uuid4(),
        "key_hash": hash_key(key),
        "prefix": prefix,
        "label": "alice",
        "role": "viewer",
    }
    monkeypatch.setattr(
        auth.operator_store,
        "operator_key_lookup",
        lambda conn, *, key_hash: row if key_hash == row["key_hash"] else None,
    )
    monkeypatch.setattr(
        auth.api_key_store, "api_key_lookup", lambda conn, *, key_hash: pytest.fail("tenant table")
    )
    ctx = authenticate(None, key)  # type: ignore[arg-type]
    assert ctx is not None and ctx.is_operator and ctx.tenant_id is None
    assert ctx.has("admin") and ctx.actor == f"{prefix} (alice)" and ctx.role == "viewer"
    assert authenticate(None, key[:-1] + ("A" if key[-1] != "A" else "B")) is None  # type: ignore[arg-type]


def test_authenticate_refuses_an_unknown_key(stored_key: tuple[str, dict[str, Any]]) -> None:
    key, _ = stored_key
    assert authenticate(None, key[:-1] + ("A" if key[-1] != "A" else "B")) is None  # type: ignore[arg-type]
    assert authenticate(None, generate_key()[0]) is None  # type: ignore[arg-type]


def test_the_key_cache_trusts_a_lookup_for_its_ttl_only() -> None:
    """A revoked key is refused within API_KEY_CACHE_SECONDS: the cache answers from its
    entry while it is younger than the ttl and asks again after; an unknown key is never
    kept (a key created a moment later works at once)."""
    from uuid import uuid4

    from exportcore.auth import ApiKeyCache, TenantContext
    from tests.support import StepClock

    clock = StepClock()
    cache = ApiKeyCache(1.0, clock=clock)
    valid = {"nex_a": TenantContext(tenant_id="t", key_id=uuid4(), scopes=frozenset())}
    asked: list[str] = []

    def lookup(key: str):
        asked.append(key)
        return valid.get(key)

    assert cache.authenticate("nex_a", lookup) is valid["nex_a"]
    del valid["nex_a"]  # revoked
    clock.advance(0.99)
    assert cache.authenticate("nex_a", lookup) is not None and asked == ["nex_a"]
    clock.advance(0.01)
    assert cache.authenticate("nex_a", lookup) is None and asked == ["nex_a"] * 2
    assert cache.authenticate("nex_b", lookup) is None
    valid["nex_b"] = TenantContext(tenant_id="t", key_id=uuid4(), scopes=frozenset())
    assert cache.authenticate("nex_b", lookup) is valid["nex_b"]  # not remembered as unknown
    off = ApiKeyCache(0.0, clock=clock)
    off.authenticate("nex_b", lookup)
    off.authenticate("nex_b", lookup)
    assert asked.count("nex_b") == 4
    assert all(isinstance(k, bytes) for k in cache._entries)  # digests, never the key
