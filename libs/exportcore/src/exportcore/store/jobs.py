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


def _arrays(items: Sequence[Any], /, **columns: str) -> dict[str, list[Any]]:
    """A batch statement's arrays from its request rows: ``{parameter: [row.field, …]}``
    for each ``parameter="field"`` of ``columns``, the rows' values at the same positions
    (the statement ``unnest``s them together)."""
    return {param: [getattr(item, field) for item in items] for param, field in columns.items()}


GENERIC_PLAN = "SELECT set_config('plan_cache_mode', 'force_generic_plan', true)"
"""Run the rest of the transaction on generic plans: a statement whose plan does not depend
on its parameters' values (job_submit) is then planned once per connection, not on every
call."""


def submit_params(
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
) -> tuple[LiteralString, dict[str, Any]]:
    """The statement of a submit (``job_submit``) and its parameters."""
    params: dict[str, Any] = {
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
    }
    return q("jobs", "job_submit"), params


def _generic(params: dict[str, Any]) -> bool:
    """Whether a submit runs on its generic plan: explicit ids (every note and a delta are
    planned for their values: the tenant's size decides the copy's plan)."""
    return params["note_ids"] is not None and params["since"] is None


def job_submit(conn: Conn, **kwargs: Any) -> Row:
    """The whole submit in one statement: selection count, cheap admission refusal, job,
    snapshot, first outbox event, ``submitted`` event, serialised admission (keyword
    arguments: :func:`submit_params`). Inside the caller's open transaction; the explicit
    ids statement runs on its generic plan (:data:`GENERIC_PLAN`).

    ``note_ids`` None selects every note of the tenant; ``since`` (with every note) makes a
    delta of what changed since that succeeded export (its base). Returns the job row plus
    ``selected`` (notes found), ``base_found`` and ``message_id``; the row's ``id`` is None
    when nothing was written because the selection was not acceptable (none found, more
    than ``max_selection``, ids that do not exist for the tenant, or no usable base).
    Admission refusals raise ``psycopg.Error`` with SQLSTATE XEX01 / XEX02 (see
    :mod:`exportcore.admission`).
    """
    statement, params = submit_params(**kwargs)
    if _generic(params):
        conn.execute(GENERIC_PLAN)
    row = conn.execute(statement, params).fetchone()
    assert row is not None
    return row


def job_submit_committed(conn: Conn, **kwargs: Any) -> Row:
    """:func:`job_submit` as its own transaction in ONE round trip (a pipeline: BEGIN, the
    generic plan, the statement, COMMIT); ``conn`` in autocommit mode with no transaction
    open. Returns the committed row; raises like :func:`job_submit` (nothing is then
    written)."""
    statement, params = submit_params(**kwargs)
    with conn.pipeline(), conn.transaction():
        if _generic(params):
            conn.execute(GENERIC_PLAN)
        cur = conn.execute(statement, params)
    row = cur.fetchone()
    assert row is not None
    return row


@dataclass(frozen=True, slots=True)
class SubmitRow:
    """One request of a shared submit (:func:`job_submit_many`): explicit note ids only."""

    job_id: UUID
    message_id: UUID
    tenant_id: str
    fmt: str
    payload: dict[str, Any]
    note_ids: Sequence[int]
    request_hash: str
    trace_context: dict[str, str] | None = None
    event_detail: dict[str, Any] | None = None


def submit_limits(settings: Any) -> dict[str, Any]:
    """The keyword arguments of a submit that come from the settings (an
    ``exportcore.settings.Settings``): attempts, deadline, selection bound, fast-queue bound,
    capacity and default quota."""
    return {
        "max_attempts": settings.max_attempts,
        "deadline_seconds": settings.job_deadline_seconds,
        "max_selection": settings.max_selection,
        "fast_queue_max_notes": settings.fast_queue_max_notes,
        "capacity": settings.admission_capacity,
        "default_quota": settings.tenant_active_quota,
    }


def job_submit_many(
    conn: Conn,
    rows: Sequence[SubmitRow],
    *,
    max_attempts: int,
    deadline_seconds: float,
    max_selection: int,
    fast_queue_max_notes: int,
    capacity: int,
    default_quota: int,
) -> list[Row]:
    """Several submits in ONE statement and its own transaction (one round trip, one
    commit, on its generic plan), each row admitted or refused on its own; ``conn`` in
    autocommit mode with no transaction open. One row back per request, in order: the job
    row (``id`` None when nothing was written), ``selected`` (notes found), ``refusal`` (an
    admission SQLSTATE, XEX01 / XEX02, or None) and its ``detail``. A database error fails
    the whole statement and writes nothing (``psycopg.Error``)."""
    params = {
        "job_ids": [r.job_id for r in rows],
        "message_ids": [r.message_id for r in rows],
        "tenant_ids": [r.tenant_id for r in rows],
        "formats": [r.fmt for r in rows],
        "payloads": [Jsonb(r.payload) for r in rows],
        "request_hashes": [r.request_hash for r in rows],
        "trace_contexts": [Jsonb(r.trace_context) if r.trace_context else None for r in rows],
        "event_details": [Jsonb(r.event_detail or {}) for r in rows],
        "requested": [len(r.note_ids) for r in rows],
        "note_rows": [i for i, r in enumerate(rows, start=1) for _ in r.note_ids],
        "note_ids": [note for r in rows for note in r.note_ids],
        "max_attempts": max_attempts,
        "deadline_seconds": deadline_seconds,
        "max_selection": max_selection,
        "fast_queue_max_notes": fast_queue_max_notes,
        "capacity": capacity,
        "default_quota": default_quota,
    }
    with conn.pipeline(), conn.transaction():
        conn.execute(GENERIC_PLAN)
        cur = conn.execute(q("jobs", "job_submit_many"), params)
    return cur.fetchall()


def claim_params(
    *,
    job_ids: Sequence[UUID],
    message_ids: Sequence[UUID | None],
    lease_seconds: float,
    take_token: UUID | None = None,
) -> dict[str, Any]:
    """The parameters of ``job_claim_many`` (see :func:`job_claim_many`; also sent by the
    worker's claim in its pipeline: :mod:`exportcore.claims`)."""
    return {
        "job_ids": list(job_ids),
        "message_ids": list(message_ids),
        "lease_seconds": lease_seconds,
        "take_token": take_token,
    }


def job_claim_many(
    conn: Conn,
    *,
    job_ids: Sequence[UUID],
    message_ids: Sequence[UUID | None],
    lease_seconds: float,
    take_token: UUID | None = None,
) -> list[JobRow]:
    """queued → running for each claimable job of a batch (``job_ids``, carried by the
    outbox events ``message_ids``, plus the jobs of the events claimed for ``take_token`` in
    the same transaction), with a fresh lease token and one more attempt, in one statement;
    returns the claimed rows (by id). A job that is not claimable (not due, leased,
    cancelled, terminal, out of time or attempts) is absent. The events delivered for the
    first time stamp their job's dispatch in the same row version."""
    return _job_rows(
        conn,
        q("jobs", "job_claim_many"),
        claim_params(
            job_ids=job_ids,
            message_ids=message_ids,
            lease_seconds=lease_seconds,
            take_token=take_token,
        ),
    )


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


def first_chunk_params(
    *, job_ids: Sequence[UUID], limit: int, max_bytes: int, take_token: UUID | None = None
) -> dict[str, Any]:
    """The parameters of ``job_items_first_chunk_many`` (see
    :func:`job_items_first_chunk_many`)."""
    return {
        "job_ids": list(job_ids),
        "limit": limit,
        "max_bytes": max_bytes,
        "take_token": take_token,
    }


def group_chunks(rows: Sequence[Row]) -> dict[UUID, list[Row]]:
    """Rows of ``job_items_first_chunk_many`` by job id, items in ordinal order."""
    out: dict[UUID, list[Row]] = {}
    for r in rows:
        out.setdefault(r["job_id"], []).append(r)
    return out


def job_items_first_chunk_many(
    conn: Conn,
    *,
    job_ids: Sequence[UUID],
    limit: int,
    max_bytes: int,
    take_token: UUID | None = None,
) -> dict[UUID, list[Row]]:
    """The first chunk of each job's snapshot (bounded per job as :func:`job_items_chunk`),
    in one read, for ``job_ids`` and the jobs of the events claimed for ``take_token``; by
    job id, items in ordinal order. A job without items is absent."""
    rows = conn.execute(
        q("jobs", "job_items_first_chunk_many"),
        first_chunk_params(
            job_ids=job_ids, limit=limit, max_bytes=max_bytes, take_token=take_token
        ),
    ).fetchall()
    return group_chunks(rows)


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
        _arrays(
            finishes,
            job_ids="job_id",
            lease_tokens="lease_token",
            result_refs="result_ref",
            sha256s="sha256",
            nbytes="nbytes",
            rows="rows",
            etags="etag",
        ),
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
    labels: dict[str, Any] | None = None,
) -> list[Row]:
    """Up to ``limit`` of the tenant's jobs, newest first, strictly after the keyset
    cursor ``before`` = (created_at, id) of the last row of the previous page; with
    ``labels`` (:func:`exportcore.domain.labels_filter`), only the jobs that carry every
    tag and metadata pair in it (``job_list_for_tenant_labelled``, served by the labels
    index)."""
    params: dict[str, Any] = {
        "tenant_id": tenant_id,
        "status": status,
        "before_created_at": before[0] if before else None,
        "before_id": before[1] if before else None,
        "limit": limit,
    }
    if labels is None:
        return conn.execute(q("jobs", "job_list_for_tenant"), params).fetchall()
    return conn.execute(
        q("jobs", "job_list_for_tenant_labelled"), {**params, "labels": Jsonb(labels)}
    ).fetchall()


def job_list_admin(
    conn: Conn,
    *,
    limit: int,
    tenant_id: str | None = None,
    status: str | None = None,
    labels: dict[str, Any] | None = None,
    before: tuple[datetime, UUID] | None = None,
) -> list[Row]:
    """Up to ``limit`` jobs of any tenant (or of ``tenant_id``), newest first, strictly
    after the keyset cursor ``before``; ``status`` and ``labels``
    (:func:`exportcore.domain.labels_filter`) narrow them. Unprepared: every filter is
    optional, and a generic plan would serve none of them well."""
    return conn.execute(
        q("jobs", "job_list_admin"),
        {
            "tenant_id": tenant_id,
            "status": status,
            "labels": Jsonb(labels) if labels else None,
            "before_created_at": before[0] if before else None,
            "before_id": before[1] if before else None,
            "limit": limit,
        },
        prepare=False,
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


def job_events(
    conn: Conn,
    *,
    job_id: UUID,
    limit: int,
    after: tuple[datetime, int] | None = None,
) -> list[Row]:
    """One page of the job's history, oldest first: at most ``limit`` events after the
    keyset cursor ``after`` = (at, id) of the previous page's last event."""
    after_at, after_id = after if after is not None else (None, None)
    return conn.execute(
        q("jobs", "job_events"),
        {"job_id": job_id, "limit": limit, "after_at": after_at, "after_id": after_id},
    ).fetchall()


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
            **_arrays(
                requeues,
                job_ids="job_id",
                lease_tokens="lease_token",
                message_ids="message_id",
                delays="delay_seconds",
                error_codes="error_code",
            ),
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
            **_arrays(
                failures, job_ids="job_id", lease_tokens="lease_token", error_codes="error_code"
            ),
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
            **_replay_params(max_attempts, deadline_seconds, trace_context, detail),
        },
    ).fetchall()


def _replay_params(
    max_attempts: int,
    deadline_seconds: float,
    trace_context: dict[str, str] | None,
    detail: dict[str, Any] | None,
) -> dict[str, Any]:
    """The parameters every replay statement (``job_replay``, ``job_replay_many``) gives
    its new jobs: attempts, the deadline in seconds from now, the trace context, and the
    ``detail`` both history events carry."""
    return {
        "max_attempts": max_attempts,
        "deadline_seconds": deadline_seconds,
        "trace_context": Jsonb(trace_context) if trace_context else None,
        "detail": Jsonb(detail or {}),
    }


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
            **_replay_params(max_attempts, deadline_seconds, trace_context, detail),
        },
    ).fetchone()


def job_mark_replayed(
    conn: Conn, *, job_id: UUID, replay_id: UUID, corrected: Sequence[str]
) -> Row | None:
    """Write the failed job's ``replayed`` event for a corrected replay ``replay_id``
    (``corrected``: the corrected fields); None if the job is not failed."""
    return conn.execute(
        q("jobs", "job_mark_replayed"),
        {"job_id": job_id, "replay_id": replay_id, "corrected": Jsonb(list(corrected))},
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
