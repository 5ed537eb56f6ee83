"""Running exports: claim a batch → render each in chunks (keeping its lease) → write → finish.

The Celery task is a thin wrapper around :meth:`JobRunner.run`. No database transaction is
held while rendering or writing: each chunk read, renewal and transition is its own short
transaction (docs/architecture.md INV-13 no-transaction-across-io). Every claimed lease is
kept by :mod:`exportcore.lease_renewal`; a failure is classified by :mod:`exportcore.failures`
and retried or failed by the retry policy (:mod:`exportcore.retry`).
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg
from opentelemetry.trace import SpanKind
from psycopg_pool import ConnectionPool

from exportcore import encryption, faults, telemetry
from exportcore import metrics as m
from exportcore.artifacts import ArtifactStore, ArtifactWriter, StoredArtifact, artifact_key
from exportcore.checkpoints import Checkpointer
from exportcore.claims import Claimed, claim_delivery
from exportcore.db import DATABASE_UNAVAILABLE, Conn, Row, retry_rolled_back
from exportcore.deadlines import Deadline, statement_timeout
from exportcore.domain import ExportFormat
from exportcore.downstream import NOTES_SOURCE, DownstreamLimiter
from exportcore.encryption import AgeSink
from exportcore.failures import PermanentError, classify
from exportcore.lease_renewal import LeaseKeeper, LeaseLost
from exportcore.manifests import manifest_sha256
from exportcore.render import ExportHeader, NoteRecord, Renderer, make_renderer
from exportcore.retry import Decision
from exportcore.settings import Settings
from exportcore.store import envelopes as envelope_store
from exportcore.store import jobs as job_store
from exportcore.store.jobs import Finish, JobRow
from exportcore.store.manifests import record_manifests
from exportcore.transitions import settle

log = logging.getLogger(__name__)


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
    ``lease_lost`` (stopped without publishing: recovery owns the job now);
    ``finish_refused`` (rendered, but a newer lease won); or ``unknown`` (the database
    became unreachable at the finish or while recording the attempt's end, as during a
    failover: whether it committed is unknown, and the job is left to its lease).

    ``attempt`` and ``lease_token`` are those of the execution this delivery started (a new
    attempt, a fresh token); for ``refused``, those the job had when the claim was refused
    (the execution a redelivered or duplicate message repeats; None for an unknown job or
    one never claimed). The worker's per-message log line carries them for every job, so a
    redelivery (refused, same attempt and token) is told from a re-execution (a new attempt
    and token) at the default level.
    """

    result: str
    job_id: UUID
    reason: str | None = None
    attempt: int | None = None
    lease_token: UUID | None = None


@dataclass
class _Attempt:
    """One claimed job of a delivered batch while it is worked on."""

    job: JobRow
    message_id: UUID | None
    keeper: LeaseKeeper
    claimed_at: float
    first_chunk: list[Row]
    writer: ArtifactWriter | None = None
    outcome: Outcome | None = None
    trace: Any = None  # the context of the job's claim span (tracing on), parent of the rest
    checkpointer: Checkpointer | None = None
    manifest: Renderer | None = None
    recipients: tuple[str, ...] | Exception = ()
    """The age recipients the artifact is encrypted to (none: plain), or the error that
    kept them from being read (the render then fails with it: never plain by default)."""
    envelope: tuple[dict[str, Any], dict[str, str] | None] | None = None
    """An encrypted artifact's envelope and its signature, recorded with the finish."""

    def ids(self) -> dict[str, Any]:
        """The ids every log line of this attempt carries."""
        return _log_ids(self.job, self.message_id)


class JobRunner:
    """Executes jobs for one worker process: owns nothing but references to shared parts.

    A delivery is one message of ``(job id, outbox event id)`` pairs (one pair since
    messages carry one job); its claim on ``exports.fast`` takes the due small exports of the
    outbox beside it, up to ``WORKER_CLAIM_JOBS`` (:mod:`exportcore.claims`): one job at low
    load, a batch under a backlog. The batch is claimed in one transaction with the first
    chunk of every snapshot, each job rendered on its own (a failure or a lost
    lease of one never touches the others), the artifacts of the jobs rendered so far made
    durable together (overlapping fsyncs), and finished in one statement with a per-row
    compare-and-set. Every claimed lease is kept by the renewal thread until its job is settled,
    so a job waiting behind a slow neighbour never loses its lease, and finished work is
    committed at least every ``WORKER_BATCH_FLUSH_SECONDS``.
    """

    def __init__(
        self,
        settings: Settings,
        pool: ConnectionPool[Conn],
        store: ArtifactStore,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        downstream: DownstreamLimiter | None = None,
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.store = store
        self.clock = clock
        self.rng = rng or random.Random()
        self.policy = settings.retry_policy()
        self.downstream = downstream  # the deployment's notes-source limit (exportcore.downstream)
        self.signer = settings.manifest_signer()

    def run(self, job_id: UUID, message_id: UUID | None, queue: str | None = None) -> Outcome:
        """Handle one delivery of ``job_id``'s message (:meth:`run_batch` of one); the
        outcome of that job (the jobs its claim took beside it are handled too)."""
        return self.run_batch([(job_id, message_id)], queue=queue, carrier=message_id)[0]

    def run_batch(
        self,
        deliveries: Sequence[tuple[UUID, UUID | None]],
        queue: str | None = None,
        carrier: UUID | None = None,
    ) -> list[Outcome]:
        """Handle one delivered message of ``queue`` (``carrier``: its task id): its
        ``(job id, outbox event id)`` pairs and, on ``exports.fast``, the due jobs its claim
        takes from the outbox beside them (:mod:`exportcore.claims`). Returns one outcome
        per pair, in the order given, then one per taken job. Never raises for a refused
        claim.

        Raises only when the database is unreachable at claim time (the message is then
        redelivered or its jobs re-dispatched by the recovery-scanner).
        """
        deliveries = [(_uuid(job_id), _uuid(message_id)) for job_id, message_id in deliveries]
        job_ids = [job_id for job_id, _ in deliveries]
        faults.hit("worker.before_claim", subjects=job_ids)
        claim_ns = time.time_ns()
        claimed, facts = self._claim(deliveries, queue, _uuid(carrier))
        by_id = {job.id: job for job in claimed.jobs}
        messages: dict[UUID, UUID | None] = dict(deliveries)
        messages.update({job_id: event["id"] for job_id, event in claimed.taken.items()})
        outcomes: dict[UUID, Outcome] = {}
        for job_id in job_ids:
            if job_id not in by_id and job_id not in outcomes:
                outcomes[job_id] = self._refused(job_id, messages[job_id], facts.get(job_id))
        if claimed.jobs:
            _histogram(m.CLAIM_BATCH, claimed.jobs[0].queue).observe(len(claimed.jobs))
            for attempt in self._work(claimed, messages, _uuid(carrier), claim_ns):
                assert attempt.outcome is not None
                outcomes[attempt.job.id] = attempt.outcome
        carried = set(job_ids)
        result = [outcomes[job_id] for job_id in job_ids] + [
            outcomes[job_id] for job_id in claimed.taken if job_id not in carried
        ]
        if log.isEnabledFor(logging.INFO):
            _log_batch(result, queue, carrier, len(claimed.taken), claim_ns)
        return result

    # --- claim -----------------------------------------------------------------------------

    def _claim(
        self,
        deliveries: Sequence[tuple[UUID, UUID | None]],
        queue: str | None,
        carrier: UUID | None,
    ) -> tuple[Claimed, dict[UUID, Row]]:
        """The claim with the first snapshot chunk of every claimed job (one transaction,
        one round trip: :func:`exportcore.claims.claim_delivery`), and the facts explaining
        refusals. The pool already replaces connections the server closed while idle
        (:func:`exportcore.db.make_pool`); one that breaks at the claim itself (the session
        ended between the pool's check and the statement) fails once and is discarded: the
        claim is tried once more on a fresh one rather than leaving the jobs to the
        lost-dispatch rule. (Had the broken attempt committed, the retry is refused as
        ``leased`` and the lease recovers them.)"""
        for attempt in (1, 2):
            try:
                with self.pool.connection() as conn:
                    claimed = claim_delivery(
                        conn,
                        self.settings,
                        job_ids=[job_id for job_id, _ in deliveries],
                        message_ids=[message_id for _, message_id in deliveries],
                        queue=queue,
                        carrier=carrier,
                    )
                    refused = {job_id for job_id, _ in deliveries} - {
                        job.id for job in claimed.jobs
                    }
                    facts = (
                        job_store.job_claim_refusal_many(conn, job_ids=sorted(refused))
                        if refused
                        else {}
                    )
                return claimed, facts
            except psycopg.OperationalError:
                if attempt == 2:
                    raise
                log.warning(
                    "database connection lost at claim; retrying once",
                    extra={"jobs": len(deliveries), "job_id": str(deliveries[0][0])},
                )
        raise AssertionError("unreachable")

    def _refused(self, job_id: UUID, message_id: UUID | None, facts: Row | None) -> Outcome:
        reason = classify_refusal(facts)
        queue = facts["queue"] if facts else ""
        _counter(m.CLAIMS, _REFUSALS.get(reason, "refused_other"), queue).inc()
        # the execution this delivery repeats: the job's attempt and lease token now
        attempt = facts["attempts"] if facts else None
        token = facts["lease_token"] if facts else None
        log.info(
            "claim refused",
            extra={
                "job_id": str(job_id),
                "message_id": str(message_id),
                "reason": reason,
                "attempt": attempt,
                "lease_token": str(token) if token else None,
            },
        )
        return Outcome("refused", job_id, reason=reason, attempt=attempt, lease_token=token)

    # --- the batch -------------------------------------------------------------------------

    def _work(
        self,
        claimed: Claimed,
        messages: dict[UUID, UUID | None],
        carrier: UUID | None,
        claim_ns: int,
    ) -> list[_Attempt]:
        """Render, commit and finish the claimed jobs (with the first snapshot chunk of
        each, read with the claim); every attempt ends with an outcome."""
        now = self.clock()
        claim_end = time.time_ns()
        attempts: list[_Attempt] = []
        for job in claimed.jobs:
            trace = (
                self._trace_claim(job, messages.get(job.id), claimed, carrier, claim_ns, claim_end)
                if telemetry.enabled()
                else None
            )
            keeper = LeaseKeeper(
                self.pool, job.id, job.token, self.settings.lease_seconds, self.clock, trace
            )
            attempts.append(
                _Attempt(
                    job,
                    messages.get(job.id),
                    keeper,
                    now,
                    claimed.chunks.get(job.id, []),
                    trace=trace,
                )
            )
        self._resolve_recipients(attempts)
        for a in attempts:
            _observe_claim(a.job)
            a.keeper.start()
            if log.isEnabledFor(logging.DEBUG):
                log.debug("job claimed", extra=a.ids())
        try:
            ready: list[_Attempt] = []
            failed: list[tuple[_Attempt, Decision]] = []
            flushed_at = self.clock()
            for a in attempts:
                decision = self._render_one(a)
                if decision is not None:
                    failed.append((a, decision))
                elif a.writer is not None:
                    ready.append(a)
                if ready and self.clock() - flushed_at >= self.settings.worker_batch_flush_seconds:
                    self._commit_and_finish(ready)
                    ready, flushed_at = [], self.clock()
            if ready:
                self._commit_and_finish(ready)
            if failed:
                self._settle(failed)
        finally:
            for a in attempts:
                a.keeper.stop()
                if a.writer is not None and a.outcome is None:
                    a.writer.abort()  # an unexpected error: nothing becomes visible
        for a in attempts:
            assert a.outcome is not None
            _counter(m.FINISHES, a.outcome.result, a.job.queue).inc()
            m.RUN.labels(a.job.queue, a.outcome.result).observe(
                max(0.0, self.clock() - a.claimed_at)
            )
        return attempts

    def _resolve_recipients(self, attempts: Sequence[_Attempt]) -> None:
        """Read the age recipients of the batch's jobs (the request's and the tenant's), one
        statement for the batch. When the database does not answer, each attempt keeps the
        error and its render fails with it (retried): an export is never written in plain
        text because its recipients could not be read."""
        try:
            with self.pool.connection() as conn:
                found = envelope_store.envelope_recipients_many(
                    conn, job_ids=[a.job.id for a in attempts]
                )
        except DATABASE_UNAVAILABLE as exc:
            for a in attempts:
                a.recipients = exc
            return
        for a in attempts:
            a.recipients = found.get(a.job.id, ())

    def _trace_claim(
        self,
        job: JobRow,
        message_id: UUID | None,
        claimed: Claimed,
        carrier: UUID | None,
        start_ns: int,
        end_ns: int,
    ) -> Any:
        """The job's ``exports.claim`` span (returns its context), in the job's own trace.
        The message's own job: a child of the current (Celery task) span. A job the claim
        took from the outbox: first its own ``exports.publish`` span, a child of its stored
        context linked to the task span of the message that carried the claim, and the
        claim span a child of that. A job of a batch message of an earlier publisher: a
        child of its stored context, linked to the task span."""
        taken = claimed.taken.get(job.id)
        attributes = {
            **telemetry.job_attributes(job, message_id),
            "batch_jobs": len(claimed.jobs),
        }
        links = telemetry.current_link()
        parent: Any = None  # the current span
        claim_links = None
        if taken is not None:
            parent = telemetry.record(
                "exports.publish",
                parent=job.trace_context,
                start_ns=start_ns,
                end_ns=end_ns,
                kind=SpanKind.PRODUCER,
                links=links,
                attributes={
                    "job_id": job.id,
                    "message_id": taken["id"],
                    "queue": job.queue,
                    "reason": taken["reason"],
                    "publish_attempt": taken["publish_attempts"],
                    "dispatched_by": "claim",
                    "carrier": carrier,
                },
            )
        elif job.trace_context and not telemetry.in_trace_of(job.trace_context):
            parent, claim_links = job.trace_context, links
        return telemetry.record(
            "exports.claim",
            parent=parent,
            start_ns=start_ns,
            end_ns=end_ns,
            attributes=attributes,
            links=claim_links,
        )

    def _render_one(self, a: _Attempt) -> Decision | None:
        """Render ``a`` into an uncommitted writer (``a.writer``); returns the decision for
        a failed attempt, None when rendered or stopped (``a.outcome`` set)."""
        try:
            with telemetry.span(
                "exports.render",
                parent=a.trace,
                attributes=telemetry.job_attributes(a.job, a.message_id),
            ) as render_span:
                a.writer = self._render(a, render_span)
        except LeaseLost as exc:
            a.outcome = self._stopped(a, str(exc))
            return None
        except Exception as exc:
            return self._decide(a, exc)
        return None

    def _commit_and_finish(self, ready: list[_Attempt]) -> None:
        """Make the rendered artifacts durable (fsyncs overlapped; each artifact is fsynced
        and renamed, with its folder, before the finish commits), then finish them in one
        statement. A lease lost at the last check or at the finish takes the lost-lease
        path; a storage error fails only its own job."""
        writers: list[_Attempt] = []
        failed: list[tuple[_Attempt, Decision]] = []
        for a in ready:
            try:
                faults.hit("artifact.commit")
                # Last check, right before the artifact becomes visible: a lost lease leaves
                # nothing (the writer aborts: temp file removed, multipart upload aborted).
                a.keeper.check(progress=a.job.note_count)
                writers.append(a)
            except LeaseLost as exc:
                self._drop_writer(a)
                a.outcome = self._stopped(a, str(exc))
            except Exception as exc:
                self._drop_writer(a)
                failed.append((a, self._decide(a, exc)))
        stored: list[tuple[_Attempt, StoredArtifact]] = []
        started = time.time_ns()
        results = self.store.commit_all([a.writer for a in writers if a.writer is not None])
        ended = time.time_ns()
        for a, result in zip(writers, results, strict=True):
            a.writer = None
            if telemetry.enabled():  # each job's share of the batch's durable write
                telemetry.record(
                    "exports.write",
                    parent=a.trace,
                    start_ns=started,
                    end_ns=ended,
                    attributes={
                        **telemetry.job_attributes(a.job, a.message_id),
                        "batch_jobs": len(writers),
                        "ok": not isinstance(result, BaseException),
                    },
                )
            # Rendered and durable: from here the lease is only kept by the time it has
            # left, as for a single job. A worker stalled before its finish loses it, and
            # its finish is then refused (the CAS), instead of renewing it for ever.
            a.keeper.stop()
            if isinstance(result, BaseException):
                failed.append((a, self._decide(a, result)))
            else:
                stored.append((a, result))
        if stored:
            self._finish(stored)
        if failed:
            self._settle(failed)

    def _drop_writer(self, a: _Attempt) -> None:
        if a.writer is not None:
            a.writer.abort()
            a.writer = None

    def _decide(self, a: _Attempt, exc: BaseException) -> Decision:
        failure = classify(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
        log.warning(
            "export attempt failed",
            extra={**a.ids(), "error_code": failure.code, "error_kind": failure.kind},
            exc_info=failure.code == "internal_error",
        )
        return self.policy.decide(
            failure,
            attempts=a.job.attempts,
            max_attempts=a.job.max_attempts,
            seconds_to_deadline=a.job.seconds_to_deadline - (self.clock() - a.claimed_at),
            rng=self.rng,
        )

    # --- the three ends of an attempt ------------------------------------------------------

    def _finish(self, stored: list[tuple[_Attempt, StoredArtifact]]) -> None:
        faults.hit("worker.before_finish")
        finishes = [
            Finish(
                a.job.id,
                a.job.token,
                artifact.ref,
                artifact.sha256,
                artifact.size,
                a.job.note_count,
                artifact.etag,
            )
            for a, artifact in stored
        ]
        started = time.time_ns()
        try:
            with self.pool.connection() as conn:
                record_manifests(conn, [(a.job, a.manifest) for a, _ in stored])
                envelope_store.envelope_record_many(
                    conn, [(a.job, *a.envelope) for a, _ in stored if a.envelope is not None]
                )
                # A finish PostgreSQL rolled back (a deadlock victim) runs again: else its
                # jobs would wait for their lease to expire and render again.
                done = {
                    row.id: row
                    for row in retry_rolled_back(
                        conn,
                        lambda: job_store.job_finish_if_leased_many(conn, finishes),
                        what="job_finish_if_leased_many",
                        rng=self.rng,
                    )
                }
        except DATABASE_UNAVAILABLE as exc:
            # The artifacts stay: one may be the committed result. If the finish did not
            # commit, the lease expires, the job runs again, and orphan cleanup removes
            # these files after ORPHAN_GRACE_SECONDS.
            self._unknown([a for a, _ in stored], "finish", exc)
            return
        ended = time.time_ns()
        for a, artifact in stored:
            row = done.get(a.job.id)
            if telemetry.enabled():  # one finish span per job, a child of its claim
                telemetry.record(
                    "exports.finish",
                    parent=a.trace,
                    start_ns=started,
                    end_ns=ended,
                    attributes={
                        **telemetry.job_attributes(a.job, a.message_id),
                        "bytes": artifact.size,
                        "finished": row is not None,
                        "batch_jobs": len(stored),
                    },
                )
            if row is not None:
                if log.isEnabledFor(logging.DEBUG):  # per export; INFO: one line per batch
                    log.debug("job succeeded", extra={**a.ids(), "bytes": artifact.size})
                a.outcome = self._outcome("succeeded", a.job, row=row)
                if a.checkpointer is not None and a.checkpointer.held:
                    a.checkpointer.finished()
                continue
            # A cancel, the deadline or a newer lease won: this artifact must never be
            # served. (It never is: only a recorded result_ref is. If storage refuses the
            # delete now, orphan cleanup removes it later.)
            try:
                self.store.delete(artifact.ref)
            except Exception as exc:
                log.warning(
                    "could not delete the artifact of a refused finish",
                    extra={**a.ids(), "key": artifact.ref, "error": type(exc).__name__},
                )
            stopped = self._stopped(a, "finish refused")
            a.outcome = (
                stopped
                if stopped.result != "lease_lost"
                else self._outcome("finish_refused", a.job)
            )

    def _stopped(self, a: _Attempt, why: str) -> Outcome:
        """The lease could not be kept: finalise a requested cancel or a passed deadline
        while we still hold the token; otherwise recovery owns the job."""
        try:
            return self._stop_leased(a, why)
        except DATABASE_UNAVAILABLE as exc:
            self._unknown([a], "stop", exc)
            assert a.outcome is not None
            return a.outcome

    def _stop_leased(self, a: _Attempt, why: str) -> Outcome:
        job, ids = a.job, a.ids()
        with self.pool.connection() as conn:
            cancelled = job_store.job_cancel_if_leased(conn, job_id=job.id, lease_token=job.token)
            if cancelled is None and job_store.job_past_deadline(conn, job_id=job.id):
                [end] = settle(
                    conn,
                    [
                        (
                            job,
                            Decision(
                                "fail",
                                "deadline_exceeded",
                                "the deadline passed while the export was running",
                            ),
                        )
                    ],
                    margin_seconds=self.policy.margin_seconds,
                )
                if end.row is not None:
                    log.warning("deadline passed; job failed", extra=ids)
                    return self._outcome(end.result, job, "deadline_exceeded", row=end.row)
        if cancelled is not None:
            log.info("cancel honoured; job cancelled", extra=ids)
            return self._outcome("cancelled", job, row=cancelled)
        log.warning("lease lost; stopped without publishing", extra={**ids, "why": why})
        return self._outcome("lease_lost", job)

    def _settle(self, failed: list[tuple[_Attempt, Decision]]) -> None:
        """Retry, fail or cancel the failed attempts of the batch (exportcore.transitions)."""
        try:
            with self.pool.connection() as conn:
                ends = settle(
                    conn,
                    [(a.job, decision) for a, decision in failed],
                    margin_seconds=self.policy.margin_seconds,
                )
        except DATABASE_UNAVAILABLE as exc:
            self._unknown([a for a, _ in failed], "settle", exc)
            return
        for (a, _), end in zip(failed, ends, strict=True):
            ids = a.ids()
            code = end.decision.code
            if end.result == "retry":
                log.info(
                    "job will be retried",
                    extra={**ids, "error_code": code, "delay": round(end.decision.delay, 3)},
                )
                _counter(m.RETRIES, code, a.job.queue).inc()
                a.outcome = self._outcome("retry", a.job, code)
            elif end.result == "cancelled":
                a.outcome = self._outcome("cancelled", a.job, row=end.row)
            elif end.result == "failed":
                log.warning("job failed; dead-lettered", extra={**ids, "error_code": code})
                a.outcome = self._outcome("failed", a.job, code, row=end.row)
            else:
                log.warning("lease lost before the failure was recorded", extra=ids)
                a.outcome = self._outcome("lease_lost", a.job)

    def _unknown(self, attempts: Sequence[_Attempt], step: str, exc: Exception) -> None:
        """The database did not answer while ``step`` (``finish``, ``settle``, ``stop``)
        recorded these attempts' ends (a failover, a restart): whether that committed is
        unknown. Nothing is retried here; each job keeps its lease until it expires, then
        the recovery-scanner makes it claimable again (lease recovery) — or it already
        ended, if the write did commit. Outcome ``unknown``."""
        for a in attempts:
            log.warning(
                "completion unknown: the database did not answer; the lease recovers the job",
                extra={**a.ids(), "step": step, "error": type(exc).__name__},
            )
            a.outcome = self._outcome("unknown", a.job, step)

    def _outcome(
        self, result: str, job: JobRow, reason: str | None = None, row: JobRow | None = None
    ) -> Outcome:
        """The end of a claimed attempt; ``row`` is the job after a terminal change (its
        end-to-end time and dead letter are recorded)."""
        if row is not None and row.finished_at is not None:
            _histogram(m.END_TO_END, job.queue, row.status).observe(
                (row.finished_at - row.created_at).total_seconds()
            )
            if row.status == "failed":
                _counter(m.DEAD_LETTERS, row.error_code or "unknown").inc()
        return Outcome(
            result, job.id, reason=reason, attempt=job.attempts, lease_token=job.lease_token
        )

    # --- rendering ---------------------------------------------------------------------------

    def _render(self, a: _Attempt, current: Any) -> ArtifactWriter:
        """Render the whole snapshot into a new writer and return it uncommitted (the caller
        commits or aborts it). A bulk export checkpoints as it goes and starts from the
        job's checkpoint when it has one (:mod:`exportcore.checkpoints`). Raises
        ``LeaseLost`` or the render's own error (the writer is then aborted; a
        checkpointed prefix is kept for the next claimer)."""
        job, keeper = a.job, a.keeper
        if isinstance(a.recipients, Exception):
            raise a.recipients
        recipients = a.recipients
        fmt = ExportFormat(job.format)
        ext = encryption.EXTENSION if recipients else fmt.extension
        key = artifact_key(job.tenant_id, job.id, job.token, ext)
        chunk_size = self.settings.render_chunk_size
        deadline = Deadline.after(job.seconds_to_deadline - (self.clock() - a.claimed_at))
        header = ExportHeader.of_job(job)

        def make(sink: Any) -> Renderer:
            return make_renderer(fmt, sink, self.signer)

        sealed: AgeSink | None = None
        if recipients:
            # Encrypted while it streams; never checkpointed: a takeover starts over
            # (docs/architecture.md "Checkpoints": an age stream cannot be resumed).
            if job.queue == "exports.bulk":
                Checkpointer(self.pool, self.store, job, 0).discard_any(
                    "encrypted", "an encrypted export starts over"
                )
            out = self.store.open_writer(key).bound_by(deadline)
            renderer, after = None, 0
            try:
                sealed = AgeSink(out, recipients)
            except BaseException:
                out.abort()
                raise
        elif job.queue == "exports.bulk" and self.settings.checkpoint_bytes > 0:
            a.checkpointer = Checkpointer(
                self.pool, self.store, job, self.settings.checkpoint_bytes
            )
            opened = a.checkpointer.open(key, make, header)
            out, renderer, after = opened.writer.bound_by(deadline), opened.renderer, opened.after
        else:
            out = self.store.open_writer(key).bound_by(deadline)
            renderer, after = None, 0
        try:
            if renderer is None:
                renderer = make(sealed if sealed is not None else out)
                renderer.begin(header)
            chunks = 0
            rows: list[Row] | None = a.first_chunk if after == 0 else None
            a.first_chunk = []
            while True:
                if rows is None:
                    rows = self._next_chunk(job, after, deadline)
                if not rows:
                    break
                faults.hit("render.chunk", subjects=(job.id,))
                renderer.add([_note(r) for r in rows])
                chunks += 1
                after = rows[-1]["ordinal"]
                if a.checkpointer is not None:
                    a.checkpointer.after_chunk(out, renderer, after)
                keeper.check(progress=renderer.rows)
                if len(rows) == rows[0]["window_rows"] < chunk_size:
                    break  # the window reached the end: no empty read to find it
                rows = None
            if renderer.rows != job.note_count:
                raise PermanentError(
                    "invalid_snapshot",
                    f"the snapshot holds {renderer.rows} notes, the job {job.note_count}",
                )
            renderer.end()
            a.manifest = renderer
            if sealed is not None:
                sealed.close()
                a.envelope = self._envelope(job, renderer, recipients, out)
            current.set_attribute("chunks", chunks)
            current.set_attribute("rows", renderer.rows)
            current.set_attribute("encrypted", sealed is not None)
            return out
        except BaseException:
            if sealed is not None:
                sealed.abort()  # the encrypting thread stops writing before the abort
            out.abort()
            raise

    def _envelope(
        self,
        job: JobRow,
        renderer: Renderer,
        recipients: Sequence[str],
        out: ArtifactWriter,
    ) -> tuple[dict[str, Any], dict[str, str] | None]:
        """The signed envelope of an encrypted artifact (:mod:`exportcore.encryption`)."""
        assert renderer.manifest is not None
        header = encryption.envelope_header(
            export_id=str(job.id),
            tenant=job.tenant_id,
            fmt=job.format,
            recipients=recipients,
            ciphertext_sha256=out.sha256(),
            ciphertext_size=out.tell(),
            manifest=renderer.manifest,
            manifest_sha256=manifest_sha256(renderer.manifest),
        )
        signature = self.signer.sign(header, encryption.ENVELOPE_CONTEXT) if self.signer else None
        return header, signature

    def _next_chunk(self, job: JobRow, after: int, deadline: Deadline) -> list[Row]:
        """The snapshot chunk after ordinal ``after``: a token of the deployment's
        notes-source limit first, then the read with a statement timeout of at most the
        time left to the job's deadline (exportcore.deadlines)."""
        if self.downstream is not None:
            self.downstream.acquire(NOTES_SOURCE, deadline)
        with (
            self.pool.connection() as conn,
            statement_timeout(conn, deadline, self.settings.db_statement_timeout_ms),
        ):
            return job_store.job_items_chunk(
                conn,
                job_id=job.id,
                after=after,
                limit=self.settings.render_chunk_size,
                max_bytes=self.settings.render_chunk_bytes,
            )


def _note(row: Row) -> NoteRecord:
    """A snapshot item read back at its recorded version (``job_items_chunk``). Raises
    PermanentError ``snapshot_version_missing`` when neither the note nor the version store
    holds that version: the snapshot can no longer be rendered as it was accepted, and
    rendering anything else would break docs/architecture.md INV-18."""
    if row.get("missing"):
        raise PermanentError(
            "snapshot_version_missing",
            f"note {row['note_id']} version {row['version']} (item {row['ordinal']}) is "
            "neither the note's current version nor kept in note_versions",
        )
    return NoteRecord.from_row(row)


def _uuid(value: Any) -> Any:
    """A UUID from a UUID or its text (callers pass either); None stays None."""
    return value if value is None or isinstance(value, UUID) else UUID(str(value))


_REFUSALS = {
    "not_due": "refused_not_due",
    "terminal": "refused_terminal",
    "leased": "refused_leased",
}


@functools.cache
def _counter(metric: Any, *labels: str) -> Any:
    """A labelled child of a counter, looked up once per label set (prometheus_client's
    ``labels()`` takes a lock and builds a tuple on every call)."""
    return metric.labels(*labels)


_histogram = _counter


def _observe_claim(job: JobRow) -> None:
    """Count the claim; pickup latency (first claim) and recovery duration (after a
    recovery), from the database's own timestamps."""
    claimed = job.updated_at
    if job.attempts == 1:
        _histogram(m.PICKUP, job.queue).observe(
            max(0.0, (claimed - job.created_at).total_seconds())
        )
    if job.recovery_kind and job.recovery_started_at:
        _histogram(m.RECOVERY, job.recovery_kind).observe(
            max(0.0, (claimed - job.recovery_started_at).total_seconds())
        )
    _counter(m.CLAIMS, "claimed", job.queue).inc()


def _log_batch(
    outcomes: Sequence[Outcome],
    queue: str | None,
    carrier: Any,
    taken: int,
    claim_ns: int,
) -> None:
    """The one INFO line of a delivered message (per-job lines are DEBUG), written for every
    message, one whose claims were all refused too: the message's task id, its queue, the
    ids of the jobs it named or took and how each ended (``outcomes``: counts by result),
    ``runs`` (per job, in the order of ``job_ids``: its ``job_id``, ``result``, ``attempt``
    and ``lease_token``, and the ``reason`` of a refusal — see :class:`Outcome`), the jobs
    its claim took from the outbox, and the seconds from the claim to the last outcome.

    ``runs`` is how the logs tell a redelivery from a re-execution (docs/observability.md,
    "Redelivery or re-execution"): a redelivered message's job is ``refused`` with the
    attempt and lease token of the execution it repeats; a job executed again has a new
    attempt and a new lease token."""
    ended: dict[str, int] = {}
    for o in outcomes:
        ended[o.result] = ended.get(o.result, 0) + 1
    log.info(
        "batch done",
        extra={
            "message_id": str(carrier) if carrier else None,
            "queue": queue,
            "jobs": len(outcomes),
            "taken": taken,
            "outcomes": ended,
            "job_ids": [str(o.job_id) for o in outcomes],
            "runs": [_run(o) for o in outcomes],
            "seconds": round((time.time_ns() - claim_ns) / 1e9, 4),
        },
    )


def _run(o: Outcome) -> dict[str, Any]:
    """One job of the per-message line: its id, result, attempt and lease token, and its
    ``reason`` when it has one (why a claim was refused, the error code of a retry or a
    failure, the step of an unknown end)."""
    run: dict[str, Any] = {
        "job_id": str(o.job_id),
        "result": o.result,
        "attempt": o.attempt,
        "lease_token": str(o.lease_token) if o.lease_token else None,
    }
    if o.reason is not None:
        run["reason"] = o.reason
    return run


def _log_ids(job: JobRow, message_id: UUID | None) -> dict[str, Any]:
    return {
        "job_id": str(job.id),
        "message_id": str(message_id) if message_id else None,
        "lease_token": str(job.lease_token),
        "attempt": job.attempts,
        "queue": job.queue,
        "tenant_id": job.tenant_id,
    }
