"""The schedule tick: due slots become jobs, one job per slot.

The durable cursor ``next_due_at`` is the next slot not yet handled. A tick (run by a worker,
emitted by beat) locks each due schedule in its own short transaction and, for the due slots
up to a bounded batch, records the slot (unique on schedule id + instant), creates the job
through the same admission and outbox path as the API, and moves the cursor on. Duplicate
ticks, two beats, redelivered old ticks or concurrent workers therefore never create two
jobs for one slot (docs/architecture.md INV-12 one-job-per-slot). When admission refuses,
the cursor stays on that slot and the refusal is recorded; a later tick retries it. The
slots a tick runs are planned by :func:`exportcore.schedules.rules.plan_slots`; while an
earlier export of the schedule is still queued or running, its overlap policy decides
instead (:func:`exportcore.schedules.rules.plan_overlap`: ``skip``, ``buffer_one``;
``allow_all`` does not ask; ``cancel_other`` cancels the earlier scheduled export through
the ordinary cancel statement, :func:`exportcore.cancel.cancel_in_transaction`, and runs the
slot). A schedule's slot is due ``jitter_offset`` seconds after its instant (its jitter);
the slot is still recorded at its instant.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from exportcore import metrics, telemetry
from exportcore.admission import AdmissionRefused, CapacityExceeded, QuotaExceeded
from exportcore.audit import Actor
from exportcore.cancel import cancel_in_transaction
from exportcore.db import Conn, Row, transaction
from exportcore.domain import (
    ExportError,
    ExportFormat,
    ExportRequest,
    InvalidSelection,
    Labels,
    UnknownNotes,
    UnusableBase,
    new_id,
)
from exportcore.retry import full_jitter
from exportcore.schedules.rules import Rule, plan_overlap, plan_slots
from exportcore.settings import Settings
from exportcore.store import schedules as schedule_store
from exportcore.submit import SelectionChanged, Submitted, counted, submit_in_transaction

log = logging.getLogger(__name__)


@dataclass
class TickCounts:
    """What a tick did, summed over schedules."""

    schedules: int = 0
    created: int = 0
    skipped: int = 0
    overlap: int = 0
    held: int = 0
    refused: int = 0
    invalid: int = 0
    paused: int = 0
    cancelled: int = 0
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
        for outcome in ("created", "skipped", "overlap", "refused", "invalid"):
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
            # a slot fires jitter_offset seconds after its instant: it is due when its instant
            # is at most now - offset (the slot keeps its instant: its identity)
            fire_now = now - timedelta(seconds=int(row["jitter_offset"]))
            if row["overlap"] in ("skip", "buffer_one"):
                active = schedule_store.schedule_active_job(
                    conn, schedule_id=schedule_id, window_seconds=self.overlap_window_seconds
                )
                if active is not None:
                    return self._overlap(conn, row, active, fire_now, state)
            plan = plan_slots(
                Rule.of(row),
                row["next_due_at"],
                fire_now,
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
                    reason="catch_up",
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
            if row["overlap"] == "cancel_other":
                self._cancel_superseded(conn, row, slot, state)
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

    @property
    def overlap_window_seconds(self) -> float:
        """How far back the overlap check looks for an export still active: twice
        ``JOB_DEADLINE_SECONDS`` (an export cannot outlive its deadline: the
        recovery-scanner fails it; the margin covers a scanner that is behind and a deadline
        lowered since)."""
        return 2.0 * self.settings.job_deadline_seconds

    def _cancel_superseded(self, conn: Conn, row: Row, slot: datetime, state: _TickState) -> None:
        """``overlap: cancel_other``: before ``slot`` runs, cancel the exports of the
        schedule's earlier slots still queued or running (not manual runs or backfills:
        explicit requests), through the ordinary cancel statement in this slot's transaction
        (a queued one is cancelled now, a running one stops at its next chunk boundary),
        audited as ``cancel`` by the schedule, ``requested_by: schedule`` on their history.
        The cancel stands even when admission then refuses the slot: the slot backs off and
        runs on a later tick, and the superseded export is not left running meanwhile."""
        active = schedule_store.schedule_active_slot_jobs(
            conn,
            schedule_id=row["id"],
            window_seconds=self.overlap_window_seconds,
            limit=self.settings.schedule_slots_per_tick,
        )
        if not active:
            return
        changed = cancel_in_transaction(
            conn,
            tenant_id=row["tenant_id"],
            job_ids=[a["id"] for a in active],
            actor=Actor(kind="system", name=f"schedule {row['id']}"),
            detail={
                "requested_by": "schedule",
                "schedule_id": str(row["id"]),
                "superseded_by_slot": slot.isoformat(),
            },
        )
        state.counts.cancelled += len(changed)
        metrics.SCHEDULE_SUPERSEDED.inc(len(changed))
        if changed:
            log.info(
                "scheduled exports cancelled: a newer slot supersedes them",
                extra={
                    "schedule_id": str(row["id"]),
                    "tenant_id": row["tenant_id"],
                    "slot": slot.isoformat(),
                    "job_ids": [str(j["id"]) for j in changed],
                },
            )

    def _overlap(
        self, conn: Conn, row: Row, active: Row, fire_now: datetime, state: _TickState
    ) -> bool | None:
        """An earlier export of the schedule is still queued or running: skip the due slots
        (``skip``), or all but the latest, which waits (``buffer_one``), each recorded
        ``skipped`` with reason ``overlap``; due means at most ``fire_now`` (the tick's now
        less the jitter offset). False when something was written (nothing more is due this
        tick), None when the schedule only keeps waiting (nothing written)."""
        plan = plan_overlap(Rule.of(row), row["next_due_at"], fire_now, row["overlap"])
        detail = (
            f"overlap ({row['overlap']}): the export {active['id']} of the slot "
            f"{active['scheduled_at'].isoformat()} was still {active['status']}"
        )
        for slot in plan.skipped:
            schedule_store.slot_claim(
                conn,
                schedule_id=row["id"],
                scheduled_at=slot,
                outcome="skipped",
                reason="overlap",
                detail=detail,
            )
        state.counts.overlap += plan.skipped_total
        state.counts.held += plan.held is not None
        moved = plan.cursor != row["next_due_at"]
        if moved:
            schedule_store.schedule_advance(conn, schedule_id=row["id"], next_due_at=plan.cursor)
        if plan.skipped_total:
            log.info(
                "scheduled slots skipped: an earlier export is still active",
                extra={
                    "schedule_id": str(row["id"]),
                    "tenant_id": row["tenant_id"],
                    "overlap": row["overlap"],
                    "skipped": plan.skipped_total,
                    "active_job_id": str(active["id"]),
                    "held": plan.held.isoformat() if plan.held else None,
                },
            )
        return False if (moved or plan.skipped_total) else None

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
                submit_slot(
                    conn,
                    self.settings,
                    schedule,
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


def slot_request(schedule: Row, conn: Conn | None = None) -> ExportRequest:
    """The export a slot of ``schedule`` (a schedule row) creates: its format and its saved
    selection, with its metadata and tags (every export of a schedule inherits them). An
    incremental schedule (``full_every`` N > 1, every note) is read on
    ``conn``: a full export at its first slot and after every N - 1 deltas, else a delta
    since its latest succeeded export (docs/schedules.md "Incremental schedules")."""
    selection = schedule["payload"]["selection"]
    fmt = ExportFormat(schedule["format"])
    labels = Labels.from_payload(schedule["payload"])
    full = ExportRequest.build(
        fmt, selection.get("note_ids"), bool(selection.get("all")), labels=labels
    )
    every = int(schedule["payload"].get("full_every") or 1)
    if conn is None or every <= 1 or full.note_ids is not None:
        return full
    chain = schedule_store.schedule_recent_succeeded(conn, schedule_id=schedule["id"], limit=every)
    if not chain or chain[0]["format"] != fmt.value:
        return full
    deltas = 0
    for row in chain:
        if row["base_job_id"] is None:
            break
        deltas += 1
    else:
        return full  # no full export among the last N: the chain starts again
    if deltas >= every - 1:
        return full
    return ExportRequest.build(fmt, None, True, since=chain[0]["id"], labels=labels)


def submit_slot(
    conn: Conn,
    settings: Settings,
    schedule: Row,
    *,
    job_id: UUID,
    event_detail: dict[str, Any],
) -> Submitted:
    """Submit a slot's export (:func:`slot_request`) in the caller's transaction; a delta
    whose base can no longer serve (pruned, another format) becomes a full export."""
    request = slot_request(schedule, conn)
    full = ExportRequest.build(request.format, None, True, labels=request.labels)
    for attempt in (request, full) if request.since is not None else (request,):
        try:
            return submit_in_transaction(
                conn,
                settings,
                tenant_id=schedule["tenant_id"],
                request=attempt,
                source="schedule",
                job_id=job_id,
                event_detail=event_detail,
            )
        except UnusableBase:
            if attempt is full:
                raise
    raise AssertionError("unreachable: only a delta is refused for its base")
