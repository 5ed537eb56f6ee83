"""``/console/bulk``: cancel or replay every job a filter matches — the count first, a
confirmation that names it, then the run (written here; run by the recovery-scanner's bulk
runner, :mod:`exportcore.bulk_runner`), followed live on its audit page."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any
from uuid import UUID, uuid4

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from exportcore import bulk
from exportcore.domain import ExportError
from services.api.console.jobs import parse_filters
from services.api.console.render import error_page, page
from services.api.console.sessions import Action, CurrentOperator, admin_action
from services.api.deps import PoolDep, SettingsDep

log = logging.getLogger(__name__)

router = APIRouter(prefix="/console/bulk", include_in_schema=False)

WHAT = {"cancel": "Cancel", "replay": "Replay"}
FIELDS = ("status", "queue", "tenant", "error_code", "from", "to", "tags", "meta")


def bulk_filter(kind: str, params: Mapping[str, str]) -> bulk.BulkFilter | str:
    """The bulk filter of the jobs page's filters (``status``, ``queue``, ``tenant``,
    ``error_code``, ``from``, ``to``, ``since``, ``tags``, ``meta``), or the error to
    show."""
    filters = parse_filters(params, _now())
    if filters.errors:
        return "; ".join(filters.errors)
    status = filters.status
    if kind == "replay" and status is None:
        status = "failed"
    return bulk.BulkFilter(
        status=status,
        queue=filters.queue,
        tenant_id=filters.tenant_id,
        reason=filters.error_code,
        created_from=filters.created_from,
        created_to=filters.created_to,
        tags=filters.tags,
        metadata=filters.metadata,
    )


def _now() -> datetime:
    return datetime.now(UTC)


def _kind_or_404(request: Request, kind: str) -> Response | None:
    if kind not in WHAT:
        return error_page(request, 404, "No such bulk action", "A bulk action cancels or replays.")
    return None


@router.get("/{kind}")
def confirm(request: Request, kind: str, operator: CurrentOperator, pool: PoolDep) -> Response:
    """The confirmation: how many jobs the filter matches now, and what acting on them does."""
    if (bad := _kind_or_404(request, kind)) is not None:
        return bad
    filt = bulk_filter(kind, request.query_params)
    if isinstance(filt, str):
        return error_page(request, 400, "The filter is not valid", filt)
    try:
        seen = bulk.preview(pool, kind, filt)
    except ExportError as exc:
        return error_page(request, 422, "No bulk action for this filter", exc.detail)
    params = {k: request.query_params[k] for k in FIELDS if request.query_params.get(k)}
    if filt.created_from and "from" not in params:  # a "since" range, frozen to its instant
        params["from"] = filt.created_from.isoformat()
    if kind == "replay":
        params["status"] = "failed"
    return page(
        request,
        "bulk_confirm.html",
        {
            "nav": "jobs",
            "kind": kind,
            "what": WHAT[kind],
            "preview": seen,
            "description": filt.describe(),
            "params": params,
            "request_id": uuid4(),
            "batch": bulk.BATCH_SIZE,
            "back": "/console/jobs?" + "&".join(f"{k}={v}" for k, v in params.items()),
        },
    )


async def _start(
    request: Request, kind: str, action: Action, pool: PoolDep, settings: SettingsDep
) -> Response:
    form: dict[str, Any] = {k: str(v) for k, v in action.form.items()}
    filt = bulk_filter(kind, {k: form[k] for k in FIELDS if form.get(k)})
    if isinstance(filt, str):
        return error_page(request, 400, "The filter is not valid", filt)
    try:
        as_of = datetime.fromisoformat(form.get("as_of", ""))
        confirmed = int(form.get("confirmed", ""))
        request_id = UUID(form.get("request_id", ""))
    except ValueError:
        return error_page(
            request, 400, "The confirmation is not valid", "Start again from the jobs page."
        )
    try:
        run_row, created = bulk.start(
            pool,
            action.operator.actor,
            kind,
            filt,
            as_of=as_of,
            confirmed=confirmed,
            request_id=request_id,
        )
    except ExportError as exc:
        return error_page(request, 422, "The bulk action was not started", exc.detail)
    log.info(
        "console bulk action",
        extra={
            "bulk_id": run_row["id"],
            "kind": kind,
            "new_run": created,
            "operator_key_id": str(action.operator.key_id),
        },
    )
    return RedirectResponse(f"/console/audit/{run_row['audit_id']}?done=bulk_started", 303)


@router.post("/cancel")
async def start_cancel(
    request: Request,
    action: Annotated[Action, admin_action("bulk_cancel")],
    pool: PoolDep,
    settings: SettingsDep,
) -> Response:
    """Start the confirmed bulk cancel (idempotent: the same confirmation twice starts one)."""
    return await _start(request, "cancel", action, pool, settings)


@router.post("/replay")
async def start_replay(
    request: Request,
    action: Annotated[Action, admin_action("bulk_replay")],
    pool: PoolDep,
    settings: SettingsDep,
) -> Response:
    """Start the confirmed bulk replay (idempotent: the same confirmation twice starts one)."""
    return await _start(request, "replay", action, pool, settings)


@router.post("/runs/{bulk_id}/resume")
def resume(
    request: Request,
    bulk_id: int,
    action: Annotated[Action, admin_action("bulk_resume")],
    pool: PoolDep,
    settings: SettingsDep,
) -> Response:
    """Wake the bulk runners for a run whose runner went silent: a recovery-scanner takes
    it on from its last committed batch (they do so by themselves once its lease ends)."""
    try:
        row = bulk.nudge(pool, bulk_id)
    except ExportError as exc:
        return error_page(request, 404, "No such bulk action", exc.detail)
    return RedirectResponse(f"/console/audit/{row['audit_id']}?done=bulk_resumed", 303)
