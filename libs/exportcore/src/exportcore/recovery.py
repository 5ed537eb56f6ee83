"""The recovery-scanner: every failure ends in a correct, visible, repairable state.

Each pass applies these rules, each in its own short transaction over a bounded batch
locked with ``FOR UPDATE SKIP LOCKED`` (so several scanners are safe), and each change
writes its history event in the same statement (docs/architecture.md, "Retries, leases and
recovery"; every transition with its statement: "State machine"):

- ``running`` with an expired lease → ``queued`` with a durable backoff and a new outbox
  event available at that time; or ``cancelled`` when a cancel was requested; or
  ``failed`` + dead letter when attempts or the deadline are exhausted. A lease that has
  not expired is never touched.
- ``queued`` with a cancel request → ``cancelled``.
- ``queued`` past its deadline or out of attempts → ``failed`` + dead letter.
- ``queued``, due, no pending outbox event, last dispatched (or created) longer ago than
  the dispatch threshold → a new outbox event; attempts unchanged.
- every ``admission_reconcile_seconds``: the admission counters are reconciled with the
  rows (drift only comes from writes outside the admission path).

Every ``hygiene_interval_seconds`` it also deletes orphan artifacts (written under a lease
that did not win) older than a grace period, and prunes terminal jobs (with their history,
snapshot and files), sent outbox events and expired idempotency keys past their retention,
and superseded note versions that no job may still render (:mod:`exportcore.note_versions`).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import Any
from uuid import UUID

from psycopg_pool import ConnectionPool

from exportcore import metrics, telemetry
from exportcore.artifacts import ArtifactStore
from exportcore.db import Conn, transaction
from exportcore.note_versions import VersionPruner
from exportcore.retry import RetryPolicy
from exportcore.settings import Settings
from exportcore.store import admission as admission_store
from exportcore.store import checkpoints as checkpoint_store
from exportcore.store import idempotency_keys as idempotency_store
from exportcore.store import jobs as job_store
from exportcore.store import operator_actions as action_store
from exportcore.store import outbox as outbox_store
from exportcore.store.jobs import JobRow
from exportcore.transitions import settle

log = logging.getLogger(__name__)

RULES = (
    "expired_requeued",
    "expired_failed",
    "expired_cancelled",
    "queued_cancelled",
    "queued_failed",
    "redispatched",
)
HYGIENE = (
    "orphans_deleted",
    "jobs_pruned",
    "outbox_pruned",
    "idempotency_keys_pruned",
    "audit_pruned",
    "note_versions_pruned",
)


@dataclass(frozen=True)
class ScannerConfig:
    """Batch size per rule, dispatch threshold and hygiene timings (seconds unless named)."""

    batch_size: int
    dispatch_threshold_seconds: float
    dispatch_backoff_max_factor: int
    hygiene_interval_seconds: float
    orphan_grace_seconds: float
    job_retention_days: float
    outbox_retention_hours: float
    admission_reconcile_seconds: float = 60.0
    audit_retention_days: float = 400.0

    @classmethod
    def from_settings(cls, s: Settings) -> ScannerConfig:
        """Read the scanner settings."""
        return cls(
            batch_size=s.scanner_batch_size,
            dispatch_threshold_seconds=s.dispatch_threshold_seconds,
            dispatch_backoff_max_factor=s.dispatch_backoff_max_factor,
            hygiene_interval_seconds=s.hygiene_interval_seconds,
            orphan_grace_seconds=s.orphan_grace_seconds,
            job_retention_days=s.job_retention_days,
            outbox_retention_hours=s.outbox_retention_hours,
            admission_reconcile_seconds=s.admission_reconcile_seconds,
            audit_retention_days=s.audit_retention_days,
        )


class RecoveryScanner:
    """One scanner; ``run_once()`` returns counts per rule (and per hygiene task)."""

    name = "recovery-scanner"

    def __init__(
        self,
        settings: Settings,
        pool: ConnectionPool[Conn],
        store: ArtifactStore,
        config: ScannerConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.pool = pool
        self.store = store
        self.config = config or ScannerConfig.from_settings(settings)
        self.policy: RetryPolicy = settings.retry_policy()
        self.clock = clock
        self.rng = rng or random.Random()
        self._last_hygiene: float | None = None
        self._last_reconcile: float | None = None
        self.versions = VersionPruner(pool, self.config.batch_size * 10)

    # --- one pass ----------------------------------------------------------------------------

    def run_once(self) -> dict[str, int]:
        """Apply every rule once (hygiene when due); returns ``{rule: changed jobs}``."""
        counts = self.recover_expired_leases()
        counts["queued_cancelled"] = self.cancel_queued()
        counts["queued_failed"] = self.fail_queued()
        counts["redispatched"] = self.redispatch_lost()
        counts["admission_reconciled"] = self.reconcile_admission()
        now = self.clock()
        if (
            self._last_hygiene is None
            or now - self._last_hygiene >= self.config.hygiene_interval_seconds
        ):
            self._last_hygiene = now
            try:
                counts.update(self.hygiene())
            except Exception as exc:
                # Artifact storage can be down while the database is fine: the recovery
                # rules above must keep their pace, so hygiene waits for its next interval
                # instead of failing (and slowing down) every pass.
                log.warning(
                    "hygiene failed; retried at the next interval",
                    extra={"error": type(exc).__name__},
                    exc_info=True,
                )
        return counts

    def recover_expired_leases(self) -> dict[str, int]:
        """Requeue, fail or cancel running jobs whose lease expired (one batch), through the
        same transitions as the worker (:func:`exportcore.transitions.settle`)."""
        counts = {"expired_requeued": 0, "expired_failed": 0, "expired_cancelled": 0}
        with transaction(self.pool) as conn:  # the batch stays locked until COMMIT
            jobs = job_store.job_lock_lease_expired(conn, limit=self.config.batch_size)
            if not jobs:
                return counts
            decided = [(job, self.policy.decide_expired(_facts(job), self.rng)) for job in jobs]
            ends = settle(
                conn, decided, margin_seconds=self.policy.margin_seconds, expired_only=True
            )
        for end in ends:
            job, decision = end.job, end.decision
            if telemetry.enabled():
                with telemetry.span(
                    "exports.recovery.lease_expired",
                    parent=job.trace_context,
                    attributes={**telemetry.job_attributes(job), "action": decision.action},
                ):
                    pass
            if end.row is None:
                continue
            rule = _RULE_OF[end.result]
            counts[rule] += 1
            metrics.RECOVERY_ACTIONS.labels(rule).inc()
            if end.row.status in ("failed", "cancelled"):
                _observe_terminal(end.row)
            log.info(
                "expired lease recovered",
                extra={
                    "job_id": str(job.id),
                    "lease_token": str(job.lease_token),
                    "attempt": job.attempts,
                    "tenant_id": job.tenant_id,
                    "action": decision.action,
                    "code": decision.code,
                },
            )
        return counts

    def reconcile_admission(self) -> int:
        """Correct the admission counters to the rows when due (every
        ``admission_reconcile_seconds``); returns how many scopes had drifted."""
        now = self.clock()
        if (
            self._last_reconcile is not None
            and now - self._last_reconcile < self.config.admission_reconcile_seconds
        ):
            return 0
        self._last_reconcile = now
        with self.pool.connection() as conn:
            drift = admission_store.admission_reconcile(conn)
        if drift:
            log.warning(
                "admission counters drifted from the jobs; corrected",
                extra={"scopes": len(drift), "global_drift": drift.get("*", 0)},
            )
        return len(drift)

    def cancel_queued(self) -> int:
        """Cancel queued jobs with a cancel request (one batch)."""
        with self.pool.connection() as conn:
            rows = job_store.job_cancel_if_queued_many(conn, limit=self.config.batch_size)
        for row in rows:
            metrics.END_TO_END.labels(row["queue"], "cancelled").observe(row["age"])
        metrics.RECOVERY_ACTIONS.labels("queued_cancelled").inc(len(rows))
        return len(rows)

    def fail_queued(self) -> int:
        """Fail and dead-letter queued jobs past their deadline or attempts (one batch)."""
        with self.pool.connection() as conn:
            rows = job_store.job_fail_if_queued_exhausted_many(conn, limit=self.config.batch_size)
        for row in rows:
            log.info(
                "queued job failed", extra={"job_id": str(row["id"]), "code": row["error_code"]}
            )
        return len(rows)

    def redispatch_lost(self) -> int:
        """New outbox events for queued jobs whose message was lost (one batch)."""
        with self.pool.connection() as conn:
            rows = job_store.job_redispatch_if_lost_many(
                conn,
                threshold_seconds=self.config.dispatch_threshold_seconds,
                max_factor=self.config.dispatch_backoff_max_factor,
                limit=self.config.batch_size,
            )
        for row in rows:
            with telemetry.span(
                "exports.recovery.redispatch",
                parent=row["trace_context"],
                attributes={
                    "job_id": row["job_id"],
                    "message_id": row["message_id"],
                    "queue": row["queue"],
                    "tenant_id": row["tenant_id"],
                    "attempt": row["attempts"],
                },
            ):
                log.info(
                    "lost dispatch: new outbox event",
                    extra={"job_id": str(row["job_id"]), "message_id": str(row["message_id"])},
                )
        metrics.RECOVERY_ACTIONS.labels("redispatched").inc(len(rows))
        return len(rows)

    # --- hygiene -----------------------------------------------------------------------------

    def hygiene(self) -> dict[str, int]:
        """Orphan artifacts, then pruning past retention."""
        return {
            "orphans_deleted": self.delete_orphans(),
            "jobs_pruned": self.prune_jobs(),
            "outbox_pruned": self.prune_outbox(),
            "idempotency_keys_pruned": self.prune_idempotency_keys(),
            "audit_pruned": self.prune_audit(),
            "note_versions_pruned": self.prune_note_versions(),
        }

    def delete_orphans(self) -> int:
        """Delete artifacts older than the grace period that no job publishes: files of a
        lease that did not win (a stale worker's output, a crashed worker's half-written
        file) or of a job that no longer exists. The current lease's file is kept, and so
        is the unfinished write a queued or running job's checkpoint holds (the next claim
        takes it over)."""
        cutoff = datetime.now(UTC) - timedelta(seconds=self.config.orphan_grace_seconds)
        deleted = 0
        keys = (key for key, _ in self.store.list_older_than(cutoff))
        for chunk in _chunks(keys, 500):
            parsed = {key: _key_parts(key) for key in chunk}
            with self.pool.connection() as conn:
                job_ids = sorted({p[0] for p in parsed.values()})
                owners = job_store.job_artifact_owners(conn, job_ids=job_ids)
                held = checkpoint_store.checkpoint_keys_in_use_many(conn, job_ids=job_ids)
            for key, (job_id, token) in parsed.items():
                job = owners.get(job_id)
                if key in held:
                    continue
                if job is not None and (
                    job["result_ref"] == key
                    or (job["status"] == "running" and job["lease_token"] == token)
                ):
                    continue
                if self.store.delete(key):
                    deleted += 1
                    log.info("orphan artifact deleted", extra={"job_id": str(job_id), "key": key})
        return deleted

    def prune_jobs(self) -> int:
        """Delete terminal jobs past retention (one batch), then their artifacts."""
        with self.pool.connection() as conn:
            rows = job_store.job_delete_terminal_before(
                conn, retention_days=self.config.job_retention_days, limit=self.config.batch_size
            )
        for row in rows:
            if row["result_ref"]:
                self.store.delete(row["result_ref"])
        return len(rows)

    def prune_outbox(self) -> int:
        """Delete sent outbox events past retention (one batch)."""
        with self.pool.connection() as conn:
            return outbox_store.outbox_delete_sent_before(
                conn,
                retention_seconds=self.config.outbox_retention_hours * 3600,
                limit=self.config.batch_size * 10,
            )

    def prune_idempotency_keys(self) -> int:
        """Delete expired Idempotency-Keys (one batch); they may be reused anyway."""
        with self.pool.connection() as conn:
            return idempotency_store.idempotency_key_delete_expired(
                conn, limit=self.config.batch_size * 10
            )

    def prune_audit(self) -> int:
        """Delete audit rows past ``AUDIT_RETENTION_DAYS`` (one batch; never the row of a
        bulk action still running)."""
        with self.pool.connection() as conn:
            return action_store.operator_action_delete_before(
                conn,
                retention_seconds=self.config.audit_retention_days * 86400,
                limit=self.config.batch_size * 10,
            )

    def prune_note_versions(self) -> int:
        """Delete superseded note versions no job may still render, one batch, after a
        grace period of one hygiene interval at least (:mod:`exportcore.note_versions`)."""
        return self.versions.run_once()

    # --- loop hooks ---------------------------------------------------------------------------

    def next_wait(self, counts: dict[str, int], interval: float) -> float:
        """0 when a rule filled its batch (more is waiting), else ``interval``."""
        expired = sum(counts.get(r, 0) for r in RULES if r.startswith("expired_"))
        others = (counts.get(r, 0) for r in RULES if not r.startswith("expired_"))
        if expired >= self.config.batch_size or any(n >= self.config.batch_size for n in others):
            return 0.0
        return interval

    def idle(self, timeout: float, stop: threading.Event) -> None:
        """Sleep until the next pass or a stop request."""
        stop.wait(timeout)


_RULE_OF = {
    "retry": "expired_requeued",
    "failed": "expired_failed",
    "cancelled": "expired_cancelled",
}


def _facts(job: JobRow) -> dict[str, Any]:
    """What ``RetryPolicy.decide_expired`` reads of a job."""
    return {
        "cancel_requested": job.cancel_requested,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "seconds_to_deadline": job.seconds_to_deadline,
    }


def _observe_terminal(row: JobRow) -> None:
    assert row.finished_at is not None
    metrics.END_TO_END.labels(row.queue, row.status).observe(
        (row.finished_at - row.created_at).total_seconds()
    )
    if row.status == "failed":
        metrics.DEAD_LETTERS.labels(row.error_code or "unknown").inc()


def _key_parts(key: str) -> tuple[UUID, UUID]:
    _, job, leaf = key.split("/")
    return UUID(job), UUID(leaf.split(".", 1)[0])


def _chunks(items: Iterator[str], size: int) -> Iterator[list[str]]:
    while chunk := list(islice(items, size)):
        yield chunk
