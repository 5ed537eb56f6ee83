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

from exportcore.domain import METADATA_MAX_KEYS, METADATA_VALUE_MAX, TAG_PATTERN, TAGS_MAX

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


# --- the event types and their JSON Schemas (GET /v1/webhooks/event-types) ----------------

_TIME = {"type": "string", "format": "date-time"}
_UUID = {"type": "string", "format": "uuid"}
_LINK = {"type": "string", "description": "absolute with API_PUBLIC_URL, else relative"}
_EXPORT: dict[str, Any] = {
    "type": "object",
    "required": [
        "id",
        "status",
        "format",
        "note_count",
        "attempts",
        "replay_of",
        "created_at",
        "finished_at",
        "result",
        "error",
        "links",
    ],
    "additionalProperties": False,
    "properties": {
        "id": _UUID,
        "status": {"enum": ["succeeded", "failed", "cancelled"]},
        "format": {"enum": ["json", "ndjson", "markdown_zip"]},
        "note_count": {"type": "integer", "minimum": 0},
        "attempts": {"type": "integer", "minimum": 0},
        "replay_of": {"oneOf": [_UUID, {"type": "null"}]},
        "created_at": _TIME,
        "finished_at": {"oneOf": [_TIME, {"type": "null"}]},
        "result": {
            "oneOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "required": ["rows", "bytes", "sha256"],
                    "additionalProperties": False,
                    "properties": {
                        "rows": {"type": "integer", "minimum": 0},
                        "bytes": {"type": "integer", "minimum": 0},
                        "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                    },
                },
            ]
        },
        "error": {
            "oneOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "required": ["code"],
                    "additionalProperties": False,
                    "properties": {"code": {"type": "string"}},
                },
            ]
        },
        # the export's metadata and tags (docs/api.md "Metadata and tags"); not required:
        # a message written before migration 0025 has neither
        "metadata": {
            "type": "object",
            "maxProperties": METADATA_MAX_KEYS,
            "additionalProperties": {"type": "string", "maxLength": METADATA_VALUE_MAX},
        },
        "tags": {
            "type": "array",
            "maxItems": TAGS_MAX,
            "items": {"type": "string", "pattern": f"^{TAG_PATTERN.pattern}$"},
        },
        "links": {
            "type": "object",
            "required": ["self", "events"],
            "additionalProperties": False,
            "properties": {"self": _LINK, "events": _LINK, "download": _LINK},
        },
    },
}


def _envelope(event_type: str, data: dict[str, Any]) -> dict[str, Any]:
    """The Standard Webhooks body of ``event_type``: ``type``, ``timestamp``, ``data``."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": event_type,
        "type": "object",
        "required": ["type", "timestamp", "data"],
        "additionalProperties": False,
        "properties": {
            "type": {"const": event_type},
            "timestamp": _TIME,
            "data": data,
        },
    }


def _export_event(status: str) -> dict[str, Any]:
    export = {**_EXPORT, "properties": {**_EXPORT["properties"], "status": {"const": status}}}
    return _envelope(
        f"export.{status}",
        {
            "type": "object",
            "required": ["export"],
            "additionalProperties": False,
            "properties": {"export": export},
        },
    )


EVENT_SCHEMAS: dict[str, dict[str, Any]] = {
    EXPORT_SUCCEEDED: _export_event("succeeded"),
    EXPORT_FAILED: _export_event("failed"),
    EXPORT_CANCELLED: _export_event("cancelled"),
    SCHEDULE_PAUSED: _envelope(
        SCHEDULE_PAUSED,
        {
            "type": "object",
            "required": ["schedule"],
            "additionalProperties": False,
            "properties": {
                "schedule": {
                    "type": "object",
                    "required": ["id", "enabled", "format", "next_due_at", "paused_at", "links"],
                    "additionalProperties": False,
                    "properties": {
                        "id": _UUID,
                        "enabled": {"const": False},
                        "format": {"enum": ["json", "ndjson", "markdown_zip"]},
                        "next_due_at": _TIME,
                        "paused_at": _TIME,
                        "links": {
                            "type": "object",
                            "required": ["self"],
                            "additionalProperties": False,
                            "properties": {"self": _LINK},
                        },
                    },
                }
            },
        },
    ),
    TEST_EVENT: _envelope(
        TEST_EVENT,
        {
            "type": "object",
            "required": ["webhook"],
            "additionalProperties": False,
            "properties": {
                "webhook": {
                    "type": "object",
                    "required": ["id"],
                    "additionalProperties": False,
                    "properties": {"id": _UUID},
                }
            },
        },
    ),
}
"""Every event type's body as a JSON Schema (draft 2020-12); tests/unit/test_webhooks.py
validates rendered bodies against them."""

EVENT_DESCRIPTIONS = {
    EXPORT_SUCCEEDED: "an export succeeded: its file can be downloaded",
    EXPORT_FAILED: "an export failed for good (its dead letter waits for an operator)",
    EXPORT_CANCELLED: "an export was cancelled",
    SCHEDULE_PAUSED: "a schedule was paused (by a request, or its selection became invalid)",
    TEST_EVENT: "a test message (POST /v1/webhooks/{id}/test), sent whatever the subscription",
}
