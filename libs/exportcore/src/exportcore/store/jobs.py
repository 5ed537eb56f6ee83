"""Job transitions (``sql/jobs.sql``): submit, claim, renew, finish, requeue, fail, cancel,
and the recovery-scanner's batch rules and retention.

Each transition is ONE guarded statement written for a batch (``job_*_many``: arrays in,
one history event per changed row, the changed rows back as :class:`JobRow`); the
one-job functions call the same statement with one row. The worker and the
recovery-scanner both go through these (and :mod:`exportcore.transitions`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, LiteralString
from uuid import UUID

from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from exportcore.db import Conn, Row
from exportcore.sql import q


@dataclass(frozen=True, slots=True)
class JobRow:
    """The typed job row every transition returns (``job_*_many`` in ``sql/jobs.sql``).

    Only the columns the worker and the recovery-scanner act on: ids, routing, the attempt
    and lease, the timestamps metrics are computed from (UTC), and ``seconds_to_deadline``
    measured by the database clock when the row was returned. ``message_id`` is the outbox
    event that carried a claim (None elsewhere). A delta names its base export and the
    base manifest's SHA-256; ``selects_all``: the export is of every note (only such an
    export can be a delta's base).
    """

    id: UUID
    tenant_id: str
    status: str
    queue: str
    format: str
    note_count: int
    attempts: int
    max_attempts: int
    cancel_requested: bool
    lease_token: UUID | None
    lease_expires_at: datetime | None
    deadline_at: datetime
    error_code: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    recovery_kind: str | None
    recovery_started_at: datetime | None
    trace_context: dict[str, str] | None
    result_ref: str | None
    base_job_id: UUID | None
    base_manifest_sha256: str | None
    selects_all: bool
    seconds_to_deadline: float

    @property
    def token(self) -> UUID:
        """The lease token of a leased row (raises AssertionError on an unleased one)."""
        assert self.lease_token is not None, f"job {self.id} holds no lease"
        return self.lease_token


def _job_rows(conn: Conn, statement: LiteralString, params: dict[str, Any]) -> list[JobRow]:
    with conn.cursor(row_factory=class_row(JobRow)) as cur:
        return cur.execute(statement, params).fetchall()


def job_submit(
    conn: Conn,
    *,
    job_id: UUID,
    message_id: UUID,
    tenant_id: str,
    fmt: str,
    payload: dict[str, Any],
    note_ids: Sequence[int] | None,
    request_hash: str,
    max_attempts: int,
    deadline_seconds: float,
    max_selection: int,
    fast_queue_max_notes: int,
    capacity: int,
    default_quota: int,
    idempotency_key: str | None = None,
    replay_of: UUID | None = None,
    trace_context: dict[str, str] | None = None,
    event_detail: dict[str, Any] | None = None,
    since: UUID | None = None,
) -> Row:
    """The whole submit in one statement: selection count, cheap admission refusal, job,
    snapshot, first outbox event, ``submitted`` event, serialised admission.

    ``note_ids`` None selects every note of the tenant; ``since`` (with every note) makes a
    delta of what changed since that succeeded export (its base). Returns the job row plus
    ``selected`` (notes found), ``base_found`` and ``message_id``; the row's ``id`` is None
    when nothing was written because the selection was not acceptable (none found, more
    than ``max_selection``, ids that do not exist for the tenant, or no usable base).
    Admission refusals raise ``psycopg.Error`` with SQLSTATE XEX01 / XEX02 (see
    :mod:`exportcore.admission`).
    """
    row = conn.execute(
        q("jobs", "job_submit"),
        {
            "job_id": job_id,
            "message_id": message_id,
            "tenant_id": tenant_id,
            "format": fmt,
            "payload": Jsonb(payload),
            "note_ids": None if note_ids is None else list(note_ids),
            "request_hash": request_hash,
            "idempotency_key": idempotency_key,
            "max_attempts": max_attempts,
            "deadline_seconds": deadline_seconds,
            "max_selection": max_selection,
            "fast_queue_max_notes": fast_queue_max_notes,
            "capacity": capacity,
            "default_quota": default_quota,
            "replay_of": replay_of,
            "trace_context": Jsonb(trace_context) if trace_context else None,
            "event_detail": Jsonb(event_detail or {}),
            "since": since,
        },
    ).fetchone()
    assert row is not None
    return row


def job_claim_many(
    conn: Conn,
    *,
    job_ids: Sequence[UUID],
    message_ids: Sequence[UUID | None],
    lease_seconds: float,
) -> list[JobRow]:
    """queued → running for each claimable job of a batch, with a fresh lease token and one
    more attempt, in one statement; returns the claimed rows (by id). A job that is not
    claimable (not due, leased, cancelled, terminal, out of time or attempts) is absent."""
    return _job_rows(
        conn,
        q("jobs", "job_claim_many"),
        {
            "job_ids": list(job_ids),
            "message_ids": list(message_ids),
            "lease_seconds": lease_seconds,
        },
    )


def job_claim_many_with_first_chunks(
    conn: Conn,
    *,
    job_ids: Sequence[UUID],
    message_ids: Sequence[UUID | None],
    lease_seconds: float,
    limit: int,
    max_bytes: int,
) -> tuple[list[JobRow], dict[UUID, list[Row]]]:
    """:func:`job_claim_many` and :func:`job_items_first_chunk_many` in ONE transaction sent
    in one round trip (a pipeline): the claimed rows, and the first snapshot chunk of each
    claimed job. ``conn`` must be in autocommit mode with no transaction open."""
    ids = list(job_ids)
    with conn.pipeline(), conn.transaction():
        claim = conn.cursor(row_factory=class_row(JobRow))
        claim.execute(
            q("jobs", "job_claim_many"),
            {"job_ids": ids, "message_ids": list(message_ids), "lease_seconds": lease_seconds},
        )
        items = conn.execute(
            q("jobs", "job_items_first_chunk_many"),
            {"job_ids": ids, "limit": limit, "max_bytes": max_bytes},
        )
        jobs = claim.fetchall()
        rows = items.fetchall()
    claimed = {job.id for job in jobs}
    chunks: dict[UUID, list[Row]] = {}
    for r in rows:
        if r["job_id"] in claimed:  # a refused job's items were read for nothing
            chunks.setdefault(r["job_id"], []).append(r)
    return jobs, chunks


def job_claim(
    conn: Conn, *, job_id: UUID, message_id: UUID | None, lease_seconds: float
) -> JobRow | None:
    """:func:`job_claim_many` for one job; None if refused."""
    rows = job_claim_many(
        conn, job_ids=[job_id], message_ids=[message_id], lease_seconds=lease_seconds
    )
    return rows[0] if rows else None


def job_claim_refusal_many(conn: Conn, *, job_ids: Sequence[UUID]) -> dict[UUID, Row]:
    """The facts that explain refused claims, by job id (unknown ids are absent)."""
    rows = conn.execute(q("jobs", "job_claim_refusal_many"), {"job_ids": list(job_ids)})
    return {r["id"]: r for r in rows}


def job_claim_refusal(conn: Conn, *, job_id: UUID) -> Row | None:
    """The facts that explain a refused claim (None when the job does not exist)."""
    return job_claim_refusal_many(conn, job_ids=[job_id]).get(job_id)


def job_items_first_chunk_many(
    conn: Conn, *, job_ids: Sequence[UUID], limit: int, max_bytes: int
) -> dict[UUID, list[Row]]:
    """The first chunk of each job's snapshot (bounded per job as :func:`job_items_chunk`),
    in one read; by job id, items in ordinal order. A job without items is absent."""
    out: dict[UUID, list[Row]] = {}
    for r in conn.execute(
        q("jobs", "job_items_first_chunk_many"),
        {"job_ids": list(job_ids), "limit": limit, "max_bytes": max_bytes},
    ):
        out.setdefault(r["job_id"], []).append(r)
    return out


def job_renew_lease(
    conn: Conn, *, job_id: UUID, lease_token: UUID, lease_seconds: float, progress: int
) -> Row | None:
    """Extend the lease by ``lease_seconds`` from now; None if the token lost the lease."""
    return conn.execute(
        q("jobs", "job_renew_lease"),
        {
            "job_id": job_id,
            "lease_token": lease_token,
            "lease_seconds": lease_seconds,
            "progress": progress,
        },
    ).fetchone()


@dataclass(frozen=True, slots=True)
class Finish:
    """One row of a batch finish: the lease that rendered ``result_ref`` and its facts."""

    job_id: UUID
    lease_token: UUID
    result_ref: str
    sha256: str
    nbytes: int
    rows: int
    etag: str | None = None


def job_finish_if_leased_many(conn: Conn, finishes: Sequence[Finish]) -> list[JobRow]:
    """running → succeeded for each row whose lease still holds (per-row compare-and-set
    on token, lease expiry, deadline and cancel), in one statement; returns the rows that
    won. A refused row (stale token, expired lease, past deadline, cancel) is absent and
    never affects the others."""
    return _job_rows(
        conn,
        q("jobs", "job_finish_if_leased_many"),
        {
            "job_ids": [f.job_id for f in finishes],
            "lease_tokens": [f.lease_token for f in finishes],
            "result_refs": [f.result_ref for f in finishes],
            "sha256s": [f.sha256 for f in finishes],
            "nbytes": [f.nbytes for f in finishes],
            "rows": [f.rows for f in finishes],
            "etags": [f.etag for f in finishes],
        },
    )


def job_finish_if_leased(
    conn: Conn,
    *,
    job_id: UUID,
    lease_token: UUID,
    result_ref: str,
    sha256: str,
    nbytes: int,
    rows: int,
    etag: str | None = None,
) -> JobRow | None:
    """:func:`job_finish_if_leased_many` for one job; None if a stale worker.

    ``etag`` is the store's own ETag of the artifact (S3), None when it has none."""
    done = job_finish_if_leased_many(
        conn, [Finish(job_id, lease_token, result_ref, sha256, nbytes, rows, etag)]
    )
    return done[0] if done else None


def job_get(conn: Conn, *, job_id: UUID, tenant_id: str | None = None) -> Row | None:
    """One job; scoped to ``tenant_id`` when given (another tenant's job reads as None)."""
    if tenant_id is None:
        return conn.execute(q("jobs", "job_get"), {"job_id": job_id}).fetchone()
    return conn.execute(
        q("jobs", "job_get_for_tenant"), {"job_id": job_id, "tenant_id": tenant_id}
    ).fetchone()


def job_past_deadline(conn: Conn, *, job_id: UUID) -> bool:
    """True when the job exists and its deadline has passed (database clock)."""
    row = conn.execute(q("jobs", "job_past_deadline"), {"job_id": job_id}).fetchone()
    return bool(row and row["past"])


def job_list_for_tenant(
    conn: Conn,
    *,
    tenant_id: str,
    limit: int,
    status: str | None = None,
    before: tuple[datetime, UUID] | None = None,
) -> list[Row]:
    """Up to ``limit`` of the tenant's jobs, newest first, strictly after the keyset
    cursor ``before`` = (created_at, id) of the last row of the previous page."""
    return conn.execute(
        q("jobs", "job_list_for_tenant"),
        {
            "tenant_id": tenant_id,
            "status": status,
            "before_created_at": before[0] if before else None,
            "before_id": before[1] if before else None,
            "limit": limit,
        },
    ).fetchall()


def job_items_chunk(
    conn: Conn, *, job_id: UUID, after: int, limit: int, max_bytes: int
) -> list[Row]:
    """Snapshot items with ordinal > ``after``, in order: at most ``limit`` of them and at
    most ``max_bytes`` of text (at least one). Each row has ``window_rows`` (see the SQL)."""
    return conn.execute(
        q("jobs", "job_items_chunk"),
        {"job_id": job_id, "after": after, "limit": limit, "max_bytes": max_bytes},
    ).fetchall()


def job_events(conn: Conn, *, job_id: UUID) -> list[Row]:
    """The job's history, oldest first."""
    return conn.execute(q("jobs", "job_events"), {"job_id": job_id}).fetchall()


def job_lock_lease_expired(conn: Conn, *, limit: int) -> list[JobRow]:
    """Lock up to ``limit`` running jobs whose lease expired (skipping locked ones), oldest
    expiry first; held until the caller's transaction ends."""
    return _job_rows(conn, q("jobs", "job_lock_lease_expired"), {"limit": limit})


@dataclass(frozen=True, slots=True)
class Requeue:
    """One row of a batch requeue: the lease, the new outbox event, the backoff (s), why."""

    job_id: UUID
    lease_token: UUID
    message_id: UUID
    delay_seconds: float
    error_code: str
    error_detail: str


def job_requeue_if_leased_many(
    conn: Conn, requeues: Sequence[Requeue], *, margin_seconds: float, expired_only: bool = False
) -> list[JobRow]:
    """running → queued with a durable backoff and a new outbox event, per row.

    By the lease holder after a transient error (``expired_only=False``: event ``retried``),
    or by the recovery-scanner after the lease expired (``expired_only=True``: event
    ``lease_expired``). A row is refused (absent from the result) when its token lost the
    lease, a cancel was requested, no attempt is left, or less than ``margin_seconds``
    remain before the deadline.
    """
    return _job_rows(
        conn,
        q("jobs", "job_requeue_if_leased_many"),
        {
            "job_ids": [r.job_id for r in requeues],
            "lease_tokens": [r.lease_token for r in requeues],
            "message_ids": [r.message_id for r in requeues],
            "delays": [r.delay_seconds for r in requeues],
            "error_codes": [r.error_code for r in requeues],
            "error_details": [r.error_detail[:1000] for r in requeues],
            "margin_seconds": margin_seconds,
            "expired_only": expired_only,
            "event_kind": "lease_expired" if expired_only else "retried",
            "outbox_reason": "recovery" if expired_only else "retry",
        },
    )


def job_requeue_if_leased(
    conn: Conn,
    *,
    job_id: UUID,
    lease_token: UUID,
    message_id: UUID,
    delay_seconds: float,
    margin_seconds: float,
    error_code: str,
    error_detail: str,
    expired_only: bool = False,
) -> JobRow | None:
    """:func:`job_requeue_if_leased_many` for one job; None when refused."""
    rows = job_requeue_if_leased_many(
        conn,
        [Requeue(job_id, lease_token, message_id, delay_seconds, error_code, error_detail)],
        margin_seconds=margin_seconds,
        expired_only=expired_only,
    )
    return rows[0] if rows else None


@dataclass(frozen=True, slots=True)
class Fail:
    """One row of a batch fail: the lease and the error recorded with the dead letter."""

    job_id: UUID
    lease_token: UUID
    error_code: str
    error_detail: str


def job_fail_if_leased_many(
    conn: Conn, failures: Sequence[Fail], *, expired_only: bool = False
) -> list[JobRow]:
    """running → failed with a dead letter, per row; a row whose token no longer holds the
    job (or, with ``expired_only``, whose lease has not expired) is absent."""
    return _job_rows(
        conn,
        q("jobs", "job_fail_if_leased_many"),
        {
            "job_ids": [f.job_id for f in failures],
            "lease_tokens": [f.lease_token for f in failures],
            "error_codes": [f.error_code for f in failures],
            "error_details": [f.error_detail[:1000] for f in failures],
            "expired_only": expired_only,
        },
    )


def job_fail_if_leased(
    conn: Conn,
    *,
    job_id: UUID,
    lease_token: UUID,
    error_code: str,
    error_detail: str,
    expired_only: bool = False,
) -> JobRow | None:
    """:func:`job_fail_if_leased_many` for one job; None when refused."""
    rows = job_fail_if_leased_many(
        conn, [Fail(job_id, lease_token, error_code, error_detail)], expired_only=expired_only
    )
    return rows[0] if rows else None


def job_cancel_if_leased_many(
    conn: Conn, leases: Sequence[tuple[UUID, UUID]], *, expired_only: bool = False
) -> list[JobRow]:
    """running → cancelled for each (job id, lease token) whose cancel was requested; the
    others are absent."""
    return _job_rows(
        conn,
        q("jobs", "job_cancel_if_leased_many"),
        {
            "job_ids": [job_id for job_id, _ in leases],
            "lease_tokens": [token for _, token in leases],
            "expired_only": expired_only,
        },
    )


def job_cancel_if_leased(
    conn: Conn, *, job_id: UUID, lease_token: UUID, expired_only: bool = False
) -> JobRow | None:
    """:func:`job_cancel_if_leased_many` for one job; None unless a cancel was requested."""
    rows = job_cancel_if_leased_many(conn, [(job_id, lease_token)], expired_only=expired_only)
    return rows[0] if rows else None


def job_request_cancel_many(
    conn: Conn,
    *,
    job_ids: Sequence[UUID],
    tenant_id: str | None,
    detail: dict[str, Any] | None = None,
) -> list[Row]:
    """Ask to cancel ``job_ids`` (of ``tenant_id``, or of any tenant when None): queued
    ones are cancelled at once, running ones flagged; returns the jobs that changed, in id
    order, each with ``previous_status``. ``detail`` (who asked, the bulk action) goes on
    their history events."""
    return conn.execute(
        q("jobs", "job_request_cancel_many"),
        {"job_ids": list(job_ids), "tenant_id": tenant_id, "detail": Jsonb(detail or {})},
    ).fetchall()


def job_request_cancel(
    conn: Conn, *, job_id: UUID, tenant_id: str | None, detail: dict[str, Any] | None = None
) -> Row | None:
    """Flag a cancel (a queued job is cancelled at once); None when nothing changed
    (unknown, another tenant's, terminal, or already requested). The one-job call of
    :func:`job_request_cancel_many`."""
    rows = job_request_cancel_many(conn, job_ids=[job_id], tenant_id=tenant_id, detail=detail)
    return rows[0] if rows else None


def job_replay_many(
    conn: Conn,
    *,
    dead_letter_ids: list[int],
    job_ids: list[UUID],
    message_ids: list[UUID],
    actor: str,
    max_attempts: int,
    deadline_seconds: float,
    trace_context: dict[str, str] | None = None,
    detail: dict[str, Any] | None = None,
) -> list[Row]:
    """A bulk replay's batch in one statement: each open dead letter of ``dead_letter_ids``
    replayed as a new queued job (id and outbox message id at the same position of
    ``job_ids`` / ``message_ids``), its dead letter moved to ``replayed`` by ``actor``.
    Returns ``{dead_letter_id, original_id, id, tenant_id, queue}`` per replay written; a
    dead letter no longer open, or whose job already has an active or succeeded replay, is
    absent. Admission is the caller's (``admission_admit_many``, before COMMIT)."""
    if not (len(dead_letter_ids) == len(job_ids) == len(message_ids)):
        raise ValueError("dead_letter_ids, job_ids and message_ids differ in length")
    return conn.execute(
        q("jobs", "job_replay_many"),
        {
            "dead_letter_ids": dead_letter_ids,
            "job_ids": job_ids,
            "message_ids": message_ids,
            "actor": actor,
            "max_attempts": max_attempts,
            "deadline_seconds": deadline_seconds,
            "trace_context": Jsonb(trace_context) if trace_context else None,
            "detail": Jsonb(detail or {}),
        },
    ).fetchall()


def job_lock_for_replay(conn: Conn, *, job_id: UUID) -> Row | None:
    """Lock the job (``FOR UPDATE``) a replay is asked for; its ``id``, ``tenant_id`` and
    ``status``, or None when there is no such job."""
    return conn.execute(q("jobs", "job_lock_for_replay"), {"job_id": job_id}).fetchone()


def job_latest_replay(conn: Conn, *, job_id: UUID) -> Row | None:
    """The newest job whose ``replay_of`` is ``job_id``, or None."""
    return conn.execute(q("jobs", "job_latest_replay"), {"job_id": job_id}).fetchone()


def job_replay(
    conn: Conn,
    *,
    original_id: UUID,
    job_id: UUID,
    message_id: UUID,
    max_attempts: int,
    deadline_seconds: float,
    trace_context: dict[str, str] | None = None,
    detail: dict[str, Any] | None = None,
) -> Row | None:
    """A new queued job copying a failed job's snapshot; None if the original is not failed.
    ``detail`` (who asked, the bulk action) goes on both history events."""
    return conn.execute(
        q("jobs", "job_replay"),
        {
            "original_id": original_id,
            "job_id": job_id,
            "message_id": message_id,
            "max_attempts": max_attempts,
            "deadline_seconds": deadline_seconds,
            "trace_context": Jsonb(trace_context) if trace_context else None,
            "detail": Jsonb(detail or {}),
        },
    ).fetchone()


def job_cancel_if_queued_many(conn: Conn, *, limit: int) -> list[Row]:
    """Cancel queued jobs with a cancel request; returns their ids."""
    return conn.execute(q("jobs", "job_cancel_if_queued_many"), {"limit": limit}).fetchall()


def job_fail_if_queued_exhausted_many(conn: Conn, *, limit: int) -> list[Row]:
    """Fail (and dead-letter) queued jobs past their deadline or out of attempts."""
    return conn.execute(q("jobs", "job_fail_if_queued_exhausted_many"), {"limit": limit}).fetchall()


def job_redispatch_if_lost_many(
    conn: Conn, *, threshold_seconds: float, max_factor: int, limit: int
) -> list[Row]:
    """New outbox events for queued jobs whose message was lost; returns ``{job_id,
    message_id}`` per job."""
    return conn.execute(
        q("jobs", "job_redispatch_if_lost_many"),
        {"threshold_seconds": threshold_seconds, "max_factor": max_factor, "limit": limit},
    ).fetchall()


def job_delete_terminal_before(conn: Conn, *, retention_days: float, limit: int) -> list[Row]:
    """Delete terminal jobs finished more than ``retention_days`` ago; returns ``{id,
    result_ref}`` so their artifacts can be deleted after commit."""
    return conn.execute(
        q("jobs", "job_delete_terminal_before"), {"retention_days": retention_days, "limit": limit}
    ).fetchall()


def job_artifact_owners(conn: Conn, *, job_ids: list[UUID]) -> dict[UUID, Row]:
    """``{job id: {status, result_ref, lease_token}}`` for the jobs that still exist."""
    rows = conn.execute(q("jobs", "job_artifact_owners"), {"job_ids": job_ids}).fetchall()
    return {r["id"]: r for r in rows}
