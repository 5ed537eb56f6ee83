"""``/console/audit``: the audit trail with filters, and one entry (a bulk action's progress,
followed live while it runs)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from fastapi import APIRouter, Request
from fastapi.responses import Response

from exportcore.bulk import BulkFilter
from exportcore.store import bulk_actions as bulk_store
from exportcore.store import operator_actions as action_store
from services.api.console.render import error_page, notice, page
from services.api.console.sessions import CurrentOperator
from services.api.deps import PoolDep

router = APIRouter(prefix="/console/audit", include_in_schema=False)

PAGE_SIZE = 50
SINCE = {"1h": timedelta(hours=1), "24h": timedelta(hours=24), "7d": timedelta(days=7)}
ACTIONS = (
    "replay",
    "resolve",
    "cancel",
    "pause",
    "resume",
    "run_now",
    "schedule_create",
    "schedule_update",
    "schedule_delete",
    "notes_import",
    "notes_delete",
    "bulk_cancel",
    "bulk_replay",
    "purge_stale",
    "operator_key_create",
    "operator_key_revoke",
    "operator_key_set_role",
    "api_key_create",
    "api_key_revoke",
    "webhook_create",
    "webhook_update",
    "webhook_delete",
    "webhook_rotate_secret",
    "webhook_redeliver",
    "webhook_recover",
)
"""The actions the filter offers (the trail may hold others: it is free text to the page)."""
ACTOR_KINDS = ("operator", "tenant", "database", "system")


def _filters(request: Request) -> tuple[dict[str, str], dict[str, Any], list[str]]:
    """The page's filters as given (for links), as the store takes them, and errors."""
    q = request.query_params
    keep = ("action", "actor_kind", "tenant", "job", "since")
    given = {k: q[k].strip()[:100] for k in keep if q.get(k, "").strip()}
    errors: list[str] = []
    parsed: dict[str, Any] = {}
    if (action := given.get("action")) is not None:
        parsed["action"] = action if action.replace("_", "").isalpha() else None
        if parsed["action"] is None:
            errors.append("an action is a word such as replay or bulk_cancel")
    if (kind := given.get("actor_kind")) is not None:
        if kind in ACTOR_KINDS:
            parsed["actor_kind"] = kind
        else:
            errors.append(f"the actor is one of {', '.join(ACTOR_KINDS)}")
    if (tenant := given.get("tenant")) is not None:
        parsed["tenant_id"] = tenant[:63]
    if (job := given.get("job")) is not None:
        try:
            parsed["job_id"] = UUID(job)
        except ValueError:
            errors.append("the job filter takes a whole job id")
    if (since := given.get("since")) is not None:
        if since in SINCE:
            parsed["since"] = datetime.now(UTC) - SINCE[since]
        else:
            errors.append(f"unknown range; one of {', '.join(SINCE)}")
    return given, parsed, errors


@router.get("")
def audit_page(request: Request, operator: CurrentOperator, pool: PoolDep) -> Response:
    """Who did what, newest first, by action, actor kind, tenant, job and time."""
    given, parsed, errors = _filters(request)
    raw = request.query_params.get("before", "")
    before = int(raw) if raw.isdigit() and len(raw) < 19 else None
    rows: list[dict[str, Any]] = []
    if not errors:
        with pool.connection() as conn:
            rows = action_store.operator_actions_page(
                conn, limit=PAGE_SIZE + 1, before=before, **parsed
            )
    items = rows[:PAGE_SIZE]
    return page(
        request,
        "audit.html",
        {
            "nav": "audit",
            "items": items,
            "filters": given,
            "errors": errors,
            "actions": ACTIONS,
            "actor_kinds": ACTOR_KINDS,
            "next_before": items[-1]["id"] if len(rows) > PAGE_SIZE else None,
            "first_page": before is not None,
        },
        status=400 if errors else 200,
    )


def filter_words(stored: dict[str, Any] | None) -> str | None:
    """A bulk action's stored filter in the words of its audit target
    (``BulkFilter.describe``: ``status queued, tenant acme``), so the entry page names a
    filter as the list does; None when there is none or it cannot be read."""
    if stored is None:
        return None
    try:
        return BulkFilter.from_json(stored).describe()
    except (TypeError, ValueError):
        return None


def _render_entry(
    request: Request, pool: PoolDep, raw: str, template: str, **extra: Any
) -> Response:
    """``template`` with the audit entry of the path's id and its bulk action (``run``, None
    unless the entry started one), or the console's 404 page."""
    ctx: dict[str, Any] | None = None
    if raw.isdigit() and len(raw) <= 18:
        # One snapshot for both rows: a batch advances the run and its audit row in one
        # transaction, so two autocommit reads could see the run done beside the count
        # before it, and the page, which stops polling once the run is done, would keep it.
        with pool.connection() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            row = action_store.operator_action_get(conn, action_id=int(raw))
            if row is not None:
                bulk_id = (row["detail"] or {}).get("bulk_id")
                run = bulk_store.bulk_action_get(conn, bulk_id=int(bulk_id)) if bulk_id else None
                ctx = {"entry": row, "run": run, "filter_words": filter_words(row["filter"])}
    if ctx is None:
        return error_page(request, 404, "No such entry", f"There is no audit entry {raw[:20]}.")
    return page(request, template, ctx | extra)


@router.get("/{action_id}")
def entry_page(
    request: Request, action_id: str, operator: CurrentOperator, pool: PoolDep
) -> Response:
    """One audit entry; a bulk action's progress, live while it runs."""
    return _render_entry(
        request, pool, action_id, "audit_entry.html", nav="audit", notice=notice(request)
    )


@router.get("/{action_id}/live")
def entry_live(
    request: Request, action_id: str, operator: CurrentOperator, pool: PoolDep
) -> Response:
    """The entry's live part (a running bulk action's progress), polled by htmx."""
    return _render_entry(request, pool, action_id, "_audit_live.html")
