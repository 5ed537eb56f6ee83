"""``/v1/admin``: dead letters and replay, for keys with the ``admin`` scope (operators).

Admin endpoints work across tenants: the ``admin`` scope is an operator's, granted only
with ``exportctl apikey create --scope admin``.
"""

from __future__ import annotations

from uuid import UUID

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from exportcore.store import dead_letters as dl_store
from exportcore.submit import replay_export
from services.api.deps import Admin, PoolDep, SettingsDep
from services.api.problems import problem_responses
from services.api.schemas import DeadLetterOut, DeadLetterPage, ExportOut, export_out

router = APIRouter(prefix="/v1/admin", tags=["admin"])


@router.get(
    "/dead-letters",
    response_model=DeadLetterPage,
    responses=problem_responses(401, 403, 422, 503),
    summary="List dead letters",
)
def list_dead_letters(
    caller: Admin,
    pool: PoolDep,
    reason: str | None = Query(
        default=None, pattern=r"^[a-z0-9_]{1,100}$", description="only this reason code"
    ),
    limit: int = Query(default=50, ge=1, le=500),
    cursor: int | None = Query(
        default=None, ge=1, le=2**63 - 1, description="next_cursor of the previous page"
    ),
) -> DeadLetterPage:
    """Failed jobs with their reason, newest first; page with ``cursor``."""
    with pool.connection() as conn:
        rows = dl_store.dead_letters_page(conn, limit=limit + 1, before=cursor, reason=reason)
    items = [DeadLetterOut.model_validate(r) for r in rows[:limit]]
    next_cursor = items[-1].id if len(rows) > limit else None
    return DeadLetterPage(items=items, next_cursor=next_cursor)


@router.post(
    "/exports/{job_id}/replay",
    status_code=202,
    response_model=ExportOut,
    responses=problem_responses(401, 403, 404, 409, 503),
    summary="Replay a failed export as a new job",
)
def replay(job_id: UUID, caller: Admin, pool: PoolDep, settings: SettingsDep) -> JSONResponse:
    """A NEW export with the failed one's snapshot and ``replay_of``; the original and its
    dead letter are kept. 409 unless the original failed."""
    job = replay_export(pool, settings, original_id=job_id)
    out = export_out(job, settings.api_public_url)
    return JSONResponse(
        out.model_dump(mode="json"), status_code=202, headers={"Location": out.links.self}
    )
