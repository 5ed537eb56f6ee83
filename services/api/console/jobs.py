"""``/console/jobs``: the jobs list (filters, keyset pages) and one job (timeline, dead
letter, replay chain; cancel, replay, download)."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from exportcore.admission import AdmissionRefused
from exportcore.cancel import request_cancel
from exportcore.domain import (
    QUEUES,
    ArtifactMissing,
    ExportError,
    InvalidLabels,
    JobStatus,
    labels_filter,
)
from exportcore.store import console as console_store
from exportcore.store import operator_actions as action_store
from services.api.console import timeline
from services.api.console.actions import correction_from_form, replay_once
from services.api.console.render import error_page, found_or_404, notice, page
from services.api.console.sessions import Action, CurrentOperator, admin_action
from services.api.deps import PoolDep, SettingsDep, StoreDep
from services.api.routers.exports import (
    InvalidCursor,
    _decode_cursor,
    _encode_cursor,
    artifact_response,
)

log = logging.getLogger(__name__)

router = APIRouter(prefix="/console/jobs", include_in_schema=False)

PAGE_SIZE = 50
MAX_EVENTS = 2000
STATES = tuple(s.value for s in JobStatus)
SINCE = {"1h": timedelta(hours=1), "24h": timedelta(hours=24), "7d": timedelta(days=7)}


@dataclass
class JobFilters:
    """The jobs page's filters as given (``params``, for links) and as parsed."""

    params: dict[str, str] = field(default_factory=dict)
    status: str | None = None
    queue: str | None = None
    tenant_id: str | None = None
    error_code: str | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None
    tags: tuple[str, ...] = ()
    metadata: tuple[tuple[str, str], ...] = ()
    errors: list[str] = field(default_factory=list)

    @property
    def labels(self) -> dict[str, Any] | None:
        """The tags and metadata asked, as the jobs query's containment (None: any)."""
        return labels_filter(dict(self.metadata), list(self.tags))


def _instant(params: Mapping[str, str], name: str, errors: list[str]) -> datetime | None:
    """``name`` as an ISO 8601 instant (console.js sends UTC), else ``name_local`` read as
    UTC (what the form sends without JavaScript); None when empty."""
    raw = (params.get(name) or params.get(f"{name}_local") or "").strip()
    if not raw:
        return None
    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        errors.append(f"'{raw[:40]}' is not a date and time (use YYYY-MM-DDTHH:MM)")
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def parse_filters(params: Mapping[str, str], now: datetime) -> JobFilters:
    """Read the filters from the query string; unknown values become ``errors`` (shown on
    the page) instead of being ignored silently."""
    f = JobFilters()
    keep = ("status", "queue", "tenant", "error_code", "from", "to", "since", "tags", "meta")
    f.params = {k: params[k].strip() for k in keep if params.get(k, "").strip()}
    status = f.params.get("status")
    if status and status not in STATES:
        f.errors.append(f"unknown state '{status[:20]}'; one of {', '.join(STATES)}")
    else:
        f.status = status
    queue = f.params.get("queue")
    if queue and queue not in QUEUES:
        f.errors.append(f"unknown queue '{queue[:40]}'; one of {', '.join(QUEUES)}")
    else:
        f.queue = queue
    tenant = f.params.get("tenant")
    f.tenant_id = tenant[:63] if tenant else None
    code = f.params.get("error_code")
    f.error_code = code[:100] if code else None
    f.created_from = _instant(params, "from", f.errors)
    f.created_to = _instant(params, "to", f.errors)
    since = f.params.get("since")
    if since:
        if since in SINCE:
            f.created_from = now - SINCE[since]
        else:
            f.errors.append(f"unknown range '{since[:10]}'; one of {', '.join(SINCE)}")
    for name in ("from", "to"):
        if name not in f.params and params.get(f"{name}_local", "").strip():
            f.params[name] = params[f"{name}_local"].strip()
    _parse_labels(f)
    return f


def _parse_labels(f: JobFilters) -> None:
    """``tags`` (tags separated by spaces or commas) and ``meta`` (one ``key=value``) of
    the query string into ``f``; a malformed one becomes an error of the page."""
    tags = tuple(sorted({t for t in re.split(r"[\s,]+", f.params.get("tags", "")) if t}))
    metadata: tuple[tuple[str, str], ...] = ()
    meta = f.params.get("meta")
    if meta:
        key, sep, value = meta.partition("=")
        if not sep or not key.strip():
            f.errors.append("metadata is one key=value pair, e.g. order_id=ord_1234")
            return
        metadata = ((key.strip(), value.strip()),)
    try:
        labels_filter(dict(metadata), list(tags))
    except InvalidLabels as exc:
        f.errors.append(exc.detail)
        return
    f.tags, f.metadata = tags, metadata


def _progress(row: dict[str, Any]) -> int | None:
    """Percent of the notes rendered: 100 for a succeeded job, the last reported progress
    of a running one, None otherwise."""
    if row["status"] == "succeeded":
        return 100
    progress: int | None = row.get("progress")
    notes: int = row["note_count"]
    if row["status"] == "running" and progress and notes:
        return min(100, round(100 * progress / notes))
    return None


@router.get("")
def jobs_page(
    request: Request, operator: CurrentOperator, pool: PoolDep, settings: SettingsDep
) -> Response:
    """Jobs newest first, by state, queue, tenant, error code, created time, tags and a
    metadata pair (all kept in the URL, so a filtered view can be shared)."""
    now = datetime.now(UTC)
    filters = parse_filters(request.query_params, now)
    before = None
    cursor = request.query_params.get("after", "")
    if cursor:
        try:
            before = _decode_cursor(cursor[:200])
        except InvalidCursor:
            filters.errors.append("the page link is not valid; start again from the first page")
    rows: list[dict[str, Any]] = []
    with pool.connection() as conn:
        if not filters.errors:
            rows = console_store.jobs_page(
                conn,
                limit=PAGE_SIZE + 1,
                status=filters.status,
                queue=filters.queue,
                tenant_id=filters.tenant_id,
                error_code=filters.error_code,
                created_from=filters.created_from,
                created_to=filters.created_to,
                labels=filters.labels,
                before=before,
            )
        reasons = console_store.reasons(conn)
    items = rows[:PAGE_SIZE]
    for r in items:
        r["percent"] = _progress(r)
    next_cursor = (
        _encode_cursor(items[-1]["created_at"], items[-1]["id"]) if len(rows) > PAGE_SIZE else None
    )
    return page(
        request,
        "jobs.html",
        {
            "nav": "jobs",
            "filters": filters,
            "items": items,
            "next_cursor": next_cursor,
            "first_page": bool(cursor),
            "states": STATES,
            "queues": QUEUES,
            "reasons": reasons,
        },
        status=400 if filters.errors else 200,
    )


def job_context(pool: PoolDep, job_id: UUID) -> dict[str, Any] | None:
    """What the job page shows, or None for an unknown job."""
    now = datetime.now(UTC)
    with pool.connection() as conn, conn.transaction():
        conn.execute("SET TRANSACTION READ ONLY")
        job = console_store.job(conn, job_id=job_id)
        if job is None:
            return None
        events = console_store.job_events(conn, job_id=job_id, limit=MAX_EVENTS + 1)
        chain = console_store.replay_chain(conn, job_id=job_id)
        actions = action_store.operator_actions_for_job(conn, job_id=job_id, limit=MAX_EVENTS)
    replays = [c for c in chain if c["depth"] == 1]
    replay = max(replays, key=lambda c: c["created_at"]) if replays else None
    return {
        "job": job,
        "steps": timeline.build_timeline(job, events[:MAX_EVENTS], actions),
        "events_cut": len(events) > MAX_EVENTS,
        "ancestors": [c for c in chain if c["depth"] < 0],
        "descendants": [c for c in chain if c["depth"] > 0],
        "replay": replay,
        "explanation": timeline.explain(job, now, replay),
        "terminal": job["status"] in ("succeeded", "failed", "cancelled"),
        "now": now,
    }


def _job_or_404(request: Request, pool: PoolDep, raw: str) -> dict[str, Any] | Response:
    return found_or_404(request, raw, lambda job_id: job_context(pool, job_id), "job", "export job")


def _render_job(
    request: Request, pool: PoolDep, job_id: str, template: str, **extra: Any
) -> Response:
    ctx = _job_or_404(request, pool, job_id)
    if isinstance(ctx, Response):
        return ctx
    return page(request, template, ctx | extra)


@router.get("/{job_id}")
def job_page(request: Request, job_id: str, operator: CurrentOperator, pool: PoolDep) -> Response:
    """One job: why it is where it is, its timeline, dead letter and replay chain."""
    return _render_job(request, pool, job_id, "job.html", nav="jobs", notice=notice(request))


@router.get("/{job_id}/live")
def job_live(request: Request, job_id: str, operator: CurrentOperator, pool: PoolDep) -> Response:
    """The job page's live part (state, explanation, actions, timeline), polled by htmx
    while the job is not finished."""
    return _render_job(request, pool, job_id, "_job_live.html")


@router.get("/{job_id}/replay")
def replay_confirm(
    request: Request, job_id: str, operator: CurrentOperator, pool: PoolDep
) -> Response:
    """The replay confirmation: what replaying this job will do."""
    return _render_job(request, pool, job_id, "replay_confirm.html", nav="jobs")


@router.post("/{job_id}/replay")
def replay(
    request: Request,
    job_id: str,
    action: Annotated[Action, admin_action("replay")],
    pool: PoolDep,
    settings: SettingsDep,
) -> Response:
    """Replay a failed job as a new job (the replay's page follows it live)."""
    ctx = _job_or_404(request, pool, job_id)
    if isinstance(ctx, Response):
        return ctx
    job = ctx["job"]
    # A replay that failed (or was cancelled) may be replayed again: the new job chains.
    if ctx["replay"] is not None and ctx["replay"]["status"] not in ("failed", "cancelled"):
        return RedirectResponse(
            f"/console/jobs/{ctx['replay']['id']}?done=already_replayed", status_code=303
        )
    try:
        correction = correction_from_form(action.form)
        new = replay_once(
            pool,
            settings,
            job_id=job["id"],
            actor=action.operator.actor,
            correction=correction,
        )
    except (AdmissionRefused, ExportError) as exc:
        status = (
            429
            if isinstance(exc, AdmissionRefused)
            else 422
            if getattr(exc, "kind", "") == "invalid"
            else 409
        )
        return page(
            request, "replay_confirm.html", ctx | {"nav": "jobs", "error": exc.detail}, status
        )
    if new is None:  # replayed by someone else meanwhile
        ctx = job_context(pool, job["id"]) or ctx
        target = ctx["replay"]["id"] if ctx["replay"] else job["id"]
        return RedirectResponse(f"/console/jobs/{target}?done=already_replayed", status_code=303)
    log.info(
        "console replay",
        extra={
            "job_id": str(new["id"]),
            "replay_of": str(job["id"]),
            "operator_key_id": str(action.operator.key_id),
            "corrected": correction.fields if correction else [],
        },
    )
    return RedirectResponse(f"/console/jobs/{new['id']}?done=replayed", status_code=303)


@router.get("/{job_id}/cancel")
def cancel_confirm(
    request: Request, job_id: str, operator: CurrentOperator, pool: PoolDep
) -> Response:
    """The cancel confirmation: what cancelling this job will do."""
    return _render_job(request, pool, job_id, "cancel_confirm.html", nav="jobs")


@router.post("/{job_id}/cancel")
def cancel(
    request: Request,
    job_id: str,
    action: Annotated[Action, admin_action("cancel")],
    pool: PoolDep,
) -> Response:
    """Cancel a queued job at once, or ask a running one to stop at its next chunk."""
    ctx = _job_or_404(request, pool, job_id)
    if isinstance(ctx, Response):
        return ctx
    job = ctx["job"]
    try:
        changed = request_cancel(
            pool, tenant_id=None, job_id=job["id"], actor=action.operator.actor
        )
    except ExportError as exc:
        return page(request, "cancel_confirm.html", ctx | {"nav": "jobs", "error": exc.detail}, 409)
    log.info(
        "console cancel",
        extra={"job_id": str(job["id"]), "operator_key_id": str(action.operator.key_id)},
    )
    done = "cancelled" if changed["status"] == "cancelled" else "cancel_requested"
    return RedirectResponse(f"/console/jobs/{job['id']}?done={done}", status_code=303)


@router.get("/{job_id}/download")
def download(
    request: Request,
    job_id: str,
    operator: CurrentOperator,
    pool: PoolDep,
    store: StoreDep,
    settings: SettingsDep,
) -> Response:
    """The job's artifact, for operators (any tenant's), as the tenant API serves it."""
    ctx = _job_or_404(request, pool, job_id)
    if isinstance(ctx, Response):
        return ctx
    try:
        response = artifact_response(ctx["job"], request, store, settings)
    except ArtifactMissing:
        return error_page(
            request,
            410,
            "The file is gone",
            "The job succeeded, but its artifact is no longer "
            "in storage (deleted, or pruned after the retention).",
        )
    except ExportError as exc:
        return error_page(request, 409, "No file to download", exc.detail)
    log.info("console download", extra={"job_id": job_id, "operator_key_id": str(operator.key_id)})
    return response
