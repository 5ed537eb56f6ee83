"""The outbox relay: claim due events, publish them to Celery, mark them sent.

ONE statement per pass and no transaction across broker I/O (docs/architecture.md INV-13
no-transaction-across-io):
1. one statement marks the events of the PREVIOUS pass sent (only while still owned),
   stamps their jobs' dispatch, writes their ``dispatched`` events, claims a bounded batch
   of due events with ``FOR UPDATE SKIP LOCKED`` and a claim token + expiry, and says when
   the next pending event is due;
2. send the batch over one broker connection: one message per bulk job
   (``EXPORT_TASK``, ``args=[job_id]``, task id = event id) and, for small jobs, messages
   of up to ``PUBLISHER_MESSAGE_JOBS`` jobs (``EXPORT_BATCH_TASK``) when the pass found a
   backlog (:func:`plan_messages`); the unpublished ones are released with a backoff;
3. the sent events are marked by the next pass, which comes at once when more work
   arrives and at most ``PUBLISHER_MARK_DELAY_SECONDS`` later otherwise (or by
   :meth:`Publisher.flush` when stopping).

The broker window (``PUBLISHER_BROKER_WINDOW``): while ``exports.fast`` already has that many
messages waiting in Redis (the workers are behind), a pass leaves that queue's events pending
in the outbox and the publisher watches the queue's length instead of sending; when the
workers catch up, the next pass claims the backlog at once and sends it as batch messages.
Without it the backlog of a saturated system forms in Redis as one-job messages, because the
publisher keeps up with the submits and each pass finds a single due event.
A crash before the mark leaves the claim to expire and the events are published again:
duplicates are expected and refused by the job claim, losses are not possible.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

import psycopg
import redis
from celery import Celery
from opentelemetry.trace import SpanKind
from psycopg_pool import ConnectionPool, PoolTimeout

from exportcore import faults, metrics, telemetry
from exportcore.broker import EXPORT_BATCH_TASK, EXPORT_TASK
from exportcore.broker_inspect import QueueDepth
from exportcore.db import Conn, connect
from exportcore.retry import full_jitter
from exportcore.settings import FAST_QUEUE, Settings
from exportcore.store import outbox as outbox_store

log = logging.getLogger(__name__)

NOTIFY_CHANNEL = "export_outbox"
# While a queue is held, how often the publisher reads its length in the broker (one LLEN
# pipeline, a few microseconds of Redis time): the delay between the workers catching up and
# the held backlog being sent.
HOLD_POLL_SECONDS = 0.005


@functools.cache
def _window_holds(queue: str) -> Any:
    """The ``exports_publisher_window_holds_total`` child of one queue (looked up once)."""
    return metrics.PUBLISHER_WINDOW_HOLDS.labels(queue)


@functools.cache
def _publishes(outcome: str, queue: str) -> Any:
    """The ``exports_publishes_total`` child of one label set (looked up once)."""
    return metrics.PUBLISHES.labels(outcome, queue)


@dataclass(frozen=True)
class PublisherConfig:
    """Batch size, claim length and waits of one publisher (seconds), and the default
    per-tenant in-flight caps of the fair claim (jobs, per queue)."""

    batch_size: int
    claim_seconds: float
    poll_seconds: float
    retry_base_seconds: float
    retry_cap_seconds: float = 60.0
    message_jobs: int = 1
    message_spread: int = 1
    mark_delay: float = 0.0
    broker_window: int = 0
    bulk_cap: int = 1
    fast_cap: int = 8
    held_recheck: float = 0.25

    @classmethod
    def from_settings(cls, s: Settings) -> PublisherConfig:
        """Read the ``PUBLISHER_*`` settings."""
        return cls(
            batch_size=s.publisher_batch_size,
            claim_seconds=s.publisher_claim_seconds,
            poll_seconds=s.publisher_poll_seconds,
            retry_base_seconds=s.publisher_retry_seconds,
            message_jobs=s.publisher_message_jobs,
            message_spread=s.publisher_message_spread,
            mark_delay=s.publisher_mark_delay_seconds,
            broker_window=s.publisher_broker_window,
            bulk_cap=s.tenant_bulk_in_flight,
            fast_cap=s.tenant_fast_in_flight,
            held_recheck=s.publisher_held_recheck_seconds,
        )


@dataclass(frozen=True)
class _Unmarked:
    """Events a pass sent, to be marked sent by the next pass (with their claim token and
    the claim's time, when their dispatch began)."""

    ids: list[UUID]
    token: UUID
    dispatched_at: datetime


def plan_messages(
    events: Sequence[dict[str, Any]], max_jobs: int, spread: int
) -> list[list[dict[str, Any]]]:
    """Group claimed outbox events into broker messages, in claim order.

    Bulk events (and any queue but ``exports.fast``) travel one per message. Small events
    of one pass are split into at least ``spread`` messages (so ``spread`` worker processes
    share a backlog), each of at most ``max_jobs``: at low load a pass holds one event and
    sends one message of one job at once; batches form only when events queued up.
    """
    fast = [e for e in events if e["queue"] == FAST_QUEUE]
    out: list[list[dict[str, Any]]] = [[e] for e in events if e["queue"] != FAST_QUEUE]
    if fast:
        size = max(1, min(max_jobs, -(-len(fast) // spread)))
        out[:0] = [fast[i : i + size] for i in range(0, len(fast), size)]
    return out


def pass_outcome(claimed: int, held: int) -> str:
    """The ``outcome`` label of ``exports_publisher_passes_total`` for one pass: ``held``
    when an in-flight cap held due events back (whether or not others were claimed),
    else ``claimed`` when events were claimed, else ``idle``."""
    if held:
        return "held"
    return "claimed" if claimed else "idle"


class Publisher:
    """One outbox relay; several may run at once (claims never overlap)."""

    name = "publisher"

    def __init__(
        self,
        settings: Settings,
        pool: ConnectionPool[Conn],
        celery_app: Celery,
        config: PublisherConfig | None = None,
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.celery = celery_app
        self.config = config or PublisherConfig.from_settings(settings)
        self._listen: Conn | None = None
        self._listen_lost = False
        self._rng = random.Random()
        self._next_due_in: float | None = None
        self._unmarked: _Unmarked | None = None
        self._depth: QueueDepth | None = None
        self._window_full: tuple[str, ...] = ()

    # --- one pass ------------------------------------------------------------------------

    def run_once(self) -> dict[str, int]:
        """One pass: mark the previous pass's events sent and claim due ones (one
        statement), publish them, remember them to be marked by the next pass. Returns
        ``{claimed, published, failed, messages, marked, held}`` (``published``: events sent
        to the broker in this pass; ``marked``: events of the previous pass marked sent;
        ``held``: (tenant, queue) pairs whose due events their in-flight cap held back)."""
        token = uuid4()
        pending = self._unmarked
        self._window_full = self._full_queues()
        with self.pool.connection() as conn:
            result = outbox_store.outbox_mark_sent_and_claim_due(
                conn,
                claim_token=token,
                limit=self.config.batch_size,
                claim_seconds=self.config.claim_seconds,
                bulk_cap=self.config.bulk_cap,
                fast_cap=self.config.fast_cap,
                sent_ids=pending.ids if pending else (),
                sent_token=pending.token if pending else None,
                dispatched_at=pending.dispatched_at if pending else None,
                held_queues=self._window_full,
            )
        self._unmarked = None
        self._next_due_in = result.next_due_in
        metrics.PUBLISHER_PASSES.labels(pass_outcome(len(result.events), result.held)).inc()
        if pending is not None and result.marked != len(pending.ids):
            log.warning(
                "some published events were no longer owned when marked sent",
                extra={"published": len(pending.ids), "marked": result.marked},
            )
        events = result.events
        if not events:
            return {
                "claimed": 0,
                "published": 0,
                "failed": 0,
                "messages": 0,
                "marked": result.marked,
                "held": result.held,
            }

        published: list[UUID] = []
        failed: list[dict[str, Any]] = []
        error: Exception | None = None
        messages = plan_messages(events, self.config.message_jobs, self.config.message_spread)
        sent = 0
        try:
            # One producer (one broker connection from the pool) for the whole batch.
            with self.celery.producer_or_acquire() as producer:
                for message in messages:
                    self._publish(message, producer)
                    published.extend(e["id"] for e in message)
                    sent += 1
        except Exception as exc:
            # The broker is unreachable: do not hammer it with the rest of the batch.
            error = exc
            failed.extend(e for message in messages[sent:] for e in message)

        faults.hit("publisher.after_send")
        if published:  # marked by the next pass (or flush()), in its claim statement
            self._unmarked = _Unmarked(published, token, events[0]["claimed_at"])
        if failed:
            assert error is not None
            with self.pool.connection() as conn:
                outbox_store.outbox_release_many(
                    conn,
                    ids=[e["id"] for e in failed],
                    claim_token=token,
                    retry_seconds=[
                        max(
                            full_jitter(
                                e["publish_attempts"],
                                base=self.config.retry_base_seconds,
                                cap=self.config.retry_cap_seconds,
                                rng=self._rng,
                            ),
                            self.config.retry_base_seconds / 2,
                        )
                        for e in failed
                    ],
                    error=f"{type(error).__name__}: {error}",
                )
            log.warning(
                "broker publish failed; events stay pending and will be retried",
                extra={
                    "failed": len(failed),
                    "message_id": str(failed[0]["id"]),
                    "job_id": str(failed[0]["job_id"]),
                    "error": type(error).__name__,
                },
            )
        return {
            "claimed": len(events),
            "published": len(published),
            "failed": len(failed),
            "messages": sent,
            "marked": result.marked,
            "held": result.held,
        }

    def flush(self) -> int:
        """Mark the events sent by the last pass now (before stopping); returns how many
        were marked. A no-op when nothing is waiting to be marked."""
        pending, self._unmarked = self._unmarked, None
        if pending is None:
            return 0
        try:
            with self.pool.connection() as conn:
                return outbox_store.outbox_mark_sent_many(
                    conn,
                    ids=pending.ids,
                    claim_token=pending.token,
                    dispatched_at=pending.dispatched_at,
                ).marked
        except (psycopg.Error, PoolTimeout) as exc:
            # The database is going away with us (a stopping stack): the claims expire and
            # the events are sent again; the duplicates are refused by the job claim.
            log.warning(
                "could not mark the last sent events; they will be sent again",
                extra={"events": len(pending.ids), "error": type(exc).__name__},
            )
            return 0

    def _publish(self, message: Sequence[dict[str, Any]], producer: Any = None) -> None:
        """Send one broker message for ``message`` (outbox events of one queue): the job id
        alone for one event, the job ids and event ids for several."""
        first = message[0]
        queue = first["queue"]
        args: list[Any]
        if len(message) == 1:
            task, args = EXPORT_TASK, [str(first["job_id"])]
        else:
            task = EXPORT_BATCH_TASK
            args = [[str(e["job_id"]) for e in message], [str(e["id"]) for e in message]]
        # A child of the submit span stored with the event: the Celery instrumentation puts
        # this span's context in the message, so the worker joins the same trace.
        with telemetry.span(
            "exports.publish",
            parent=first["trace_context"],
            kind=SpanKind.PRODUCER,
            attributes={
                "job_id": first["job_id"],
                "message_id": first["id"],
                "queue": queue,
                "reason": first["reason"],
                "publish_attempt": first["publish_attempts"],
                "jobs": len(message),
            },
        ):
            try:
                self.celery.send_task(
                    task,
                    producer=producer,
                    args=args,
                    task_id=str(first["id"]),
                    queue=queue,
                    retry=True,
                    retry_policy={
                        "max_retries": 1,
                        "interval_start": 0.0,
                        "interval_step": 0.2,
                        "interval_max": 0.2,
                    },
                )
            except Exception:
                _publishes("failed", queue).inc(len(message))
                raise
        _publishes("sent", queue).inc(len(message))
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "published",
                extra={
                    "message_id": str(first["id"]),
                    "job_id": str(first["job_id"]),
                    "queue": queue,
                    "jobs": len(message),
                },
            )

    # --- the broker window ----------------------------------------------------------------

    def _full_queues(self, count: bool = True) -> tuple[str, ...]:
        """``(exports.fast,)`` while that queue has ``broker_window`` or more messages
        waiting in the broker, else ``()`` (``count``: a pass's decision, counted in
        ``exports_publisher_window_holds_total``). A broker that cannot be read holds nothing (the
        send then fails and releases the events with a backoff, as before)."""
        if self.config.broker_window <= 0:
            return ()
        if self._depth is None:
            self._depth = QueueDepth.from_settings(self.settings)
            if self._depth is None:  # not a Redis broker: no window
                self.config = replace(self.config, broker_window=0)
                return ()
        try:
            full = self._depth.ready(FAST_QUEUE) >= self.config.broker_window
        except (redis.RedisError, OSError):
            return ()
        if full:
            if count:
                _window_holds(FAST_QUEUE).inc()
            return (FAST_QUEUE,)
        return ()

    # --- waiting for work ------------------------------------------------------------------

    def next_wait(self, counts: dict[str, int], interval: float) -> float:
        """0 after a full batch (more is waiting); else until the next event is due, at most
        ``interval``, at most ``PUBLISHER_HELD_RECHECK_SECONDS`` while the pass held events
        back (an in-flight cap: the slot frees when one of that tenant's jobs ends, which
        sends no NOTIFY), and at most ``PUBLISHER_MARK_DELAY_SECONDS`` while sent events
        wait to be marked (a NOTIFY wakes the publisher earlier: the mark then rides on its
        claim)."""
        if counts.get("claimed", 0) >= self.config.batch_size and not counts.get("failed"):
            return 0.0
        if counts.get("failed"):
            return interval
        due_in = self._next_due_in  # from the pass's own statement
        if counts.get("held"):  # a slot frees when a held tenant's job ends: look again soon
            due_in = (
                min(due_in, self.config.held_recheck)
                if due_in is not None
                else self.config.held_recheck
            )
        if self._unmarked is not None:  # mark soon even when no new work wakes us
            due_in = (
                min(due_in, self.config.mark_delay)
                if due_in is not None
                else self.config.mark_delay
            )
        return interval if due_in is None else min(interval, due_in)

    def idle(self, timeout: float, stop: threading.Event) -> None:
        """Wait for a NOTIFY on ``export_outbox`` (sent by every submit, its payload the
        job's queue) or ``timeout``. While a queue is held, NOTIFYs for it do not wake the
        publisher; the queue's length in the broker is read every ``HOLD_POLL_SECONDS``
        instead, and the wait ends when it drops below the window."""
        deadline = time.monotonic() + timeout
        while not stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            # bounded so that TERM is noticed quickly (and a held queue is re-read)
            slice_ = min(remaining, HOLD_POLL_SECONDS if self._window_full else 0.5)
            try:
                fresh = self._listen is None or self._listen.closed
                conn = self._listen_conn()
                if fresh and self._listen_lost:
                    # LISTEN is back after a loss (a restart, a failover): submits made
                    # meanwhile sent NOTIFYs nobody heard; look for them now
                    self._listen_lost = False
                    return
                for note in conn.notifies(timeout=slice_, stop_after=1):
                    if note.payload not in self._window_full:
                        return
                if self._window_full and self._full_queues(count=False) != self._window_full:
                    return
            except psycopg.Error as exc:
                log.warning("LISTEN connection lost; polling", extra={"error": type(exc).__name__})
                self._listen_lost = True
                self.close_listener()
                stop.wait(min(remaining, 1.0))

    def _listen_conn(self) -> Conn:
        if self._listen is None or self._listen.closed:
            # A session of its own (DATABASE_DIRECT_URL behind a pooler): a LISTEN lasts as
            # long as its session, on the primary (the multi-host URL finds it again).
            self._listen = connect(
                self.settings, "exports-publisher-listen", autocommit=True, direct=True
            )
            self._listen.execute(f"LISTEN {NOTIFY_CHANNEL}")
        return self._listen

    def close_listener(self) -> None:
        """Close the LISTEN connection and the broker-window reader (both are reopened when
        needed)."""
        if self._depth is not None:
            self._depth.close()
            self._depth = None
        if self._listen is not None:
            try:
                self._listen.close()
            finally:
                self._listen = None
