"""The outbox relay: claim due events, publish them to Celery, leave the mark to the claim.

ONE statement per pass and no transaction across broker I/O (docs/architecture.md INV-13
no-transaction-across-io):
1. one statement marks the events this publisher sent earlier that no worker's claim has
   marked within the mark delay (``PublisherConfig.mark_delay``; a message still waiting
   in the broker; the claim that delivers a message marks its event and stamps the job's
   dispatch itself), and claims a bounded batch of due events fairly with ``FOR UPDATE SKIP LOCKED``
   and a claim token + expiry, and says when the next pending event is due;
2. send each claimed event as ONE message of one job (``EXPORT_TASK``, ``args=[job_id]``,
   task id = event id) over one broker connection; the unpublished ones are released with
   a backoff.

Small exports (``exports.fast``) are sent while fewer than ``PUBLISHER_MESSAGES_AHEAD`` of
this publisher's messages are on their way to the workers (sent, no claim reported yet);
beyond that, due small exports stay in the outbox, and the claim of each arriving message
takes them beside its own job (up to ``WORKER_CLAIM_JOBS``, in the same fair order:
:mod:`exportcore.claims`). So batches form where a backlog meets a free worker, never by
holding work while a worker waits: a message is held back only while others are already
waiting for a worker, and each of those claims takes what was held. The claims report
themselves (NOTIFY ``claimed:<event id>`` on ``export_outbox``), which is when this
publisher sends its next message; nothing polls the broker.
A crash before the mark leaves the claim to expire and the events are published again:
duplicates are expected and refused by the job claim, losses are not possible.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID, uuid4

import psycopg
from celery import Celery
from opentelemetry.trace import SpanKind
from psycopg_pool import ConnectionPool, PoolTimeout

from exportcore import faults, metrics, telemetry
from exportcore.broker import EXPORT_TASK
from exportcore.db import Conn, connect
from exportcore.domain import FAST_QUEUE
from exportcore.retry import full_jitter
from exportcore.settings import Settings
from exportcore.store import outbox as outbox_store
from exportcore.store.outbox import Sent

log = logging.getLogger(__name__)

NOTIFY_CHANNEL = "export_outbox"
CLAIMED_PREFIX = "claimed:"
"""Payload prefix of the NOTIFY a worker's claim sends for the message it received
(``claimed:<task id>``, outbox.sql outbox_mark_delivered)."""


@functools.cache
def _holds(queue: str) -> Any:
    """The ``exports_publisher_holds_total`` child of one queue (looked up once)."""
    return metrics.PUBLISHER_HOLDS.labels(queue)


@functools.cache
def _publishes(outcome: str, queue: str) -> Any:
    """The ``exports_publishes_total`` child of one label set (looked up once)."""
    return metrics.PUBLISHES.labels(outcome, queue)


MARK_DELAY_SECONDS = 1.0
"""The longest a publisher leaves an event it sent for the worker's claim to mark."""


@dataclass(frozen=True)
class PublisherConfig:
    """Batch size, claim length and waits of one publisher (seconds), the small-export
    messages it keeps ahead of the workers, and the default per-tenant in-flight caps of the
    fair claim (jobs, per queue).

    ``send_retry_base_seconds`` / ``send_retry_cap_seconds`` bound the full-jitter backoff
    before an event whose send to the broker failed is claimed again. ``mark_delay`` is how
    long the publisher leaves an event it sent for the worker's claim to mark (the claim
    marks it and stamps the job's dispatch in the same transaction) before it marks the
    event itself in its next pass: only a message still waiting in the broker is marked by
    the publisher. ``held_recheck`` is how often the publisher claims again while a tenant's
    events are held back by its in-flight cap (a slot frees when one of its jobs finishes,
    fails, is cancelled or waits for a retry, which sends no NOTIFY), instead of
    ``poll_seconds``."""

    batch_size: int
    claim_seconds: float
    poll_seconds: float
    send_retry_base_seconds: float
    send_retry_cap_seconds: float = 60.0
    mark_delay: float = MARK_DELAY_SECONDS
    messages_ahead: int = 2
    bulk_cap: int = 1
    fast_cap: int = 8
    held_recheck: float = 0.25

    @classmethod
    def from_settings(cls, s: Settings) -> PublisherConfig:
        """Read the ``PUBLISHER_*`` settings and the default in-flight caps. The mark delay
        is a quarter of ``PUBLISHER_CLAIM_SECONDS``, at most ``MARK_DELAY_SECONDS``: an
        event sent and not marked is sent again once its claim expires (a duplicate the job
        claim refuses), so the publisher's own mark must come well before that."""
        return cls(
            batch_size=s.publisher_batch_size,
            claim_seconds=s.publisher_claim_seconds,
            poll_seconds=s.publisher_poll_seconds,
            send_retry_base_seconds=s.publisher_retry_seconds,
            mark_delay=min(MARK_DELAY_SECONDS, s.publisher_claim_seconds / 4),
            messages_ahead=s.publisher_messages_ahead,
            bulk_cap=s.tenant_bulk_in_flight,
            fast_cap=s.tenant_fast_in_flight,
        )


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
    # a pass per message at low load: its counts are metrics, its line DEBUG
    pass_log_level = logging.DEBUG

    def __init__(
        self,
        settings: Settings,
        pool: ConnectionPool[Conn],
        celery_app: Celery,
        config: PublisherConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.celery = celery_app
        self.config = config or PublisherConfig.from_settings(settings)
        self.clock = clock
        self._listen: Conn | None = None
        self._listen_lost = False
        self._rng = random.Random()
        self._next_due_in: float | None = None
        # events sent and not yet marked (by a claim or by us), with when they were sent
        self._unmarked: dict[UUID, tuple[Sent, float]] = {}
        # small-export messages sent and not yet reported claimed, with when they were sent
        self._ahead: dict[UUID, float] = {}
        # due small exports are waiting in the outbox for room ahead (the last pass left
        # some, or a submit of exports.fast arrived while the messages ahead were full)
        self._fast_held = False

    # --- one pass ------------------------------------------------------------------------

    def run_once(self) -> dict[str, int]:
        """One pass: mark what no claim marked in time and claim due events (one
        statement), publish them one job per message. Returns ``{claimed, published,
        failed, messages, marked, held, waiting}`` (``published``: events sent to the
        broker in this pass; ``marked``: earlier sends this publisher marked itself;
        ``held``: (tenant, queue) pairs whose due events their in-flight cap held back;
        ``waiting``: > 0 when due small exports were left in the outbox because the messages
        ahead were full, for the next claim to take; the claim looks one event past its
        limit, so this is not the whole backlog)."""
        token = uuid4()
        self._listen_early()
        now = self.clock()
        self._expire_ahead(now)
        due_marks = [
            sent for sent, at in self._unmarked.values() if now - at >= self.config.mark_delay
        ]
        free = max(0, self.config.messages_ahead - len(self._ahead))
        with self.pool.connection() as conn:
            result = outbox_store.outbox_mark_sent_and_claim_due(
                conn,
                asynchronous_commit=not self.settings.claims_synchronous_commit,
                claim_token=token,
                limit=self.config.batch_size,
                fast_limit=free,
                claim_seconds=self.config.claim_seconds,
                bulk_cap=self.config.bulk_cap,
                fast_cap=self.config.fast_cap,
                sent=due_marks,
            )
        for sent in due_marks:
            self._unmarked.pop(sent.id, None)
        self._next_due_in = result.next_due_in
        self._fast_held = result.fast_left > 0
        if result.fast_left:
            _holds(FAST_QUEUE).inc()
        metrics.PUBLISHER_PASSES.labels(pass_outcome(len(result.events), result.held)).inc()
        counts = {
            "claimed": len(result.events),
            "published": 0,
            "failed": 0,
            "messages": 0,
            "marked": result.marked,
            "held": result.held,
            "waiting": result.fast_left,
        }
        if not result.events:
            return counts

        failed: list[dict[str, Any]] = []
        error: Exception | None = None
        sent_at = self.clock()
        try:
            # One producer (one broker connection from the pool) for the whole batch.
            with self.celery.producer_or_acquire() as producer:
                for event in result.events:
                    self._publish(event, producer)
                    self._unmarked[event["id"]] = (
                        Sent(event["id"], token, event["claimed_at"]),
                        sent_at,
                    )
                    if event["queue"] == FAST_QUEUE:
                        self._ahead[event["id"]] = sent_at
                    counts["published"] += 1
        except Exception as exc:
            # The broker is unreachable: do not hammer it with the rest of the batch.
            error = exc
            failed = result.events[counts["published"] :]
        counts["messages"] = counts["published"]
        faults.hit("publisher.after_send")
        if failed:
            assert error is not None
            self._release(failed, token, error)
        counts["failed"] = len(failed)
        return counts

    def _release(self, failed: Sequence[dict[str, Any]], token: UUID, error: Exception) -> None:
        """Give unpublished events back, each due again after a jittered backoff."""
        with self.pool.connection() as conn:
            outbox_store.outbox_release_many(
                conn,
                ids=[e["id"] for e in failed],
                claim_token=token,
                retry_seconds=[
                    max(
                        full_jitter(
                            e["publish_attempts"],
                            base=self.config.send_retry_base_seconds,
                            cap=self.config.send_retry_cap_seconds,
                            rng=self._rng,
                        ),
                        self.config.send_retry_base_seconds / 2,
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

    def flush(self) -> int:
        """Mark the events this publisher sent and no claim reported, now (before
        stopping); returns how many were marked (those a claim marked meanwhile are not
        counted). A no-op when nothing is waiting to be marked."""
        pending = [sent for sent, _ in self._unmarked.values()]
        self._unmarked.clear()
        if not pending:
            return 0
        try:
            with self.pool.connection() as conn:
                return outbox_store.outbox_mark_sent_many(conn, sent=pending).marked
        except (psycopg.Error, PoolTimeout) as exc:
            # The database is going away with us (a stopping stack): the claims expire and
            # the events are sent again; the duplicates are refused by the job claim.
            log.warning(
                "could not mark the last sent events; they will be sent again",
                extra={"events": len(pending), "error": type(exc).__name__},
            )
            return 0

    def _publish(self, event: dict[str, Any], producer: Any = None) -> None:
        """Send one broker message for the outbox event ``event``: its job id alone
        (INV-2), task id = the event id."""
        queue = event["queue"]
        # A child of the submit span stored with the event: the Celery instrumentation puts
        # this span's context in the message, so the worker joins the same trace.
        with telemetry.span(
            "exports.publish",
            parent=event["trace_context"],
            kind=SpanKind.PRODUCER,
            attributes={
                "job_id": event["job_id"],
                "message_id": event["id"],
                "queue": queue,
                "reason": event["reason"],
                "publish_attempt": event["publish_attempts"],
            },
        ):
            try:
                self.celery.send_task(
                    EXPORT_TASK,
                    producer=producer,
                    args=[str(event["job_id"])],
                    task_id=str(event["id"]),
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
                _publishes("failed", queue).inc()
                raise
        _publishes("sent", queue).inc()
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "published",
                extra={
                    "message_id": str(event["id"]),
                    "job_id": str(event["job_id"]),
                    "queue": queue,
                },
            )

    # --- the messages ahead of the workers -------------------------------------------------

    def _expire_ahead(self, now: float) -> None:
        """Forget messages no claim reported within ``PUBLISHER_POLL_SECONDS`` (a message
        lost with the broker, a claim report lost with the LISTEN connection, or workers far
        behind): they no longer keep small exports in the outbox."""
        horizon = now - self.config.poll_seconds
        for message_id in [m for m, at in self._ahead.items() if at <= horizon]:
            del self._ahead[message_id]

    def _ahead_full(self) -> bool:
        self._expire_ahead(self.clock())
        return len(self._ahead) >= self.config.messages_ahead

    def claimed(self, message_id: str) -> bool:
        """A claim reported the message ``message_id`` (a NOTIFY ``claimed:<id>``): it is no
        longer ahead of the workers and the claim marked its event. Returns True when this
        frees room for small exports waiting in the outbox (a pass should run now)."""
        try:
            key = UUID(message_id)
        except ValueError:
            return False
        self._unmarked.pop(key, None)
        was_ahead = self._ahead.pop(key, None) is not None
        return was_ahead and self._fast_held and not self._ahead_full()

    # --- waiting for work ------------------------------------------------------------------

    def next_wait(self, counts: dict[str, int], interval: float) -> float:
        """0 after a full batch (more is waiting); else until the next event is due, at most
        ``interval``, at most ``config.held_recheck`` seconds while the pass held events
        back (an in-flight cap: the slot frees when one of that tenant's jobs ends, which
        sends no NOTIFY), until the oldest unmarked send is due for its mark, and, while
        small exports wait in the outbox, until the oldest message ahead expires (a claim's
        NOTIFY wakes the publisher earlier)."""
        if counts.get("claimed", 0) >= self.config.batch_size and not counts.get("failed"):
            return 0.0
        if counts.get("failed"):
            return interval
        now = self.clock()
        waits = [interval]
        if self._next_due_in is not None:  # from the pass's own statement
            waits.append(self._next_due_in)
        if counts.get("held"):  # a slot frees when a held tenant's job ends: look again soon
            waits.append(self.config.held_recheck)
        if self._unmarked:  # mark what no claim marked, in time
            oldest = min(at for _, at in self._unmarked.values())
            waits.append(oldest + self.config.mark_delay - now)
        if self._fast_held and self._ahead:
            waits.append(min(self._ahead.values()) + self.config.poll_seconds - now)
        elif self._fast_held:  # room ahead already (a send failed): come back at once
            return 0.0
        return max(0.0, min(waits))

    def idle(self, timeout: float, stop: threading.Event) -> None:
        """Wait for a NOTIFY on ``export_outbox`` or ``timeout``. A submit sends the job's
        queue as the payload: it wakes the publisher, except a small export while the
        messages ahead are full (the next claim takes it). A claim sends
        ``claimed:<event id>``: it wakes the publisher only when that frees room for small
        exports waiting in the outbox."""
        deadline = time.monotonic() + timeout
        while not stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                fresh = self._listen is None or self._listen.closed
                conn = self._listen_conn()
                if fresh and self._listen_lost:
                    # LISTEN is back after a loss (a restart, a failover): submits made
                    # meanwhile sent NOTIFYs nobody heard; look for them now
                    self._listen_lost = False
                    log.info("LISTEN connection back")
                    return
                # bounded so that TERM is noticed quickly
                for note in conn.notifies(timeout=min(remaining, 0.5), stop_after=1):
                    payload = note.payload
                    if payload.startswith(CLAIMED_PREFIX):
                        if self.claimed(payload[len(CLAIMED_PREFIX) :]):
                            return
                    elif payload == FAST_QUEUE and self._ahead_full():
                        self._fast_held = True  # a claim's report wakes us
                    else:
                        return
            except psycopg.Error as exc:
                if not self._listen_lost:  # once per loss, not once per failed reconnect
                    log.warning(
                        "LISTEN connection lost; polling", extra={"error": type(exc).__name__}
                    )
                self._listen_lost = True
                self.close_listener()
                stop.wait(min(remaining, 1.0))

    def _listen_early(self) -> None:
        """LISTEN before sending, so that no claim report of a message of this pass is
        missed; a failure is left to :meth:`idle` (which polls and reconnects)."""
        try:
            self._listen_conn()
        except psycopg.Error:
            self.close_listener()

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
        """Close the LISTEN connection (it is reopened when needed)."""
        if self._listen is not None:
            try:
                self._listen.close()
            finally:
                self._listen = None
