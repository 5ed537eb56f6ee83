"""Bulk actions by filter: cancel, or replay, every job a filter matches (docs/console.md,
"Bulk actions"; docs/operations.md).

A bulk action is asked for in three steps, and runs as a durable record (``bulk_actions``,
migration 0015):

1. :func:`preview` counts the targets at an instant ``as_of``: the active jobs (no cancel
   requested yet) a cancel would act on, or the open dead letters a replay would act on. The
   console and the CLI show that count and the confirmation names it.
2. :func:`start`, with the count the operator confirmed and a request id, writes the run and
   its one audit row (``bulk_cancel`` / ``bulk_replay``, :mod:`exportcore.audit`) in one
   transaction. The same request id posted again finds the same run: starting is idempotent.
3. The recovery-scanner's bulk runner (:class:`exportcore.bulk_runner.BulkRunner`, woken by
   the NOTIFY ``bulk_actions`` the start sends at COMMIT) claims the run with a lease
   (:func:`run_claimed`; :func:`run` claims one run by id) and acts in keyset batches,
   each batch in one transaction together with the run's progress (cursor, counters,
   renewed lease) and its audit row's count. It never acts on a target that matched only
   after ``as_of`` (which may not lie after the start's own instant: :func:`start` refuses
   a future one), nor on more than the confirmed count. A runner that dies leaves a run
   whose lease expires; a runner's next claim then resumes it where the last committed
   batch ended. No run lives in the api process: an api restart loses none.

Targets are acted on through the same guarded statements as single actions: a cancel
through ``job_request_cancel_many`` (a cancel already requested, or a finished job, matches
nothing), a batch of replays through ``job_replay_many``: one statement that locks the
failed jobs in id order (as a single replay, :func:`exportcore.replays.replay_in`, locks its
one job), moves each dead letter that is still ``open`` to ``replayed`` and writes the
replays with their snapshots, outbox events and history; the unique index of active replays
is the durable guard behind. So a bulk action racing single ones, or another bulk action,
acts on each job once, and running the same filter again acts only on what is still left.
The new replays go through the outbox and the publisher's fair claim like any export
(docs/architecture.md INV-16 fair-dispatch: a flood of one tenant's replays never starves
another's exports). A batch passes admission control last, per tenant and all its new jobs
at once (``exports_admit_many``), so the admission counters' locks are held for the
shortest time; when admission refuses, the batch rolls back and is redone one target per
transaction (the single replay's path) up to the refusal, where the run stops
(``stopped``, with the refusal): what was admitted before it is replayed, the refused dead
letter and the rest stay open, and nothing is lost.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal
from uuid import UUID, uuid4

import psycopg
from psycopg_pool import ConnectionPool

from exportcore import audit, faults, telemetry
from exportcore.admission import AdmissionRefused, admit_many
from exportcore.audit import Actor, as_actor
from exportcore.db import Conn, Row, transaction
from exportcore.domain import (
    QUEUES,
    ExportError,
    JobNotFound,
    JobStateConflict,
    labels_filter,
    new_id,
)
from exportcore.replays import Replayed, replay_in
from exportcore.settings import Settings
from exportcore.store import bulk_actions as bulk_store
from exportcore.store import dead_letters as dl_store
from exportcore.store import jobs as job_store

log = logging.getLogger(__name__)

Kind = Literal["cancel", "replay"]
KINDS: tuple[Kind, ...] = ("cancel", "replay")
BATCH_SIZE = 100
"""Targets per batch (one transaction each)."""
LEASE_SECONDS = 60.0
"""How long a runner owns a run without finishing a batch; then another may resume it."""


class BulkNotFound(ExportError):
    """No bulk action with this id."""

    code = "bulk_action_not_found"
    title = "Bulk action not found"
    kind = "not_found"


class InvalidBulkAction(ExportError):
    """A filter or a confirmation a bulk action cannot take."""

    code = "invalid_bulk_action"
    title = "Invalid bulk action"
    kind = "invalid"


class BulkAsOfInFuture(InvalidBulkAction):
    """A start whose ``as_of`` lies after the database's now: it would reach targets that
    matched only after the preview (a preview's ``as_of`` is the database's now when it
    counted, so a start from a preview never has one)."""

    code = "bulk_as_of_in_future"
    title = "Invalid bulk action"


class _LeaseLost(Exception):
    """The run's lease is another runner's now: roll the batch back and stop."""


@dataclass(frozen=True)
class BulkFilter:
    """What a bulk action acts on (each field optional, like the console's jobs filters):
    the job's ``status`` (a cancel: ``queued`` or ``running``; a replay: ``failed``),
    ``queue``, ``tenant_id``, ``reason`` (the error code, a replay's dead-letter reason),
    a created-time range (``created_from`` inclusive, ``created_to`` exclusive), and the
    ``tags`` and ``metadata`` pairs the job must all carry (docs/api.md "Metadata and
    tags"; sorted tuples, so that a filter is a value)."""

    status: str | None = None
    queue: str | None = None
    tenant_id: str | None = None
    reason: str | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None
    tags: tuple[str, ...] = ()
    metadata: tuple[tuple[str, str], ...] = ()

    def check(self, kind: str) -> None:
        """Raise :class:`InvalidBulkAction` unless this filter fits a bulk ``kind``."""
        if kind not in KINDS:
            raise InvalidBulkAction(f"a bulk action is one of {', '.join(KINDS)}, not {kind!r}")
        allowed = ("queued", "running") if kind == "cancel" else ("failed",)
        if self.status is not None and self.status not in allowed:
            raise InvalidBulkAction(
                f"a bulk {kind} acts on {' or '.join(allowed)} jobs, not {self.status!r} ones"
            )
        if kind == "cancel" and self.reason is not None:
            raise InvalidBulkAction("a bulk cancel acts on active jobs, which have no reason")
        if self.queue is not None and self.queue not in QUEUES:
            raise InvalidBulkAction(f"unknown queue {self.queue!r}; one of {', '.join(QUEUES)}")
        if self.created_from and self.created_to and self.created_from >= self.created_to:
            raise InvalidBulkAction("the created-time range is empty (from is not before to)")
        labels_filter(dict(self.metadata), list(self.tags))  # raises InvalidLabels

    def as_json(self) -> dict[str, Any]:
        """The filter as stored and audited (set fields only, instants in ISO 8601)."""
        out: dict[str, Any] = {}
        for key, value in self._values().items():
            if value:
                out[key] = value.isoformat() if isinstance(value, datetime) else value
        return out

    def _values(self) -> dict[str, Any]:
        """The filter as the store takes it (``tags`` a list, ``metadata`` an object)."""
        values = {k: getattr(self, k) for k in bulk_store.FILTER_KEYS}
        values.update(tags=list(self.tags), metadata=dict(self.metadata))
        return values

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BulkFilter:
        """The filter of :meth:`as_json`."""
        values: dict[str, Any] = {k: data.get(k) for k in bulk_store.FILTER_KEYS}
        for key in ("created_from", "created_to"):
            if isinstance(values[key], str):
                values[key] = datetime.fromisoformat(values[key])
        values["tags"] = tuple(sorted(values["tags"] or ()))
        values["metadata"] = tuple(sorted((values["metadata"] or {}).items()))
        return cls(**values)

    def describe(self) -> str:
        """The filter in words, for confirmations and the audit page."""
        parts = [
            f"{label} {value}"
            for label, value in (
                ("status", self.status),
                ("queue", self.queue),
                ("tenant", self.tenant_id),
                ("reason", self.reason),
                ("created from", self.created_from and self.created_from.isoformat()),
                ("created before", self.created_to and self.created_to.isoformat()),
                ("tags", ", ".join(self.tags)),
                ("metadata", ", ".join(f"{k}={v}" for k, v in self.metadata)),
            )
            if value
        ]
        return ", ".join(parts) if parts else "every job"


@dataclass(frozen=True)
class Preview:
    """The count a bulk ``kind`` of ``filter`` matches at ``as_of`` (what a confirmation
    names)."""

    kind: Kind
    filter: BulkFilter
    as_of: datetime
    count: int


def preview(
    pool: ConnectionPool[Conn], kind: str, filt: BulkFilter, *, now: datetime | None = None
) -> Preview:
    """Count the targets of a bulk ``kind`` of ``filt`` now (or at ``now``). Raises
    :class:`InvalidBulkAction` for a filter that does not fit the kind."""
    filt.check(kind)
    as_of = now or _db_now(pool)
    with pool.connection() as conn:
        count = bulk_store.bulk_action_count(conn, kind=kind, filters=_params(filt), as_of=as_of)
    return Preview(kind=kind, filter=filt, as_of=as_of, count=count)  # type: ignore[arg-type]


def _db_now(pool: ConnectionPool[Conn]) -> datetime:
    with pool.connection() as conn:
        row = conn.execute("SELECT now() AS now").fetchone()
    assert row is not None
    return row["now"]  # type: ignore[no-any-return]


def _params(filt: BulkFilter) -> dict[str, Any]:
    return filt._values()


def start(
    pool: ConnectionPool[Conn],
    actor: Actor,
    kind: str,
    filt: BulkFilter,
    *,
    as_of: datetime,
    confirmed: int,
    request_id: UUID,
    lease_token: UUID | None = None,
    lease_seconds: float = LEASE_SECONDS,
) -> tuple[Row, bool]:
    """Write a run of a bulk ``kind`` of ``filt`` over at most ``confirmed`` targets that
    matched at ``as_of`` (the preview's instant), audited in the same transaction; returns
    ``(the run, True)``. The same ``request_id`` again returns ``(that run, False)``, and
    writes nothing. Without ``lease_token`` the run is left to the bulk runner (NOTIFY
    ``bulk_actions`` at COMMIT); with one it is leased to the caller for ``lease_seconds``
    (who runs it with :func:`run`, ``token=lease_token``). Raises
    :class:`BulkAsOfInFuture` for an ``as_of`` after the database's now (the start acts
    only on what the preview saw), :class:`InvalidBulkAction` for the rest."""
    filt.check(kind)
    if confirmed < 0:
        raise InvalidBulkAction("the confirmed count is a number of targets (0 or more)")
    with pool.connection() as conn:
        existing = bulk_store.bulk_action_get_by_request(conn, request_id=request_id)
    if existing is not None:
        return existing, False
    with transaction(pool) as conn:
        when = bulk_store.bulk_action_as_of_future(conn, as_of=as_of)
        if when is not None and when["future"]:
            raise BulkAsOfInFuture(
                f"as_of {as_of.isoformat()} is later than now ({when['now'].isoformat()}): "
                "start with the as_of of a preview, which is never in the future",
                errors=[
                    {
                        "loc": ["body", "as_of"],
                        "msg": "as_of lies in the future; use the preview's as_of",
                        "type": "as_of_in_future",
                    }
                ],
            )
        entry = audit.record(
            conn,
            actor,
            f"bulk_{kind}",
            target_kind="filter",
            target_id=filt.describe()[:200],
            tenant_id=filt.tenant_id,
            filter=filt.as_json(),
            count=0,
            outcome="running",
            detail={"confirmed": confirmed, "as_of": as_of.isoformat()},
        )
        run_row = bulk_store.bulk_action_insert(
            conn,
            request_id=request_id,
            kind=kind,
            filters=filt.as_json(),
            as_of=as_of,
            confirmed=confirmed,
            audit_id=entry["id"],
            actor=actor.name,
            lease_token=lease_token,
            lease_seconds=lease_seconds,
        )
        if run_row is not None:
            audit.advance(
                conn, entry["id"], count=0, outcome="running", detail={"bulk_id": run_row["id"]}
            )
    if run_row is None:  # the same request, posted at the same time: the other one won
        with pool.connection() as conn:
            existing = bulk_store.bulk_action_get_by_request(conn, request_id=request_id)
        assert existing is not None
        return existing, False
    log.info(
        "bulk action started",
        extra={"bulk_id": run_row["id"], "kind": kind, "confirmed": confirmed},
    )
    return get(pool, run_row["id"]), True


def get(pool: ConnectionPool[Conn], bulk_id: int) -> Row:
    """The run with its progress and ``interrupted`` (its runner went silent). Raises
    :class:`BulkNotFound`."""
    with pool.connection() as conn:
        row = bulk_store.bulk_action_get(conn, bulk_id=bulk_id)
    if row is None:
        raise BulkNotFound(f"no bulk action {bulk_id}")
    return row


ItemHook = Callable[[str, Row, Replayed | None, Exception | None], None]
"""Called for each target a run handled: ``(outcome, target row, the replay or None, the
error or None)``; outcome is ``acted``, ``existing``, ``skipped`` or ``refused``."""


def run(
    pool: ConnectionPool[Conn],
    settings: Settings,
    bulk_id: int,
    *,
    batch_size: int = BATCH_SIZE,
    lease_seconds: float = LEASE_SECONDS,
    on_item: ItemHook | None = None,
    token: UUID | None = None,
) -> Row:
    """Run (or resume) bulk action ``bulk_id`` to its end in the caller's thread; returns
    the run as it ended. Without ``token`` it claims the run first: a run another runner
    holds (valid lease), or one that ended, is left as it is and returned. With ``token``
    (the lease :func:`start` wrote) it runs on under that lease. Safe to call from several
    processes at once."""
    if token is None:
        token = uuid4()
        with pool.connection() as conn:
            claimed = bulk_store.bulk_action_claim(
                conn, bulk_id=bulk_id, lease_token=token, lease_seconds=lease_seconds
            )
    else:
        claimed = get(pool, bulk_id)
        if claimed["lease_token"] != token:
            claimed = None
    if claimed is None:
        return get(pool, bulk_id)
    return run_claimed(
        pool,
        settings,
        claimed,
        token,
        batch_size=batch_size,
        lease_seconds=lease_seconds,
        on_item=on_item,
    )


def run_claimed(
    pool: ConnectionPool[Conn],
    settings: Settings,
    claimed: Row,
    token: UUID,
    *,
    batch_size: int = BATCH_SIZE,
    lease_seconds: float = LEASE_SECONDS,
    on_item: ItemHook | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> Row:
    """Run the run ``claimed`` (a row this runner leased with ``token``) batch after batch
    to its end; returns the run as it is then. ``should_stop`` is asked between batches:
    when it answers True the lease is handed back (it ends now: the next claim of any
    runner takes the run on from its last committed batch) and the run is returned still
    ``running``. A lease lost to another runner (this one was too slow) ends the loop; the
    batch it was in rolled back."""
    bulk_id = claimed["id"]
    current: Row = claimed
    try:
        while current["state"] == "running":
            if should_stop is not None and should_stop():
                with pool.connection() as conn:
                    bulk_store.bulk_action_release(conn, bulk_id=bulk_id, lease_token=token)
                log.info(
                    "bulk action handed back (stopping)",
                    extra={"bulk_id": bulk_id, "seen": current["seen"]},
                )
                return get(pool, bulk_id)
            current = _batch(pool, settings, current, token, batch_size, lease_seconds, on_item)
    except _LeaseLost:
        log.warning("bulk action lease lost: another runner resumed it", extra={"bulk_id": bulk_id})
        return get(pool, bulk_id)
    log.info(
        "bulk action ended",
        extra={
            "bulk_id": bulk_id,
            "state": current["state"],
            "acted": current["acted"],
            "skipped": current["skipped"],
        },
    )
    return get(pool, bulk_id)


def resume(pool: ConnectionPool[Conn], settings: Settings, bulk_id: int) -> Row:
    """Resume a run whose runner went silent (its lease expired) in the caller's thread; a
    run still held, or ended, is returned as it is. Raises :class:`BulkNotFound`. (The
    recovery-scanner's bulk runner does this by itself; :func:`nudge` wakes it.)"""
    get(pool, bulk_id)
    return run(pool, settings, bulk_id)


def nudge(pool: ConnectionPool[Conn], bulk_id: int) -> Row:
    """Wake the bulk runners now (NOTIFY ``bulk_actions``) for run ``bulk_id``, and return
    it: what an operator's resume does. A run nobody holds is claimed by the next runner
    that wakes; one held, or ended, is left alone. Raises :class:`BulkNotFound`."""
    row = get(pool, bulk_id)
    if row["state"] == "running":
        with pool.connection() as conn:
            bulk_store.bulk_action_nudge(conn, bulk_id=bulk_id)
    return row


@dataclass
class _Tally:
    acted: int = 0
    skipped: int = 0
    items: list[tuple[str, Row, Any, Exception | None]] = field(default_factory=list)


def _advance(
    conn: Conn,
    run_row: Row,
    token: UUID,
    *,
    cursor: str | None,
    seen: int,
    tally: _Tally,
    state: str,
    stop_reason: str | None,
    lease_seconds: float,
) -> Row:
    advanced = bulk_store.bulk_action_advance(
        conn,
        bulk_id=run_row["id"],
        lease_token=token,
        cursor=cursor,
        seen=seen,
        acted=tally.acted,
        skipped=tally.skipped,
        state=state,
        stop_reason=stop_reason,
        lease_seconds=lease_seconds,
    )
    if advanced is None:
        raise _LeaseLost()
    audit.advance(
        conn,
        run_row["audit_id"],
        count=advanced["acted"],
        outcome=state,
        detail={
            "seen": advanced["seen"],
            "skipped": advanced["skipped"],
            "batches": advanced["batches"],
            **({"stop_reason": stop_reason} if stop_reason else {}),
        },
    )
    return advanced


def _batch(
    pool: ConnectionPool[Conn],
    settings: Settings,
    run_row: Row,
    token: UUID,
    batch_size: int,
    lease_seconds: float,
    on_item: ItemHook | None,
) -> Row:
    kind = run_row["kind"]
    filters = _params(BulkFilter.from_json(run_row["filter"]))
    left = run_row["confirmed"] - run_row["seen"]
    actor = Actor(kind="operator", name=run_row["actor"])
    faults.hit("bulk.batch", (run_row["id"],))  # drills: a slow batch, a runner killed in one
    try:
        with transaction(pool) as conn:
            targets = (
                bulk_store.bulk_action_targets(
                    conn,
                    kind=kind,
                    filters=filters,
                    as_of=run_row["as_of"],
                    after=run_row["cursor"],
                    limit=min(batch_size, left),
                )
                if left > 0
                else []
            )
            tally = _Tally()
            if kind == "cancel" and targets:
                changed = _cancel(conn, run_row, [t["id"] for t in targets])
                for t in targets:
                    outcome = "acted" if t["id"] in changed else "skipped"
                    tally.items.append((outcome, t, None, None))
                tally.acted, tally.skipped = len(changed), len(targets) - len(changed)
            elif targets:
                _replay_batch(conn, settings, run_row, actor, targets, tally)
            done = not targets or len(targets) >= left
            advanced = _advance(
                conn,
                run_row,
                token,
                cursor=str(targets[-1]["id"]) if targets else run_row["cursor"],
                seen=len(targets),
                tally=tally,
                state="done" if done else "running",
                stop_reason=None,
                lease_seconds=lease_seconds,
            )
    except (AdmissionRefused, psycopg.errors.UniqueViolation):
        # Refused, or a replay written without the job's lock won the unique index: redo
        # the batch one target at a time, each through the single replay's path.
        return _replay_singly(
            pool, settings, run_row, token, actor, filters, batch_size, lease_seconds, on_item
        )
    _report(on_item, tally)
    return advanced


def _report(on_item: ItemHook | None, tally: _Tally) -> None:
    if on_item is not None:
        for outcome, target, replayed, error in tally.items:
            on_item(outcome, target, replayed, error)


def _cancel(conn: Conn, run_row: Row, job_ids: list[UUID]) -> set[UUID]:
    changed = job_store.job_request_cancel_many(
        conn,
        job_ids=job_ids,
        tenant_id=None,
        detail={"requested_by": "operator", "bulk_id": run_row["id"]},
    )
    return {r["id"] for r in changed}


def _replay_one(
    conn: Conn,
    settings: Settings,
    run_row: Row,
    actor: Actor,
    target: Row,
    tally: _Tally,
    *,
    admit_now: bool,
) -> Row | None:
    """Replay one target inside a savepoint; the new job (to admit), or None."""
    try:
        with conn.transaction():  # a savepoint: a refused target leaves the batch intact
            replayed = replay_in(
                conn,
                settings,
                original_id=target["job_id"],
                actor=actor,
                bulk_id=run_row["id"],
                admit_now=admit_now,
            )
    except (JobNotFound, JobStateConflict) as exc:
        tally.skipped += 1
        tally.items.append(("skipped", target, None, exc))
        return None
    if not replayed.created:
        tally.skipped += 1
        tally.items.append(("existing", target, replayed, None))
        return None
    tally.acted += 1
    tally.items.append(("acted", target, replayed, None))
    return replayed.job


def _replay_batch(
    conn: Conn,
    settings: Settings,
    run_row: Row,
    actor: Actor,
    targets: list[Row],
    tally: _Tally,
) -> None:
    """Replay a batch of open dead letters set-based: one guarded statement writes every
    replay (``job_replay_many``), then admission control counts them per tenant, in tenant
    order, last before COMMIT (the counters' row locks are held from here to COMMIT only).
    A refusal rolls the whole batch back (the caller redoes it one target at a time)."""
    written = job_store.job_replay_many(
        conn,
        dead_letter_ids=[t["id"] for t in targets],
        job_ids=[new_id() for _ in targets],
        message_ids=[new_id() for _ in targets],
        actor=actor.name,
        max_attempts=settings.max_attempts,
        deadline_seconds=settings.job_deadline_seconds,
        trace_context=telemetry.current_context(),
        detail={"requested_by": actor.requested_by, "bulk_id": run_row["id"]},
    )
    per_tenant = Counter(r["tenant_id"] for r in written)
    for tenant_id in sorted(per_tenant):
        admit_many(conn, tenant_id=tenant_id, count=per_tenant[tenant_id], settings=settings)
    by_dead_letter = {r["dead_letter_id"]: r for r in written}
    tally.acted, tally.skipped = len(written), len(targets) - len(written)
    for t in targets:
        job = by_dead_letter.get(t["id"])
        if job is not None:
            tally.items.append(("acted", t, Replayed(job, created=True), None))
        else:
            tally.items.append(_not_replayed(conn, t))


def _not_replayed(conn: Conn, target: Row) -> tuple[str, Row, Any, Exception | None]:
    """Why a batch did not replay a target: another replay took it first (``existing``,
    with that replay) or it is no longer a failed job's open dead letter (``skipped``)."""
    row = dl_store.dead_letter_get(conn, dead_letter_id=target["id"])
    if row is not None and row["replayed_by"] is not None:
        replay = {"id": row["replayed_by"], "tenant_id": row["tenant_id"]}
        return ("existing", target, Replayed(replay, created=False), None)
    state = row["state"] if row is not None else "gone"
    return ("skipped", target, None, JobStateConflict(f"the dead letter is {state}"))


def _replay_singly(
    pool: ConnectionPool[Conn],
    settings: Settings,
    run_row: Row,
    token: UUID,
    actor: Actor,
    filters: dict[str, Any],
    batch_size: int,
    lease_seconds: float,
    on_item: ItemHook | None,
) -> Row:
    """The batch again, one target per transaction, up to the admission refusal that
    stopped it: the run then stops there (``stopped``), the rest of its targets open."""
    with pool.connection() as conn:
        current = bulk_store.bulk_action_get(conn, bulk_id=run_row["id"])
    assert current is not None
    left = current["confirmed"] - current["seen"]
    with pool.connection() as conn:
        targets = bulk_store.bulk_action_targets(
            conn,
            kind="replay",
            filters=filters,
            as_of=current["as_of"],
            after=current["cursor"],
            limit=min(batch_size, left),
        )
    for target in targets:
        tally = _Tally()
        try:
            with transaction(pool) as conn:
                _replay_one(conn, settings, current, actor, target, tally, admit_now=True)
                current = _advance(
                    conn,
                    current,
                    token,
                    cursor=str(target["id"]),
                    seen=1,
                    tally=tally,
                    state="done" if left <= 1 else "running",
                    stop_reason=None,
                    lease_seconds=lease_seconds,
                )
        except AdmissionRefused as exc:
            with transaction(pool) as conn:
                current = _advance(
                    conn,
                    current,
                    token,
                    cursor=current["cursor"],
                    seen=0,
                    tally=_Tally(),
                    state="stopped",
                    stop_reason=f"admission refused ({exc.code}): {exc.detail}",
                    lease_seconds=lease_seconds,
                )
            _report(on_item, _Tally(items=[("refused", target, None, exc)]))
            log.warning(
                "bulk action stopped by admission control",
                extra={"bulk_id": current["id"], "code": exc.code},
            )
            return current
        _report(on_item, tally)
        left -= 1
        if current["state"] != "running":
            break
    return current


# --- the synchronous bulk replay of one reason (POST /v1/admin/replays) ------------------


@dataclass
class BulkReplay:
    """What a bulk replay of one reason did, per dead letter (``dead_letter_id``,
    ``job_id``, ``replay_id`` / ``detail``), and whether open dead letters of the reason
    remain; ``bulk_id`` is its run (and its audit row's)."""

    reason: str
    created: list[dict[str, Any]] = field(default_factory=list)
    existing: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    refused: dict[str, Any] | None = None
    more: bool = False
    bulk_id: int | None = None


def replay_dead_letters(
    pool: ConnectionPool[Conn],
    settings: Settings,
    *,
    reason: str,
    actor: Actor | str,
    tenant_id: str | None = None,
    limit: int = 100,
    batch_size: int = BATCH_SIZE,
) -> BulkReplay:
    """Replay up to ``limit`` open dead letters with ``reason`` (of one tenant, or all),
    oldest first: a bulk replay run to its end in the caller's thread, with what it did to
    each dead letter. Idempotent (a dead letter replayed meanwhile is ``existing``); stops
    at the first admission refusal (``refused``: code, detail, retry_after)."""
    filt = BulkFilter(reason=reason, tenant_id=tenant_id)
    seen = preview(pool, "replay", filt)
    token = uuid4()  # leased to this caller from the start: no bulk runner takes it
    run_row, _ = start(
        pool,
        as_actor(actor),
        "replay",
        filt,
        as_of=seen.as_of,
        confirmed=limit,
        request_id=uuid4(),
        lease_token=token,
    )
    result = BulkReplay(reason=reason, bulk_id=run_row["id"])

    def collect(outcome: str, target: Row, replayed: Any, error: Exception | None) -> None:
        item: dict[str, Any] = {"dead_letter_id": target["id"], "job_id": target["job_id"]}
        if outcome == "refused" and isinstance(error, AdmissionRefused):
            result.refused = {
                **item,
                "code": error.code,
                "detail": error.detail,
                "retry_after": error.retry_after,
            }
        elif outcome == "skipped":
            result.skipped.append({**item, "detail": getattr(error, "detail", str(error))})
        else:
            item["replay_id"] = replayed.job["id"]
            (result.created if outcome == "acted" else result.existing).append(item)

    run(pool, settings, run_row["id"], batch_size=batch_size, on_item=collect, token=token)
    result.more = preview(pool, "replay", filt).count > 0
    return result
