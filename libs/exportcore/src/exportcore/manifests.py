"""Export manifests: what an artifact holds, bound by hashes and signed with Ed25519.

Every artifact ends with a manifest (docs/api.md "Manifests"): one entry per snapshot item
in artifact order (``[note id, version, sha256 hex]`` for a note, ``[note id, version,
null]`` for a tombstone) and a small header that names the export, its kind (``full`` or
``delta``), its base (a delta's base export and that export's manifest SHA-256), the counts,
the snapshot time and ``entries_sha256``. The header's canonical bytes are what is signed
and what ``manifest_sha256`` (the identity a delta names as its base) is computed over, so a
signature covers every entry through ``entries_sha256``:

- ``entries_sha256`` = SHA-256 of the entry lines, in order: ``note <id> <version>
  <sha256>\\n`` or ``tombstone <id> <version>\\n`` (ASCII);
- canonical header bytes = RFC 8785 (JSON Canonicalization Scheme) of the header object
  (``rfc8785``); ``manifest_sha256`` = SHA-256 of them;
- signature = Ed25519 (RFC 8032, by ``cryptography``) over ``SIGNING_CONTEXT`` + the
  canonical header bytes, base64url without padding, with the key's ``key_id`` (the first
  16 hex digits of the SHA-256 of the raw 32-byte public key);
- ``files_sha256`` (manifest version 2, markdown_zip only; ``null`` for json and ndjson) =
  SHA-256 of the lines ``<note id> <path> <size>\n`` of ``manifest.json``'s file list, in
  order (``size``: the member's uncompressed bytes), so the signature covers the archive's
  member names and sizes too. A version-1 manifest has no ``files_sha256``: its file list
  is not covered by the signature (verify and restore then accept only the exact names
  ``notes/<slug>-<id>.md``, as the renderer writes them).

The deployment's private key is ``MANIFEST_SIGNING_KEY`` (a Secret in the chart); the public
keys (current, then ``MANIFEST_PREVIOUS_PUBLIC_KEYS`` during a rotation) are served as a
JWK Set (RFC 7517, OKP keys of RFC 8037) at ``GET /v1/manifest-keys``.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import rfc8785
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

MANIFEST_VERSION = 2
"""2: the header has ``files_sha256``. Verify still reads version 1 (no ``files_sha256``)."""
SIGNING_CONTEXT = b"notes-exports manifest v1\n"
"""Prefixed to the canonical header before signing (domain separation)."""

Entry = tuple[int, int, str | None]
"""``(note id, version, sha256 hex)`` of a note; the hash is None for a tombstone."""


def entry_line(entry: Sequence[Any]) -> bytes:
    """The line ``entries_sha256`` hashes for one entry (see the module docstring)."""
    note_id, version, digest = int(entry[0]), int(entry[1]), entry[2]
    if digest is None:
        return f"tombstone {note_id} {version}\n".encode("ascii")
    return f"note {note_id} {version} {digest}\n".encode("ascii")


def entries_sha256(entries: Iterable[Sequence[Any]]) -> str:
    """``entries_sha256`` of ``entries`` (hex)."""
    h = hashlib.sha256()
    for entry in entries:
        h.update(entry_line(entry))
    return h.hexdigest()


def file_line(note_id: int, path: str, size: int) -> bytes:
    """The line ``files_sha256`` hashes for one member of a markdown_zip's file list
    (UTF-8; a path holds no line break or space, the renderer's names are ASCII)."""
    return f"{int(note_id)} {path} {int(size)}\n".encode()


def files_sha256(files: Iterable[tuple[int, str, int]]) -> str:
    """``files_sha256`` of ``(note id, path, size)`` triples, in order (hex)."""
    h = hashlib.sha256()
    for note_id, path, size in files:
        h.update(file_line(note_id, path, size))
    return h.hexdigest()


def canonical(header: dict[str, Any]) -> bytes:
    """The RFC 8785 canonical bytes of a manifest header."""
    return bytes(rfc8785.dumps(header))


def manifest_sha256(header: dict[str, Any]) -> str:
    """The manifest's identity: SHA-256 (hex) of its canonical header bytes."""
    return hashlib.sha256(canonical(header)).hexdigest()


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def key_id(public: Ed25519PublicKey) -> str:
    """The first 16 hex digits of the SHA-256 of the raw public key."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def load_private_key(text: str) -> Ed25519PrivateKey:
    """An Ed25519 private key from a PKCS#8 PEM or the base64 of its 32 raw bytes; raises
    ValueError saying what is wrong (never the key itself)."""
    text = text.strip()
    if text.startswith("-----BEGIN"):
        key = serialization.load_pem_private_key(text.encode("ascii"), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError("MANIFEST_SIGNING_KEY is a PEM key but not an Ed25519 key")
        return key
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise ValueError(
            "MANIFEST_SIGNING_KEY must be a PKCS#8 PEM Ed25519 key or the base64 of its 32 "
            "raw bytes (exportctl manifest-key new prints one)"
        )
    return Ed25519PrivateKey.from_private_bytes(raw)


def load_public_key(text: str) -> Ed25519PublicKey:
    """An Ed25519 public key from the base64 (standard or url-safe) of its 32 raw bytes or
    a PEM ``PUBLIC KEY``; raises ValueError."""
    text = text.strip()
    if text.startswith("-----BEGIN"):
        key = serialization.load_pem_public_key(text.encode("ascii"))
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError("the PEM public key is not an Ed25519 key")
        return key
    try:
        raw = _unb64url(text.replace("+", "-").replace("/", "_").rstrip("="))
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise ValueError("an Ed25519 public key is 32 bytes (base64) or a PEM PUBLIC KEY")
    return Ed25519PublicKey.from_public_bytes(raw)


def new_private_key_text() -> tuple[str, str]:
    """A new key pair as ``(private base64, public base64)`` of the raw 32-byte keys."""
    key = Ed25519PrivateKey.generate()
    raw = key.private_bytes(
        serialization.Encoding.Raw,
        serialization.PrivateFormat.Raw,
        serialization.NoEncryption(),
    )
    pub = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode("ascii"), base64.b64encode(pub).decode("ascii")


def jwk(public: Ed25519PublicKey) -> dict[str, str]:
    """The public key as a JWK (RFC 8037 ``OKP`` / ``Ed25519``) with its ``kid``."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return {
        "kty": "OKP",
        "crv": "Ed25519",
        "x": _b64url(raw),
        "kid": key_id(public),
        "use": "sig",
        "alg": "EdDSA",
    }


def keys_from_jwks(document: dict[str, Any]) -> dict[str, Ed25519PublicKey]:
    """``{kid: key}`` of the Ed25519 keys of a JWK Set; other keys are ignored. Raises
    ValueError for a document that is not a JWK Set."""
    keys = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(keys, list):
        raise ValueError("not a JWK Set: no 'keys' list")
    out: dict[str, Ed25519PublicKey] = {}
    for item in keys:
        if isinstance(item, dict) and item.get("kty") == "OKP" and item.get("crv") == "Ed25519":
            public = Ed25519PublicKey.from_public_bytes(_unb64url(str(item["x"])))
            out[key_id(public)] = public
    return out


@dataclass(frozen=True)
class Signer:
    """The deployment's signing key and the public keys it publishes (current first)."""

    private: Ed25519PrivateKey
    previous: tuple[Ed25519PublicKey, ...] = field(default=())

    @property
    def key_id(self) -> str:
        """The current key's id."""
        return key_id(self.private.public_key())

    def sign(self, header: dict[str, Any], context: bytes = SIGNING_CONTEXT) -> dict[str, str]:
        """``{"alg": "Ed25519", "key_id", "value"}`` over ``context`` + the header's
        canonical bytes (``key_id`` must be this key's: the header names the key that signs
        it). ``context``: ``SIGNING_CONTEXT`` for a manifest, another for another kind of
        document (an encrypted artifact's envelope, :mod:`exportcore.encryption`)."""
        value = self.private.sign(context + canonical(header))
        return {"alg": "Ed25519", "key_id": self.key_id, "value": _b64url(value)}

    def public_keys(self) -> list[Ed25519PublicKey]:
        """The current public key, then the previous ones."""
        return [self.private.public_key(), *self.previous]

    @classmethod
    def from_texts(cls, private: str | None, previous: str = "") -> Signer | None:
        """A signer from ``MANIFEST_SIGNING_KEY`` / ``MANIFEST_PREVIOUS_PUBLIC_KEYS``
        (comma-separated); None without a key. Raises ValueError for a malformed key."""
        if not private:
            return None
        olds = tuple(load_public_key(p) for p in previous.split(",") if p.strip())
        return cls(load_private_key(private), olds)


def check_signature(
    header: dict[str, Any],
    signature: dict[str, Any],
    keys: dict[str, Ed25519PublicKey],
    context: bytes = SIGNING_CONTEXT,
) -> str | None:
    """None when ``signature`` is a valid Ed25519 signature of ``header`` (with
    ``context``, as :meth:`Signer.sign`) by one of ``keys`` (by ``key_id``); else what is
    wrong, in words."""
    if signature.get("alg") != "Ed25519":
        return f"unsupported signature algorithm {signature.get('alg')!r}"
    kid = str(signature.get("key_id"))
    if header.get("key_id") != kid:
        return "the signature's key_id is not the manifest's key_id"
    public = keys.get(kid)
    if public is None:
        return f"the manifest is signed by key {kid}, which is not among the trusted keys"
    try:
        public.verify(_unb64url(str(signature.get("value", ""))), context + canonical(header))
    except (InvalidSignature, ValueError):
        return f"the signature does not match the manifest (key {kid})"
    return None


def header(
    *,
    export_id: str,
    tenant: str,
    fmt: str,
    snapshot_at: str,
    base_id: str | None,
    base_manifest_sha256: str | None,
    notes: int,
    tombstones: int,
    digest: str,
    signer_key_id: str | None,
    files_digest: str | None = None,
) -> dict[str, Any]:
    """The manifest header (see the module docstring); ``snapshot_at`` in ISO 8601;
    ``files_digest``: a markdown_zip's ``files_sha256`` (None for the other formats)."""
    return {
        "manifest_version": MANIFEST_VERSION,
        "export_id": export_id,
        "tenant": tenant,
        "format": fmt,
        "kind": "delta" if base_id else "full",
        "snapshot_at": snapshot_at,
        "base": (
            {"export_id": base_id, "manifest_sha256": base_manifest_sha256} if base_id else None
        ),
        "notes": notes,
        "tombstones": tombstones,
        "entries_sha256": digest,
        "key_id": signer_key_id,
        "files_sha256": files_digest,
    }
