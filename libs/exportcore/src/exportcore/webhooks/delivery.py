"""The webhook delivery process: relays the webhook outbox (``webhook_messages``) to the
tenants' endpoints.

A pipeline with the service shape of :mod:`exportcore.service`:

- each pass records the attempts that finished since the last pass and claims more due
  messages, in ONE short transaction (no transaction spans HTTP,
  docs/architecture.md INV-13 no-transaction-across-io):
  lock the endpoints concerned, apply the breaker and retry policy
  (:mod:`exportcore.webhooks.policy`), write the attempts and settle the messages (only
  while this process's claim still owns them), keep the claims of the attempts still
  running, then claim due messages within every endpoint's concurrency bound
  (``WEBHOOK_ENDPOINT_CONCURRENCY``) and every tenant's share of the senders
  (``WEBHOOK_TENANT_CONCURRENCY``), both counted over every delivery process through the
  unexpired claims, round robin across tenants;
- each claimed message is sent by a thread of a bounded pool (``WEBHOOK_MAX_IN_FLIGHT``);
  an attempt ends by its wall-clock deadline (``WEBHOOK_TIMEOUT_SECONDS``, see
  :mod:`exportcore.webhooks.attempt_deadline`); a finished attempt wakes the loop, as does
  a NOTIFY on ``webhook_messages`` (written by the triggers with every new message), read
  by a listener thread.

A message whose attempt is running is never claimed again: while the attempt runs, the
passes of its process extend its claim. A process killed at any point loses nothing: a
message is settled only after its attempt is recorded, so an attempt in flight at the kill
is made again once its claim expires (``WEBHOOK_CLAIM_SECONDS``) — with the same
``webhook-id``, which is how receivers de-duplicate (Standard Webhooks: at-least-once
delivery).
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import psycopg
from psycopg_pool import ConnectionPool

from exportcore import metrics
from exportcore.db import Conn, Row, connect, transaction
from exportcore.settings import Settings
from exportcore.store import webhook_endpoints as endpoint_store
from exportcore.store import webhook_messages as message_store
from exportcore.webhooks import encryption, events, policy
from exportcore.webhooks.sender import AttemptResult, Delivery, Sender

log = logging.getLogger(__name__)

NOTIFY_CHANNEL = "webhook_messages"
PRUNE_BATCH = 1000


@dataclass(frozen=True)
class DeliveryConfig:
    """Bounds and waits of one delivery process (seconds), from the ``WEBHOOK_*`` settings."""

    batch_size: int
    max_in_flight: int
    per_endpoint: int
    per_tenant: int
    claim_seconds: float
    poll_seconds: float
    hygiene_seconds: float
    retention_seconds: float
    base_url: str

    @classmethod
    def from_settings(cls, s: Settings) -> DeliveryConfig:
        """Read the settings."""
        return cls(
            batch_size=s.webhook_batch_size,
            max_in_flight=s.webhook_max_in_flight,
            per_endpoint=s.webhook_endpoint_concurrency,
            per_tenant=s.webhook_tenant_concurrency,
            claim_seconds=s.webhook_claim_seconds,
            poll_seconds=s.webhook_poll_seconds,
            hygiene_seconds=s.hygiene_interval_seconds,
            retention_seconds=s.webhook_retention_days * 86_400,
            base_url=s.api_public_url,
        )


def retry_schedule(s: Settings) -> policy.RetrySchedule:
    """The message retry schedule of these settings (``WEBHOOK_RETRY_SCHEDULE``)."""
    return policy.RetrySchedule(waits=s.webhook_retry_waits)


def breaker_policy(s: Settings) -> policy.BreakerPolicy:
    """The endpoint circuit breaker of these settings."""
    return policy.BreakerPolicy(
        threshold=s.webhook_breaker_threshold,
        base_seconds=s.webhook_breaker_base_seconds,
        cap_seconds=s.webhook_breaker_cap_seconds,
        disable_after=timedelta(hours=s.webhook_disable_after_hours),
    )


def _health(row: Row) -> policy.Health:
    return policy.Health(
        enabled=row["enabled"],
        consecutive_failures=row["consecutive_failures"],
        failing_since=row["failing_since"],
        circuit_open_until=row["circuit_open_until"],
        disabled_reason=row["disabled_reason"],
        last_error=row["last_error"],
        last_success_at=row["last_success_at"],
        last_failure_at=row["last_failure_at"],
    )


class WebhookDelivery:
    """One delivery process; several may run at once (claims and bounds are in PostgreSQL)."""

    name = "webhook-delivery"

    def __init__(
        self,
        settings: Settings,
        pool: ConnectionPool[Conn],
        sender: Sender | None = None,
        config: DeliveryConfig | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.config = config or DeliveryConfig.from_settings(settings)
        self.sender = sender or Sender(settings)
        self.retry = retry_schedule(settings)
        self._box = settings.webhook_secret_box()
        self._key_ids = self._box.key_ids if self._box is not None else ()
        self.breaker = breaker_policy(settings)
        self._rng = rng or random.Random()
        self._executor = ThreadPoolExecutor(
            max_workers=self.config.max_in_flight, thread_name_prefix="webhook-send"
        )
        self._done: queue.SimpleQueue[AttemptResult] = queue.SimpleQueue()
        self._in_flight = 0
        # the attempts sent and not yet recorded: message id -> (claim token, when its
        # claim was last taken or extended, monotonic seconds)
        self._running: dict[UUID, tuple[UUID, float]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._listener: threading.Thread | None = None
        self._last_prune = 0.0

    # --- one pass ------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Attempts sent and not yet finished in this process."""
        with self._lock:
            return self._in_flight

    def run_once(self) -> dict[str, int]:
        """Record finished attempts, keep the claims of running ones, claim and start due
        ones; returns counts of the pass (``claimed``, ``extended``, ``delivered``,
        ``retrying``, ``failed``, ``disabled``, ``pruned``)."""
        results = self._drain()
        free = min(self.config.batch_size, self.config.max_in_flight - self.in_flight)
        counts = {"claimed": 0, "delivered": 0, "retrying": 0, "failed": 0, "disabled": 0}
        token = uuid4()
        extend = self._claims_to_extend()
        try:
            # Pipeline mode: the statements of a pass go out without waiting for each other's
            # answers; only the endpoint lock (its rows feed the policy) and the claim wait.
            # Three round trips per pass instead of seven.
            with self.pool.connection() as conn, conn.pipeline(), conn.transaction():
                message_store.pass_begin(conn)
                if results:
                    counts.update(self._record(conn, results))
                if extend:
                    message_store.extend_claims(
                        conn,
                        message_ids=[mid for mid, _ in extend],
                        claim_tokens=[claim for _, claim in extend],
                        claim_seconds=self.config.claim_seconds,
                        within_seconds=self.config.claim_seconds * 2 / 3,
                    )
                claiming = free > 0 and bool(self._key_ids) and not self._stopping.is_set()
                if claiming:
                    message_store.claim_lock(conn)
                rows = (
                    message_store.claim_due(
                        conn,
                        claim_token=token,
                        limit=free,
                        claim_seconds=self.config.claim_seconds,
                        per_endpoint=self.config.per_endpoint,
                        per_tenant=self.config.per_tenant,
                        threshold=self.breaker.threshold,
                        key_ids=self._key_ids,
                    )
                    if claiming
                    else []
                )
        except BaseException:
            for r in results:  # recorded next pass (the claims still hold their messages)
                self._done.put(r)
            raise
        for row in rows:
            self._start(self._delivery(row, token))
        counts["claimed"] = len(rows)
        counts["extended"] = len(extend)
        counts["pruned"] = self._maybe_prune()
        return counts

    def _claims_to_extend(self) -> list[tuple[UUID, UUID]]:
        """``(message id, claim token)`` of the running attempts whose claim was taken (or
        last extended) a third of ``WEBHOOK_CLAIM_SECONDS`` ago or more; marked extended.
        An attempt ends by its deadline, well before that, so this is usually empty: it
        guards against an attempt stalled past its deadline (a blocked thread, a paused
        process) being claimed and sent again beside itself."""
        now = time.monotonic()
        due_after = self.config.claim_seconds / 3
        with self._lock:
            out = [
                (mid, claim)
                for mid, (claim, since) in self._running.items()
                if now - since >= due_after
            ]
            for mid, claim in out:
                self._running[mid] = (claim, now)
        return out

    def _delivery(self, row: Row, token: UUID) -> Delivery:
        # claimed only if this process holds the secrets' keys (claim_due's key_ids)
        box = encryption.require(self._box)
        secrets: tuple[str, ...] = (box.open(row["secret_ciphertext"], row["secret_key_id"]),)
        if row["previous_secret_ciphertext"]:
            previous = box.open(row["previous_secret_ciphertext"], row["previous_secret_key_id"])
            secrets += (previous,)
        return Delivery(
            message_id=row["id"],
            webhook_id=events.webhook_id(row["id"]),
            endpoint_id=row["endpoint_id"],
            url=row["url"],
            body=events.render_body(
                row["event_type"], row["occurred_at"], row["data"], self.config.base_url
            ),
            signing_secrets=secrets,
            attempt=row["attempts"],
            budget_used=row["budget_used"],
            redelivery=row["redelivery"],
            claim_token=token,
            event_type=row["event_type"],
            created_at=row["created_at"],
        )

    def _start(self, delivery: Delivery) -> None:
        with self._lock:
            self._in_flight += 1
            self._running[delivery.message_id] = (delivery.claim_token, time.monotonic())
        self._executor.submit(self._attempt, delivery)

    def _attempt(self, delivery: Delivery) -> None:
        try:
            result = self.sender.send(delivery)
        except Exception as exc:  # a bug, not the network: still recorded, still retried
            log.exception("webhook attempt crashed", extra={"message_id": delivery.webhook_id})
            result = AttemptResult(
                delivery=delivery,
                started_at=delivery.created_at,
                outcome=policy.CONNECTION_ERROR,
                status_code=None,
                latency_ms=0.0,
                address=None,
                error=f"internal error: {type(exc).__name__}",
                retry_after=None,
                signatures=len(delivery.signing_secrets),
            )
        metrics.WEBHOOK_DELIVERIES.labels(result.outcome, delivery.event_type).inc()
        metrics.WEBHOOK_ATTEMPT_SECONDS.labels(result.outcome).observe(result.latency_ms / 1000)
        if result.outcome == policy.DELIVERED:
            done_at = result.started_at + timedelta(milliseconds=result.latency_ms)
            lag = (done_at - delivery.created_at).total_seconds()
            metrics.WEBHOOK_LAG.labels(delivery.event_type).observe(max(0.0, lag))
        self._done.put(result)
        with self._lock:
            self._in_flight -= 1
        self._wake.set()

    def _drain(self) -> list[AttemptResult]:
        out: list[AttemptResult] = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                break
        with self._lock:  # recorded in this pass: their claims end with it
            for r in out:
                if self._running.get(r.delivery.message_id, (None,))[0] == r.delivery.claim_token:
                    del self._running[r.delivery.message_id]
        return out

    def _record(self, conn: Conn, results: list[AttemptResult]) -> dict[str, int]:
        ids = sorted({r.delivery.endpoint_id for r in results})
        locked = endpoint_store.endpoints_lock(conn, ids=ids)
        if not locked:
            return {}
        now = locked[0]["now"]
        before = {row["id"]: _health(row) for row in locked}
        health = dict(before)
        columns: dict[str, list[Any]] = {k: [] for k in message_store.RECORD_KEYS}
        counts = {"delivered": 0, "retrying": 0, "failed": 0}
        for r in sorted(results, key=lambda x: x.started_at):
            d = r.delivery
            current = health.get(d.endpoint_id)
            if current is None:  # the endpoint was deleted, with its messages
                continue
            health[d.endpoint_id] = self.breaker.after_attempt(
                current,
                outcome=r.outcome,
                started_at=r.started_at,
                now=now,
                error=r.error,
                rng=self._rng,
            )
            delay: float | None = 0.0
            refund = False
            if r.outcome == policy.DELIVERED:
                status = "delivered"
            elif r.outcome == policy.GONE:
                status, delay = "failed", None
            elif self.breaker.is_half_open(current):
                # a probe of an open circuit: the endpoint is down, the message waits for it
                # without using up its attempts (it goes first once the circuit closes)
                status, refund = "pending", True
            else:
                delay = self.retry.next_delay(d.budget_used, r.retry_after, self._rng)
                status = "failed" if delay is None else "pending"
            counts[
                {"delivered": "delivered", "pending": "retrying", "failed": "failed"}[status]
            ] += 1
            for key, value in (
                ("message_ids", d.message_id),
                ("claim_tokens", d.claim_token),
                ("endpoint_ids", d.endpoint_id),
                ("attempts", d.attempt),
                ("redelivery", d.redelivery),
                ("started_at", r.started_at),
                ("outcomes", r.outcome),
                ("status_codes", r.status_code),
                ("latency_ms", round(r.latency_ms, 3)),
                ("addresses", r.address),
                ("signatures", r.signatures),
                ("errors", r.error),
                ("next_status", status),
                ("delay_seconds", delay or 0.0),
                ("refund", refund),
            ):
                columns[key].append(value)
            if status == "failed":
                metrics.WEBHOOK_MESSAGES_FAILED.inc()
                log.warning(
                    "webhook message failed for good",
                    extra={
                        "message_id": d.webhook_id,
                        "endpoint_id": str(d.endpoint_id),
                        "attempts": d.attempt,
                        "outcome": r.outcome,
                        "error": r.error,
                    },
                )
        changed = [
            {
                "id": eid,
                "enabled": h.enabled,
                "failures": h.consecutive_failures,
                "failing_since": h.failing_since,
                "open_until": h.circuit_open_until,
                "disabled_reason": h.disabled_reason,
                "last_error": h.last_error,
                "last_success_at": h.last_success_at,
                "last_failure_at": h.last_failure_at,
            }
            for eid, h in health.items()
            if h != before[eid]
        ]
        endpoint_store.endpoints_set_health(conn, changed)
        message_store.record_attempts(conn, columns)
        disabled = 0
        for eid in (c["id"] for c in changed):
            old, new = before[eid], health[eid]
            if old.enabled and not new.enabled:
                disabled += 1
                reason = "gone" if "410" in (new.disabled_reason or "") else "failing"
                metrics.WEBHOOK_ENDPOINTS_DISABLED.labels(reason).inc()
                log.warning(
                    "webhook endpoint disabled",
                    extra={"endpoint_id": str(eid), "reason": new.disabled_reason},
                )
            elif new.circuit_open_until and not old.circuit_open_until:
                log.info(
                    "webhook endpoint circuit opened",
                    extra={
                        "endpoint_id": str(eid),
                        "failures": new.consecutive_failures,
                        "until": new.circuit_open_until.isoformat(),
                    },
                )
        return {**counts, "disabled": disabled}

    def _maybe_prune(self) -> int:
        if time.monotonic() - self._last_prune < self.config.hygiene_seconds:
            return 0
        self._last_prune = time.monotonic()
        with self.pool.connection() as conn:
            return message_store.prune(
                conn, retention_seconds=self.config.retention_seconds, limit=PRUNE_BATCH
            )

    # --- waiting for work ------------------------------------------------------------------

    def next_wait(self, counts: dict[str, int], interval: float) -> float:
        """0 when finished attempts wait to be recorded or a full batch was claimed (more
        may be due); else ``interval`` (``WEBHOOK_POLL_SECONDS``): retries that come due
        are found by that poll, new messages by their NOTIFY."""
        if not self._done.empty():
            return 0.0
        if counts.get("claimed", 0) >= self.config.batch_size:
            return 0.0
        return interval

    def idle(self, timeout: float, stop: threading.Event) -> None:
        """Wait for a NOTIFY, a finished attempt, or ``timeout`` seconds."""
        self._ensure_listener()
        deadline = time.monotonic() + timeout
        while not stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            if self._wake.wait(min(remaining, 0.5)):
                self._wake.clear()
                return

    def _ensure_listener(self) -> None:
        if self._listener is None or not self._listener.is_alive():
            self._listener = threading.Thread(
                target=self._listen, name="webhook-listen", daemon=True
            )
            self._listener.start()

    def _listen(self) -> None:
        while not self._stopping.is_set():
            try:
                with connect(
                    self.settings, "exports-webhook-listen", autocommit=True, direct=True
                ) as conn:
                    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    self._wake.set()  # messages may have arrived while not listening
                    while not self._stopping.is_set():
                        for _ in conn.notifies(timeout=0.5, stop_after=1):
                            self._wake.set()
            except psycopg.Error as exc:
                log.warning("LISTEN connection lost; polling", extra={"error": type(exc).__name__})
                self._stopping.wait(1.0)

    # --- shutdown ----------------------------------------------------------------------------

    def close(self, timeout: float | None = None) -> int:
        """Stop claiming, let the attempts in flight finish (each is bounded by
        ``WEBHOOK_TIMEOUT_SECONDS``), record them, and release the listener and the
        connections. Returns how many attempts were recorded at shutdown."""
        self._stopping.set()
        self._executor.shutdown(wait=True)
        recorded = 0
        results = self._drain()
        if results:
            try:
                with transaction(self.pool, timeout=timeout) as conn:
                    self._record(conn, results)
                recorded = len(results)
            except Exception:
                log.exception(
                    "could not record the last attempts; they are sent again after the claim "
                    "expires",
                    extra={"attempts": len(results)},
                )
        if self._listener is not None:
            self._listener.join(2.0)
        self.sender.close()
        return recorded
