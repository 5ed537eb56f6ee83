"""``/v1/schedules``: periodic exports of the caller's notes (tenant-scoped like exports)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from fastapi import APIRouter, Query, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from exportcore.admission import AdmissionRefused
from exportcore.db import Row
from exportcore.domain import Labels
from exportcore.schedules import management
from exportcore.schedules.management import (
    BackfillSlot,
    ScheduleNotFound,
    backfill,
    create_schedule,
    run_now,
    update_schedule,
)
from exportcore.schedules.rules import (
    MAX_BACKFILL_SLOTS,
    MAX_JITTER_SECONDS,
    PreviewSlot,
    Rule,
    preview,
)
from exportcore.store import schedules as schedule_store
from services.api.cron_words import describe
from services.api.deps import (
    PoolDep,
    Reader,
    ReadRateLimited,
    SettingsDep,
    SubmitRateLimited,
    Writer,
    actor_of,
    count_refusal,
)
from services.api.problems import problem_responses
from services.api.schemas import ExportOut, FormatName, Metadata, Rfc3339, Tags, export_out

router = APIRouter(prefix="/v1/schedules", tags=["schedules"])
# Its own path: under /v1/schedules/ it would be shadowed by /v1/schedules/{schedule_id}
# for the methods it does not have (a PATCH would answer 422 "not a UUID" instead of 405).
preview_router = APIRouter(prefix="/v1/schedule-preview", tags=["schedules"])

_NAME_PATTERN = r"^[^\x00-\x1f\x7f]*$"
_CRON = "5-field cron expression, e.g. '30 2 * * *', or a nickname: @hourly, @daily, @weekly, "
_CRON += "@monthly, @yearly"
Overlap = Literal["skip", "buffer_one", "allow_all", "cancel_other"]
_OVERLAP = (
    "while an earlier export of the schedule is still queued or running: skip the slot "
    "(recorded skipped, reason overlap), buffer_one (the latest due slot waits and runs when "
    "it ended), allow_all, or cancel_other (the earlier scheduled export is cancelled and the "
    "slot runs); catch_up all needs allow_all"
)
_JITTER = (
    f"seconds, 0-{MAX_JITTER_SECONDS}: every slot fires a fixed delay after its instant, "
    "derived from the schedule's id within this bound (jitter_offset), so schedules of the "
    "same rule do not all fire at once; 0 (the default) fires on the instant"
)
Jitter = Annotated[StrictInt, Field(ge=0, le=MAX_JITTER_SECONDS, description=_JITTER)]


def _drop_null_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


def _unset(**kwargs: Any) -> Any:
    """A PATCH field that may be omitted but not null: no default in the schema, and an
    explicit null is a 422 naming the field (it is not of the field's type)."""
    return Field(default=None, json_schema_extra=_drop_null_default, **kwargs)


FullEvery = Annotated[
    StrictInt | None,
    Field(
        ge=1,
        le=366,
        description=(
            "incremental (with all=true): a full export every N slots, deltas since the "
            "previous export in between (a daily schedule with 7: full weekly)"
        ),
    ),
]


class ScheduleCreate(BaseModel):
    """A new schedule: a rule (cron + timezone, or interval_seconds) and a selection
    (note_ids, or all). Omitted fields take their defaults; null is accepted only where it
    means "not this one" (cron, timezone, interval_seconds, note_ids)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="", max_length=200, pattern=_NAME_PATTERN)
    cron: str | None = Field(default=None, max_length=200, description=_CRON)
    timezone: str | None = Field(
        default=None, max_length=64, description="IANA zone the cron rule is evaluated in"
    )
    interval_seconds: StrictInt | None = Field(
        default=None,
        ge=1,
        le=31_536_000,
        description="instead of cron: every N seconds (at least SCHEDULE_MIN_INTERVAL_SECONDS)",
    )
    note_ids: list[StrictInt] | None = Field(default=None, min_length=1, max_length=100_000)
    all: StrictBool = False
    format: FormatName = "json"
    catch_up: Literal["skip", "all"] = Field(
        default="skip", description="after downtime: run only the latest missed slot, or all"
    )
    max_catch_up: StrictInt = Field(default=10, ge=1, le=1000)
    overlap: Overlap = Field(default="skip", description=_OVERLAP)
    jitter: Jitter = 0
    enabled: StrictBool = True
    full_every: FullEvery = None
    metadata: Metadata = None
    tags: Tags = None


class ScheduleFields(BaseModel):
    """A partial update: only the fields given change. ``name``, ``all``, ``format``,
    ``catch_up``, ``max_catch_up``, ``overlap`` and ``enabled`` are never null (omit them to
    keep them)."""

    model_config = ConfigDict(extra="forbid")

    name: str = _unset(max_length=200, pattern=_NAME_PATTERN)
    cron: str | None = Field(default=None, max_length=200, description=_CRON)
    timezone: str | None = Field(
        default=None, max_length=64, description="IANA zone the cron rule is evaluated in"
    )
    interval_seconds: StrictInt | None = Field(
        default=None, ge=1, le=31_536_000, description="instead of cron: every N seconds"
    )
    note_ids: list[StrictInt] | None = Field(default=None, min_length=1, max_length=100_000)
    all: StrictBool = _unset()
    format: FormatName = _unset()
    catch_up: Literal["skip", "all"] = _unset(
        description="after downtime: run only the latest missed slot, or all"
    )
    max_catch_up: StrictInt = _unset(ge=1, le=1000)
    overlap: Overlap = _unset(description=_OVERLAP)
    jitter: StrictInt = _unset(ge=0, le=MAX_JITTER_SECONDS, description=_JITTER)
    enabled: StrictBool = _unset(description="false pauses, true resumes")
    full_every: FullEvery = None
    metadata: Metadata = Field(
        default=None, description="replaces the schedule's metadata whole; null removes it"
    )
    tags: Tags = Field(default=None, description="replaces the schedule's tags; null removes them")


class RuleFields(BaseModel):
    """A rule to preview before saving it: cron + timezone, or interval_seconds."""

    model_config = ConfigDict(extra="forbid")

    cron: str | None = Field(default=None, max_length=200, description=_CRON)
    timezone: str | None = Field(default=None, max_length=64)
    interval_seconds: StrictInt | None = Field(default=None, ge=1, le=31_536_000)
    count: StrictInt = Field(default=5, ge=1, le=100, description="how many slots")


class ScheduleOut(BaseModel):
    """A schedule, its durable cursor, its backoff and why it is paused."""

    id: UUID
    name: str
    cron: str | None
    timezone: str | None
    interval_seconds: int | None
    rule_description: str = Field(
        description="the rule in words (cron-descriptor), e.g. 'At 02:00 (Europe/Berlin)'"
    )
    selection: dict[str, Any]
    format: FormatName
    catch_up: Literal["skip", "all"]
    max_catch_up: int
    overlap: Overlap = Field(description=_OVERLAP)
    jitter: int = Field(description=_JITTER)
    jitter_offset: int = Field(
        description="seconds each slot of this schedule fires after its instant: a hash of "
        "its id within jitter, the same in every process and after every restart"
    )
    enabled: bool
    full_every: int | None = Field(
        default=None, description="incremental: a full export every N slots, deltas between"
    )
    metadata: dict[str, str] = Field(description="every export of the schedule gets it ({})")
    tags: list[str] = Field(description="every export of the schedule gets them ([])")
    next_due_at: datetime
    retry_at: datetime | None = Field(
        description="after admission refused a slot: not tried again before this"
    )
    last_refusal: dict[str, Any] | None = Field(
        description="the last refusal: code, detail, slot, at, refusals (in a row), "
        "next_retry_at; null once a slot went through"
    )
    paused_reason: str | None = Field(
        description="requested (through the API), unknown_notes or invalid_selection "
        "(paused by the tick: the selection can no longer be exported); null when enabled"
    )
    paused_detail: str
    paused_at: datetime | None
    created_at: datetime
    updated_at: datetime


class RunOut(BaseModel):
    """One slot: when it was due, what happened, and its export."""

    scheduled_at: datetime
    trigger: Literal["schedule", "manual"] = Field(
        description="schedule: a slot of the rule; manual: a run requested through the API"
    )
    outcome: Literal["created", "skipped", "invalid"]
    reason: Literal["catch_up", "overlap"] | None = Field(
        description="why a slot was skipped: catch_up (missed, beyond the catch-up policy) or "
        "overlap (an earlier export was still queued or running); null otherwise"
    )
    job_id: UUID | None
    job_status: str | None
    detail: str
    created_at: datetime
    backfilled_at: datetime | None = Field(
        default=None, description="when a backfill created this slot's export; null otherwise"
    )


class ManualRunOut(BaseModel):
    """A run requested now: its slot and its export."""

    scheduled_at: datetime
    trigger: Literal["manual"] = "manual"
    export: ExportOut


class PreviewSlotOut(BaseModel):
    """An upcoming slot in UTC and in the rule's own zone, and when it fires (its jitter)."""

    at: datetime = Field(description="the slot's instant, UTC (its identity in the runs)")
    local: datetime = Field(description="the same instant with the zone's offset")
    fires_at: datetime = Field(description="when the slot fires: at + jitter_offset, UTC")
    fires_local: datetime = Field(description="the same with the zone's offset")


class PreviewOut(BaseModel):
    """The next slots of a rule."""

    timezone: str = Field(description="the zone of `local` (UTC for an interval rule)")
    rule_description: str = Field(description="the rule in words (cron-descriptor)")
    jitter: int = Field(default=0, description="the schedule's jitter bound, seconds")
    jitter_offset: int = Field(
        default=0,
        description="seconds each slot fires after its instant (0 for a rule not saved yet: "
        "the offset derives from the schedule's id)",
    )
    slots: list[PreviewSlotOut]


class BackfillRequest(BaseModel):
    """A past range of the schedule's slots to create the exports of: ``from`` <= slot <=
    ``to``, both RFC 3339 with an offset."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    start: Rfc3339 = Field(alias="from", description="the first instant of the range")
    end: Rfc3339 = Field(
        alias="to",
        description=f"the last instant of the range (not after now; at most "
        f"{MAX_BACKFILL_SLOTS} slots in the range)",
    )


class BackfillSlotOut(BaseModel):
    """What the backfill did with one slot."""

    scheduled_at: datetime
    outcome: Literal["created", "exists", "refused", "invalid"] = Field(
        description="created (a new export), exists (the slot already had its export: "
        "nothing new), refused (admission refused it or it was not tried after a quota or "
        "capacity refusal: code, detail; a later backfill tries it again), invalid (the "
        "selection cannot be exported)"
    )
    job_id: UUID | None = Field(description="the slot's export (created or exists)")
    job_status: str | None
    code: str | None = Field(description="why refused or invalid, e.g. quota_exceeded")
    detail: str


class BackfillOut(BaseModel):
    """A backfill's report, slot by slot, and its counts."""

    schedule_id: UUID
    start: datetime = Field(serialization_alias="from")
    end: datetime = Field(serialization_alias="to")
    created: int
    existing: int
    refused: int
    invalid: int
    slots: list[BackfillSlotOut]


def backfill_out(
    schedule_id: UUID, body: BackfillRequest, slots: list[BackfillSlot]
) -> BackfillOut:
    """Render a backfill's report (:func:`exportcore.schedules.management.backfill`)."""
    outcomes = [s.outcome for s in slots]
    return BackfillOut(
        schedule_id=schedule_id,
        start=body.start,
        end=body.end,
        created=outcomes.count("created"),
        existing=outcomes.count("exists"),
        refused=outcomes.count("refused"),
        invalid=outcomes.count("invalid"),
        slots=[
            BackfillSlotOut(
                scheduled_at=s.scheduled_at,
                outcome=s.outcome,  # type: ignore[arg-type]
                job_id=s.job_id,
                job_status=s.job_status,
                code=s.code,
                detail=s.detail,
            )
            for s in slots
        ],
    )


def schedule_out(row: Row) -> ScheduleOut:
    """Render a schedule row."""
    return ScheduleOut(
        id=row["id"],
        name=row["name"],
        cron=row["cron"],
        timezone=row["timezone"],
        interval_seconds=row["interval_seconds"],
        rule_description=describe(row["cron"], row["timezone"], row["interval_seconds"]),
        selection=row["payload"]["selection"],
        format=row["format"],
        catch_up=row["catch_up"],
        max_catch_up=row["max_catch_up"],
        overlap=row["overlap"],
        jitter=row["jitter"],
        jitter_offset=row["jitter_offset"],
        enabled=row["enabled"],
        full_every=row["payload"].get("full_every"),
        metadata=Labels.from_payload(row["payload"]).metadata_dict,
        tags=list(Labels.from_payload(row["payload"]).tags),
        next_due_at=row["next_due_at"],
        retry_at=row["retry_at"],
        last_refusal=row["last_refusal"],
        paused_reason=row["paused_reason"],
        paused_detail=row["paused_detail"],
        paused_at=row["paused_at"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def _preview_out(
    rule: Rule, slots: list[PreviewSlot], jitter: int = 0, jitter_offset: int = 0
) -> PreviewOut:
    return PreviewOut(
        timezone=rule.timezone or "UTC",
        rule_description=describe(rule.cron, rule.timezone, rule.interval_seconds),
        jitter=jitter,
        jitter_offset=jitter_offset,
        slots=[
            PreviewSlotOut(at=p.at, local=p.local, fires_at=p.fires_at, fires_local=p.fires_local)
            for p in slots
        ],
    )


def _fields(body: BaseModel) -> dict[str, Any]:
    return body.model_dump(exclude_unset=True)


@router.post(
    "",
    status_code=201,
    response_model=ScheduleOut,
    responses=problem_responses(400, 401, 403, 413, 415, 422, 503),
    summary="Create a schedule",
)
def create(
    body: ScheduleCreate, caller: Writer, pool: PoolDep, settings: SettingsDep
) -> JSONResponse:
    """Create a schedule; its first slot is the rule's first instant after now.

    422 for a bad rule, slots closer than the minimum interval, unknown note ids (listed in
    ``unknown_note_ids``), or a tenant that has ``SCHEDULES_PER_TENANT_MAX`` schedules."""
    row = create_schedule(
        pool,
        tenant_id=caller.tenant_id,
        fields=_fields(body),
        settings=settings,
        actor=actor_of(caller),
    )
    out = schedule_out(row)
    return JSONResponse(
        out.model_dump(mode="json"),
        status_code=201,
        headers={"Location": f"/v1/schedules/{out.id}"},
    )


@router.get("", response_model=list[ScheduleOut], responses=problem_responses(401, 403, 429, 503))
def list_schedules(caller: Reader, _rate: ReadRateLimited, pool: PoolDep) -> list[ScheduleOut]:
    """The caller's schedules, newest first."""
    with pool.connection() as conn:
        rows = schedule_store.schedule_list_for_tenant(conn, tenant_id=caller.tenant_id, limit=500)
    return [schedule_out(r) for r in rows]


@preview_router.post(
    "",
    response_model=PreviewOut,
    responses=problem_responses(400, 401, 403, 413, 415, 422, 503),
    summary="The next slots of a rule not saved yet",
)
def preview_rule(body: RuleFields, caller: Reader, settings: SettingsDep) -> PreviewOut:
    """The next ``count`` slots of a rule after now, checked as a new schedule's rule would
    be (422 saying what to fix). Nothing is saved."""
    rule = Rule(body.cron, body.timezone, body.interval_seconds)
    rule.validate(settings.schedule_min_interval_seconds)
    return _preview_out(rule, preview(rule, body.count))


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
    schedule_id: UUID, body: ScheduleFields, caller: Writer, pool: PoolDep, settings: SettingsDep
) -> ScheduleOut:
    """``{"enabled": false}`` pauses, ``{"enabled": true}`` resumes (missed slots follow the
    catch-up policy; the selection must still be exportable); a new rule moves the cursor to
    its first slot after now."""
    row = update_schedule(
        pool,
        tenant_id=caller.tenant_id,
        schedule_id=schedule_id,
        patch=_fields(body),
        settings=settings,
        actor=actor_of(caller),
    )
    if row is None:
        raise ScheduleNotFound(f"no schedule {schedule_id}")
    return schedule_out(row)


@router.delete("/{schedule_id}", status_code=204, responses=problem_responses(401, 403, 404, 503))
def delete_schedule(schedule_id: UUID, caller: Writer, pool: PoolDep) -> Response:
    """Delete the schedule and its slot records (audited: ``schedule_delete``); exports it
    created stay."""
    found = management.delete_schedule(
        pool, tenant_id=caller.tenant_id, schedule_id=schedule_id, actor=actor_of(caller)
    )
    if not found:
        raise ScheduleNotFound(f"no schedule {schedule_id}")
    return Response(status_code=204)


@router.get(
    "/{schedule_id}/runs",
    response_model=list[RunOut],
    responses=problem_responses(401, 403, 404, 422, 429, 503),
    summary="A schedule's slots and their exports",
)
def runs(
    schedule_id: UUID,
    caller: Reader,
    _rate: ReadRateLimited,
    pool: PoolDep,
    limit: int = Query(default=50, ge=1, le=500),
    before: Rfc3339 | None = Query(default=None, description="slots scheduled before this"),
) -> list[RunOut]:
    """Slots newest first: created (with the export and its status), skipped (with its
    reason: catch_up or overlap), or invalid."""
    _get(pool, caller.tenant_id, schedule_id)
    with pool.connection() as conn:
        rows = schedule_store.schedule_runs(
            conn, schedule_id=schedule_id, limit=limit, before=before
        )
    return [RunOut.model_validate(r) for r in rows]


@router.post(
    "/{schedule_id}/runs",
    status_code=202,
    response_model=ManualRunOut,
    responses={
        202: {
            "description": "Accepted: the run's export was committed",
            "headers": {"Location": {"schema": {"type": "string"}}},
        },
        **problem_responses(401, 403, 404, 422, 429, 503),
    },
    summary="Run a schedule now",
)
def run_schedule_now(
    schedule_id: UUID,
    caller: Writer,
    _rate: SubmitRateLimited,
    pool: PoolDep,
    settings: SettingsDep,
) -> JSONResponse:
    """One export of the schedule's selection now, through the same slot and admission path
    as its scheduled slots: a slot of trigger ``manual`` at this instant (it can never take a
    scheduled slot's place), admission last (429 / 503 with ``Retry-After``, nothing
    written), the submit rate limit first. The cursor and the rule do not change."""
    try:
        run = run_now(
            pool,
            settings,
            tenant_id=caller.tenant_id,
            schedule_id=schedule_id,
            actor=actor_of(caller),
        )
    except AdmissionRefused as exc:
        count_refusal(settings, caller.tenant_id, exc)
        raise
    job = export_out(run.job, settings.api_public_url)
    body = ManualRunOut(scheduled_at=run.scheduled_at, export=job)
    return JSONResponse(
        body.model_dump(mode="json"), status_code=202, headers={"Location": job.links.self}
    )


@router.get(
    "/{schedule_id}/preview",
    response_model=PreviewOut,
    responses=problem_responses(401, 403, 404, 422, 503),
    summary="The next slots of a schedule",
)
def preview_schedule(
    schedule_id: UUID,
    caller: Reader,
    pool: PoolDep,
    count: int = Query(default=5, ge=1, le=100, description="how many slots"),
) -> PreviewOut:
    """The schedule's next ``count`` slots that fire after now, in UTC and in its own zone
    (an interval rule keeps the phase of its cursor), each with when it fires (its instant
    plus the schedule's ``jitter_offset``)."""
    row = _get(pool, caller.tenant_id, schedule_id)
    rule = Rule.of(row)
    offset = int(row["jitter_offset"])
    slots = preview(rule, count, cursor=row["next_due_at"], jitter_offset=offset)
    return _preview_out(rule, slots, int(row["jitter"]), offset)


@router.post(
    "/{schedule_id}/backfill",
    response_model=BackfillOut,
    responses=problem_responses(400, 401, 403, 404, 413, 415, 422, 429, 503),
    summary="Create the exports of a past range of slots",
)
def backfill_schedule(
    schedule_id: UUID,
    body: BackfillRequest,
    caller: Writer,
    _rate: SubmitRateLimited,
    pool: PoolDep,
    settings: SettingsDep,
) -> JSONResponse:
    """One export per slot of the schedule's rule in ``from`` <= slot <= ``to`` (past
    slots only, at most ``MAX_BACKFILL_SLOTS``: a wider range is a 422 saying where to
    split it), each through admission like a scheduled slot, each audited
    (``schedule_backfill``). A slot that already has its export is reported ``exists`` and
    never gets a second one, so repeating the call is harmless; a refusal of admission is
    reported for its slot (and the slots after it), which a later call tries again. 200 with
    the report slot by slot."""
    slots = backfill(
        pool,
        settings,
        tenant_id=caller.tenant_id,
        schedule_id=schedule_id,
        start=body.start,
        end=body.end,
        actor=actor_of(caller),
    )
    return JSONResponse(
        backfill_out(schedule_id, body, slots).model_dump(mode="json", by_alias=True)
    )
