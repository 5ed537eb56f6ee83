"""Manifest hashing and Ed25519 signatures (exportcore.manifests): pure logic."""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from exportcore import manifests
from exportcore.manifests import Signer


def header(**changes: object) -> dict[str, object]:
    h = manifests.header(
        export_id="e1",
        tenant="acme",
        fmt="ndjson",
        snapshot_at="2026-12-03T00:00:00+00:00",
        base_id=None,
        base_manifest_sha256=None,
        notes=1,
        tombstones=1,
        digest=manifests.entries_sha256([[1, 2, "ab"], [3, 4, None]]),
        signer_key_id=None,
    )
    h.update(changes)
    return h


def test_entry_lines_are_the_documented_text() -> None:
    assert manifests.entry_line([1, 2, "ab"]) == b"note 1 2 ab\n"
    assert manifests.entry_line([3, 4, None]) == b"tombstone 3 4\n"


def test_canonical_form_ignores_key_order() -> None:
    h = header()
    assert manifests.canonical(h) == manifests.canonical(dict(reversed(list(h.items()))))
    assert manifests.manifest_sha256(h) != manifests.manifest_sha256(header(notes=2))


def test_a_signature_verifies_only_the_header_it_signed_with_its_key() -> None:
    signer = Signer.from_texts(manifests.new_private_key_text()[0])
    assert signer is not None
    h = header(key_id=signer.key_id)
    sig = signer.sign(h)
    keys = manifests.keys_from_jwks({"keys": [manifests.jwk(k) for k in signer.public_keys()]})
    assert manifests.check_signature(h, sig, keys) is None
    assert "does not match" in str(
        manifests.check_signature(header(key_id=signer.key_id, notes=5), sig, keys)
    )
    other = Signer.from_texts(manifests.new_private_key_text()[0])
    assert other is not None
    assert "not among the trusted keys" in str(
        manifests.check_signature(h, sig, {other.key_id: other.private.public_key()})
    )


def test_keys_load_from_pem_or_raw_base64_and_malformed_ones_are_refused() -> None:
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    raw = key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    a = manifests.load_private_key(pem)
    b = manifests.load_private_key(base64.b64encode(raw).decode())
    assert manifests.key_id(a.public_key()) == manifests.key_id(b.public_key())
    with pytest.raises(ValueError, match="32 raw bytes"):
        manifests.load_private_key("not a key")
    with pytest.raises(ValueError, match="32 bytes"):
        manifests.load_public_key("AAAA")


def test_previous_public_keys_are_published_after_the_current_one() -> None:
    old_private, old_public = manifests.new_private_key_text()
    signer = Signer.from_texts(manifests.new_private_key_text()[0], old_public)
    assert signer is not None
    kids = [manifests.key_id(k) for k in signer.public_keys()]
    assert kids[0] == signer.key_id and len(kids) == 2
    assert kids[1] == manifests.key_id(manifests.load_private_key(old_private).public_key())
