"""Running one export: claim → render in chunks (renewing the lease) → write → finish.

The Celery task is a thin wrapper around :meth:`JobRunner.run`. No database transaction is
held while rendering or writing: each chunk read, renewal and transition is its own short
transaction (DESIGN.md invariant 13).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from exportcore.artifacts import ArtifactStore, StoredArtifact, artifact_key
from exportcore.db import Conn, Row
from exportcore.domain import ExportFormat
from exportcore.render import ExportHeader, NoteRecord, make_renderer
from exportcore.settings import Settings
from exportcore.store import jobs as job_store
from psycopg_pool import ConnectionPool

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

    ``result`` is ``succeeded``, ``refused`` (claim refused; ``reason`` says why),
    ``lease_lost`` (stopped without publishing), ``finish_refused`` (rendered but a newer
    lease or a cancel won), or ``failed``.
    """

    result: str
    job_id: UUID
    reason: str | None = None
    attempt: int | None = None
    lease_token: UUID | None = None


class LeaseKeeper:
    """Renews a lease when a third of it has elapsed since the last renewal.

    ``check(progress)`` is called between chunks; it raises ``LeaseLost`` when renewal is
    refused. ``clock`` returns monotonic seconds (injectable for tests).
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

    def due(self) -> bool:
        """True when a third of the lease has passed since the last renewal."""
        return self.clock() - self.renewed_at >= self.lease_seconds / 3

    def renew(self, progress: int) -> Row:
        """Renew now; raises ``LeaseLost`` if the token no longer holds the lease."""
        started = self.clock()
        with self.pool.connection() as conn:
            row = job_store.job_renew_lease(
                conn,
                job_id=self.job_id,
                lease_token=self.lease_token,
                lease_seconds=self.lease_seconds,
                progress=progress,
            )
        if row is None:
            raise LeaseLost(f"lease {self.lease_token} of job {self.job_id} could not be renewed")
        self.renewed_at = started
        return row

    def check(self, progress: int) -> None:
        """Renew if due; raises ``LeaseLost`` when the lease is gone."""
        if self.due():
            self.renew(progress)


class JobRunner:
    """Executes jobs for one worker process: owns nothing but references to shared parts."""

    def __init__(
        self,
        settings: Settings,
        pool: ConnectionPool[Conn],
        store: ArtifactStore,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.store = store
        self.clock = clock

    def run(self, job_id: UUID, message_id: UUID | None) -> Outcome:
        """Handle one delivery of ``job_id``'s message; never raises for a refused claim."""
        with self.pool.connection() as conn:
            job = job_store.job_claim(
                conn,
                job_id=job_id,
                message_id=message_id,
                lease_seconds=self.settings.lease_seconds,
            )
            facts = None if job else job_store.job_claim_refusal(conn, job_id=job_id)
        if job is None:
            reason = classify_refusal(facts)
            log.info(
                "claim refused",
                extra={"job_id": str(job_id), "message_id": str(message_id), "reason": reason},
            )
            return Outcome("refused", job_id, reason=reason)

        token: UUID = job["lease_token"]
        ids = _log_ids(job, message_id)
        log.info("job claimed", extra=ids)
        keeper = LeaseKeeper(self.pool, job_id, token, self.settings.lease_seconds, self.clock)
        try:
            artifact = self._render(job, keeper)
        except LeaseLost as exc:
            log.warning("lease lost; stopping without publishing", extra={**ids, "why": str(exc)})
            return Outcome("lease_lost", job_id, attempt=job["attempts"], lease_token=token)
        except Exception as exc:  # classified properly by the retry policy (issue 3)
            log.exception("export failed", extra=ids)
            with self.pool.connection() as conn:
                job_store.job_fail_if_leased(
                    conn,
                    job_id=job_id,
                    lease_token=token,
                    error_code="render_error",
                    error_detail=type(exc).__name__,
                )
            return Outcome("failed", job_id, attempt=job["attempts"], lease_token=token)

        with self.pool.connection() as conn:
            done = job_store.job_finish_if_leased(
                conn,
                job_id=job_id,
                lease_token=token,
                result_ref=artifact.ref,
                sha256=artifact.sha256,
                nbytes=artifact.size,
                rows=job["note_count"],
            )
        if done is None:
            # A newer lease or a cancel won: this artifact must never be served.
            self.store.delete(artifact.ref)
            log.warning("finish refused; artifact discarded", extra=ids)
            return Outcome("finish_refused", job_id, attempt=job["attempts"], lease_token=token)
        log.info("job succeeded", extra={**ids, "bytes": artifact.size})
        return Outcome("succeeded", job_id, attempt=job["attempts"], lease_token=token)

    def _render(self, job: Row, keeper: LeaseKeeper) -> StoredArtifact:
        fmt = ExportFormat(job["format"])
        key = artifact_key(job["tenant_id"], job["id"], job["lease_token"], fmt.extension)
        chunk_size = self.settings.render_chunk_size
        with self.store.open_writer(key) as out:
            renderer = make_renderer(fmt, out)
            renderer.begin(
                ExportHeader(
                    id=str(job["id"]),
                    tenant=job["tenant_id"],
                    created_at=job["created_at"],
                    format=fmt.value,
                    count=job["note_count"],
                )
            )
            after = 0
            while True:
                with self.pool.connection() as conn:
                    rows = job_store.job_items_chunk(
                        conn, job_id=job["id"], after=after, limit=chunk_size
                    )
                if not rows:
                    break
                renderer.add([NoteRecord.from_row(r) for r in rows])
                after = rows[-1]["ordinal"]
                keeper.check(progress=renderer.rows)
            renderer.end()
            # Last check before the artifact becomes visible: a lost lease leaves nothing.
            keeper.check(progress=renderer.rows)
            return out.commit()


def _log_ids(job: Row, message_id: UUID | None) -> dict[str, Any]:
    return {
        "job_id": str(job["id"]),
        "message_id": str(message_id) if message_id else None,
        "lease_token": str(job["lease_token"]),
        "attempt": job["attempts"],
        "queue": job["queue"],
        "tenant_id": job["tenant_id"],
    }
