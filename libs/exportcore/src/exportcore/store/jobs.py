"""Job transitions (``sql/jobs.sql``): submit, snapshot, claim, renew, finish, reads."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from exportcore.db import Conn, Row
from exportcore.sql import q


def job_submit(
    conn: Conn,
    *,
    job_id: UUID,
    message_id: UUID,
    tenant_id: str,
    queue: str,
    fmt: str,
    payload: dict[str, Any],
    note_count: int,
    request_hash: str,
    max_attempts: int,
    deadline_seconds: float,
    idempotency_key: str | None = None,
    replay_of: UUID | None = None,
    trace_context: dict[str, str] | None = None,
    event_detail: dict[str, Any] | None = None,
) -> Row:
    """Insert a queued job + its first outbox event + a ``submitted`` event; returns the job."""
    row = conn.execute(
        q("jobs", "job_submit"),
        {
            "job_id": job_id,
            "message_id": message_id,
            "tenant_id": tenant_id,
            "queue": queue,
            "format": fmt,
            "payload": Jsonb(payload),
            "note_count": note_count,
            "request_hash": request_hash,
            "idempotency_key": idempotency_key,
            "max_attempts": max_attempts,
            "deadline_seconds": deadline_seconds,
            "replay_of": replay_of,
            "trace_context": Jsonb(trace_context) if trace_context else None,
            "event_detail": Jsonb(event_detail or {}),
        },
    ).fetchone()
    assert row is not None
    return row


def job_snapshot_notes(
    conn: Conn, *, job_id: UUID, tenant_id: str, note_ids: Sequence[int] | None
) -> int:
    """Copy the selected notes (all of the tenant's when ``note_ids`` is None) into the
    job's snapshot; returns the number of items written."""
    if note_ids is None:
        cur = conn.execute(
            q("jobs", "job_snapshot_all_notes"), {"job_id": job_id, "tenant_id": tenant_id}
        )
    else:
        cur = conn.execute(
            q("jobs", "job_snapshot_notes"),
            {"job_id": job_id, "tenant_id": tenant_id, "note_ids": list(note_ids)},
        )
    return cur.rowcount


def job_claim(
    conn: Conn, *, job_id: UUID, message_id: UUID | None, lease_seconds: float
) -> Row | None:
    """queued → running with a fresh lease token and one more attempt; None if refused."""
    return conn.execute(
        q("jobs", "job_claim"),
        {"job_id": job_id, "message_id": message_id, "lease_seconds": lease_seconds},
    ).fetchone()


def job_claim_refusal(conn: Conn, *, job_id: UUID) -> Row | None:
    """The facts that explain a refused claim (None when the job does not exist)."""
    return conn.execute(q("jobs", "job_claim_refusal"), {"job_id": job_id}).fetchone()


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
) -> Row | None:
    """running → succeeded as a compare-and-set on the lease; None if a stale worker.

    ``etag`` is the store's own ETag of the artifact (S3), None when it has none."""
    return conn.execute(
        q("jobs", "job_finish_if_leased"),
        {
            "job_id": job_id,
            "lease_token": lease_token,
            "result_ref": result_ref,
            "sha256": sha256,
            "bytes": nbytes,
            "rows": rows,
            "etag": etag,
        },
    ).fetchone()


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
) -> Row | None:
    """running → queued with a durable backoff and a new outbox event.

    By the lease holder after a transient error (``expired_only=False``: event ``retried``),
    or by the recovery-scanner after the lease expired (``expired_only=True``: event
    ``lease_expired``). None when refused: token lost, cancel requested, no attempt left,
    or less than ``margin_seconds`` before the deadline.
    """
    return conn.execute(
        q("jobs", "job_requeue_if_leased"),
        {
            "job_id": job_id,
            "lease_token": lease_token,
            "message_id": message_id,
            "delay_seconds": delay_seconds,
            "margin_seconds": margin_seconds,
            "error_code": error_code,
            "error_detail": error_detail[:1000],
            "expired_only": expired_only,
            "event_kind": "lease_expired" if expired_only else "retried",
            "outbox_reason": "recovery" if expired_only else "retry",
        },
    ).fetchone()


def job_fail_if_leased(
    conn: Conn,
    *,
    job_id: UUID,
    lease_token: UUID,
    error_code: str,
    error_detail: str,
    expired_only: bool = False,
) -> Row | None:
    """running → failed with a dead letter; None if ``lease_token`` no longer holds the job
    (or, with ``expired_only``, its lease has not expired)."""
    return conn.execute(
        q("jobs", "job_fail_if_leased"),
        {
            "job_id": job_id,
            "lease_token": lease_token,
            "error_code": error_code,
            "error_detail": error_detail[:1000],
            "expired_only": expired_only,
        },
    ).fetchone()


def job_cancel_if_leased(
    conn: Conn, *, job_id: UUID, lease_token: UUID, expired_only: bool = False
) -> Row | None:
    """running → cancelled for a job whose cancel was requested; None otherwise."""
    return conn.execute(
        q("jobs", "job_cancel_if_leased"),
        {"job_id": job_id, "lease_token": lease_token, "expired_only": expired_only},
    ).fetchone()


def job_request_cancel(conn: Conn, *, job_id: UUID, tenant_id: str) -> Row | None:
    """Flag a cancel (a queued job is cancelled at once); None when nothing changed
    (unknown, another tenant's, terminal, or already requested)."""
    return conn.execute(
        q("jobs", "job_request_cancel"), {"job_id": job_id, "tenant_id": tenant_id}
    ).fetchone()


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
) -> Row | None:
    """A new queued job copying a failed job's snapshot; None if the original is not failed."""
    return conn.execute(
        q("jobs", "job_replay"),
        {
            "original_id": original_id,
            "job_id": job_id,
            "message_id": message_id,
            "max_attempts": max_attempts,
            "deadline_seconds": deadline_seconds,
            "trace_context": Jsonb(trace_context) if trace_context else None,
        },
    ).fetchone()
