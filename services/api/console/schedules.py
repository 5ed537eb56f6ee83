"""``/console/schedules``: every tenant's schedules with their next slots, recent runs and
last refusal; pause, resume and run now."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from exportcore.admission import AdmissionRefused
from exportcore.db import Row
from exportcore.domain import ExportError
from exportcore.schedules.management import run_now, update_schedule
from exportcore.schedules.rules import Rule
from exportcore.store import console as console_store
from services.api.console.render import error_page, found_or_404, notice, page
from services.api.console.sessions import Action, CurrentOperator, admin_action
from services.api.deps import PoolDep, SettingsDep

log = logging.getLogger(__name__)

router = APIRouter(prefix="/console/schedules", include_in_schema=False)

PAGE_SIZE = 50
NEXT_SLOTS = 3
RECENT_RUNS = 5


def next_slots(row: dict[str, Any], n: int = NEXT_SLOTS) -> list[datetime]:
    """When the schedule's next ``n`` slots from its cursor fire (the first may be
    overdue): each slot's instant plus the schedule's ``jitter_offset`` (seconds)."""
    rule = Rule.of(row)
    slots = [row["next_due_at"]]
    try:
        while len(slots) < n:
            slots.append(rule.next_after(slots[-1]))
    except (ValueError, KeyError, StopIteration):  # a rule that no longer evaluates
        pass
    delay = timedelta(seconds=int(row.get("jitter_offset") or 0))
    return [s + delay for s in slots]


def tenant_keyset(raw: str) -> tuple[str, datetime, UUID] | None:
    """The keyset cursor of the pages listed by tenant, then newest first (schedules,
    webhooks): ``tenant~created_at~id`` as given by the page's "next" link, or None."""
    try:
        tenant, created, sid = raw.split("~", 2)
        return tenant[:63], datetime.fromisoformat(created), UUID(sid)
    except ValueError:
        return None


@router.get("")
def schedules_page(request: Request, operator: CurrentOperator, pool: PoolDep) -> Response:
    """Schedules by tenant, newest first within a tenant; ``tenant`` filters."""
    tenant = request.query_params.get("tenant", "").strip()[:63] or None
    after = tenant_keyset(request.query_params.get("after", "")[:200])
    with pool.connection() as conn:
        rows = console_store.schedules_page(
            conn, limit=PAGE_SIZE + 1, runs=RECENT_RUNS, tenant_id=tenant, after=after
        )
    items = rows[:PAGE_SIZE]
    for r in items:
        r["next_slots"] = next_slots(r)
        for run in r["recent_runs"]:
            run["scheduled_at"] = datetime.fromisoformat(run["scheduled_at"]).astimezone(UTC)
    last = items[-1] if len(rows) > PAGE_SIZE else None
    return page(
        request,
        "schedules.html",
        {
            "nav": "schedules",
            "items": items,
            "tenant": tenant or "",
            "next_after": f"{last['tenant_id']}~{last['created_at'].isoformat()}~{last['id']}"
            if last
            else None,
            "first_page": after is not None,
            "notice": notice(request),
            "now": datetime.now(UTC),
        },
    )


def _schedule_or_404(request: Request, raw: str, pool: PoolDep) -> dict[str, Any] | Response:
    """The schedule row of the path's id (any tenant's), or the console's 404 page."""

    def find(schedule_id: UUID) -> Row | None:
        with pool.connection() as conn:
            return console_store.schedule(conn, schedule_id=schedule_id)

    return found_or_404(request, raw, find, "schedule")


def _set_enabled(
    request: Request, raw: str, action: Action, pool: PoolDep, enabled: bool
) -> Response:
    row = _schedule_or_404(request, raw, pool)
    if isinstance(row, Response):
        return row
    schedule_id = row["id"]
    try:
        update_schedule(
            pool,
            tenant_id=row["tenant_id"],
            schedule_id=schedule_id,
            patch={"enabled": enabled},
            actor=action.operator.actor,
        )
    except ExportError as exc:
        return error_page(request, 409, "The schedule was not changed", exc.detail)
    log.info(
        "console schedule " + ("resumed" if enabled else "paused"),
        extra={"schedule_id": str(schedule_id), "operator_key_id": str(action.operator.key_id)},
    )
    back = f"/console/schedules?tenant={row['tenant_id']}"
    return RedirectResponse(
        f"{back}&done={'resumed' if enabled else 'paused'}#schedule-{schedule_id}", 303
    )


@router.post("/{schedule_id}/pause")
def pause(
    request: Request,
    schedule_id: str,
    action: Annotated[Action, admin_action("pause")],
    pool: PoolDep,
) -> Response:
    """Pause a schedule (its cursor stays where it is)."""
    return _set_enabled(request, schedule_id, action, pool, False)


@router.post("/{schedule_id}/resume")
def resume(
    request: Request,
    schedule_id: str,
    action: Annotated[Action, admin_action("resume")],
    pool: PoolDep,
) -> Response:
    """Resume a schedule (missed slots follow its catch-up policy)."""
    return _set_enabled(request, schedule_id, action, pool, True)


@router.post("/{schedule_id}/run")
def run(
    request: Request,
    schedule_id: str,
    action: Annotated[Action, admin_action("run_now")],
    pool: PoolDep,
    settings: SettingsDep,
) -> Response:
    """Run a schedule once, now: a ``manual`` slot through the schedule's own slot and
    admission path (:func:`exportcore.schedules.management.run_now`, as ``POST
    /v1/schedules/{id}/runs``); the new export's page follows it live."""
    row = _schedule_or_404(request, schedule_id, pool)
    if isinstance(row, Response):
        return row
    sid = row["id"]
    try:
        manual = run_now(
            pool, settings, tenant_id=row["tenant_id"], schedule_id=sid, actor=action.operator.actor
        )
    except AdmissionRefused as exc:
        return error_page(request, 429, "The run was refused by admission control", exc.detail)
    except ExportError as exc:
        return error_page(request, 409, "The schedule could not run", exc.detail)
    log.info(
        "console schedule run now",
        extra={
            "schedule_id": str(sid),
            "job_id": str(manual.job["id"]),
            "operator_key_id": str(action.operator.key_id),
        },
    )
    return RedirectResponse(f"/console/jobs/{manual.job['id']}?done=run_now", 303)
