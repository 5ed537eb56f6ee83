"""Webhook signing secrets encrypted at rest with the deployment's keys (``WEBHOOK_SECRET_KEYS``).

A signing secret must be readable by the sender (HMAC is symmetric), so it cannot be
hashed like an API key; instead ``webhook_endpoints`` holds it encrypted (as Svix does),
so that a database dump or backup alone does not let anyone sign webhooks. The cipher is
``cryptography``'s Fernet (AES-128-CBC + HMAC-SHA256, authenticated, a random IV per
token; https://cryptography.io/en/latest/fernet/), never home-made code.

``WEBHOOK_SECRET_KEYS`` is a comma-separated list of Fernet keys (url-safe base64 of 32
bytes), the current key first: new secrets are encrypted with it, and every key decrypts
(:class:`cryptography.fernet.MultiFernet`). Each stored ciphertext is kept with the id of
the key that encrypted it (:func:`key_id`), so the processes can check at start that they
hold every key in use, and ``exportctl webhook reencrypt-secrets`` knows which rows still
need the current key. Rotation (docs/webhooks.md "Encryption at rest"): put a new key first,
roll out, run ``reencrypt-secrets``, then drop the old key.

Never logged: secrets, keys, ciphertexts. Errors name a key by its position and id only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from exportcore.domain import ExportError

ENV = "WEBHOOK_SECRET_KEYS"


class SecretKeysMissing(ExportError):
    """Secrets must be encrypted or decrypted but ``WEBHOOK_SECRET_KEYS`` is empty."""

    code = "webhook_secret_keys_missing"
    title = "Webhook secret keys missing"
    kind = "unavailable"


class SecretUndecryptable(ExportError):
    """A stored secret was encrypted with a key this process does not hold (or is damaged)."""

    code = "webhook_secret_undecryptable"
    title = "Webhook secret undecryptable"
    kind = "unavailable"


def key_id(key: bytes) -> str:
    """The public id of a Fernet key: the first 8 hex digits of SHA-256 over the key text
    (a one-way label of a 256-bit random key; it reveals nothing usable)."""
    return hashlib.sha256(key.strip()).hexdigest()[:8]


def new_key() -> str:
    """A new Fernet key (url-safe base64 of 32 random bytes) for ``WEBHOOK_SECRET_KEYS``."""
    return Fernet.generate_key().decode("ascii")


@dataclass(frozen=True)
class Sealed:
    """A secret as stored: the Fernet token (text, starts ``gAAAAA``) and its key's id."""

    ciphertext: str
    key_id: str


class SecretBox:
    """The deployment's keys: encrypts with the first, decrypts with any.

    Built from the text of ``WEBHOOK_SECRET_KEYS`` by :meth:`from_text`; raises ValueError
    naming the position of a malformed or repeated key (never its value)."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise ValueError(f"{ENV} holds no key")
        self._ids = tuple(key_id(k) for k in keys)
        self._fernets = {kid: Fernet(k) for kid, k in zip(self._ids, keys, strict=True)}
        self._multi = MultiFernet([self._fernets[kid] for kid in self._ids])

    @classmethod
    def from_text(cls, text: str | None) -> SecretBox | None:
        """The box of ``WEBHOOK_SECRET_KEYS`` (comma-separated, current first); None when
        empty. Raises ValueError for a malformed or repeated key, naming its position."""
        parts = [p.strip() for p in (text or "").split(",") if p.strip()]
        if not parts:
            return None
        keys: list[bytes] = []
        for n, part in enumerate(parts, 1):
            try:
                Fernet(part.encode("ascii"))
            except (ValueError, UnicodeEncodeError):
                raise ValueError(
                    f"{ENV}: key {n} of {len(parts)} is not a Fernet key (url-safe base64 of "
                    "32 bytes; `exportctl webhook new-secret-key` prints one)"
                ) from None
            keys.append(part.encode("ascii"))
        ids = [key_id(k) for k in keys]
        if len(set(ids)) != len(ids):
            raise ValueError(f"{ENV} names the same key twice")
        return cls(keys)

    @property
    def current_key_id(self) -> str:
        """The id of the key new secrets are encrypted with (the first)."""
        return self._ids[0]

    @property
    def key_ids(self) -> tuple[str, ...]:
        """The ids of every key held, current first."""
        return self._ids

    def seal(self, secret: str) -> Sealed:
        """``secret`` encrypted with the current key."""
        token = self._fernets[self.current_key_id].encrypt(secret.encode("utf-8"))
        return Sealed(token.decode("ascii"), self.current_key_id)

    def open(self, ciphertext: str, kid: str | None = None) -> str:
        """The secret of a stored ciphertext (``kid``: the stored key id, for the error).
        Raises SecretUndecryptable when no key held decrypts it."""
        try:
            return self._multi.decrypt(ciphertext.encode("ascii")).decode("utf-8")
        except (InvalidToken, UnicodeError):
            held = ", ".join(self._ids)
            raise SecretUndecryptable(
                f"a webhook signing secret is encrypted with key id {kid or 'unknown'}, which "
                f"{ENV} (key ids {held}) does not decrypt: restore that key "
                '(docs/webhooks.md "Encryption at rest")'
            ) from None

    def reseal(self, ciphertext: str, kid: str | None = None) -> Sealed:
        """The same secret encrypted with the current key (``MultiFernet.rotate``). Raises
        SecretUndecryptable like :meth:`open`."""
        if kid == self.current_key_id:
            return Sealed(ciphertext, kid)
        try:
            token = self._multi.rotate(ciphertext.encode("ascii"))
        except InvalidToken:
            self.open(ciphertext, kid)  # raises the error that names the key
            raise
        return Sealed(token.decode("ascii"), self.current_key_id)

    def __repr__(self) -> str:  # never the keys
        return f"SecretBox(key_ids={list(self._ids)})"


def require(box: SecretBox | None) -> SecretBox:
    """``box``, or SecretKeysMissing when the deployment has no ``WEBHOOK_SECRET_KEYS``."""
    if box is None:
        raise SecretKeysMissing(
            f"webhook signing secrets are stored encrypted and {ENV} is not set: set it to a "
            "key from `exportctl webhook new-secret-key` (docs/webhooks.md "
            '"Encryption at rest")'
        )
    return box
