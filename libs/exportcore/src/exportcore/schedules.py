"""Periodic exports: durable schedules with one job per slot and an explicit catch-up policy.

A schedule fires at *slots*: instants in UTC. A cron rule is evaluated in the schedule's own
IANA time zone by cronsim (a well-kept evaluator that follows Debian cron across daylight
saving changes); an interval rule fires every ``interval_seconds`` after the previous slot.
What a wall-clock time means on a day when clocks change, for a daily ``30 2 * * *`` in
Europe/Berlin:

- spring forward (02:00 → 03:00): 02:30 never happens; the run is at 03:00 local, right
  after the gap, once;
- fall back (03:00 → 02:00): 02:30 happens twice; the run is at the first 02:30 (summer
  time), once. An hourly rule runs in both real hours.

The durable cursor ``next_due_at`` is the next slot not yet handled. A tick (run by a worker,
emitted by beat) locks each due schedule in its own short transaction and, for the due slots
up to a bounded batch, records the slot (unique on schedule id + instant), creates the job
through the same admission and outbox path as the API, and moves the cursor on. Duplicate
ticks, two beats, redelivered old ticks or concurrent workers therefore never create two
jobs for one slot (DESIGN.md invariant 12). When admission refuses, the cursor stays on that
slot and the refusal is recorded; a later tick retries it.

Catch-up after downtime (or a pause): ``skip`` runs only the latest missed slot; ``all``
runs every missed slot, at most ``max_catch_up`` of them (the most recent); older missed
slots are recorded as ``skipped``.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from psycopg_pool import ConnectionPool

from exportcore import metrics, telemetry
from exportcore.admission import AdmissionRefused
from exportcore.db import Conn, Row, transaction
from exportcore.domain import (
    ExportError,
    ExportFormat,
    ExportRequest,
    InvalidSelection,
    UnknownNotes,
    new_id,
)
from exportcore.settings import Settings
from exportcore.store import schedules as schedule_store
from exportcore.submit import SelectionChanged, counted, submit_in_transaction

log = logging.getLogger(__name__)

MAX_SLOT_SCAN = 1_000_000  # slots enumerated per catch-up at most (a minutely rule ≈ 2 years)
SKIPPED_RECORDED = 100  # skipped slots recorded individually per catch-up, most recent first


class InvalidSchedule(ExportError):
    """A schedule that cannot fire: a bad cron expression, an unknown time zone, both or
    neither of cron and interval."""

    code = "invalid_schedule"
    title = "Invalid schedule"
    kind = "invalid"


@dataclass(frozen=True)
class Rule:
    """When a schedule fires: ``cron`` in ``timezone``, or every ``interval_seconds``."""

    cron: str | None = None
    timezone: str | None = None
    interval_seconds: int | None = None

    def validate(self) -> Rule:
        """Return self, or raise ``InvalidSchedule`` saying what to fix."""
        if (self.cron is None) == (self.interval_seconds is None):
            raise InvalidSchedule("give either cron (with timezone) or interval_seconds")
        if self.interval_seconds is not None:
            if self.timezone is not None:
                raise InvalidSchedule("timezone applies to cron schedules only")
            if self.interval_seconds < 1:
                raise InvalidSchedule("interval_seconds must be at least 1")
            return self
        if not self.timezone:
            raise InvalidSchedule("a cron schedule needs an IANA timezone, e.g. Europe/Berlin")
        try:
            zone = ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise InvalidSchedule(f"unknown time zone {self.timezone!r}") from None
        try:
            CronSim(str(self.cron), datetime(2026, 1, 1, tzinfo=zone))
        except CronSimError as exc:
            raise InvalidSchedule(f"invalid cron expression {self.cron!r}: {exc}") from None
        return self

    def next_after(self, instant: datetime) -> datetime:
        """The first slot strictly after ``instant`` (aware), in UTC."""
        if self.interval_seconds is not None:
            return (instant + timedelta(seconds=self.interval_seconds)).astimezone(UTC)
        zone = ZoneInfo(str(self.timezone))
        return next(iter(CronSim(str(self.cron), instant.astimezone(zone)))).astimezone(UTC)

    @classmethod
    def of(cls, row: Row) -> Rule:
        """The rule of a schedule row."""
        return cls(row["cron"], row["timezone"], row["interval_seconds"])


@dataclass
class Plan:
    """What one tick does for one schedule: ``run`` these slots in order, record ``skipped``
    ones, and (when everything ran) move the cursor to ``cursor``."""

    run: list[datetime] = field(default_factory=list)
    skipped: list[datetime] = field(default_factory=list)
    skipped_total: int = 0
    cursor: datetime | None = None


def plan_slots(
    rule: Rule,
    cursor: datetime,
    now: datetime,
    *,
    catch_up: str,
    max_catch_up: int,
    batch: int,
) -> Plan:
    """Due slots ``cursor <= s <= now`` under the catch-up policy, at most ``batch`` to run.

    ``skip`` keeps only the latest due slot; ``all`` keeps the latest ``max_catch_up``; the
    others are skipped. ``plan.cursor`` is the slot after the last one to run (so the rest
    of a long catch-up comes on later ticks), or after the last due slot when none runs.
    """
    keep = 1 if catch_up == "skip" else max_catch_up
    recent: deque[datetime] = deque(maxlen=keep + SKIPPED_RECORDED)
    slot, seen = cursor, 0
    while slot <= now and seen < MAX_SLOT_SCAN:
        recent.append(slot)
        seen += 1
        slot = rule.next_after(slot)
    if not recent:
        return Plan(cursor=cursor)
    due = list(recent)
    run = due[-keep:]
    plan = Plan(run=run[:batch], skipped=due[:-keep], skipped_total=seen - len(run))
    plan.cursor = rule.next_after(plan.run[-1]) if plan.run else slot
    return plan


@dataclass
class TickCounts:
    """What a tick did, summed over schedules."""

    schedules: int = 0
    created: int = 0
    skipped: int = 0
    refused: int = 0
    invalid: int = 0

    def as_dict(self) -> dict[str, int]:
        """Counts by name (for logs and metrics)."""
        return dict(self.__dict__)


class ScheduleTicker:
    """Advances every due schedule; safe to run from many workers at once."""

    def __init__(
        self,
        settings: Settings,
        pool: ConnectionPool[Conn],
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.clock = clock

    def tick(self, now: datetime | None = None) -> TickCounts:
        """One pass over due schedules at ``now`` (default: the clock)."""
        now = now or self.clock()
        counts = TickCounts()
        with telemetry.span(
            "exports.schedule_tick", attributes={"now": now.isoformat()}
        ) as current:
            with self.pool.connection() as conn:
                due = schedule_store.schedule_due_ids(
                    conn, now=now, limit=self.settings.schedule_batch_size
                )
            for schedule_id in due:
                if self._advance(schedule_id, now, counts):
                    counts.schedules += 1
            telemetry.set_attributes(current, counts.as_dict())
        for outcome in ("created", "skipped", "refused", "invalid"):
            metrics.SCHEDULE_SLOTS.labels(outcome).inc(getattr(counts, outcome))
        if counts.schedules:
            log.info("schedules advanced", extra={"counts": counts.as_dict()})
        return counts

    def _advance(self, schedule_id: UUID, now: datetime, counts: TickCounts) -> bool:
        """Run the schedule's due slots, at most ``schedule_slots_per_tick``, each in a
        transaction of its own: a created job's admission takes the global admission lock
        (:func:`exportcore.admission.admit`), which must not be held across slots. False
        when the schedule was not due or another tick holds it."""
        advanced = False
        for _ in range(self.settings.schedule_slots_per_tick):
            step = self._advance_one(schedule_id, now, counts)
            if step is None:
                break
            advanced = True
            if not step:
                break
        return advanced

    def _advance_one(self, schedule_id: UUID, now: datetime, counts: TickCounts) -> bool | None:
        """One transaction: lock the due schedule, record its skipped slots, run the next
        slot and move the cursor. None when it is not due (or locked by another tick); else
        whether a further slot may be due now (False after a refusal or when none ran)."""
        with transaction(self.pool) as conn:
            row = schedule_store.schedule_lock_due(conn, schedule_id=schedule_id, now=now)
            if row is None:
                return None
            plan = plan_slots(
                Rule.of(row),
                row["next_due_at"],
                now,
                catch_up=row["catch_up"],
                max_catch_up=row["max_catch_up"],
                batch=1,
            )
            for slot in plan.skipped:
                schedule_store.slot_claim(
                    conn,
                    schedule_id=schedule_id,
                    scheduled_at=slot,
                    outcome="skipped",
                    detail=f"missed; catch-up policy {row['catch_up']}",
                )
            counts.skipped += plan.skipped_total
            assert plan.cursor is not None
            if not plan.run:
                schedule_store.schedule_advance(
                    conn, schedule_id=schedule_id, next_due_at=plan.cursor, last_refusal=None
                )
                return False
            slot = plan.run[0]
            outcome = self._run_slot(conn, row, slot, plan.cursor)
            if isinstance(outcome, dict):
                # The slot stays due: a later tick tries it again.
                schedule_store.schedule_advance(
                    conn, schedule_id=schedule_id, next_due_at=slot, last_refusal=outcome
                )
                counts.refused += 1
                return False
            if outcome == "created":
                counts.created += 1
                return True
            if outcome == "invalid":
                counts.invalid += 1
            schedule_store.schedule_advance(
                conn, schedule_id=schedule_id, next_due_at=plan.cursor, last_refusal=None
            )
            return True

    def _run_slot(
        self, conn: Conn, schedule: Row, slot: datetime, cursor: datetime
    ) -> str | dict[str, Any] | None:
        """Claim the slot, move the cursor to ``cursor`` and create the slot's job, in a
        savepoint whose last statement is the job's admission (the caller commits right
        after): ``created``, ``invalid``, None if already handled, or a refusal record (the
        savepoint is rolled back and the slot left for a later tick)."""
        job_id = new_id()
        try:
            with counted("schedule") as count, conn.transaction():
                if not schedule_store.slot_claim(
                    conn,
                    schedule_id=schedule["id"],
                    scheduled_at=slot,
                    outcome="created",
                    job_id=job_id,
                ):
                    return None
                schedule_store.schedule_advance(
                    conn, schedule_id=schedule["id"], next_due_at=cursor, last_refusal=None
                )
                submit_in_transaction(
                    conn,
                    self.settings,
                    tenant_id=schedule["tenant_id"],
                    request=_request_of(schedule),
                    source="schedule",
                    job_id=job_id,
                    event_detail={
                        "schedule_id": str(schedule["id"]),
                        "scheduled_at": slot.isoformat(),
                    },
                )
                count("accepted")
            return "created"
        except (AdmissionRefused, SelectionChanged) as exc:
            code = exc.code if isinstance(exc, AdmissionRefused) else "notes_changed"
            log.info(
                "scheduled slot refused; will retry",
                extra={"schedule_id": str(schedule["id"]), "slot": slot.isoformat(), "code": code},
            )
            return {
                "code": code,
                "detail": str(exc)[:300],
                "slot": slot.isoformat(),
                "at": datetime.now(UTC).isoformat(),
            }
        except (InvalidSelection, UnknownNotes) as exc:
            schedule_store.slot_claim(
                conn,
                schedule_id=schedule["id"],
                scheduled_at=slot,
                outcome="invalid",
                detail=f"{exc.code}: {exc.detail}",
            )
            return "invalid"


def _request_of(schedule: Row) -> ExportRequest:
    selection = schedule["payload"]["selection"]
    return ExportRequest.build(
        ExportFormat(schedule["format"]), selection.get("note_ids"), bool(selection.get("all"))
    )


def first_slot(rule: Rule, after: datetime) -> datetime:
    """The first slot strictly after ``after`` (a new schedule's cursor)."""
    return rule.next_after(after)


# --- managing schedules (API and CLI) -----------------------------------------------------

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
    "enabled",
)
RULE_FIELDS = ("cron", "timezone", "interval_seconds")


def _payload(fields: dict[str, Any]) -> tuple[dict[str, Any], str]:
    fmt = ExportFormat(fields.get("format") or "json")
    request = ExportRequest.build(fmt, fields.get("note_ids"), bool(fields.get("all")))
    return request.canonical(), fmt.value


def create_schedule(pool: ConnectionPool[Conn], *, tenant_id: str, fields: dict[str, Any]) -> Row:
    """Create a tenant's schedule from API fields; its cursor is the first slot after now.

    Raises ``InvalidSchedule`` / ``InvalidSelection`` saying what to fix.
    """
    rule = Rule(fields.get("cron"), fields.get("timezone"), fields.get("interval_seconds"))
    rule.validate()
    payload, fmt = _payload(fields)
    with pool.connection() as conn:
        return schedule_store.schedule_insert(
            conn,
            schedule_id=uuid4(),
            tenant_id=tenant_id,
            name=fields.get("name") or "",
            cron=rule.cron,
            timezone=rule.timezone,
            interval_seconds=rule.interval_seconds,
            payload=payload,
            format=fmt,
            next_due_at=first_slot(rule, datetime.now(UTC)),
            catch_up=fields.get("catch_up") or "skip",
            max_catch_up=fields.get("max_catch_up") or 10,
            enabled=fields.get("enabled", True),
        )


def update_schedule(
    pool: ConnectionPool[Conn], *, tenant_id: str, schedule_id: UUID, patch: dict[str, Any]
) -> Row | None:
    """Apply a partial update; None if the tenant has no such schedule.

    Changing the rule moves the cursor to the rule's first slot after now. Pausing keeps the
    cursor where it is, so resuming catches up on the missed slots by the schedule's policy.
    """
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
            "enabled": row["enabled"],
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
        rule = Rule(merged["cron"], merged["timezone"], merged["interval_seconds"]).validate()
        payload, fmt = _payload(merged)
        rule_changed = Rule.of(row) != rule
        return schedule_store.schedule_update(
            conn,
            schedule_id=schedule_id,
            tenant_id=tenant_id,
            name=merged["name"],
            cron=rule.cron,
            timezone=rule.timezone,
            interval_seconds=rule.interval_seconds,
            payload=payload,
            format=fmt,
            next_due_at=first_slot(rule, datetime.now(UTC)) if rule_changed else row["next_due_at"],
            catch_up=merged["catch_up"],
            max_catch_up=merged["max_catch_up"],
            enabled=merged["enabled"],
        )
