"""The stored webhook signing secrets against the deployment's ``WEBHOOK_SECRET_KEYS``: the
start check of the processes that use them, and the re-encryption of a key rotation.

- :func:`check_keys` (api and webhook-delivery at start): every key id the table uses must
  be held, so that a missing or dropped key stops the process at start with a message that
  says what to do, never at the first delivery.
- :func:`reencrypt` (``exportctl webhook reencrypt-secrets``): re-encrypts every stored
  secret with the current key (``MultiFernet.rotate``), in short batches, and drops
  previous secrets whose overlap has ended; afterwards the older keys can be removed.

See :mod:`exportcore.webhooks.encryption` and docs/webhooks.md "Encryption at rest".
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from exportcore.db import DATABASE_UNAVAILABLE, Conn, transaction
from exportcore.store import webhook_endpoints as endpoint_store
from exportcore.webhooks.encryption import ENV, SecretBox, SecretKeysMissing

log = logging.getLogger(__name__)

REENCRYPT_BATCH = 200


class SecretKeyNotHeld(SecretKeysMissing):
    """Stored secrets are encrypted with a key that ``WEBHOOK_SECRET_KEYS`` lacks."""

    code = "webhook_secret_key_not_held"
    title = "Webhook secret key not held"


def check_keys(
    pool: ConnectionPool[Conn], box: SecretBox | None, *, timeout: float | None = None
) -> dict[str, int]:
    """The stored secrets by key id (key id -> count: current secrets and previous ones
    still signing) after checking that ``box`` holds every key id in use. Raises
    SecretKeysMissing when secrets are stored and ``box`` is None, SecretKeyNotHeld when a
    key id in use is not among ``box``'s (nothing to check before the schema is migrated),
    and one of ``exportcore.db.DATABASE_UNAVAILABLE``
    when no connection comes within ``timeout`` seconds (None: the pool's)."""
    try:
        with pool.connection(timeout=timeout) as conn:
            counts = endpoint_store.secret_key_census(conn)
    except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn):
        # a schema not migrated yet (before 0022): no encrypted secret to check
        log.warning("webhook secret keys not checked: the schema is not migrated")
        return {}
    if not counts:
        return counts
    total = sum(counts.values())
    if box is None:
        raise SecretKeysMissing(
            f"{total} webhook signing secret(s) are stored encrypted and {ENV} is not set: "
            f"set {ENV} to the keys that encrypted them (key ids {', '.join(counts)}; "
            'docs/webhooks.md "Encryption at rest")'
        )
    missing = {kid: n for kid, n in counts.items() if kid not in box.key_ids}
    if missing:
        named = ", ".join(f"{kid} ({n} secret(s))" for kid, n in missing.items())
        raise SecretKeyNotHeld(
            f"webhook signing secrets are encrypted with key id(s) {named} that {ENV} (key "
            f"ids {', '.join(box.key_ids)}) does not hold: add the key(s) back, after the "
            "current one (a key is removed only once `exportctl webhook reencrypt-secrets` "
            'reports none left under it; docs/webhooks.md "Encryption at rest")'
        )
    return counts


@dataclass
class Reencrypted:
    """What :func:`reencrypt` did: ``secrets`` re-encrypted with the current key,
    ``expired`` previous secrets dropped, and the census after (key id -> secrets)."""

    secrets: int = 0
    expired: int = 0
    census: dict[str, int] = field(default_factory=dict)


def reencrypt(
    pool: ConnectionPool[Conn], box: SecretBox, *, batch: int = REENCRYPT_BATCH
) -> Reencrypted:
    """Re-encrypt every stored secret not under ``box``'s current key and drop the previous
    secrets whose overlap has ended, ``batch`` endpoints per transaction, until none is
    left (a row another transaction holds at that moment is skipped: the census returned
    still counts it under its old key, and a second run takes it). Safe to run beside the
    api and webhook-delivery (they decrypt with any key held) and to run again. Raises
    SecretUndecryptable (naming the key id) when a secret's key is not held: nothing of
    that batch is written."""
    done = Reencrypted()
    while True:
        with transaction(pool) as conn:
            rows = endpoint_store.secrets_to_reencrypt(
                conn, current_key_id=box.current_key_id, limit=batch
            )
            if not rows:
                break
            updates: list[dict[str, Any]] = []
            for row in rows:
                current = box.reseal(row["secret_ciphertext"], row["secret_key_id"])
                done.secrets += current.key_id != row["secret_key_id"]
                previous = None
                if row["previous_secret_ciphertext"] is not None:
                    if row["previous_valid"]:
                        previous = box.reseal(
                            row["previous_secret_ciphertext"], row["previous_secret_key_id"]
                        )
                        done.secrets += previous.key_id != row["previous_secret_key_id"]
                    else:
                        done.expired += 1
                updates.append(
                    {
                        "id": row["id"],
                        "ciphertext": current.ciphertext,
                        "key_id": current.key_id,
                        "previous_ciphertext": previous.ciphertext if previous else None,
                        "previous_key_id": previous.key_id if previous else None,
                    }
                )
            endpoint_store.secrets_reencrypted(conn, updates)
    with pool.connection() as conn:
        done.census = endpoint_store.secret_key_census(conn)
    return done


def check_keys_at_start(
    pool: ConnectionPool[Conn],
    box: SecretBox | None,
    *,
    retry_seconds: float,
    stop: threading.Event,
) -> dict[str, int] | None:
    """:func:`check_keys` for a process that starts (webhook-delivery): retried every
    ``retry_seconds`` while the database does not answer (a restart, a failover: logged as
    a warning), until it answers or ``stop`` is set (then None). Raises SecretKeysMissing
    (or SecretKeyNotHeld) for the process to exit with."""
    while not stop.is_set():
        try:
            return check_keys(pool, box)
        except DATABASE_UNAVAILABLE as exc:
            log.warning(
                "database unavailable for the webhook secret key check; retrying",
                extra={"error": type(exc).__name__},
            )
            stop.wait(retry_seconds)
    return None
