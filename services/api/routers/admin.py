"""``/v1/admin``: dead letters, replay and the full job view, for operator keys only.

Admin endpoints work across tenants. They take an operator key (its own kind, tied to no
tenant, created only with database access by ``exportctl operator-key create``); a tenant
key gets 403 here, whatever its scopes. Reads take any operator key; changes an ``admin``
one (``operator_may``: 403 ``role_insufficient`` for a ``viewer``), and each change is
audited in its own transaction (:mod:`exportcore.audit`).
"""

from __future__ import annotations

from typing import Annotated, Literal
from uuid import UUID

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse

from exportcore.auth import AuthContext
from exportcore.bulk import replay_dead_letters
from exportcore.cancel import request_cancel
from exportcore.domain import JobNotFound, labels_filter, parse_idempotency_key
from exportcore.replays import DeadLetterNotFound, replay_export, resolve_dead_letter
from exportcore.schedules.management import backfill
from exportcore.store import dead_letters as dl_store
from exportcore.store import jobs as job_store
from services.api.deps import Operator, PoolDep, SettingsDep, actor_of, operator_may
from services.api.problems import problem_responses
from services.api.routers.exports import (
    EVENTS_PAGE,
    METADATA_QUERY_PARAMETER,
    CursorQuery,
    EventsCursor,
    EventsLimit,
    LimitQuery,
    StatusQuery,
    TagQuery,
    _decode_cursor,
    _encode_cursor,
    events_page,
    metadata_query,
)
from services.api.routers.schedules import BackfillOut, BackfillRequest, backfill_out
from services.api.schemas import (
    AdminEventOut,
    AdminExportOut,
    AdminExportPage,
    BulkReplayCreate,
    BulkReplayOut,
    DeadLetterOut,
    DeadLetterPage,
    DeadLetterResolve,
    ReplayCorrection,
    admin_export_out,
)

router = APIRouter(prefix="/v1/admin", tags=["admin"])

REPLAYED_HEADER = "Idempotent-Replayed"

Replayer = Annotated[AuthContext, operator_may("replay")]
Resolver = Annotated[AuthContext, operator_may("resolve")]
BulkReplayer = Annotated[AuthContext, operator_may("bulk_replay")]
Canceller = Annotated[AuthContext, operator_may("cancel")]
Backfiller = Annotated[AuthContext, operator_may("backfill")]

_REASON = r"^[a-z0-9_]{1,100}$"
_TENANT = r"^[a-z0-9][a-z0-9-]{0,62}$"


@router.get(
    "/dead-letters",
    response_model=DeadLetterPage,
    responses=problem_responses(401, 403, 422, 503),
    summary="List dead letters",
)
def list_dead_letters(
    caller: Operator,
    pool: PoolDep,
    state: Literal["open", "replayed", "resolved"] | None = Query(
        default=None, description="only dead letters in this state"
    ),
    reason: str | None = Query(default=None, pattern=_REASON, description="only this reason"),
    tenant: str | None = Query(default=None, pattern=_TENANT, description="only this tenant"),
    limit: int = Query(default=50, ge=1, le=500),
    cursor: int | None = Query(
        default=None, ge=1, le=2**63 - 1, description="next_cursor of the previous page"
    ),
) -> DeadLetterPage:
    """Failed jobs with their reason, state and replay, newest first; page with ``cursor``."""
    with pool.connection() as conn:
        rows = dl_store.dead_letters_page(
            conn, limit=limit + 1, before=cursor, reason=reason, state=state, tenant_id=tenant
        )
    items = [DeadLetterOut.model_validate(r) for r in rows[:limit]]
    next_cursor = items[-1].id if len(rows) > limit else None
    return DeadLetterPage(items=items, next_cursor=next_cursor)


@router.get(
    "/dead-letters/{dead_letter_id}",
    response_model=DeadLetterOut,
    responses=problem_responses(401, 403, 404, 422, 503),
    summary="One dead letter",
)
def get_dead_letter(dead_letter_id: int, caller: Operator, pool: PoolDep) -> DeadLetterOut:
    """The dead letter with its state, replay and resolution."""
    with pool.connection() as conn:
        row = dl_store.dead_letter_get(conn, dead_letter_id=dead_letter_id)
    if row is None:
        raise DeadLetterNotFound(f"no dead letter {dead_letter_id}")
    return DeadLetterOut.model_validate(row)


@router.post(
    "/dead-letters/{dead_letter_id}/resolve",
    response_model=DeadLetterOut,
    responses=problem_responses(400, 401, 403, 404, 409, 415, 422, 503),
    summary="Resolve a dead letter (no more replays needed)",
)
def resolve(
    dead_letter_id: int,
    caller: Resolver,
    pool: PoolDep,
    body: DeadLetterResolve | None = None,
) -> DeadLetterOut:
    """``open`` or ``replayed`` → ``resolved``, recording the operator key and the note.
    409 when it is already resolved (the problem names who and when)."""
    row = resolve_dead_letter(
        pool,
        dead_letter_id=dead_letter_id,
        actor=actor_of(caller),
        note=body.note if body is not None else None,
    )
    return DeadLetterOut.model_validate(row)


@router.post(
    "/replays",
    response_model=BulkReplayOut,
    responses=problem_responses(400, 401, 403, 415, 422, 503),
    summary="Replay every open dead letter with one reason (idempotent)",
)
def replay_all(
    body: BulkReplayCreate, caller: BulkReplayer, pool: PoolDep, settings: SettingsDep
) -> BulkReplayOut:
    """Each open dead letter with ``reason`` (oldest first, at most ``limit``) gets one
    replay. Idempotent: running it again, or twice at once, finds the replays already
    written (``existing``) and writes no second one. Admission control applies to each
    replay; the first refusal stops the run (``refused``) and leaves the rest open. It is
    a bulk action run in the request (``bulk_id``), audited once with its count."""
    result = replay_dead_letters(
        pool,
        settings,
        reason=body.reason,
        tenant_id=body.tenant,
        limit=body.limit,
        actor=actor_of(caller),
    )
    return BulkReplayOut.model_validate(result, from_attributes=True)


@router.post(
    "/exports/{job_id}/replay",
    status_code=202,
    response_model=AdminExportOut,
    responses={
        202: {
            "description": "A new replay was accepted (committed); `Location` is its status.",
            "headers": {"Location": {"schema": {"type": "string"}}},
        },
        200: {
            "model": AdminExportOut,
            "description": "The export already has a queued, running or succeeded replay: "
            f"that replay, with `{REPLAYED_HEADER}: true`; nothing new was written.",
        },
        **problem_responses(400, 401, 403, 404, 409, 413, 415, 422, 429, 503),
    },
    summary="Replay a failed export as a new job (at most one active replay), optionally "
    "with a corrected input",
)
def replay(
    job_id: UUID,
    caller: Replayer,
    pool: PoolDep,
    settings: SettingsDep,
    body: ReplayCorrection | None = None,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            description="optional, as for POST /v1/exports, in the job's tenant's keys: the "
            "same key and the same (corrected) request return the replay it created",
        ),
    ] = None,
) -> JSONResponse:
    """A NEW export with the failed one's snapshot and ``replay_of``; the original is kept
    and its dead letter becomes ``replayed``. Idempotent: while a replay is queued or
    running, or after it succeeded, the answer is that replay (200, no new job);
    concurrent requests write one. When the replay failed, replaying again chains
    (``replay_of`` = the failed replay). 409 unless the export failed.

    With a body (``format``, ``note_ids`` or ``all``) the replay redrives a corrected
    input: a new submit of the corrected request — a new snapshot of the tenant's notes as
    they are now, validated (422) and admitted (429, 503) like any submit — that keeps
    ``replay_of``; 409 when the export already has a replay of another request."""
    key = parse_idempotency_key(idempotency_key) if idempotency_key is not None else None
    replayed = replay_export(
        pool,
        settings,
        original_id=job_id,
        actor=actor_of(caller),
        correction=body.correction() if body is not None else None,
        idempotency_key=key,
    )
    out = admin_export_out(replayed.job, settings.api_public_url)
    headers = {"Location": out.links.self}
    if not replayed.created:
        headers[REPLAYED_HEADER] = "true"
    return JSONResponse(
        out.model_dump(mode="json"),
        status_code=202 if replayed.created else 200,
        headers=headers,
    )


@router.post(
    "/exports/{job_id}/cancel",
    status_code=202,
    response_model=AdminExportOut,
    responses=problem_responses(401, 403, 404, 409, 422, 503),
    summary="Cancel any tenant's export",
)
def cancel(job_id: UUID, caller: Canceller, pool: PoolDep, settings: SettingsDep) -> AdminExportOut:
    """The operator's cancel, as a tenant's: a queued export is cancelled at once, a running
    one stops at its next chunk boundary (``cancel_requested``). Audited; the job's history
    says an operator asked. 409 for a finished export."""
    job = request_cancel(pool, tenant_id=None, job_id=job_id, actor=actor_of(caller))
    return admin_export_out(job, settings.api_public_url)


@router.post(
    "/schedules/{schedule_id}/backfill",
    response_model=BackfillOut,
    responses=problem_responses(400, 401, 403, 404, 413, 415, 422, 503),
    summary="Create the exports of a past range of any tenant's schedule's slots",
)
def backfill_schedule(
    schedule_id: UUID,
    body: BackfillRequest,
    caller: Backfiller,
    pool: PoolDep,
    settings: SettingsDep,
) -> JSONResponse:
    """The tenant's ``POST /v1/schedules/{id}/backfill`` for an operator (an ``admin`` key),
    on any tenant's schedule: one export per slot of the range, through admission, never two
    for a slot; each created slot audited (``schedule_backfill``) with the operator's name.
    The same 422 bounds and the same report."""
    slots = backfill(
        pool,
        settings,
        tenant_id=None,
        schedule_id=schedule_id,
        start=body.start,
        end=body.end,
        actor=actor_of(caller),
    )
    return JSONResponse(
        backfill_out(schedule_id, body, slots).model_dump(mode="json", by_alias=True)
    )


@router.get(
    "/exports",
    response_model=AdminExportPage,
    responses=problem_responses(400, 401, 403, 422, 503),
    summary="Any tenant's exports, newest first, by tenant, state, tags and metadata",
    openapi_extra={"parameters": [METADATA_QUERY_PARAMETER]},
)
def list_exports(
    request: Request,
    caller: Operator,
    pool: PoolDep,
    settings: SettingsDep,
    tenant: str | None = Query(default=None, pattern=_TENANT, description="only this tenant"),
    status: StatusQuery = None,
    tag: TagQuery = None,
    limit: LimitQuery = 50,
    cursor: CursorQuery = None,
) -> AdminExportPage:
    """Exports of every tenant as operators see them, newest first, with the filters of
    ``GET /v1/exports`` (``tag=``, ``metadata[key]=``, ``status``; docs/api.md "Metadata
    and tags") and ``tenant``; keyset pages (``next_cursor``)."""
    before = _decode_cursor(cursor) if cursor else None
    labels = labels_filter(metadata_query(request), tag)
    with pool.connection() as conn:
        rows = job_store.job_list_admin(
            conn, limit=limit + 1, tenant_id=tenant, status=status, labels=labels, before=before
        )
    page = rows[:limit]
    more = len(rows) > limit
    return AdminExportPage(
        items=[admin_export_out(r, settings.api_public_url) for r in page],
        next_cursor=_encode_cursor(page[-1]["created_at"], page[-1]["id"]) if more else None,
    )


@router.get(
    "/exports/{job_id}",
    response_model=AdminExportOut,
    responses=problem_responses(401, 403, 404, 422, 503),
    summary="An export of any tenant, with internals",
)
def get_export(
    job_id: UUID, caller: Operator, pool: PoolDep, settings: SettingsDep
) -> AdminExportOut:
    """Status, tenant, recorded error detail and storage key of one export."""
    with pool.connection() as conn:
        job = job_store.job_get(conn, job_id=job_id)
    if job is None:
        raise JobNotFound(f"no export {job_id}")
    return admin_export_out(job, settings.api_public_url)


@router.get(
    "/exports/{job_id}/events",
    response_model=list[AdminEventOut],
    responses=problem_responses(400, 401, 403, 404, 422, 503),
    summary="An export's full history",
)
def get_export_events(
    job_id: UUID,
    request: Request,
    caller: Operator,
    pool: PoolDep,
    limit: EventsLimit = EVENTS_PAGE,
    cursor: EventsCursor = None,
) -> JSONResponse:
    """Every history row with lease tokens, message ids and full details, oldest first; at
    most ``limit`` per answer, the next page in the ``Link`` header (RFC 8288)."""
    with pool.connection() as conn:
        if job_store.job_get(conn, job_id=job_id) is None:
            raise JobNotFound(f"no export {job_id}")
        rows, headers = events_page(conn, request, job_id, limit, cursor)
    body = [AdminEventOut.model_validate(r).model_dump(mode="json") for r in rows]
    return JSONResponse(body, headers=headers)
