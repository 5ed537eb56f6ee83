"""``/v1/schedules``: periodic exports of the caller's notes (tenant-scoped like exports)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from fastapi import APIRouter, Query, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from exportcore.db import Row
from exportcore.domain import ExportError
from exportcore.schedules import create_schedule, update_schedule
from exportcore.store import schedules as schedule_store
from services.api.deps import PoolDep, Reader, Writer
from services.api.problems import problem_responses
from services.api.schemas import FormatName

router = APIRouter(prefix="/v1/schedules", tags=["schedules"])


class ScheduleNotFound(ExportError):
    """No such schedule for this tenant (another tenant's reads the same)."""

    code = "schedule_not_found"
    title = "Schedule not found"
    kind = "not_found"


class ScheduleFields(BaseModel):
    """The fields shared by create and update (all optional on update)."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(default=None, max_length=200, pattern=r"^[^\x00-\x1f\x7f]*$")
    cron: str | None = Field(
        default=None, max_length=200, description="5-field cron expression, e.g. '0 2 * * *'"
    )
    timezone: str | None = Field(
        default=None, max_length=64, description="IANA zone the cron rule is evaluated in"
    )
    interval_seconds: StrictInt | None = Field(
        default=None, ge=1, le=31_536_000, description="instead of cron: every N seconds"
    )
    note_ids: list[StrictInt] | None = Field(default=None, min_length=1, max_length=100_000)
    all: StrictBool | None = None
    format: FormatName | None = None
    catch_up: Literal["skip", "all"] | None = Field(
        default=None, description="after downtime: run only the latest missed slot, or all"
    )
    max_catch_up: StrictInt | None = Field(default=None, ge=1, le=1000)
    enabled: StrictBool | None = None


class ScheduleCreate(ScheduleFields):
    """A new schedule: a rule (cron + timezone, or interval_seconds) and a selection."""


class ScheduleOut(BaseModel):
    """A schedule and its durable cursor."""

    id: UUID
    name: str
    cron: str | None
    timezone: str | None
    interval_seconds: int | None
    selection: dict[str, Any]
    format: FormatName
    catch_up: Literal["skip", "all"]
    max_catch_up: int
    enabled: bool
    next_due_at: datetime
    last_refusal: dict[str, Any] | None
    created_at: datetime
    updated_at: datetime


class RunOut(BaseModel):
    """One slot: when it was due, what happened, and its export."""

    scheduled_at: datetime
    outcome: Literal["created", "skipped", "invalid"]
    job_id: UUID | None
    job_status: str | None
    detail: str
    created_at: datetime


def schedule_out(row: Row) -> ScheduleOut:
    """Render a schedule row."""
    return ScheduleOut(
        id=row["id"],
        name=row["name"],
        cron=row["cron"],
        timezone=row["timezone"],
        interval_seconds=row["interval_seconds"],
        selection=row["payload"]["selection"],
        format=row["format"],
        catch_up=row["catch_up"],
        max_catch_up=row["max_catch_up"],
        enabled=row["enabled"],
        next_due_at=row["next_due_at"],
        last_refusal=row["last_refusal"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def _fields(body: ScheduleFields) -> dict[str, Any]:
    return body.model_dump(exclude_unset=True)


@router.post(
    "",
    status_code=201,
    response_model=ScheduleOut,
    responses=problem_responses(400, 401, 403, 413, 415, 422, 503),
    summary="Create a schedule",
)
def create(body: ScheduleCreate, caller: Writer, pool: PoolDep) -> JSONResponse:
    """Create a schedule; its first slot is the rule's first instant after now."""
    row = create_schedule(pool, tenant_id=caller.tenant_id, fields=_fields(body))
    out = schedule_out(row)
    return JSONResponse(
        out.model_dump(mode="json"),
        status_code=201,
        headers={"Location": f"/v1/schedules/{out.id}"},
    )


@router.get("", response_model=list[ScheduleOut], responses=problem_responses(401, 403, 503))
def list_schedules(caller: Reader, pool: PoolDep) -> list[ScheduleOut]:
    """The caller's schedules, newest first."""
    with pool.connection() as conn:
        rows = schedule_store.schedule_list_for_tenant(conn, tenant_id=caller.tenant_id, limit=500)
    return [schedule_out(r) for r in rows]


def _get(pool: PoolDep, tenant_id: str, schedule_id: UUID) -> Row:
    with pool.connection() as conn:
        row = schedule_store.schedule_get_for_tenant(
            conn, schedule_id=schedule_id, tenant_id=tenant_id
        )
    if row is None:
        raise ScheduleNotFound(f"no schedule {schedule_id}")
    return row


@router.get(
    "/{schedule_id}", response_model=ScheduleOut, responses=problem_responses(401, 403, 404, 503)
)
def get_schedule(schedule_id: UUID, caller: Reader, pool: PoolDep) -> ScheduleOut:
    """One schedule with its cursor and last admission refusal."""
    return schedule_out(_get(pool, caller.tenant_id, schedule_id))


@router.patch(
    "/{schedule_id}",
    response_model=ScheduleOut,
    responses=problem_responses(400, 401, 403, 404, 413, 415, 422, 503),
    summary="Change, pause or resume a schedule",
)
def patch_schedule(
    schedule_id: UUID, body: ScheduleFields, caller: Writer, pool: PoolDep
) -> ScheduleOut:
    """``{"enabled": false}`` pauses, ``{"enabled": true}`` resumes (missed slots follow the
    catch-up policy); a new rule moves the cursor to its first slot after now."""
    row = update_schedule(
        pool, tenant_id=caller.tenant_id, schedule_id=schedule_id, patch=_fields(body)
    )
    if row is None:
        raise ScheduleNotFound(f"no schedule {schedule_id}")
    return schedule_out(row)


@router.delete("/{schedule_id}", status_code=204, responses=problem_responses(401, 403, 404, 503))
def delete_schedule(schedule_id: UUID, caller: Writer, pool: PoolDep) -> Response:
    """Delete the schedule and its slot records; exports it created stay."""
    with pool.connection() as conn:
        found = schedule_store.schedule_delete(
            conn, schedule_id=schedule_id, tenant_id=caller.tenant_id
        )
    if not found:
        raise ScheduleNotFound(f"no schedule {schedule_id}")
    return Response(status_code=204)


@router.get(
    "/{schedule_id}/runs",
    response_model=list[RunOut],
    responses=problem_responses(401, 403, 404, 422, 503),
    summary="A schedule's slots and their exports",
)
def runs(
    schedule_id: UUID,
    caller: Reader,
    pool: PoolDep,
    limit: int = Query(default=50, ge=1, le=500),
    before: datetime | None = Query(default=None, description="slots scheduled before this"),
) -> list[RunOut]:
    """Slots newest first: created (with the export and its status), skipped, or invalid."""
    _get(pool, caller.tenant_id, schedule_id)
    with pool.connection() as conn:
        rows = schedule_store.schedule_runs(
            conn, schedule_id=schedule_id, limit=limit, before=before
        )
    return [RunOut.model_validate(r) for r in rows]
