"""Signing secrets and signatures, by the Standard Webhooks specification's own library.

Standard Webhooks 1.0 ("Signature scheme", "Webhook headers"): the symmetric scheme signs
``{webhook-id}.{webhook-timestamp}.{body}`` with HMAC-SHA256 under a random secret of 24 to
64 bytes serialised as ``whsec_<base64>``, and sends ``v1,<base64 signature>``; the
``webhook-signature`` header is a space-delimited list so that a message can carry one
signature per valid secret during a rotation ("zero downtime secret rotation"). The HMAC is
computed by ``standardwebhooks.Webhook`` (PyPI ``standardwebhooks``), never here.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Sequence
from datetime import UTC, datetime

from standardwebhooks import Webhook

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32  # within the specification's 24..64 bytes


def new_secret() -> str:
    """A new signing secret ``whsec_<base64 of 32 random bytes>`` (``secrets`` CSPRNG)."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode("ascii")


def secret_hint(secret: str) -> str:
    """A non-secret label for a secret (``whsec_ab12…``: 4 characters), for listings."""
    return secret[: len(SECRET_PREFIX) + 4] + "…"


def signature_header(
    message_id: str, timestamp: int, body: str, signing_secrets: Sequence[str]
) -> str:
    """The ``webhook-signature`` value: ``v1,<sig>`` per secret, space-separated, in the
    order given (the current secret first).

    ``timestamp`` is the ``webhook-timestamp`` (Unix seconds); ``body`` is the exact text
    sent. Raises ValueError when ``signing_secrets`` is empty."""
    if not signing_secrets:
        raise ValueError("a message needs at least one signing secret")
    at = datetime.fromtimestamp(timestamp, tz=UTC)
    return " ".join(
        Webhook(secret).sign(msg_id=message_id, timestamp=at, data=body)
        for secret in signing_secrets
    )


def webhook_headers(
    message_id: str, timestamp: int, body: str, signing_secrets: Sequence[str]
) -> dict[str, str]:
    """The three Standard Webhooks headers for one attempt (plus the JSON content type)."""
    return {
        "content-type": "application/json",
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature_header(message_id, timestamp, body, signing_secrets),
    }
