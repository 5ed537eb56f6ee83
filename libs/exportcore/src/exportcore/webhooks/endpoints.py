"""Webhook endpoints of a tenant: create, change, rotate the secret, test, redeliver.

Used by the api's ``/v1/webhooks`` router; every function is tenant-scoped (another
tenant's endpoint reads as absent) and raises the domain errors below, which the api turns
into problem+json answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg_pool import ConnectionPool

from exportcore import audit
from exportcore.audit import SYSTEM, Actor
from exportcore.db import Conn, Row, transaction
from exportcore.domain import ExportError, new_id
from exportcore.settings import Settings
from exportcore.store import webhook_endpoints as endpoint_store
from exportcore.store import webhook_messages as message_store
from exportcore.webhooks import encryption, events, netguard
from exportcore.webhooks.signing import new_secret, secret_hint

EDITABLE = ("url", "description", "events", "enabled")


class WebhookNotFound(ExportError):
    """No such endpoint (or attempt) for this tenant (another tenant's reads the same)."""

    code = "webhook_not_found"
    title = "Webhook not found"
    kind = "not_found"


class InvalidWebhook(ExportError):
    """Unknown event types, an empty subscription, or another unacceptable field."""

    code = "invalid_webhook"
    title = "Invalid webhook"
    kind = "invalid"


class TooManyWebhooks(ExportError):
    """The tenant already has ``WEBHOOK_MAX_ENDPOINTS`` endpoints."""

    code = "too_many_webhooks"
    title = "Too many webhooks"
    kind = "conflict"


class WebhookDisabled(ExportError):
    """The endpoint is disabled: enable it (``PATCH {"enabled": true}``) first."""

    code = "webhook_disabled"
    title = "Webhook disabled"
    kind = "conflict"


def validate_events(values: Sequence[str] | None) -> list[str]:
    """The subscription as stored (unique, in the order of ``events.EVENT_TYPES``); None means
    every event type. Raises InvalidWebhook for an empty list or an unknown type."""
    if values is None:
        return list(events.EVENT_TYPES)
    unknown = sorted(set(values) - set(events.EVENT_TYPES))
    if unknown:
        raise InvalidWebhook(
            f"unknown event type(s) {', '.join(unknown)}; known: {', '.join(events.EVENT_TYPES)}"
        )
    if not values:
        raise InvalidWebhook("subscribe to at least one event type (or omit events for all)")
    return [e for e in events.EVENT_TYPES if e in set(values)]


def _url(settings: Settings, url: str) -> str:
    return netguard.validate_url(
        url,
        allow_http=settings.webhook_allow_http,
        allow_private=settings.webhook_allow_private_networks,
    ).url


def create_endpoint(
    pool: ConnectionPool[Conn],
    settings: Settings,
    *,
    tenant_id: str,
    url: str,
    event_types: Sequence[str] | None = None,
    description: str = "",
    enabled: bool = True,
    actor: Actor = SYSTEM,
) -> Row:
    """Register an endpoint with a new signing secret, stored encrypted with the current
    ``WEBHOOK_SECRET_KEYS`` key; returns the row plus ``secret``, the secret in plain text
    (never stored: the caller shows it once). Audited (``webhook_create`` by ``actor``).
    Raises InvalidWebhookUrl, InvalidWebhook, TooManyWebhooks, SecretKeysMissing."""
    checked = _url(settings, url)
    subscribed = validate_events(event_types)
    box = encryption.require(settings.webhook_secret_box())
    secret = new_secret()
    sealed = box.seal(secret)
    with transaction(pool) as conn:
        if not endpoint_store.tenant_lock(conn, tenant_id=tenant_id):
            raise WebhookNotFound(f"no tenant {tenant_id}")
        if endpoint_store.endpoint_count_for_tenant(conn, tenant_id=tenant_id) >= (
            settings.webhook_max_endpoints
        ):
            raise TooManyWebhooks(
                f"a tenant has at most {settings.webhook_max_endpoints} webhooks; delete one first"
            )
        row = endpoint_store.endpoint_insert(
            conn,
            endpoint_id=new_id(),
            tenant_id=tenant_id,
            url=checked,
            description=description,
            events=subscribed,
            enabled=enabled,
            secret_ciphertext=sealed.ciphertext,
            secret_key_id=sealed.key_id,
            secret_hint=secret_hint(secret),
        )
        _audit(conn, actor, "webhook_create", row["id"], tenant_id, {"events": subscribed})
        return {**row, "secret": secret}


def _audit(
    conn: Conn,
    actor: Actor,
    action: str,
    endpoint_id: UUID,
    tenant_id: str,
    detail: dict[str, Any] | None = None,
) -> None:
    """The audit row of a change to an endpoint (never its URL or its secret: a URL may
    carry a tenant's private path)."""
    audit.record(
        conn,
        actor,
        action,
        target_kind="webhook",
        target_id=endpoint_id,
        tenant_id=tenant_id,
        detail=detail,
    )


def update_endpoint(
    pool: ConnectionPool[Conn],
    settings: Settings,
    *,
    tenant_id: str,
    endpoint_id: UUID,
    patch: dict[str, Any],
    actor: Actor = SYSTEM,
) -> Row | None:
    """Apply a partial update (keys of :data:`EDITABLE`); None if there is no such endpoint.
    Enabling a disabled endpoint clears its failure record and resumes its pending messages.
    Audited (``webhook_update``, with the fields changed). Raises InvalidWebhookUrl or
    InvalidWebhook."""
    with transaction(pool) as conn:
        row = endpoint_store.endpoint_lock_for_tenant(
            conn, endpoint_id=endpoint_id, tenant_id=tenant_id
        )
        if row is None:
            return None
        merged = {k: row[k] for k in EDITABLE}
        if patch.get("url") is not None:
            merged["url"] = _url(settings, patch["url"])
        if "events" in patch:
            merged["events"] = validate_events(patch["events"])
        for key in ("description", "enabled"):
            if patch.get(key) is not None:
                merged[key] = patch[key]
        updated = endpoint_store.endpoint_update(
            conn, endpoint_id=endpoint_id, tenant_id=tenant_id, **merged
        )
        changed = sorted(k for k in EDITABLE if merged[k] != row[k])
        _audit(conn, actor, "webhook_update", endpoint_id, tenant_id, {"changed": changed})
        return updated


def delete_endpoint(
    pool: ConnectionPool[Conn], *, tenant_id: str, endpoint_id: UUID, actor: Actor = SYSTEM
) -> bool:
    """Delete the endpoint, its pending messages and its attempts (audited:
    ``webhook_delete``); False if absent."""
    with transaction(pool) as conn:
        deleted = endpoint_store.endpoint_delete(conn, endpoint_id=endpoint_id, tenant_id=tenant_id)
        if deleted:
            _audit(conn, actor, "webhook_delete", endpoint_id, tenant_id)
        return deleted


@dataclass(frozen=True)
class Rotation:
    """A rotated endpoint row and the new secret (shown once)."""

    endpoint: Row
    secret: str


def rotate_secret(
    pool: ConnectionPool[Conn],
    settings: Settings,
    *,
    tenant_id: str,
    endpoint_id: UUID,
    overlap_seconds: int,
    actor: Actor = SYSTEM,
) -> Rotation:
    """A new signing secret. Until now + ``overlap_seconds`` every message is signed with
    both (two signatures in ``webhook-signature``, Standard Webhooks "zero downtime secret
    rotation"), afterwards with the new one only. The new secret is stored encrypted with
    the current ``WEBHOOK_SECRET_KEYS`` key. Audited (``webhook_rotate_secret``). Raises
    WebhookNotFound, SecretKeysMissing."""
    box = encryption.require(settings.webhook_secret_box())
    secret = new_secret()
    sealed = box.seal(secret)
    with transaction(pool) as conn:
        row = endpoint_store.endpoint_rotate_secret(
            conn,
            endpoint_id=endpoint_id,
            tenant_id=tenant_id,
            secret_ciphertext=sealed.ciphertext,
            secret_key_id=sealed.key_id,
            secret_hint=secret_hint(secret),
            overlap_seconds=overlap_seconds,
        )
        if row is not None:
            _audit(
                conn,
                actor,
                "webhook_rotate_secret",
                endpoint_id,
                tenant_id,
                {"overlap_seconds": overlap_seconds},
            )
    if row is None:
        raise WebhookNotFound(f"no webhook {endpoint_id}")
    return Rotation(row, secret)


def _lock_enabled(conn: Conn, *, tenant_id: str, endpoint_id: UUID) -> Row:
    """The tenant's endpoint, locked for the rest of the transaction, that may be sent to
    now. Raises WebhookNotFound (no such endpoint for this tenant), WebhookDisabled."""
    row = endpoint_store.endpoint_lock_for_tenant(
        conn, endpoint_id=endpoint_id, tenant_id=tenant_id
    )
    if row is None:
        raise WebhookNotFound(f"no webhook {endpoint_id}")
    if not row["enabled"]:
        raise WebhookDisabled(f"webhook {endpoint_id} is disabled: {row['disabled_reason']}")
    return row


def send_test(pool: ConnectionPool[Conn], *, tenant_id: str, endpoint_id: UUID) -> Row:
    """Queue a ``webhook.test`` message to the endpoint (whatever it subscribes to); it is
    delivered, retried and recorded like any other. Raises WebhookNotFound, WebhookDisabled."""
    with transaction(pool) as conn:
        _lock_enabled(conn, tenant_id=tenant_id, endpoint_id=endpoint_id)
        return message_store.message_insert(
            conn,
            message_id=new_id(),
            endpoint_id=endpoint_id,
            tenant_id=tenant_id,
            event_type=events.TEST_EVENT,
            subject_id=endpoint_id,
            data={"webhook": {"id": str(endpoint_id)}},
        )


def redeliver(
    pool: ConnectionPool[Conn],
    *,
    tenant_id: str,
    endpoint_id: UUID,
    attempt_id: int,
    actor: Actor = SYSTEM,
) -> Row:
    """Send the message of one attempt again (same ``webhook-id``, a fresh attempt budget;
    audited: ``webhook_redeliver``). Raises WebhookNotFound (no such endpoint or attempt),
    WebhookDisabled."""
    with transaction(pool) as conn:
        _lock_enabled(conn, tenant_id=tenant_id, endpoint_id=endpoint_id)
        message = message_store.redeliver(
            conn, attempt_id=attempt_id, endpoint_id=endpoint_id, tenant_id=tenant_id
        )
        if message is not None:
            _audit(
                conn,
                actor,
                "webhook_redeliver",
                endpoint_id,
                tenant_id,
                {"attempt_id": attempt_id, "webhook_id": events.webhook_id(message["id"])},
            )
    if message is None:
        raise WebhookNotFound(f"webhook {endpoint_id} has no attempt {attempt_id}")
    return message


def recover(
    pool: ConnectionPool[Conn],
    *,
    tenant_id: str,
    endpoint_id: UUID,
    since: datetime,
    actor: Actor = SYSTEM,
) -> int:
    """Queue again every message of the endpoint that failed for good since ``since``
    (Svix's "recover"): same ``webhook-id``, a fresh attempt budget, due at once; audited
    (``webhook_recover``, with the count). Returns how many. Raises WebhookNotFound,
    WebhookDisabled (enable it first)."""
    with transaction(pool) as conn:
        _lock_enabled(conn, tenant_id=tenant_id, endpoint_id=endpoint_id)
        recovered = message_store.recover_since(
            conn, endpoint_id=endpoint_id, tenant_id=tenant_id, since=since
        )
        audit.record(
            conn,
            actor,
            "webhook_recover",
            target_kind="webhook",
            target_id=endpoint_id,
            tenant_id=tenant_id,
            count=recovered,
            detail={"since": since.isoformat()},
        )
    return recovered
