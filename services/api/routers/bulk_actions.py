"""``/v1/admin/bulk-actions``: cancel or replay every job a filter matches (docs/operations.md,
"Bulk actions"). Count first (``preview``), then start with the count confirmed, the
preview's ``as_of`` (never a later one) and a request id (idempotent), then follow its
progress. The api only writes the run; the recovery-scanner's bulk runner
(:mod:`exportcore.bulk_runner`) runs it, and picks up by itself a run whose runner died
(``resume`` only wakes it)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from exportcore import bulk
from exportcore.auth import AuthContext, authorize
from exportcore.db import Row
from exportcore.domain import TAGS_MAX
from services.api.deps import Operator, PoolDep, SettingsDep, actor_of, operator_may
from services.api.problems import problem_responses
from services.api.schemas import Rfc3339

router = APIRouter(prefix="/v1/admin/bulk-actions", tags=["admin"])

Kind = Literal["cancel", "replay"]


class BulkFilterIn(BaseModel):
    """What to act on (every field optional, as the console's jobs filters): a cancel acts
    on active jobs without a cancel request, a replay on failed jobs whose dead letter is
    open."""

    model_config = ConfigDict(extra="forbid")

    status: Literal["queued", "running", "failed"] | None = None
    queue: Literal["exports.fast", "exports.bulk"] | None = None
    tenant: str | None = Field(default=None, pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    reason: str | None = Field(
        default=None, pattern=r"^[a-z0-9_]{1,100}$", description="error code (replay)"
    )
    created_from: Rfc3339 | None = Field(default=None, description="inclusive (RFC 3339)")
    created_to: Rfc3339 | None = Field(default=None, description="exclusive (RFC 3339)")
    tags: list[StrictStr] | None = Field(
        default=None, max_length=TAGS_MAX, description="jobs with every one of these tags"
    )
    metadata: dict[str, StrictStr] | None = Field(
        default=None, description="jobs whose metadata has every one of these pairs"
    )

    def to_filter(self) -> bulk.BulkFilter:
        """As the library takes it."""
        return bulk.BulkFilter(
            status=self.status,
            queue=self.queue,
            tenant_id=self.tenant,
            reason=self.reason,
            created_from=self.created_from,
            created_to=self.created_to,
            tags=tuple(sorted(set(self.tags or ()))),
            metadata=tuple(sorted((self.metadata or {}).items())),
        )


class PreviewIn(BaseModel):
    """Count what a bulk ``action`` of ``filter`` would act on now."""

    model_config = ConfigDict(extra="forbid")

    action: Kind
    filter: BulkFilterIn = Field(default_factory=BulkFilterIn)


class PreviewOut(BaseModel):
    """The count at ``as_of``: start with ``confirmed_count`` = ``count`` and this
    ``as_of``; targets that match only later are never acted on."""

    action: Kind
    filter: dict[str, Any]
    description: str
    as_of: datetime
    count: int


class StartIn(PreviewIn):
    """Start: the preview's ``as_of`` (a later instant than the database's now is refused,
    422 ``bulk_as_of_in_future``: the start acts only on what the preview saw) and the count
    the operator confirmed (at most that many targets are acted on), and a ``request_id``
    the client chose: the same request again finds the same bulk action."""

    as_of: Rfc3339
    confirmed_count: StrictInt = Field(ge=0, le=1_000_000)
    request_id: UUID


class BulkActionOut(BaseModel):
    """A bulk action and its progress: ``seen`` targets of at most ``confirmed``, ``acted``
    on, ``skipped`` (changed meanwhile, or already replayed), its ``state`` (``running``,
    ``done``, ``stopped`` with ``stop_reason``), ``interrupted`` when no runner holds it
    (its runner died and no recovery-scanner took it on yet: one does by itself after the
    lease; ``POST …/resume`` wakes them), and its audit row (``audit_id``)."""

    id: int
    action: Kind
    filter: dict[str, Any]
    as_of: datetime
    confirmed: int
    state: str
    stop_reason: str | None
    seen: int
    acted: int
    skipped: int
    batches: int
    interrupted: bool
    audit_id: int
    actor: str
    created_at: datetime
    finished_at: datetime | None


def bulk_out(row: Row) -> BulkActionOut:
    """Render a ``bulk_actions`` row."""
    return BulkActionOut(
        action=row["kind"], **{k: row[k] for k in BulkActionOut.model_fields if k != "action"}
    )


@router.post(
    "/preview",
    response_model=PreviewOut,
    responses=problem_responses(400, 401, 403, 415, 422, 503),
    summary="Count what a bulk action would act on",
)
def preview(body: PreviewIn, caller: Operator, pool: PoolDep) -> PreviewOut:
    """How many targets match now (any operator key: this changes nothing)."""
    filt = body.filter.to_filter()
    seen = bulk.preview(pool, body.action, filt)
    return PreviewOut(
        action=body.action,
        filter=filt.as_json(),
        description=filt.describe(),
        as_of=seen.as_of,
        count=seen.count,
    )


@router.post(
    "",
    status_code=202,
    response_model=BulkActionOut,
    responses={
        200: {"model": BulkActionOut, "description": "This request id already started it"},
        **problem_responses(400, 401, 403, 404, 415, 422, 503),
    },
    summary="Start a bulk cancel or replay (idempotent by request_id)",
)
def start(
    body: StartIn,
    caller: Operator,
    pool: PoolDep,
    settings: SettingsDep,
) -> JSONResponse:
    """Write the bulk action with its audit row (202); the recovery-scanner's bulk runner,
    woken at COMMIT, runs it; its progress is at ``Location``. The same ``request_id``
    again answers 200 with it. An ``as_of`` after now answers 422."""
    authorize(caller, f"bulk_{body.action}")
    run_row, created = bulk.start(
        pool,
        actor_of(caller),
        body.action,
        body.filter.to_filter(),
        as_of=body.as_of,
        confirmed=body.confirmed_count,
        request_id=body.request_id,
    )
    out = bulk_out(run_row)
    return JSONResponse(
        out.model_dump(mode="json"),
        status_code=202 if created else 200,
        headers={"Location": f"{settings.api_public_url.rstrip('/')}{router.prefix}/{out.id}"},
    )


@router.get(
    "/{bulk_id}",
    response_model=BulkActionOut,
    responses=problem_responses(401, 403, 404, 422, 503),
    summary="A bulk action's progress",
)
def get(bulk_id: int, caller: Operator, pool: PoolDep) -> BulkActionOut:
    """Its state and counters (any operator key)."""
    return bulk_out(bulk.get(pool, bulk_id))


@router.post(
    "/{bulk_id}/resume",
    status_code=202,
    response_model=BulkActionOut,
    responses=problem_responses(401, 403, 404, 422, 503),
    summary="Wake the bulk runners for a bulk action whose runner died",
)
def resume(
    bulk_id: int,
    caller: Annotated[AuthContext, operator_may("bulk_resume")],
    pool: PoolDep,
) -> JSONResponse:
    """Wake the recovery-scanners' bulk runners (NOTIFY): one takes the run on from its last
    committed batch as soon as nobody holds it (they also do so by themselves, within a
    scanner interval of its lease's end). A run whose runner is alive (valid lease), or
    one that ended, is left as it is."""
    row = bulk.nudge(pool, bulk_id)
    return JSONResponse(bulk_out(row).model_dump(mode="json"), status_code=202)
