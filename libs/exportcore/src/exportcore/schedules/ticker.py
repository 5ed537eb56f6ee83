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
jobs for one slot (docs/architecture.md INV-12 one-job-per-slot). When admission refuses,
the cursor stays on that slot and the refusal is recorded; a later tick retries it.

Catch-up after downtime (or a pause): ``skip`` runs only the latest missed slot; ``all``
runs every missed slot, at most ``max_catch_up`` of them (the most recent); older missed
slots are recorded as ``skipped``.
"""

from __future__ import annotations

import itertools
import logging
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import psycopg
from cronsim import CronSim, CronSimError
from psycopg_pool import ConnectionPool, PoolTimeout

from exportcore import metrics, telemetry
from exportcore.admission import AdmissionRefused, CapacityExceeded, QuotaExceeded
from exportcore.db import Conn, Row, transaction
from exportcore.domain import (
    ExportError,
    ExportFormat,
    ExportRequest,
    InvalidSelection,
    UnknownNotes,
    new_id,
)
from exportcore.retry import full_jitter
from exportcore.settings import Settings, get_settings
from exportcore.store import notes as note_store
from exportcore.store import schedules as schedule_store
from exportcore.submit import (
    SelectionChanged,
    check_note_ids,
    counted,
    submit_in_transaction,
)

log = logging.getLogger(__name__)

MAX_SLOT_SCAN = 1_000_000  # slots enumerated per catch-up at most (a minutely rule ≈ 2 years)
SKIPPED_RECORDED = 100  # skipped slots recorded individually per catch-up, most recent first


class InvalidSchedule(ExportError):
    """A schedule that cannot fire: a bad cron expression, an unknown time zone, both or
    neither of cron and interval, slots closer than the minimum interval."""

    code = "invalid_schedule"
    title = "Invalid schedule"
    kind = "invalid"


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


# The nicknames of crontab(5) (Debian cron), which cronsim does not read itself. @reboot
# has no meaning for a schedule that lives in a database.
NICKNAMES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
GAP_CHECK_SLOTS = 500  # consecutive cron slots checked against the minimum interval


def expand_cron(expression: str) -> str:
    """The expression cronsim evaluates for ``expression``: a crontab(5) nickname
    (``@daily``…) expanded, anything else with its whitespace normalised. Raises
    ``InvalidSchedule`` for ``@reboot`` or an unknown nickname."""
    text = " ".join(expression.split())
    if text.startswith("@"):
        fields = NICKNAMES.get(text.lower())
        if fields is None:
            known = ", ".join(NICKNAMES)
            raise InvalidSchedule(f"unknown cron nickname {text!r}; known: {known}")
        return fields
    return text


@dataclass(frozen=True)
class Rule:
    """When a schedule fires: ``cron`` (5 fields or a nickname such as ``@daily``) in
    ``timezone``, or every ``interval_seconds``."""

    cron: str | None = None
    timezone: str | None = None
    interval_seconds: int | None = None

    def validate(self, min_interval_seconds: int = 1) -> Rule:
        """Return self, or raise ``InvalidSchedule`` saying what to fix. Slots must be at
        least ``min_interval_seconds`` apart (``SCHEDULE_MIN_INTERVAL_SECONDS``): the interval
        itself, or every gap between the next cron slots."""
        if (self.cron is None) == (self.interval_seconds is None):
            raise InvalidSchedule("give either cron (with timezone) or interval_seconds")
        if self.interval_seconds is not None:
            if self.timezone is not None:
                raise InvalidSchedule("timezone applies to cron schedules only")
            if self.interval_seconds < min_interval_seconds:
                raise InvalidSchedule(
                    f"interval_seconds must be at least {min_interval_seconds} "
                    "(SCHEDULE_MIN_INTERVAL_SECONDS)"
                )
            return self
        if not self.timezone:
            raise InvalidSchedule("a cron schedule needs an IANA timezone, e.g. Europe/Berlin")
        try:
            zone = ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise InvalidSchedule(f"unknown time zone {self.timezone!r}") from None
        expression = expand_cron(str(self.cron))
        if len(expression.split()) != 5:
            # cronsim would also take a seconds field, which Debian cron does not have
            raise InvalidSchedule(
                f"invalid cron expression {self.cron!r}: give 5 fields (minute hour day month "
                "weekday) or a nickname such as @daily"
            )
        try:
            CronSim(expression, datetime(2026, 1, 1, tzinfo=zone))
        except CronSimError as exc:
            raise InvalidSchedule(f"invalid cron expression {self.cron!r}: {exc}") from None
        gap = self.shortest_gap(datetime.now(UTC), GAP_CHECK_SLOTS)
        if gap is not None and gap < min_interval_seconds:
            raise InvalidSchedule(
                f"cron {self.cron!r} fires {gap:.0f} s apart; slots must be at least "
                f"{min_interval_seconds} s apart (SCHEDULE_MIN_INTERVAL_SECONDS)"
            )
        return self

    def shortest_gap(self, after: datetime, slots: int) -> float | None:
        """The shortest time in seconds between two consecutive slots among the next
        ``slots`` after ``after`` that fall within about a year (every pattern of a 5-field
        rule repeats within one), or None when fewer than two do."""
        horizon = after + timedelta(days=400)
        upcoming = [t for t in self.upcoming(after, slots) if t <= horizon]
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(upcoming)]
        return min(gaps) if gaps else None

    def next_after(self, instant: datetime) -> datetime:
        """The first slot strictly after ``instant`` (aware), in UTC."""
        if self.interval_seconds is not None:
            return (instant + timedelta(seconds=self.interval_seconds)).astimezone(UTC)
        zone = ZoneInfo(str(self.timezone))
        sim = CronSim(expand_cron(str(self.cron)), instant.astimezone(zone))
        return next(iter(sim)).astimezone(UTC)

    def upcoming(self, after: datetime, count: int) -> list[datetime]:
        """The next ``count`` slots strictly after ``after``, in UTC (fewer when a cron
        rule has no more, e.g. 30 February)."""
        out: list[datetime] = []
        if self.interval_seconds is not None:
            step = timedelta(seconds=self.interval_seconds)
            return [(after + step * (i + 1)).astimezone(UTC) for i in range(count)]
        zone = ZoneInfo(str(self.timezone))
        horizon = after + timedelta(days=3660)
        sim = iter(CronSim(expand_cron(str(self.cron)), after.astimezone(zone)))
        for _ in range(count):
            try:
                slot = next(sim).astimezone(UTC)
            except (StopIteration, CronSimError):
                break
            if slot > horizon:
                break
            out.append(slot)
        return out

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
    paused: int = 0
    errors: int = 0

    def as_dict(self) -> dict[str, int]:
        """Counts by name (for logs and metrics)."""
        return dict(self.__dict__)


@dataclass
class _TickState:
    """What one tick learnt along the way: tenants already refused for their quota (their
    other due schedules are refused without copying a snapshot), and whether global
    capacity refused (the rest of the tick waits for the next one)."""

    now: datetime
    counts: TickCounts
    refused_tenants: dict[str, dict[str, Any]] = field(default_factory=dict)
    capacity_full: bool = False
    headroom_checked: set[str] = field(default_factory=set)


class ScheduleTicker:
    """Advances every due schedule; safe to run from many workers at once.

    No tenant can hold up another's schedules: the batch is shared round-robin across
    tenants, a refused slot backs off (``retry_at``, full jitter up to
    ``SCHEDULE_RETRY_CAP_SECONDS``), a tenant at its quota is refused once per tick at the
    cost of one count, and a schedule whose selection became invalid is paused with the
    reason on its row.
    """

    def __init__(
        self,
        settings: Settings,
        pool: ConnectionPool[Conn],
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.clock = clock
        self.rng = rng or random.Random()

    def tick(self, now: datetime | None = None) -> TickCounts:
        """One pass over due schedules at ``now`` (default: the clock)."""
        now = now or self.clock()
        state = _TickState(now=now, counts=TickCounts())
        with telemetry.span(
            "exports.schedule_tick", attributes={"now": now.isoformat()}
        ) as current:
            with self.pool.connection() as conn:
                due = schedule_store.schedule_due_ids(
                    conn, now=now, limit=self.settings.schedule_batch_size
                )
            for row in due:
                if state.capacity_full:
                    break  # no slot can be admitted now; these stay due for the next tick
                try:
                    if self._advance(row["id"], state):
                        state.counts.schedules += 1
                except (psycopg.OperationalError, PoolTimeout):
                    raise  # the database is away: the whole tick waits for the next one
                except Exception as exc:
                    # one broken schedule must not hold up the others: it stays as it was
                    # (its transaction rolled back) and is tried again next tick
                    state.counts.errors += 1
                    log.error(
                        "schedule tick failed for one schedule",
                        extra={
                            "schedule_id": str(row["id"]),
                            "tenant_id": row["tenant_id"],
                            "error": type(exc).__name__,
                        },
                    )
            telemetry.set_attributes(current, state.counts.as_dict())
        counts = state.counts
        for outcome in ("created", "skipped", "refused", "invalid"):
            metrics.SCHEDULE_SLOTS.labels(outcome).inc(getattr(counts, outcome))
        if counts.schedules:
            log.info("schedules advanced", extra={"counts": counts.as_dict()})
        return counts

    def _advance(self, schedule_id: UUID, state: _TickState) -> bool:
        """Run the schedule's due slots, at most ``schedule_slots_per_tick``, each in a
        transaction of its own: a created job's admission takes the global admission lock
        (:func:`exportcore.admission.admit`), which must not be held across slots. False
        when the schedule was not due or another tick holds it."""
        advanced = False
        for _ in range(self.settings.schedule_slots_per_tick):
            step = self._advance_one(schedule_id, state)
            if step is None:
                break
            advanced = True
            if not step:
                break
        return advanced

    def _advance_one(self, schedule_id: UUID, state: _TickState) -> bool | None:
        """One transaction: lock the due schedule, record its skipped slots, run the next
        slot and move the cursor. None when it is not due (or locked by another tick); else
        whether a further slot may be due now (False after a refusal, a pause or when none
        ran)."""
        now, counts = state.now, state.counts
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
                    conn, schedule_id=schedule_id, next_due_at=plan.cursor
                )
                return False
            slot = plan.run[0]
            refusal = self._known_refusal(conn, row, state)
            outcome = refusal or self._run_slot(conn, row, slot, plan.cursor)
            if isinstance(outcome, dict):
                self._refuse(conn, row, slot, outcome, state)
                return False
            if outcome == "created":
                counts.created += 1
                return True
            if isinstance(outcome, ExportError):  # the selection became invalid
                counts.invalid += 1
                schedule_store.schedule_advance(
                    conn, schedule_id=schedule_id, next_due_at=plan.cursor
                )
                self._pause(conn, row, outcome, now)
                counts.paused += 1
                return False
            schedule_store.schedule_advance(conn, schedule_id=schedule_id, next_due_at=plan.cursor)
            return True

    def _known_refusal(self, conn: Conn, row: Row, state: _TickState) -> dict[str, Any] | None:
        """A refusal decided without copying a snapshot: the tenant was already refused for
        its quota in this tick, or (read once per tenant and tick) its active jobs already
        fill its quota. Admission still has the last word on every slot that is tried."""
        tenant = row["tenant_id"]
        if tenant in state.refused_tenants:
            return state.refused_tenants[tenant]
        if tenant in state.headroom_checked:
            return None
        state.headroom_checked.add(tenant)
        usage = schedule_store.schedule_tenant_headroom(
            conn, tenant_id=tenant, default_quota=self.settings.tenant_active_quota
        )
        if usage is None or usage["active"] < usage["quota"]:
            return None
        refusal = {
            "code": QuotaExceeded.code,
            "detail": f"tenant quota reached: {usage['active']} active jobs, quota "
            f"{usage['quota']}",
        }
        state.refused_tenants[tenant] = refusal
        return refusal

    def _refuse(
        self, conn: Conn, row: Row, slot: datetime, refusal: dict[str, Any], state: _TickState
    ) -> None:
        """Keep the cursor on ``slot`` and back the schedule off: no tick touches it before
        ``retry_at`` = now + full jitter of its refusals in a row (capped)."""
        refusals = int(row["refusals"]) + 1
        delay = full_jitter(
            refusals,
            base=self.settings.schedule_retry_base_seconds,
            cap=self.settings.schedule_retry_cap_seconds,
            rng=self.rng,
        )
        retry_at = state.now + timedelta(seconds=delay)
        record = {
            "code": refusal["code"],
            "detail": str(refusal["detail"])[:300],
            "slot": slot.isoformat(),
            "at": state.now.isoformat(),
            "refusals": refusals,
            "next_retry_at": retry_at.isoformat(),
        }
        schedule_store.schedule_refuse(
            conn, schedule_id=row["id"], retry_at=retry_at, last_refusal=record
        )
        state.counts.refused += 1
        if refusal["code"] == QuotaExceeded.code:
            state.refused_tenants.setdefault(row["tenant_id"], refusal)
        elif refusal["code"] == CapacityExceeded.code:
            state.capacity_full = True
        metrics.TENANT_REFUSALS.labels(
            self.settings.tenant_label(row["tenant_id"]), refusal["code"], "schedule"
        ).inc()
        log.info(
            "scheduled slot refused; backing off",
            extra={
                "schedule_id": str(row["id"]),
                "tenant_id": row["tenant_id"],
                "slot": slot.isoformat(),
                "code": refusal["code"],
                "refusals": refusals,
                "retry_at": retry_at.isoformat(),
            },
        )

    def _pause(self, conn: Conn, row: Row, exc: ExportError, now: datetime) -> None:
        """Pause a schedule whose selection can no longer be exported, with the reason on
        its row (``paused_reason`` = the error code, ``paused_detail``)."""
        detail = exc.detail
        unknown = exc.extra.get("unknown_note_ids")
        if unknown:
            shown = ", ".join(str(i) for i in unknown[:20])
            detail = f"{detail}: {shown}{' …' if len(unknown) > 20 else ''}"
        schedule_store.schedule_pause(
            conn, schedule_id=row["id"], reason=exc.code, detail=detail, now=now
        )
        metrics.SCHEDULE_PAUSES.labels(exc.code).inc()
        log.warning(
            "schedule paused: its selection cannot be exported",
            extra={"schedule_id": str(row["id"]), "tenant_id": row["tenant_id"], "code": exc.code},
        )

    def _run_slot(
        self, conn: Conn, schedule: Row, slot: datetime, cursor: datetime
    ) -> str | dict[str, Any] | ExportError | None:
        """Claim the slot, move the cursor to ``cursor`` and create the slot's job, in a
        savepoint whose last statement is the job's admission (the caller commits right
        after): ``created``; None if already handled; a refusal record (the savepoint is
        rolled back and the slot left for a later try); or the selection's error (the slot is
        recorded ``invalid``)."""
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
                    conn, schedule_id=schedule["id"], next_due_at=cursor
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
            return {"code": code, "detail": str(exc)}
        except (InvalidSelection, UnknownNotes) as exc:
            schedule_store.slot_claim(
                conn,
                schedule_id=schedule["id"],
                scheduled_at=slot,
                outcome="invalid",
                detail=f"{exc.code}: {exc.detail}",
            )
            return exc


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
# Fields that always have a value: an explicit null is refused (omit the field instead).
NOT_NULL = ("name", "all", "format", "catch_up", "max_catch_up", "enabled")


def reject_nulls(fields: dict[str, Any]) -> None:
    """Raise ``InvalidSchedule`` naming the first field of ``NOT_NULL`` given as null (the
    API's models refuse them first; this guards every other caller)."""
    for name in NOT_NULL:
        if name in fields and fields[name] is None:
            raise InvalidSchedule(f"{name} may not be null; omit it to keep its value")


def _payload(fields: dict[str, Any]) -> tuple[ExportRequest, dict[str, Any], str]:
    fmt = ExportFormat(fields.get("format") or "json")
    request = ExportRequest.build(fmt, fields.get("note_ids"), bool(fields.get("all")))
    return request, request.canonical(), fmt.value


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
) -> Row:
    """Create a tenant's schedule from API fields; its cursor is the first slot after now.

    Raises ``InvalidSchedule`` (bad rule, slots closer than
    ``SCHEDULE_MIN_INTERVAL_SECONDS``, a null field), ``InvalidSelection`` /
    ``UnknownNotes`` (the selection cannot be exported) or ``ScheduleLimitReached`` (the
    tenant has ``SCHEDULES_PER_TENANT_MAX`` schedules; concurrent creates are serialised
    per tenant, so the cap holds).
    """
    settings = settings or get_settings()
    reject_nulls(fields)
    rule = Rule(fields.get("cron"), fields.get("timezone"), fields.get("interval_seconds"))
    rule.validate(settings.schedule_min_interval_seconds)
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
            catch_up=fields.get("catch_up") or "skip",
            max_catch_up=fields.get("max_catch_up") or 10,
            enabled=enabled,
        )
    return row


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
) -> Row | None:
    """Apply a partial update; None if the tenant has no such schedule.

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
        return schedule_store.schedule_update(conn, **_update_values(row, merged))


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
) -> ManualRun:
    """Run a schedule once, now, through the same slot and admission path as its ticks.

    The run is a slot of trigger ``manual`` at the instant of the request, claimed in the
    transaction that writes its export: the slot key is (schedule id, trigger, instant), so
    it can never take or duplicate a scheduled slot, and the cursor, the backoff and the
    rule are left as they are (a paused schedule can be run by hand too). Raises
    ``ScheduleNotFound``, ``InvalidSelection`` / ``UnknownNotes`` for a selection that cannot
    be exported, ``CapacityExceeded`` / ``QuotaExceeded`` when admission refuses (nothing is
    written then).
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
                submitted = submit_in_transaction(
                    conn,
                    settings,
                    tenant_id=tenant_id,
                    request=_request_of(row),
                    source="schedule",
                    job_id=job_id,
                    event_detail={
                        "schedule_id": str(schedule_id),
                        "scheduled_at": instant.isoformat(),
                        "trigger": "manual",
                    },
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
class PreviewSlot:
    """One upcoming slot: the instant in UTC and the same instant in the rule's zone."""

    at: datetime
    local: datetime


def preview(
    rule: Rule, count: int, *, now: datetime | None = None, cursor: datetime | None = None
) -> list[PreviewSlot]:
    """The next ``count`` slots of ``rule`` after ``now`` (default: the clock), each also in
    the rule's own zone (UTC for an interval rule). With ``cursor`` (a saved schedule's
    ``next_due_at``), an interval rule keeps its phase: its slots are cursor + k * interval.
    Slots already due (a catch-up in progress) are not listed: ``next_due_at`` shows them.
    """
    now = now or datetime.now(UTC)
    zone = ZoneInfo(rule.timezone) if rule.timezone else UTC
    if cursor is not None and rule.interval_seconds is not None:
        step = rule.interval_seconds
        ahead = 0 if cursor > now else int((now - cursor).total_seconds() // step) + 1
        first = cursor + timedelta(seconds=step * ahead)
        slots = [first + timedelta(seconds=step * i) for i in range(count)]
    else:
        slots = rule.upcoming(now, count)
    return [PreviewSlot(s.astimezone(UTC), s.astimezone(zone)) for s in slots]
