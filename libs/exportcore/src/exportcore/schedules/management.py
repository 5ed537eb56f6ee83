"""Managing schedules (the API, the console, the CLI through the API): create, change, delete
and run one by hand, each through the same admission path as an export submitted by the API,
each change audited (:mod:`exportcore.audit`) in its own transaction.

A manual run is a slot of its own (trigger ``manual``), so it never takes or duplicates a
scheduled slot; see :func:`run_now`. A backfill (:func:`backfill`) creates the exports of a
past range of the rule's own slots, each at most once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

from psycopg_pool import ConnectionPool

from exportcore import audit
from exportcore.admission import AdmissionRefused, CapacityExceeded, QuotaExceeded
from exportcore.audit import SYSTEM, Actor
from exportcore.db import Conn, Row, transaction
from exportcore.domain import (
    ExportError,
    ExportFormat,
    ExportRequest,
    InvalidSelection,
    Labels,
    UnknownNotes,
    new_id,
)
from exportcore.schedules.rules import (
    InvalidSchedule,
    Rule,
    backfill_slots,
    check_jitter,
    check_policies,
    first_slot,
)
from exportcore.schedules.ticker import submit_slot
from exportcore.settings import Settings, get_settings
from exportcore.store import notes as note_store
from exportcore.store import schedules as schedule_store
from exportcore.submit import SelectionChanged, check_note_ids, counted

log = logging.getLogger(__name__)


class ScheduleLimitReached(ExportError):
    """The tenant already has ``SCHEDULES_PER_TENANT_MAX`` schedules."""

    code = "schedule_limit_reached"
    title = "Too many schedules"
    kind = "invalid"


class ScheduleNotFound(ExportError):
    """No such schedule for this tenant (another tenant's reads the same)."""

    code = "schedule_not_found"
    title = "Schedule not found"
    kind = "not_found"


EDITABLE = (
    "name",
    "cron",
    "timezone",
    "interval_seconds",
    "note_ids",
    "all",
    "format",
    "catch_up",
    "max_catch_up",
    "overlap",
    "jitter",
    "enabled",
    "full_every",
    "metadata",
    "tags",
)
RULE_FIELDS = ("cron", "timezone", "interval_seconds")
# Fields that always have a value: an explicit null is refused (omit the field instead).
NOT_NULL = ("name", "all", "format", "catch_up", "max_catch_up", "overlap", "jitter", "enabled")


def reject_nulls(fields: dict[str, Any]) -> None:
    """Raise ``InvalidSchedule`` naming the first field of ``NOT_NULL`` given as null (the
    API's models refuse them first; this guards every other caller)."""
    for name in NOT_NULL:
        if name in fields and fields[name] is None:
            raise InvalidSchedule(f"{name} may not be null; omit it to keep its value")


def _payload(fields: dict[str, Any]) -> tuple[ExportRequest, dict[str, Any], str]:
    fmt = ExportFormat(fields.get("format") or "json")
    labels = Labels.build(fields.get("metadata"), fields.get("tags"))
    request = ExportRequest.build(
        fmt, fields.get("note_ids"), bool(fields.get("all")), labels=labels
    )
    payload = request.canonical()
    every = fields.get("full_every")
    if every is not None:
        if not isinstance(every, int) or isinstance(every, bool) or not 1 <= every <= 366:
            raise InvalidSchedule("full_every is a number of slots from 1 to 366")
        if request.note_ids is not None and every > 1:
            raise InvalidSchedule("an incremental schedule (full_every) exports all notes")
        if every > 1:
            payload["full_every"] = every
    return request, payload, fmt.value


def check_selection(conn: Conn, settings: Settings, tenant_id: str, request: ExportRequest) -> None:
    """The selection must be exportable now, as ``POST /v1/exports`` requires: raises
    ``UnknownNotes`` listing ids the tenant does not have, or ``InvalidSelection`` for a
    tenant without notes or a selection over ``MAX_SELECTION``."""
    if request.note_ids is None:
        if note_store.notes_count(conn, tenant_id=tenant_id) == 0:
            raise InvalidSelection("the tenant has no notes to export")
        return
    if len(request.note_ids) > settings.max_selection:
        raise InvalidSelection(
            f"the selection has {len(request.note_ids)} notes; the limit is "
            f"{settings.max_selection}"
        )
    check_note_ids(conn, tenant_id, request.note_ids)


def create_schedule(
    pool: ConnectionPool[Conn],
    *,
    tenant_id: str,
    fields: dict[str, Any],
    settings: Settings | None = None,
    now: datetime | None = None,
    actor: Actor = SYSTEM,
) -> Row:
    """Create a tenant's schedule from API fields; its cursor is the first slot after now.
    Audited (``schedule_create`` by ``actor``, with the schedule's name, rule, format and
    whether it starts enabled) in the creating transaction.

    Raises ``InvalidSchedule`` (bad rule, slots closer than
    ``SCHEDULE_MIN_INTERVAL_SECONDS``, a null field, ``catch_up: all`` without
    ``overlap: allow_all``, a ``jitter`` outside 0-3600 s), ``InvalidSelection`` /
    ``UnknownNotes`` (the selection cannot be exported) or ``ScheduleLimitReached`` (the
    tenant has ``SCHEDULES_PER_TENANT_MAX`` schedules; concurrent creates are serialised
    per tenant, so the cap holds).
    """
    settings = settings or get_settings()
    reject_nulls(fields)
    rule = Rule(fields.get("cron"), fields.get("timezone"), fields.get("interval_seconds"))
    rule.validate(settings.schedule_min_interval_seconds)
    catch_up = fields.get("catch_up") or "skip"
    overlap = fields.get("overlap") or "skip"
    check_policies(catch_up, overlap)
    jitter = check_jitter(fields.get("jitter", 0))
    request, payload, fmt = _payload(fields)
    enabled = fields.get("enabled", True)
    with transaction(pool) as conn:
        check_selection(conn, settings, tenant_id, request)
        schedule_store.schedule_tenant_lock(conn, tenant_id=tenant_id)  # then count: the cap
        held = schedule_store.schedule_count_for_tenant(conn, tenant_id=tenant_id)
        if held >= settings.schedules_per_tenant_max:
            raise ScheduleLimitReached(
                f"the tenant has {held} schedules; at most {settings.schedules_per_tenant_max} "
                "are allowed (SCHEDULES_PER_TENANT_MAX): delete one first"
            )
        row = schedule_store.schedule_insert(
            conn,
            schedule_id=uuid4(),
            tenant_id=tenant_id,
            name=fields.get("name") or "",
            cron=rule.cron,
            timezone=rule.timezone,
            interval_seconds=rule.interval_seconds,
            payload=payload,
            format=fmt,
            next_due_at=first_slot(rule, now or datetime.now(UTC)),
            catch_up=catch_up,
            max_catch_up=fields.get("max_catch_up") or 10,
            overlap=overlap,
            jitter=jitter,
            enabled=enabled,
        )
        audit.record(
            conn,
            actor,
            "schedule_create",
            target_kind="schedule",
            target_id=row["id"],
            tenant_id=tenant_id,
            detail=_described(row),
        )
    return row


def _described(row: Row) -> dict[str, Any]:
    """What an audit row says about a schedule: its name, rule, format, selection kind and
    whether it is enabled (never its note ids: a count of them)."""
    selection = row["payload"]["selection"]
    note_ids = selection.get("note_ids")
    return {
        "name": row["name"],
        "cron": row["cron"],
        "timezone": row["timezone"],
        "interval_seconds": row["interval_seconds"],
        "format": row["format"],
        "selection": "all" if note_ids is None else f"{len(note_ids)} note ids",
        "enabled": row["enabled"],
    }


def delete_schedule(
    pool: ConnectionPool[Conn], *, tenant_id: str, schedule_id: UUID, actor: Actor = SYSTEM
) -> bool:
    """Delete a tenant's schedule and its slot records (the exports it created stay);
    audited (``schedule_delete`` by ``actor``, with what the schedule was) in the deleting
    transaction. False, and nothing written, when the tenant has no such schedule."""
    with transaction(pool) as conn:
        row = schedule_store.schedule_lock_for_tenant(
            conn, schedule_id=schedule_id, tenant_id=tenant_id
        )
        if row is None:
            return False
        schedule_store.schedule_delete(conn, schedule_id=schedule_id, tenant_id=tenant_id)
        audit.record(
            conn,
            actor,
            "schedule_delete",
            target_kind="schedule",
            target_id=schedule_id,
            tenant_id=tenant_id,
            detail=_described(row),
        )
    return True


def _update_values(row: Row, merged: dict[str, Any], **over: Any) -> dict[str, Any]:
    values = {
        "schedule_id": row["id"],
        "tenant_id": row["tenant_id"],
        "name": merged["name"],
        "cron": merged["cron"],
        "timezone": merged["timezone"],
        "interval_seconds": merged["interval_seconds"],
        "payload": merged["payload"],
        "format": merged["format"],
        "next_due_at": merged["next_due_at"],
        "catch_up": merged["catch_up"],
        "max_catch_up": merged["max_catch_up"],
        "overlap": merged["overlap"],
        "jitter": merged["jitter"],
        "enabled": merged["enabled"],
    }
    values.update(over)
    return values


def update_schedule(
    pool: ConnectionPool[Conn],
    *,
    tenant_id: str,
    schedule_id: UUID,
    patch: dict[str, Any],
    settings: Settings | None = None,
    actor: Actor = SYSTEM,
) -> Row | None:
    """Apply a partial update; None if the tenant has no such schedule. Audited by
    ``actor`` in the update's transaction: a pause or a resume (``enabled`` changing) as
    ``pause`` / ``resume``, a change of any other field as ``schedule_update`` (naming the
    fields that changed); a patch that changes nothing writes no row.

    Changing the rule moves the cursor to the rule's first slot after now. Pausing keeps the
    cursor where it is, so resuming catches up on the missed slots by the schedule's policy.
    A new selection, or resuming, checks that the selection can be exported (422 otherwise,
    listing unknown note ids). Raises like :func:`create_schedule`.
    """
    settings = settings or get_settings()
    reject_nulls(patch)
    with transaction(pool) as conn:
        row = schedule_store.schedule_lock_for_tenant(
            conn, schedule_id=schedule_id, tenant_id=tenant_id
        )
        if row is None:
            return None
        selection = row["payload"]["selection"]
        merged: dict[str, Any] = {
            "name": row["name"],
            "cron": row["cron"],
            "timezone": row["timezone"],
            "interval_seconds": row["interval_seconds"],
            "note_ids": selection.get("note_ids"),
            "all": bool(selection.get("all")),
            "format": row["format"],
            "catch_up": row["catch_up"],
            "max_catch_up": row["max_catch_up"],
            "overlap": row["overlap"],
            "jitter": row["jitter"],
            "enabled": row["enabled"],
            "full_every": row["payload"].get("full_every"),
            # a patch's metadata / tags replace the schedule's whole (null: none left)
            "metadata": Labels.from_payload(row["payload"]).metadata_dict,
            "tags": list(Labels.from_payload(row["payload"]).tags),
        }
        if "note_ids" in patch or "all" in patch:
            merged["note_ids"], merged["all"] = patch.get("note_ids"), bool(patch.get("all"))
        if patch.get("interval_seconds") is not None:  # becomes (or stays) an interval rule
            merged.update(cron=None, timezone=None, interval_seconds=patch["interval_seconds"])
        elif "cron" in patch or "timezone" in patch:  # becomes (or stays) a cron rule
            merged.update(
                cron=patch.get("cron", row["cron"]),
                timezone=patch.get("timezone", row["timezone"]),
                interval_seconds=None,
            )
        merged.update(
            {
                k: v
                for k, v in patch.items()
                if k in EDITABLE and k not in RULE_FIELDS and k not in ("note_ids", "all")
            }
        )
        check_policies(merged["catch_up"], merged["overlap"])
        check_jitter(merged["jitter"])
        rule = Rule(merged["cron"], merged["timezone"], merged["interval_seconds"])
        rule_changed = Rule.of(row) != rule
        if rule_changed:
            rule.validate(settings.schedule_min_interval_seconds)
        request, merged["payload"], merged["format"] = _payload(merged)
        resumed = merged["enabled"] and not row["enabled"]
        if "note_ids" in patch or "all" in patch or resumed:
            check_selection(conn, settings, tenant_id, request)
        merged["next_due_at"] = (
            first_slot(rule, datetime.now(UTC)) if rule_changed else row["next_due_at"]
        )
        updated = schedule_store.schedule_update(conn, **_update_values(row, merged))
        if merged["enabled"] != row["enabled"]:
            audit.record(
                conn,
                actor,
                "resume" if merged["enabled"] else "pause",
                target_kind="schedule",
                target_id=schedule_id,
                tenant_id=tenant_id,
            )
        changed = _changed_fields(row, updated)
        if changed:
            audit.record(
                conn,
                actor,
                "schedule_update",
                target_kind="schedule",
                target_id=schedule_id,
                tenant_id=tenant_id,
                detail={"fields": changed},
            )
        return updated


_COMPARED = (
    "name",
    "cron",
    "timezone",
    "interval_seconds",
    "format",
    "catch_up",
    "max_catch_up",
    "overlap",
    "jitter",
)
"""The columns a ``schedule_update`` row names when they change (``payload`` is compared as
``selection`` and ``full_every``; ``enabled`` has its ``pause`` / ``resume`` rows)."""


def _changed_fields(before: Row, after: Row | None) -> list[str]:
    """The names of the fields an update changed, besides ``enabled`` (a pause or a resume
    has its own audit row): ``payload`` is reported as ``selection`` / ``full_every``."""
    if after is None:
        return []
    changed = [k for k in _COMPARED if before[k] != after[k]]
    old, new = before["payload"], after["payload"]
    if old.get("selection") != new.get("selection"):
        changed.append("selection")
    if old.get("full_every") != new.get("full_every"):
        changed.append("full_every")
    before_labels, after_labels = Labels.from_payload(old), Labels.from_payload(new)
    if before_labels.metadata != after_labels.metadata:
        changed.append("metadata")
    if before_labels.tags != after_labels.tags:
        changed.append("tags")
    return changed


class _InstantTaken(Exception):
    """A manual run already holds this instant (retry with a new one)."""


@dataclass(frozen=True)
class ManualRun:
    """A "run now": its slot (trigger ``manual`` at ``scheduled_at``) and its export."""

    scheduled_at: datetime
    job: Row


def run_now(
    pool: ConnectionPool[Conn],
    settings: Settings,
    *,
    tenant_id: str,
    schedule_id: UUID,
    now: datetime | None = None,
    actor: Actor = SYSTEM,
) -> ManualRun:
    """Run a schedule once, now, through the same slot and admission path as its ticks.

    The run is a slot of trigger ``manual`` at the instant of the request, claimed in the
    transaction that writes its export: the slot key is (schedule id, trigger, instant), so
    it can never take or duplicate a scheduled slot, and the cursor, the backoff and the
    rule are left as they are (a paused schedule can be run by hand too). Raises
    ``ScheduleNotFound``, ``InvalidSelection`` / ``UnknownNotes`` for a selection that cannot
    be exported, ``CapacityExceeded`` / ``QuotaExceeded`` when admission refuses (nothing is
    written then, the audit row of the run included: ``run_now`` by ``actor``).
    """
    for _ in range(3):
        instant = now or datetime.now(UTC)
        job_id = new_id()
        try:
            with counted("schedule") as count, transaction(pool) as conn:
                row = schedule_store.schedule_get_for_tenant(
                    conn, schedule_id=schedule_id, tenant_id=tenant_id
                )
                if row is None:
                    raise ScheduleNotFound(f"no schedule {schedule_id}")
                if not schedule_store.slot_claim(
                    conn,
                    schedule_id=schedule_id,
                    scheduled_at=instant,
                    outcome="created",
                    job_id=job_id,
                    trigger="manual",
                ):
                    raise _InstantTaken()  # another run of the same microsecond
                submitted = submit_slot(
                    conn,
                    settings,
                    row,
                    job_id=job_id,
                    event_detail={
                        "schedule_id": str(schedule_id),
                        "scheduled_at": instant.isoformat(),
                        "trigger": "manual",
                    },
                )
                audit.record(
                    conn,
                    actor,
                    "run_now",
                    target_kind="schedule",
                    target_id=schedule_id,
                    tenant_id=tenant_id,
                    job_id=job_id,
                    detail={"scheduled_at": instant.isoformat()},
                )
                count("accepted")
        except (SelectionChanged, _InstantTaken):
            continue
        log.info(
            "schedule run requested",
            extra={"schedule_id": str(schedule_id), "job_id": str(job_id), "tenant_id": tenant_id},
        )
        return ManualRun(instant, submitted.job)
    raise InvalidSelection("the notes kept changing while the run was accepted; try again")


@dataclass(frozen=True)
class BackfillSlot:
    """What a backfill did with one slot of its range.

    ``outcome``: ``created`` (its export is ``job_id``), ``exists`` (the slot had already
    created the export ``job_id``, whose status is ``job_status``: nothing new),
    ``refused`` (admission refused it, or it was not tried after a refusal of the tenant's
    quota or the global capacity: ``code`` and ``detail`` say which; the slot stays as it
    was, so a later backfill tries it again) or ``invalid`` (the schedule's selection
    cannot be exported: ``code`` ``unknown_notes`` / ``invalid_selection``)."""

    scheduled_at: datetime
    outcome: str
    job_id: UUID | None = None
    job_status: str | None = None
    code: str | None = None
    detail: str = ""


def backfill(
    pool: ConnectionPool[Conn],
    settings: Settings,
    *,
    tenant_id: str | None,
    schedule_id: UUID,
    start: datetime,
    end: datetime,
    now: datetime | None = None,
    actor: Actor = SYSTEM,
) -> list[BackfillSlot]:
    """Create the exports of the schedule's own slots ``start <= s <= end`` (instants of
    its rule, never jittered), one per slot, in order; ``tenant_id`` None is an operator
    (any tenant's schedule).

    Each slot is a transaction of its own, like a tick's: the schedule row locked, the slot
    claimed with the rule's key (trigger ``schedule``), the export submitted through
    admission (the same path as a tick, :func:`exportcore.schedules.ticker.submit_slot`) and
    the audit row (``schedule_backfill`` by ``actor``, with the slot) written. A slot that
    already created an export is reported ``exists`` and never gets a second one, whoever
    created it (a tick, this or a concurrent backfill); a slot recorded skipped (missed,
    overlap) or invalid is created. Repeating a backfill is therefore harmless. After
    admission refuses a slot for the tenant's quota or the global capacity, the later slots
    are reported ``refused`` with the same code without being tried. The exports hold the
    notes as they are now (a backfill cannot export a past state).

    Raises ``ScheduleNotFound`` (also for another tenant's schedule) and
    ``InvalidSchedule`` for a range that is reversed, ends after ``now``, or holds more than
    ``MAX_BACKFILL_SLOTS`` slots (nothing is written then).
    """
    now = now or datetime.now(UTC)
    if end > now:
        raise InvalidSchedule(
            f"the backfill range ends at {end.isoformat()}, after now: a backfill covers "
            "past slots (the schedule itself runs the ones to come)"
        )
    with transaction(pool) as conn:  # the rule, read once (each slot locks the row again)
        row = schedule_store.schedule_lock_for_backfill(conn, schedule_id=schedule_id)
    if row is None or (tenant_id is not None and row["tenant_id"] != tenant_id):
        raise ScheduleNotFound(f"no schedule {schedule_id}")
    instants = backfill_slots(Rule.of(row), start, end, row["next_due_at"])
    done: list[BackfillSlot] = []
    stop: BackfillSlot | None = None
    for instant in instants:
        if stop is not None:
            done.append(BackfillSlot(instant, stop.outcome, code=stop.code, detail=stop.detail))
            continue
        slot = _backfill_one(pool, settings, row["tenant_id"], schedule_id, instant, actor)
        done.append(slot)
        if slot.outcome == "invalid" or slot.code in (QuotaExceeded.code, CapacityExceeded.code):
            stop = BackfillSlot(instant, slot.outcome, code=slot.code, detail=_not_tried(slot))
    log.info(
        "schedule backfilled",
        extra={
            "schedule_id": str(schedule_id),
            "tenant_id": row["tenant_id"],
            "slots": len(done),
            "slots_created": sum(s.outcome == "created" for s in done),
        },
    )
    return done


def _not_tried(slot: BackfillSlot) -> str:
    return f"not tried: an earlier slot of this backfill was {slot.outcome} ({slot.code})"


def _backfill_one(
    pool: ConnectionPool[Conn],
    settings: Settings,
    tenant_id: str,
    schedule_id: UUID,
    instant: datetime,
    actor: Actor,
) -> BackfillSlot:
    """One slot of :func:`backfill` in its own transaction (notes that changed under the
    submit are tried once more)."""
    for _ in range(2):
        job_id = new_id()
        try:
            with counted("schedule") as count, transaction(pool) as conn:
                row = schedule_store.schedule_lock_for_backfill(conn, schedule_id=schedule_id)
                if row is None:
                    raise ScheduleNotFound(f"no schedule {schedule_id}")
                if not schedule_store.slot_claim_backfill(
                    conn,
                    schedule_id=schedule_id,
                    scheduled_at=instant,
                    job_id=job_id,
                    detail=f"backfilled by {actor.requested_by}",
                ):
                    held = schedule_store.slot_get(
                        conn, schedule_id=schedule_id, trigger="schedule", scheduled_at=instant
                    )
                    assert held is not None  # the claim conflicted with this created slot
                    return BackfillSlot(
                        instant, "exists", job_id=held["job_id"], job_status=held["job_status"]
                    )
                submitted = submit_slot(
                    conn,
                    settings,
                    row,
                    job_id=job_id,
                    event_detail={
                        "schedule_id": str(schedule_id),
                        "scheduled_at": instant.isoformat(),
                        "trigger": "backfill",
                    },
                )
                audit.record(
                    conn,
                    actor,
                    "schedule_backfill",
                    target_kind="schedule",
                    target_id=schedule_id,
                    tenant_id=tenant_id,
                    job_id=job_id,
                    detail={"scheduled_at": instant.isoformat()},
                )
                count("accepted")
            return BackfillSlot(
                instant, "created", job_id=job_id, job_status=submitted.job["status"]
            )
        except SelectionChanged:
            continue
        except AdmissionRefused as exc:
            return BackfillSlot(instant, "refused", code=exc.code, detail=str(exc)[:300])
        except (InvalidSelection, UnknownNotes) as exc:
            return BackfillSlot(instant, "invalid", code=exc.code, detail=exc.detail[:300])
    return BackfillSlot(
        instant, "refused", code="notes_changed", detail="the notes kept changing; try again"
    )
