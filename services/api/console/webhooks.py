"""``/console/webhooks``: every tenant's webhook endpoints with their health (success rate,
last error, breaker state, attempts, pending messages, why a disabled one was disabled), one
endpoint's attempts, and redeliver one attempt or every message that failed since a time."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from exportcore.db import Row
from exportcore.domain import ExportError
from exportcore.store import console as console_store
from exportcore.store import webhook_messages as message_store
from exportcore.webhooks import endpoints
from exportcore.webhooks.events import webhook_id
from services.api.console.render import error_page, found_or_404, notice, page
from services.api.console.schedules import tenant_keyset
from services.api.console.sessions import Action, CurrentOperator, admin_action
from services.api.deps import PoolDep

log = logging.getLogger(__name__)

router = APIRouter(prefix="/console/webhooks", include_in_schema=False)

PAGE_SIZE = 50
SAMPLE = 500
ATTEMPTS = 50


def breaker(row: dict[str, Any], now: datetime) -> tuple[str, str]:
    """The endpoint's delivery state in words and its tone: disabled (with why), circuit
    open (until when), failing, or healthy."""
    if not row["enabled"]:
        return "disabled", "bad"
    until = row.get("circuit_open_until")
    if until is not None and until > now:
        return "circuit open", "bad"
    if row.get("failing_since"):
        return "failing", "warn"
    return "closed (healthy)", "ok"


@router.get("")
def webhooks_page(request: Request, operator: CurrentOperator, pool: PoolDep) -> Response:
    """Endpoints by tenant with their health; ``tenant`` filters."""
    tenant = request.query_params.get("tenant", "").strip()[:63] or None
    after = tenant_keyset(request.query_params.get("after", "")[:200])
    now = datetime.now(UTC)
    with pool.connection() as conn:
        rows = console_store.webhooks_page(
            conn, limit=PAGE_SIZE + 1, sample=SAMPLE, tenant_id=tenant, after=after
        )
    items = rows[:PAGE_SIZE]
    for r in items:
        r["state"], r["tone"] = breaker(r, now)
        r["rate"] = round(100 * r["delivered"] / r["attempts"]) if r["attempts"] else None
    last = items[-1] if len(rows) > PAGE_SIZE else None
    return page(
        request,
        "webhooks.html",
        {
            "nav": "webhooks",
            "items": items,
            "tenant": tenant or "",
            "sample": SAMPLE,
            "next_after": f"{last['tenant_id']}~{last['created_at'].isoformat()}~{last['id']}"
            if last
            else None,
            "first_page": after is not None,
            "notice": notice(request),
        },
    )


def _endpoint_or_404(request: Request, pool: PoolDep, raw: str) -> dict[str, Any] | Response:
    def find(endpoint_id: UUID) -> Row | None:
        with pool.connection() as conn:
            return console_store.webhook(conn, endpoint_id=endpoint_id)

    return found_or_404(request, raw, find, "webhook")


@router.get("/{endpoint_id}")
def endpoint_page(
    request: Request, endpoint_id: str, operator: CurrentOperator, pool: PoolDep
) -> Response:
    """One endpoint: its health and its latest attempts."""
    row = _endpoint_or_404(request, pool, endpoint_id)
    if isinstance(row, Response):
        return row
    now = datetime.now(UTC)
    row["state"], row["tone"] = breaker(row, now)
    with pool.connection() as conn:
        attempts = message_store.attempts_for_endpoint(conn, endpoint_id=row["id"], limit=ATTEMPTS)
    for a in attempts:
        a["webhook_id"] = webhook_id(a["message_id"])
    return page(
        request,
        "webhook.html",
        {
            "nav": "webhooks",
            "w": row,
            "attempts": attempts,
            "since_default": (now - timedelta(hours=24)).strftime("%Y-%m-%dT%H:%M"),
            "notice": notice(request),
        },
    )


@router.post("/{endpoint_id}/attempts/{attempt_id}/redeliver")
def redeliver(
    request: Request,
    endpoint_id: str,
    attempt_id: int,
    action: Annotated[Action, admin_action("webhook_redeliver")],
    pool: PoolDep,
) -> Response:
    """Send one attempt's message again (same webhook-id), for the endpoint's tenant."""
    row = _endpoint_or_404(request, pool, endpoint_id)
    if isinstance(row, Response):
        return row
    try:
        endpoints.redeliver(
            pool,
            tenant_id=row["tenant_id"],
            endpoint_id=row["id"],
            attempt_id=attempt_id,
            actor=action.operator.actor,
        )
    except ExportError as exc:
        return error_page(request, 409, "Not sent again", exc.detail)
    return RedirectResponse(f"/console/webhooks/{row['id']}?done=redelivered", 303)


@router.post("/{endpoint_id}/recover")
def recover(
    request: Request,
    endpoint_id: str,
    action: Annotated[Action, admin_action("webhook_recover")],
    pool: PoolDep,
) -> Response:
    """Send again every message of the endpoint that failed for good since a time."""
    row = _endpoint_or_404(request, pool, endpoint_id)
    if isinstance(row, Response):
        return row
    raw = str(action.form.get("since") or action.form.get("since_local") or "").strip()
    try:
        since = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return error_page(request, 400, "Not a time", f"'{raw[:40]}' is not a date and time.")
    since = since if since.tzinfo else since.replace(tzinfo=UTC)
    try:
        count = endpoints.recover(
            pool,
            tenant_id=row["tenant_id"],
            endpoint_id=row["id"],
            since=since,
            actor=action.operator.actor,
        )
    except ExportError as exc:
        return error_page(request, 409, "Nothing was sent again", exc.detail)
    log.info("console webhook recover", extra={"endpoint_id": str(row["id"]), "count": count})
    return RedirectResponse(f"/console/webhooks/{row['id']}?done=recovered&n={count}", 303)
