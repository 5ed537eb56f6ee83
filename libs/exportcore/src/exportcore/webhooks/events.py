"""Webhook event types and the payload a receiver gets (docs/webhooks.md "Payloads").

The body follows the Standard Webhooks payload structure: ``type`` (a full-stop delimited
event type), ``timestamp`` (when the event occurred, RFC 3339 UTC) and ``data``. Payloads
are "thin" (the specification's term): ids, status, sizes, the error code and the download
link; never note content, titles, error details or anything the client did not send.

The database triggers (migration 0010) snapshot ``data`` when the state change commits; the
sender adds the links from ``API_PUBLIC_URL`` and serialises it the same way on every
attempt (sorted keys, no spaces), so a redelivered message has the same body.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

EXPORT_SUCCEEDED = "export.succeeded"
EXPORT_FAILED = "export.failed"
EXPORT_CANCELLED = "export.cancelled"
SCHEDULE_PAUSED = "schedule.paused"
#: the event types an endpoint can subscribe to (the triggers write these)
EVENT_TYPES = (EXPORT_SUCCEEDED, EXPORT_FAILED, EXPORT_CANCELLED, SCHEDULE_PAUSED)
#: sent by ``POST /v1/webhooks/{id}/test`` whatever the subscription
TEST_EVENT = "webhook.test"


def webhook_id(message_id: UUID) -> str:
    """The ``webhook-id`` of a message: ``msg_`` + 32 hex digits (no ``.``, as the
    specification requires of ids in the signed content)."""
    return f"msg_{message_id.hex}"


def message_uuid(webhook_id_: str) -> UUID:
    """The message id of a ``webhook-id``; raises ValueError when it is not one of ours."""
    if not webhook_id_.startswith("msg_"):
        raise ValueError("a webhook-id starts with msg_")
    return UUID(hex=webhook_id_[4:])


def _links(event_type: str, data: dict[str, Any], base_url: str) -> dict[str, Any]:
    root = base_url.rstrip("/")
    out = dict(data)
    if "export" in data and isinstance(data["export"], dict):
        export = dict(data["export"])
        self_link = f"{root}/v1/exports/{export['id']}"
        links = {"self": self_link, "events": f"{self_link}/events"}
        if event_type == EXPORT_SUCCEEDED:
            links["download"] = f"{self_link}/download"
        export["links"] = links
        out["export"] = export
    if "schedule" in data and isinstance(data["schedule"], dict):
        schedule = dict(data["schedule"])
        schedule["links"] = {"self": f"{root}/v1/schedules/{schedule['id']}"}
        out["schedule"] = schedule
    return out


def _rfc3339(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def render_body(
    event_type: str, occurred_at: datetime, data: dict[str, Any], base_url: str = ""
) -> str:
    """The exact JSON text sent (and signed) for one message.

    ``data`` is the snapshot the trigger stored; links are relative unless ``base_url``
    (``API_PUBLIC_URL``) is set. Deterministic: the same inputs give the same bytes."""
    body = {
        "type": event_type,
        "timestamp": _rfc3339(occurred_at),
        "data": _links(event_type, data, base_url),
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
