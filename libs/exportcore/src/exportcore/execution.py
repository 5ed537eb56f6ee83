"""Running one export: claim → render in chunks (keeping the lease) → write → finish.

The Celery task is a thin wrapper around :meth:`JobRunner.run`. No database transaction is
held while rendering or writing: each chunk read, renewal and transition is its own short
transaction (DESIGN.md invariant 13). Failures go through :mod:`exportcore.policy`.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg
from opentelemetry import context as otel_context
from psycopg_pool import ConnectionPool

from exportcore import faults, telemetry
from exportcore import metrics as m
from exportcore.artifacts import ArtifactStore, StoredArtifact, artifact_key
from exportcore.db import Conn, Row
from exportcore.domain import ExportFormat, new_id
from exportcore.policy import Decision, PermanentError, classify
from exportcore.render import ExportHeader, NoteRecord, make_renderer
from exportcore.settings import Settings
from exportcore.store import jobs as job_store

log = logging.getLogger(__name__)


class LeaseLost(Exception):
    """The worker no longer holds the job's lease (expired, taken over, cancelled, or past
    its deadline); it must stop and never publish."""


def classify_refusal(facts: Row | None) -> str:
    """Why a claim was refused, from ``job_claim_refusal``'s row.

    One of ``not_found``, ``terminal``, ``leased`` (running under a valid lease),
    ``lease_expired`` (running, awaiting recovery), ``cancel_requested``, ``past_deadline``,
    ``attempts_exhausted``, ``not_due``, or ``race`` when the job became claimable again.
    """
    if facts is None:
        return "not_found"
    status = facts["status"]
    if status in ("succeeded", "failed", "cancelled"):
        return "terminal"
    if status == "running":
        return "leased" if facts["lease_valid"] else "lease_expired"
    if facts["cancel_requested"]:
        return "cancel_requested"
    if facts["past_deadline"]:
        return "past_deadline"
    if facts["attempts"] >= facts["max_attempts"]:
        return "attempts_exhausted"
    if facts["not_due"]:
        return "not_due"
    return "race"


@dataclass(frozen=True)
class Outcome:
    """What one delivery of a job's message did.

    ``result`` is ``succeeded``; ``refused`` (claim refused, ``reason`` says why);
    ``retry`` (transient error, queued again); ``failed`` (dead letter); ``cancelled``;
    ``lease_lost`` (stopped without publishing: recovery owns the job now); or
    ``finish_refused`` (rendered, but a newer lease won).
    """

    result: str
    job_id: UUID
    reason: str | None = None
    attempt: int | None = None
    lease_token: UUID | None = None


class LeaseKeeper:
    """Keeps a lease while a job renders.

    The lease is renewed whenever a third of it has passed since the last renewal: between
    chunks by :meth:`check`, and by a heartbeat thread while one chunk takes long. A refused
    renewal (token lost, cancel requested, deadline passed) marks the lease lost; the next
    :meth:`check` raises ``LeaseLost``. ``clock`` returns monotonic seconds.
    """

    def __init__(
        self,
        pool: ConnectionPool[Conn],
        job_id: UUID,
        lease_token: UUID,
        lease_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pool = pool
        self.job_id = job_id
        self.lease_token = lease_token
        self.lease_seconds = lease_seconds
        self.clock = clock
        self.renewed_at = clock()
        self.progress = 0
        self.lost: str | None = None
        self._trace_context = otel_context.get_current()  # renewals from the heartbeat thread
        self._lock = threading.Lock()

    def due(self) -> bool:
        """True when a third of the lease has passed since the last renewal."""
        return self.clock() - self.renewed_at >= self.lease_seconds / 3

    def renew(self) -> bool:
        """Renew now; False (and ``lost`` set) when the renewal was refused."""
        with self._lock:
            if self.lost:
                return False
            started = self.clock()
            token = otel_context.attach(self._trace_context)
            try:
                with (
                    telemetry.span(
                        "exports.renew_lease",
                        attributes={
                            "job_id": self.job_id,
                            "lease_token": self.lease_token,
                            "progress": self.progress,
                        },
                    ) as current,
                    self.pool.connection() as conn,
                ):
                    row = job_store.job_renew_lease(
                        conn,
                        job_id=self.job_id,
                        lease_token=self.lease_token,
                        lease_seconds=self.lease_seconds,
                        progress=self.progress,
                    )
                    current.set_attribute("renewed", row is not None)
            finally:
                otel_context.detach(token)
            if row is None:
                self.lost = f"lease {self.lease_token} of job {self.job_id} could not be renewed"
                return False
            self.renewed_at = started
            return True

    def check(self, progress: int) -> None:
        """Between chunks: record progress, renew if due; raises ``LeaseLost``."""
        self.progress = progress
        if self.lost or (self.due() and not self.renew()):
            raise LeaseLost(self.lost)

    def start(self) -> None:
        """Have the process's heartbeat thread renew this lease while a chunk takes long."""
        _HEARTBEAT.add(self)

    def stop(self) -> None:
        """Stop renewing from the heartbeat thread (waits for a renewal in progress)."""
        _HEARTBEAT.remove(self)
        with self._lock:  # a renewal started before removal has finished
            pass


class _Heartbeat:
    """One thread per process renews every registered lease that is due, so no thread is
    started per job. Re-created after ``fork`` (Celery prefork children)."""

    def __init__(self) -> None:
        self._keepers: set[LeaseKeeper] = set()
        self._lock = threading.Lock()
        self._pid: int | None = None

    def add(self, keeper: LeaseKeeper) -> None:
        with self._lock:
            self._keepers.add(keeper)
            if self._pid != os.getpid():
                self._pid = os.getpid()
                threading.Thread(target=self._run, name="lease-heartbeat", daemon=True).start()

    def remove(self, keeper: LeaseKeeper) -> None:
        with self._lock:
            self._keepers.discard(keeper)

    def _run(self) -> None:
        while True:
            with self._lock:
                keepers = list(self._keepers)
            period = min((k.lease_seconds / 6 for k in keepers), default=0.5)
            time.sleep(max(0.05, min(period, 0.5)))
            for keeper in keepers:
                if keeper.lost or not keeper.due():
                    continue
                try:
                    keeper.renew()
                except psycopg.Error as exc:  # the next beat tries again; expiry is the limit
                    log.warning(
                        "lease renewal failed",
                        extra={"job_id": str(keeper.job_id), "error": type(exc).__name__},
                    )


_HEARTBEAT = _Heartbeat()


class JobRunner:
    """Executes jobs for one worker process: owns nothing but references to shared parts."""

    def __init__(
        self,
        settings: Settings,
        pool: ConnectionPool[Conn],
        store: ArtifactStore,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.store = store
        self.clock = clock
        self.rng = rng or random.Random()
        self.policy = settings.retry_policy()

    def run(self, job_id: UUID, message_id: UUID | None) -> Outcome:
        """Handle one delivery of ``job_id``'s message; never raises for a refused claim.

        Raises only when the database is unreachable at claim time (the message is then
        redelivered or the job re-dispatched by the recovery-scanner).
        """
        faults.hit("worker.before_claim")
        with telemetry.span(
            "exports.claim", attributes={"job_id": job_id, "message_id": message_id}
        ) as current:
            job, facts = self._claim(job_id, message_id)
            if job is not None:
                telemetry.set_attributes(current, telemetry.job_attributes(job, message_id))
        if job is None:
            reason = classify_refusal(facts)
            current.set_attribute("refused", reason)
            queue = facts["queue"] if facts else ""
            m.CLAIMS.labels(_REFUSALS.get(reason, "refused_other"), queue).inc()
            log.info(
                "claim refused",
                extra={"job_id": str(job_id), "message_id": str(message_id), "reason": reason},
            )
            return Outcome("refused", job_id, reason=reason)

        ids = _log_ids(job, message_id)
        log.info("job claimed", extra=ids)
        _observe_claim(job)
        claimed_at = self.clock()
        outcome = self._attempt(job, ids, message_id, claimed_at)
        m.FINISHES.labels(outcome.result, job["queue"]).inc()
        m.RUN.labels(job["queue"], outcome.result).observe(max(0.0, self.clock() - claimed_at))
        return outcome

    def _attempt(
        self, job: Row, ids: dict[str, Any], message_id: UUID | None, claimed_at: float
    ) -> Outcome:
        """Render under a kept lease, then finish, retry, fail, cancel or stop."""
        keeper = LeaseKeeper(
            self.pool, job["id"], job["lease_token"], self.settings.lease_seconds, self.clock
        )
        keeper.start()
        try:
            with telemetry.span(
                "exports.render", attributes=telemetry.job_attributes(job, message_id)
            ) as render_span:
                artifact = self._render(job, keeper, render_span)
        except LeaseLost as exc:
            return self._stopped(job, ids, str(exc))
        except Exception as exc:
            failure = classify(exc)
            log.warning(
                "export attempt failed",
                extra={**ids, "error_code": failure.code, "error_kind": failure.kind},
                exc_info=failure.code == "internal_error",
            )
            seconds_left = job["seconds_to_deadline"] - (self.clock() - claimed_at)
            decision = self.policy.decide(
                failure,
                attempts=job["attempts"],
                max_attempts=job["max_attempts"],
                seconds_to_deadline=seconds_left,
                rng=self.rng,
            )
            return self._apply(job, ids, decision)
        finally:
            keeper.stop()
        return self._finish(job, ids, artifact)

    def _claim(self, job_id: UUID, message_id: UUID | None) -> tuple[Row | None, Row | None]:
        """The claim, and the facts explaining a refusal. The pool already replaces
        connections the server closed while idle (:func:`exportcore.db.make_pool`); one that
        breaks at the claim itself (the session ended between the pool's check and the
        statement) fails once and is discarded: the claim is tried once more on a fresh one
        rather than leaving the job to the lost-dispatch rule. (Had the broken attempt
        committed, the retry is refused as ``leased`` and the lease recovers it.)"""
        for attempt in (1, 2):
            try:
                with self.pool.connection() as conn:
                    job = job_store.job_claim(
                        conn,
                        job_id=job_id,
                        message_id=message_id,
                        lease_seconds=self.settings.lease_seconds,
                    )
                    facts = None if job else job_store.job_claim_refusal(conn, job_id=job_id)
                return job, facts
            except psycopg.OperationalError:
                if attempt == 2:
                    raise
                log.warning(
                    "database connection lost at claim; retrying once",
                    extra={"job_id": str(job_id)},
                )
        raise AssertionError("unreachable")

    # --- the three ends of an attempt ------------------------------------------------------

    def _finish(self, job: Row, ids: dict[str, Any], artifact: StoredArtifact) -> Outcome:
        faults.hit("worker.before_finish")
        with (
            telemetry.span(
                "exports.finish",
                attributes={**telemetry.job_attributes(job), "bytes": artifact.size},
            ) as current,
            self.pool.connection() as conn,
        ):
            done = job_store.job_finish_if_leased(
                conn,
                job_id=job["id"],
                lease_token=job["lease_token"],
                result_ref=artifact.ref,
                sha256=artifact.sha256,
                nbytes=artifact.size,
                rows=job["note_count"],
                etag=artifact.etag,
            )
            current.set_attribute("finished", done is not None)
        if done is not None:
            log.info("job succeeded", extra={**ids, "bytes": artifact.size})
            return self._outcome("succeeded", job, row=done)
        # A cancel, the deadline or a newer lease won: this artifact must never be served.
        # (It never is: only a recorded result_ref is. If storage refuses the delete now,
        # orphan cleanup removes it later.)
        try:
            self.store.delete(artifact.ref)
        except Exception as exc:
            log.warning(
                "could not delete the artifact of a refused finish",
                extra={**ids, "key": artifact.ref, "error": type(exc).__name__},
            )
        stopped = self._stopped(job, ids, "finish refused")
        if stopped.result != "lease_lost":
            return stopped
        return self._outcome("finish_refused", job)

    def _stopped(self, job: Row, ids: dict[str, Any], why: str) -> Outcome:
        """The lease could not be kept: finalise a requested cancel or a passed deadline
        while we still hold the token; otherwise recovery owns the job."""
        with self.pool.connection() as conn:
            cancelled = job_store.job_cancel_if_leased(
                conn, job_id=job["id"], lease_token=job["lease_token"]
            )
            if cancelled is None and job_store.job_past_deadline(conn, job_id=job["id"]):
                failed = job_store.job_fail_if_leased(
                    conn,
                    job_id=job["id"],
                    lease_token=job["lease_token"],
                    error_code="deadline_exceeded",
                    error_detail="the deadline passed while the export was running",
                )
                if failed is not None:
                    log.warning("deadline passed; job failed", extra=ids)
                    return self._outcome("failed", job, "deadline_exceeded", row=failed)
        if cancelled is not None:
            log.info("cancel honoured; job cancelled", extra=ids)
            return self._outcome("cancelled", job, row=cancelled)
        log.warning("lease lost; stopped without publishing", extra={**ids, "why": why})
        return self._outcome("lease_lost", job)

    def _apply(self, job: Row, ids: dict[str, Any], decision: Decision) -> Outcome:
        with self.pool.connection() as conn:
            if decision.action == "retry":
                row = job_store.job_requeue_if_leased(
                    conn,
                    job_id=job["id"],
                    lease_token=job["lease_token"],
                    message_id=new_id(),
                    delay_seconds=decision.delay,
                    margin_seconds=self.policy.margin_seconds,
                    error_code=decision.code,
                    error_detail=decision.detail,
                )
                if row is not None:
                    log.info(
                        "job will be retried",
                        extra={
                            **ids,
                            "error_code": decision.code,
                            "delay": round(decision.delay, 3),
                        },
                    )
                    m.RETRIES.labels(decision.code, job["queue"]).inc()
                    return self._outcome("retry", job, decision.code)
                # No attempt or time left after all (or a cancel): fall through to fail.
                decision = Decision("fail", decision.code, decision.detail)
            cancelled = job_store.job_cancel_if_leased(
                conn, job_id=job["id"], lease_token=job["lease_token"]
            )
            if cancelled is not None:
                return self._outcome("cancelled", job, row=cancelled)
            failed = job_store.job_fail_if_leased(
                conn,
                job_id=job["id"],
                lease_token=job["lease_token"],
                error_code=decision.code,
                error_detail=decision.detail,
            )
        if failed is None:
            log.warning("lease lost before the failure was recorded", extra=ids)
            return self._outcome("lease_lost", job)
        log.warning("job failed; dead-lettered", extra={**ids, "error_code": decision.code})
        return self._outcome("failed", job, decision.code, row=failed)

    def _outcome(
        self, result: str, job: Row, reason: str | None = None, row: Row | None = None
    ) -> Outcome:
        """The end of a claimed attempt; ``row`` is the job after a terminal change (its
        end-to-end time and dead letter are recorded)."""
        queue = job["queue"]
        if row is not None and row["finished_at"] is not None:
            m.END_TO_END.labels(queue, row["status"]).observe(
                (row["finished_at"] - row["created_at"]).total_seconds()
            )
            if row["status"] == "failed":
                m.DEAD_LETTERS.labels(row["error_code"] or "unknown").inc()
        return Outcome(
            result,
            job["id"],
            reason=reason,
            attempt=job["attempts"],
            lease_token=job["lease_token"],
        )

    # --- rendering ---------------------------------------------------------------------------

    def _render(self, job: Row, keeper: LeaseKeeper, current: Any) -> StoredArtifact:
        fmt = ExportFormat(job["format"])
        key = artifact_key(job["tenant_id"], job["id"], job["lease_token"], fmt.extension)
        chunk_size = self.settings.render_chunk_size
        with self.store.open_writer(key) as out:
            renderer = make_renderer(fmt, out)
            renderer.begin(ExportHeader.of_job(job))
            after, chunks = 0, 0
            while True:
                with self.pool.connection() as conn:
                    rows = job_store.job_items_chunk(
                        conn,
                        job_id=job["id"],
                        after=after,
                        limit=chunk_size,
                        max_bytes=self.settings.render_chunk_bytes,
                    )
                if not rows:
                    break
                faults.hit("render.chunk")
                renderer.add([NoteRecord.from_row(r) for r in rows])
                chunks += 1
                after = rows[-1]["ordinal"]
                keeper.check(progress=renderer.rows)
                if len(rows) == rows[0]["window_rows"] < chunk_size:
                    break  # the window reached the end: no empty read to find it
            if renderer.rows != job["note_count"]:
                raise PermanentError(
                    "invalid_snapshot",
                    f"the snapshot holds {renderer.rows} notes, the job {job['note_count']}",
                )
            renderer.end()
            current.set_attribute("chunks", chunks)
            current.set_attribute("rows", renderer.rows)
            faults.hit("artifact.commit")
            # Last check, right before the artifact becomes visible: a lost lease leaves
            # nothing (the writer aborts: temp file removed, multipart upload aborted).
            keeper.check(progress=renderer.rows)
            return out.commit()


_REFUSALS = {
    "not_due": "refused_not_due",
    "terminal": "refused_terminal",
    "leased": "refused_leased",
}


def _observe_claim(job: Row) -> None:
    """Count the claim; pickup latency (first claim) and recovery duration (after a
    recovery), from the database's own timestamps."""
    claimed = job["updated_at"]
    if job["attempts"] == 1:
        m.PICKUP.labels(job["queue"]).observe(
            max(0.0, (claimed - job["created_at"]).total_seconds())
        )
    if job["recovery_kind"] and job["recovery_started_at"]:
        m.RECOVERY.labels(job["recovery_kind"]).observe(
            max(0.0, (claimed - job["recovery_started_at"]).total_seconds())
        )
    m.CLAIMS.labels("claimed", job["queue"]).inc()


def _log_ids(job: Row, message_id: UUID | None) -> dict[str, Any]:
    return {
        "job_id": str(job["id"]),
        "message_id": str(message_id) if message_id else None,
        "lease_token": str(job["lease_token"]),
        "attempt": job["attempts"],
        "queue": job["queue"],
        "tenant_id": job["tenant_id"],
    }
