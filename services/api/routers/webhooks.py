"""``/v1/webhooks``: the caller's webhook endpoints, their signing secrets, test messages and
delivery attempts (tenant-scoped like exports; docs/webhooks.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from fastapi import APIRouter, Query, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from exportcore.db import Row
from exportcore.store import webhook_endpoints as endpoint_store
from exportcore.store import webhook_messages as message_store
from exportcore.webhooks import endpoints, events
from services.api.deps import (
    PoolDep,
    Reader,
    ReadRateLimited,
    SettingsDep,
    WebhookActionRateLimited,
    Writer,
    actor_of,
)
from services.api.problems import problem_responses
from services.api.schemas import Rfc3339

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"])

EventType = Literal["export.succeeded", "export.failed", "export.cancelled", "schedule.paused"]
_TEXT = r"^[^\x00-\x1f\x7f]*$"


class WebhookFields(BaseModel):
    """The fields shared by create and update (all optional on update)."""

    model_config = ConfigDict(extra="forbid")

    url: str | None = Field(
        default=None,
        min_length=8,
        max_length=2048,
        description="https:// URL the messages are POSTed to (http:// only where "
        "WEBHOOK_ALLOW_HTTP is set); no credentials, no fragment",
    )
    events: list[EventType] | None = Field(
        default=None,
        min_length=1,
        max_length=4,
        description="event types to receive; omitted on create: all of them",
    )
    description: str | None = Field(default=None, max_length=500, pattern=_TEXT)
    enabled: StrictBool | None = Field(
        default=None, description="false stops deliveries; true resumes them (and clears a disable)"
    )


class WebhookCreate(WebhookFields):
    """A new endpoint: its URL and, optionally, the events it receives."""

    url: str = Field(
        min_length=8, max_length=2048, description=WebhookFields.model_fields["url"].description
    )


class WebhookOut(BaseModel):
    """An endpoint and its delivery health (never its secret)."""

    id: UUID
    url: str
    description: str
    events: list[str]
    enabled: bool
    secret_hint: str = Field(description="the first characters of the current secret")
    previous_secret_expires_at: datetime | None = Field(
        description="end of a rotation's overlap (the previous secret still signs until then)"
    )
    consecutive_failures: int
    failing_since: datetime | None
    circuit_open_until: datetime | None
    last_success_at: datetime | None
    last_failure_at: datetime | None
    last_error: str | None
    disabled_reason: str | None
    disabled_at: datetime | None
    pending_messages: int | None = Field(
        default=None, description="messages not yet delivered (in single reads only)"
    )
    created_at: datetime
    updated_at: datetime


class WebhookCreated(WebhookOut):
    """The new endpoint with its signing secret: shown this once, store it now."""

    secret: str = Field(description="whsec_… signing secret (Standard Webhooks); shown once")


class RotateSecret(BaseModel):
    """How long the current secret keeps signing beside the new one."""

    model_config = ConfigDict(extra="forbid")

    overlap_seconds: StrictInt | None = Field(
        default=None,
        ge=0,
        le=604_800,
        description="0 retires the old secret at once; default WEBHOOK_SECRET_OVERLAP_SECONDS",
    )


class SecretRotated(BaseModel):
    """The new signing secret (shown once) and when the previous one stops signing."""

    id: UUID
    secret: str
    previous_secret_expires_at: datetime | None


class MessageQueued(BaseModel):
    """A message queued for delivery; its attempts appear under ``deliveries``."""

    message_id: UUID
    webhook_id: str
    event_type: str
    status: str
    next_attempt_at: datetime
    links: dict[str, str]


AttemptOutcome = Literal[
    "delivered", "http_error", "redirect", "gone", "timeout", "connection_error", "refused"
]


class Recover(BaseModel):
    """Recover the messages that failed for good since ``since``."""

    model_config = ConfigDict(extra="forbid")

    since: Rfc3339 = Field(description="RFC 3339; messages written at or after it")


class Recovered(BaseModel):
    """How many failed messages were queued again."""

    recovered: int
    since: datetime
    links: dict[str, str]


class AttemptOut(BaseModel):
    """One delivery attempt and the state of its message."""

    id: int
    webhook_id: str
    event_type: str
    subject_id: UUID
    attempt: int
    redelivery: bool
    started_at: datetime
    outcome: AttemptOutcome
    status_code: int | None
    latency_ms: float | None
    address: str | None
    signatures: int
    error: str | None
    message_status: Literal["pending", "delivered", "failed"]
    next_attempt_at: datetime | None


class AttemptPage(BaseModel):
    """Attempts newest first; pass ``next_cursor`` as ``cursor`` for the next page."""

    items: list[AttemptOut]
    next_cursor: int | None


def webhook_out(row: Row) -> WebhookOut:
    """Render an endpoint row (its secret only as a hint)."""
    return WebhookOut(**{k: row[k] for k in WebhookOut.model_fields if k in row})


def _base(settings: SettingsDep) -> str:
    return settings.api_public_url.rstrip("/")


def _queued(row: Row, endpoint_id: UUID, base: str) -> JSONResponse:
    out = MessageQueued(
        message_id=row["id"],
        webhook_id=events.webhook_id(row["id"]),
        event_type=row["event_type"],
        status=row["status"],
        next_attempt_at=row["next_attempt_at"],
        links={"deliveries": f"{base}/v1/webhooks/{endpoint_id}/deliveries"},
    )
    return JSONResponse(out.model_dump(mode="json"), status_code=202)


class EventTypeOut(BaseModel):
    """An event type: its name, what it means, whether endpoints subscribe to it, and the
    JSON Schema (draft 2020-12) of its bodies."""

    name: str
    description: str
    subscribable: bool
    schema_: dict[str, Any] = Field(alias="schema", serialization_alias="schema")

    model_config = ConfigDict(populate_by_name=True)


@router.get(
    "/event-types",
    response_model=list[EventTypeOut],
    response_model_by_alias=True,
    responses=problem_responses(401, 403, 503),
    summary="The event types, each with the JSON Schema of its bodies",
)
def event_types(caller: Reader) -> list[EventTypeOut]:
    """Every event a message can carry (``type``), and the schema its body follows."""
    return [
        EventTypeOut(
            name=name,
            description=events.EVENT_DESCRIPTIONS[name],
            subscribable=name in events.EVENT_TYPES,
            schema=schema,
        )
        for name, schema in events.EVENT_SCHEMAS.items()
    ]


@router.post(
    "",
    status_code=201,
    response_model=WebhookCreated,
    responses=problem_responses(400, 401, 403, 409, 413, 415, 422, 503),
    summary="Register a webhook endpoint (its secret is shown once)",
)
def create(
    body: WebhookCreate, caller: Writer, pool: PoolDep, settings: SettingsDep
) -> JSONResponse:
    """Register ``url`` for ``events`` (default: every event type). The answer carries the
    signing secret once; every message is signed with it (Standard Webhooks ``v1``)."""
    row = endpoints.create_endpoint(
        pool,
        settings,
        tenant_id=caller.tenant_id,
        url=body.url,
        event_types=body.events,
        description=body.description or "",
        enabled=True if body.enabled is None else body.enabled,
        actor=actor_of(caller),
    )
    out = WebhookCreated(**webhook_out(row).model_dump(), secret=row["secret"])
    return JSONResponse(
        out.model_dump(mode="json"),
        status_code=201,
        headers={"Location": f"{_base(settings)}/v1/webhooks/{out.id}"},
    )


@router.get("", response_model=list[WebhookOut], responses=problem_responses(401, 403, 429, 503))
def list_webhooks(caller: Reader, _rate: ReadRateLimited, pool: PoolDep) -> list[WebhookOut]:
    """The caller's endpoints, newest first."""
    with pool.connection() as conn:
        rows = endpoint_store.endpoint_list_for_tenant(conn, tenant_id=caller.tenant_id, limit=1000)
    return [webhook_out(r) for r in rows]


def _get(pool: PoolDep, tenant_id: str, endpoint_id: UUID) -> Row:
    with pool.connection() as conn:
        row = endpoint_store.endpoint_get_for_tenant(
            conn, endpoint_id=endpoint_id, tenant_id=tenant_id
        )
    if row is None:
        raise endpoints.WebhookNotFound(f"no webhook {endpoint_id}")
    return row


@router.get(
    "/{endpoint_id}",
    response_model=WebhookOut,
    responses=problem_responses(401, 403, 404, 422, 503),
)
def get_webhook(endpoint_id: UUID, caller: Reader, pool: PoolDep) -> WebhookOut:
    """One endpoint with its health, disable reason and pending messages."""
    return webhook_out(_get(pool, caller.tenant_id, endpoint_id))


@router.patch(
    "/{endpoint_id}",
    response_model=WebhookOut,
    responses=problem_responses(400, 401, 403, 404, 413, 415, 422, 503),
    summary="Change, disable or enable a webhook endpoint",
)
def patch_webhook(
    endpoint_id: UUID, body: WebhookFields, caller: Writer, pool: PoolDep, settings: SettingsDep
) -> WebhookOut:
    """``{"enabled": false}`` stops deliveries (messages wait); ``{"enabled": true}``
    resumes them and clears a disable and the failure record."""
    row = endpoints.update_endpoint(
        pool,
        settings,
        tenant_id=caller.tenant_id,
        endpoint_id=endpoint_id,
        patch=body.model_dump(exclude_unset=True),
        actor=actor_of(caller),
    )
    if row is None:
        raise endpoints.WebhookNotFound(f"no webhook {endpoint_id}")
    return webhook_out(row)


@router.delete(
    "/{endpoint_id}", status_code=204, responses=problem_responses(401, 403, 404, 422, 503)
)
def delete_webhook(endpoint_id: UUID, caller: Writer, pool: PoolDep) -> Response:
    """Delete the endpoint with its pending messages and its attempts."""
    if not endpoints.delete_endpoint(
        pool, tenant_id=caller.tenant_id, endpoint_id=endpoint_id, actor=actor_of(caller)
    ):
        raise endpoints.WebhookNotFound(f"no webhook {endpoint_id}")
    return Response(status_code=204)


@router.post(
    "/{endpoint_id}/rotate-secret",
    response_model=SecretRotated,
    responses=problem_responses(400, 401, 403, 404, 413, 415, 422, 503),
    summary="Rotate the signing secret (the new one is shown once)",
)
def rotate_secret(
    endpoint_id: UUID,
    caller: Writer,
    pool: PoolDep,
    settings: SettingsDep,
    body: RotateSecret | None = None,
) -> SecretRotated:
    """A new secret. During the overlap every message carries two signatures (new, old),
    so receivers can switch without losing a message; afterwards only the new one."""
    overlap = body.overlap_seconds if body is not None else None
    rotation = endpoints.rotate_secret(
        pool,
        settings,
        tenant_id=caller.tenant_id,
        endpoint_id=endpoint_id,
        overlap_seconds=settings.webhook_secret_overlap_seconds if overlap is None else overlap,
        actor=actor_of(caller),
    )
    return SecretRotated(
        id=rotation.endpoint["id"],
        secret=rotation.secret,
        previous_secret_expires_at=rotation.endpoint["previous_secret_expires_at"],
    )


@router.post(
    "/{endpoint_id}/test",
    status_code=202,
    response_model=MessageQueued,
    responses=problem_responses(401, 403, 404, 409, 422, 429, 503),
    summary="Send a webhook.test message",
)
def test_webhook(
    endpoint_id: UUID,
    caller: Writer,
    _rate: WebhookActionRateLimited,
    pool: PoolDep,
    settings: SettingsDep,
) -> JSONResponse:
    """Queue a signed ``webhook.test`` message (whatever the subscription); its attempt
    shows under ``deliveries``. 409 when the endpoint is disabled; 429 ``rate_limited``
    beyond the tenant's WEBHOOK_ACTION_RATE (tests and redeliveries together)."""
    row = endpoints.send_test(pool, tenant_id=caller.tenant_id, endpoint_id=endpoint_id)
    return _queued(row, endpoint_id, _base(settings))


@router.get(
    "/{endpoint_id}/attempts",
    response_model=AttemptPage,
    responses=problem_responses(401, 403, 404, 422, 429, 503),
    summary="Delivery attempts, newest first (paged)",
)
@router.get(
    "/{endpoint_id}/deliveries",
    response_model=AttemptPage,
    responses=problem_responses(401, 403, 404, 422, 429, 503),
    summary="Delivery attempts (the former name of /attempts)",
)
def deliveries(
    endpoint_id: UUID,
    caller: Reader,
    _rate: ReadRateLimited,
    pool: PoolDep,
    limit: int = Query(default=50, ge=1, le=500),
    cursor: int | None = Query(default=None, ge=1, description="next_cursor of a previous page"),
    outcome: AttemptOutcome | None = Query(default=None, description="only this outcome"),
    since: Rfc3339 | None = Query(default=None, description="started at or after (RFC 3339)"),
) -> AttemptPage:
    """Every attempt: status code, latency, error, address, and its message's state."""
    _get(pool, caller.tenant_id, endpoint_id)
    with pool.connection() as conn:
        rows = message_store.attempts_for_endpoint(
            conn,
            endpoint_id=endpoint_id,
            limit=limit + 1,
            before_id=cursor,
            outcome=outcome,
            since=since,
        )
    items = [
        AttemptOut(webhook_id=events.webhook_id(r["message_id"]), **_attempt_fields(r))
        for r in rows[:limit]
    ]
    return AttemptPage(items=items, next_cursor=items[-1].id if len(rows) > limit else None)


def _attempt_fields(r: Row) -> dict[str, Any]:
    return {k: r[k] for k in AttemptOut.model_fields if k in r}


@router.post(
    "/{endpoint_id}/deliveries/{attempt_id}/redeliver",
    status_code=202,
    response_model=MessageQueued,
    responses=problem_responses(401, 403, 404, 409, 422, 429, 503),
    summary="Send an attempt's message again (same webhook-id)",
)
def redeliver(
    endpoint_id: UUID,
    attempt_id: int,
    caller: Writer,
    _rate: WebhookActionRateLimited,
    pool: PoolDep,
    settings: SettingsDep,
) -> JSONResponse:
    """Queue the attempt's message again with the same ``webhook-id`` (receivers
    de-duplicate on it) and a fresh attempt budget. 409 when the endpoint is disabled; 429
    ``rate_limited`` beyond the tenant's WEBHOOK_ACTION_RATE (tests and redeliveries
    together)."""
    row = endpoints.redeliver(
        pool,
        tenant_id=caller.tenant_id,
        endpoint_id=endpoint_id,
        attempt_id=attempt_id,
        actor=actor_of(caller),
    )
    return _queued(row, endpoint_id, _base(settings))


@router.post(
    "/{endpoint_id}/recover",
    status_code=202,
    response_model=Recovered,
    responses=problem_responses(400, 401, 403, 404, 409, 415, 422, 429, 503),
    summary="Send again every message that failed since a time (as Svix's recover)",
)
def recover(
    endpoint_id: UUID,
    body: Recover,
    caller: Writer,
    _rate: WebhookActionRateLimited,
    pool: PoolDep,
    settings: SettingsDep,
) -> JSONResponse:
    """Every message of the endpoint that used up its attempts and was written at or after
    ``since`` is queued again, with its own ``webhook-id`` and a fresh attempt budget (the
    receiver de-duplicates on the id). Messages older than ``WEBHOOK_RETENTION_DAYS`` are
    gone. 409 when the endpoint is disabled (enable it first); 429 ``rate_limited`` beyond
    the tenant's WEBHOOK_ACTION_RATE (with tests and redeliveries)."""
    count = endpoints.recover(
        pool,
        tenant_id=caller.tenant_id,
        endpoint_id=endpoint_id,
        since=body.since,
        actor=actor_of(caller),
    )
    out = Recovered(
        recovered=count,
        since=body.since,
        links={"attempts": f"{_base(settings)}/v1/webhooks/{endpoint_id}/attempts"},
    )
    return JSONResponse(out.model_dump(mode="json"), status_code=202)
