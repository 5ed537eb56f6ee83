"""The outbox relay: claim due events, publish each to Celery, mark them sent.

Three short transactions per batch and none across broker I/O (DESIGN.md invariant 13):
1. claim a bounded batch with ``FOR UPDATE SKIP LOCKED`` and a claim token + expiry, commit;
2. ``send_task(EXPORT_TASK, args=[job_id], task_id=<event id>, queue=<event queue>)`` per event;
3. mark the published events sent (only while still owned) and release the others with a
   backoff. A crash between 2 and 3 leaves the claim to expire and the event is published
   again: duplicates are expected and refused by the job claim, losses are not possible.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Any
from uuid import UUID, uuid4

import psycopg
from celery import Celery
from opentelemetry.trace import SpanKind
from psycopg_pool import ConnectionPool

from exportcore import faults, metrics, telemetry
from exportcore.broker import EXPORT_TASK
from exportcore.db import Conn, connect
from exportcore.retry import full_jitter
from exportcore.settings import Settings
from exportcore.store import outbox as outbox_store

log = logging.getLogger(__name__)

NOTIFY_CHANNEL = "export_outbox"


@dataclass(frozen=True)
class PublisherConfig:
    """Batch size, claim length and waits of one publisher (seconds)."""

    batch_size: int
    claim_seconds: float
    poll_seconds: float
    retry_base_seconds: float
    retry_cap_seconds: float = 60.0

    @classmethod
    def from_settings(cls, s: Settings) -> PublisherConfig:
        """Read the ``PUBLISHER_*`` settings."""
        return cls(
            batch_size=s.publisher_batch_size,
            claim_seconds=s.publisher_claim_seconds,
            poll_seconds=s.publisher_poll_seconds,
            retry_base_seconds=s.publisher_retry_seconds,
        )


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
        self._rng = random.Random()

    # --- one pass ------------------------------------------------------------------------

    def run_once(self) -> dict[str, int]:
        """Claim, publish and mark one batch; returns ``{claimed, published, failed}``."""
        token = uuid4()
        with self.pool.connection() as conn:
            events = outbox_store.outbox_claim_due(
                conn,
                claim_token=token,
                limit=self.config.batch_size,
                claim_seconds=self.config.claim_seconds,
            )
        if not events:
            return {"claimed": 0, "published": 0, "failed": 0}

        published: list[UUID] = []
        failed: list[tuple[dict[str, Any], Exception]] = []
        try:
            # One producer (one broker connection from the pool) for the whole batch.
            with self.celery.producer_or_acquire() as producer:
                for event in events:
                    self._publish(event, producer)
                    published.append(event["id"])
        except Exception as exc:
            # The broker is unreachable: do not hammer it with the rest of the batch.
            failed.extend((e, exc) for e in events[len(published) :])

        faults.hit("publisher.after_send")
        with self.pool.connection() as conn:
            marked = (
                outbox_store.outbox_mark_sent(conn, ids=published, claim_token=token)
                if published
                else []
            )
            for event, error in failed:
                delay = full_jitter(
                    event["publish_attempts"],
                    base=self.config.retry_base_seconds,
                    cap=self.config.retry_cap_seconds,
                    rng=self._rng,
                )
                outbox_store.outbox_release(
                    conn,
                    event_id=event["id"],
                    claim_token=token,
                    retry_seconds=max(delay, self.config.retry_base_seconds / 2),
                    error=f"{type(error).__name__}: {error}",
                )
        if failed:
            event, first_error = failed[0]
            log.warning(
                "broker publish failed; events stay pending and will be retried",
                extra={
                    "failed": len(failed),
                    "message_id": str(event["id"]),
                    "job_id": str(event["job_id"]),
                    "error": type(first_error).__name__,
                },
            )
        if len(marked) != len(published):
            log.warning(
                "some published events were no longer owned when marked sent",
                extra={"published": len(published), "marked": len(marked)},
            )
        return {"claimed": len(events), "published": len(marked), "failed": len(failed)}

    def _publish(self, event: dict[str, Any], producer: Any = None) -> None:
        # A child of the submit span stored with the event: the Celery instrumentation puts
        # this span's context in the message, so the worker joins the same trace.
        with telemetry.span(
            "exports.publish",
            parent=event["trace_context"],
            kind=SpanKind.PRODUCER,
            attributes={
                "job_id": event["job_id"],
                "message_id": event["id"],
                "queue": event["queue"],
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
                    queue=event["queue"],
                    retry=True,
                    retry_policy={
                        "max_retries": 1,
                        "interval_start": 0.0,
                        "interval_step": 0.2,
                        "interval_max": 0.2,
                    },
                )
            except Exception:
                metrics.PUBLISHES.labels("failed", event["queue"]).inc()
                raise
        metrics.PUBLISHES.labels("sent", event["queue"]).inc()
        log.debug(
            "published",
            extra={
                "message_id": str(event["id"]),
                "job_id": str(event["job_id"]),
                "queue": event["queue"],
            },
        )

    # --- waiting for work ------------------------------------------------------------------

    def next_wait(self, counts: dict[str, int], interval: float) -> float:
        """0 after a full batch (more is waiting); else until the next event is due, at most
        ``interval``."""
        if counts.get("claimed", 0) >= self.config.batch_size and not counts.get("failed"):
            return 0.0
        if counts.get("failed"):
            return interval
        try:
            with self.pool.connection() as conn:
                due_in = outbox_store.outbox_next_due_in(conn)
        except psycopg.Error:
            return interval
        return interval if due_in is None else min(interval, due_in)

    def idle(self, timeout: float, stop: threading.Event) -> None:
        """Wait for a NOTIFY on ``export_outbox`` (sent by every submit) or ``timeout``."""
        deadline = time.monotonic() + timeout
        while not stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            slice_ = min(remaining, 0.5)  # bounded so that TERM is noticed quickly
            try:
                conn = self._listen_conn()
                for _ in conn.notifies(timeout=slice_, stop_after=1):
                    return
            except psycopg.Error as exc:
                log.warning("LISTEN connection lost; polling", extra={"error": type(exc).__name__})
                self.close_listener()
                stop.wait(min(remaining, 1.0))

    def _listen_conn(self) -> Conn:
        if self._listen is None or self._listen.closed:
            self._listen = connect(self.settings, "exports-publisher-listen", autocommit=True)
            self._listen.execute(f"LISTEN {NOTIFY_CHANNEL}")
        return self._listen

    def close_listener(self) -> None:
        """Close the LISTEN connection (it is reopened on the next wait)."""
        if self._listen is not None:
            try:
                self._listen.close()
            finally:
                self._listen = None
