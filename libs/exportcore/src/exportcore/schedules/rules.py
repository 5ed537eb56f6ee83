"""When a schedule fires, and which of its due slots a tick runs. Pure logic, no I/O.

A schedule fires at *slots*: instants in UTC. A cron rule is evaluated in the schedule's own
IANA time zone by cronsim (a well-kept evaluator that follows Debian cron across daylight
saving changes); an interval rule fires every ``interval_seconds`` after the previous slot.
What a wall-clock time means on a day when clocks change, for a daily ``30 2 * * *`` in
Europe/Berlin:

- spring forward (02:00 → 03:00): 02:30 never happens; the run is at 03:00 local, right
  after the gap, once;
- fall back (03:00 → 02:00): 02:30 happens twice; the run is at the first 02:30 (summer
  time), once. An hourly rule runs in both real hours.

Catch-up after downtime (or a pause): ``skip`` runs only the latest missed slot; ``all``
runs every missed slot, at most ``max_catch_up`` of them (the most recent); older missed
slots are recorded as ``skipped`` (reason ``catch_up``).

Overlap, while an earlier export of the schedule is still queued or running (the policies of
Temporal's schedules): ``skip`` records every due slot
as ``skipped`` (reason ``overlap``) and moves on; ``buffer_one`` keeps the latest due slot
waiting (the cursor stays on it) and records the older ones as skipped; ``allow_all`` runs
every slot whatever runs; ``cancel_other`` cancels the earlier export (the ordinary cancel
path) and runs the slot. ``catch_up: all`` runs missed slots side by side, so it needs
``allow_all`` (:func:`check_policies`).

Jitter: a schedule fires each slot ``jitter_offset`` seconds after its instant, a fixed
offset per schedule within its ``jitter`` bound (derived in PostgreSQL from a hash of the
schedule's id, migration 0026), so schedules of the same rule (every ``@daily``) do not all
fire at the same second. The slot keeps its unjittered instant as its identity: only when
it fires moves (:func:`preview` shows both).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from exportcore.db import Row
from exportcore.domain import ExportError

MAX_SLOT_SCAN = 1_000_000  # slots enumerated per catch-up at most (a minutely rule ≈ 2 years)
SKIPPED_RECORDED = 100  # skipped slots recorded individually per catch-up, most recent first


OVERLAP_POLICIES = ("skip", "buffer_one", "allow_all", "cancel_other")
"""What a slot does while an earlier export of its schedule is still queued or running."""

MAX_JITTER_SECONDS = 3600
"""The largest ``jitter`` bound a schedule may have (an hour; the database checks it too)."""

MAX_BACKFILL_SLOTS = 100
"""The most slots one backfill request may cover; a wider range is a 422 (split it)."""


class InvalidSchedule(ExportError):
    """A schedule that cannot fire: a bad cron expression, an unknown time zone, both or
    neither of cron and interval, slots closer than the minimum interval."""

    code = "invalid_schedule"
    title = "Invalid schedule"
    kind = "invalid"


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


_CRON_FIELDS = {
    "minute": ("minute", "0-59"),
    "hour": ("hour", "0-23"),
    "day-of-month": ("day of month", "1-31, a day the months given have"),
    "month": ("month", "1-12 or jan-dec"),
    "day-of-week": ("day of week", "0-7 or sun-sat"),
}
"""cronsim's field names: the words and the values of each field (crontab(5))."""


def _cron_problem(exc: CronSimError) -> str:
    """cronsim's reason (``Bad minute``, ``Bad day-of-month``) as words that name the field
    and what it takes; any other reason as cronsim says it."""
    text = str(exc).strip()
    field = text.removeprefix("Bad ").strip()
    if text.startswith("Bad ") and field in _CRON_FIELDS:
        words, values = _CRON_FIELDS[field]
        return f"the {words} field is not valid (it takes {values})"
    return text[:1].lower() + text[1:]


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
        # the expression first: a bad one is reported as such, whatever the zone (a cron
        # without a timezone used to be told only of the missing zone)
        expression = expand_cron(str(self.cron))
        if len(expression.split()) != 5:
            # cronsim would also take a seconds field, which Debian cron does not have
            raise InvalidSchedule(
                f"invalid cron expression {self.cron!r}: give 5 fields (minute hour day month "
                "weekday) or a nickname such as @daily"
            )
        try:
            CronSim(expression, datetime(2026, 1, 1, tzinfo=UTC))
        except CronSimError as exc:
            raise InvalidSchedule(
                f"invalid cron expression {self.cron!r}: {_cron_problem(exc)}"
            ) from None
        if not self.timezone:
            raise InvalidSchedule("a cron schedule needs an IANA timezone, e.g. Europe/Berlin")
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise InvalidSchedule(f"unknown time zone {self.timezone!r}") from None
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


def check_jitter(jitter: object) -> int:
    """``jitter`` as a number of seconds, or ``InvalidSchedule`` when it is not a whole
    number from 0 to :data:`MAX_JITTER_SECONDS`."""
    if not isinstance(jitter, int) or isinstance(jitter, bool):
        raise InvalidSchedule("jitter is a whole number of seconds")
    if not 0 <= jitter <= MAX_JITTER_SECONDS:
        raise InvalidSchedule(f"jitter must be from 0 to {MAX_JITTER_SECONDS} seconds")
    return jitter


def backfill_slots(rule: Rule, start: datetime, end: datetime, anchor: datetime) -> list[datetime]:
    """The rule's slots ``start <= s <= end`` (aware instants), in order, in UTC; at most
    :data:`MAX_BACKFILL_SLOTS`. An interval rule's slots keep the phase of ``anchor`` (the
    schedule's cursor): they are anchor + k * interval, before or after it. Raises
    ``InvalidSchedule`` for a reversed range and for one with more slots than that (saying
    where to split it)."""
    if end < start:
        raise InvalidSchedule("the backfill range ends before it starts: give from <= to")
    out: list[datetime] = []
    if rule.interval_seconds is not None:
        step = timedelta(seconds=rule.interval_seconds)
        slot = (anchor + step * -((anchor - start) // step)).astimezone(UTC)
    else:
        slot = rule.next_after(start - timedelta(microseconds=1))
    while slot <= end:
        if len(out) == MAX_BACKFILL_SLOTS:
            raise InvalidSchedule(
                f"the range holds more than {MAX_BACKFILL_SLOTS} slots of the schedule; a "
                f"backfill covers at most {MAX_BACKFILL_SLOTS}: end this one at "
                f"{out[-1].isoformat()} and start the next at {slot.isoformat()}"
            )
        out.append(slot)
        slot = rule.next_after(slot)
    return out


def check_policies(catch_up: str, overlap: str) -> None:
    """Raise ``InvalidSchedule`` for policies that contradict each other: ``catch_up: all``
    runs every missed slot at once, which only ``overlap: allow_all`` lets happen (under
    ``skip`` or ``buffer_one`` all but one would be skipped for overlap, under
    ``cancel_other`` cancelled)."""
    if overlap not in OVERLAP_POLICIES:
        raise InvalidSchedule(f"overlap must be one of {', '.join(OVERLAP_POLICIES)}")
    if catch_up == "all" and overlap != "allow_all":
        raise InvalidSchedule(
            "catch_up all runs every missed slot, several at once: it needs overlap "
            "allow_all (with overlap skip, buffer_one or cancel_other, use catch_up skip)"
        )


@dataclass
class OverlapPlan:
    """What a tick does for a schedule whose earlier export is still active: record
    ``skipped`` (``skipped_total`` in all, reason ``overlap``), move the cursor to ``cursor``;
    ``held`` is the slot that waits (``buffer_one``), else None."""

    skipped: list[datetime]
    skipped_total: int
    cursor: datetime
    held: datetime | None


def plan_overlap(rule: Rule, cursor: datetime, now: datetime, policy: str) -> OverlapPlan:
    """The due slots ``cursor <= s <= now`` of a schedule whose earlier export still runs,
    under the overlap ``policy`` (``skip`` or ``buffer_one``; ``allow_all`` never asks).

    ``skip``: every due slot is skipped, the cursor goes past the latest. ``buffer_one``: the
    latest due slot is held (the cursor stays on it, so it runs as soon as the earlier export
    ended), the older ones are skipped. Nothing due: nothing skipped, the cursor stays.
    At most ``SKIPPED_RECORDED`` skipped slots are listed (``skipped_total`` counts all).
    """
    latest = plan_slots(rule, cursor, now, catch_up="skip", max_catch_up=1, batch=1)
    if not latest.run:
        return OverlapPlan([], 0, cursor, None)
    last = latest.run[0]
    if policy == "buffer_one":
        return OverlapPlan(latest.skipped, latest.skipped_total, last, last)
    assert latest.cursor is not None
    return OverlapPlan([*latest.skipped, last], latest.skipped_total + 1, latest.cursor, None)


def first_slot(rule: Rule, after: datetime) -> datetime:
    """The first slot strictly after ``after`` (a new schedule's cursor)."""
    return rule.next_after(after)


@dataclass(frozen=True)
class PreviewSlot:
    """One upcoming slot: the instant in UTC and the same instant in the rule's zone (the
    slot's identity), and when it fires: ``fires_at`` = the instant + the schedule's jitter
    offset, in UTC and in the zone (the same as ``at`` / ``local`` without jitter)."""

    at: datetime
    local: datetime
    fires_at: datetime
    fires_local: datetime


def preview(
    rule: Rule,
    count: int,
    *,
    now: datetime | None = None,
    cursor: datetime | None = None,
    jitter_offset: int = 0,
) -> list[PreviewSlot]:
    """The next ``count`` slots of ``rule`` that fire after ``now`` (default: the clock),
    each also in the rule's own zone (UTC for an interval rule), and when each fires:
    ``jitter_offset`` seconds (the schedule's ``jitter_offset``) after it. With ``cursor`` (a
    saved schedule's ``next_due_at``), an interval rule keeps its phase: its slots are
    cursor + k * interval. Slots already due (a catch-up in progress) are not listed:
    ``next_due_at`` shows them.
    """
    delay = timedelta(seconds=jitter_offset)
    now = (now or datetime.now(UTC)) - delay  # a slot fires after now when s + delay > now
    zone = ZoneInfo(rule.timezone) if rule.timezone else UTC
    if cursor is not None and rule.interval_seconds is not None:
        step = rule.interval_seconds
        ahead = 0 if cursor > now else int((now - cursor).total_seconds() // step) + 1
        first = cursor + timedelta(seconds=step * ahead)
        slots = [first + timedelta(seconds=step * i) for i in range(count)]
    else:
        slots = rule.upcoming(now, count)
    return [
        PreviewSlot(
            s.astimezone(UTC),
            s.astimezone(zone),
            (s + delay).astimezone(UTC),
            (s + delay).astimezone(zone),
        )
        for s in slots
    ]
