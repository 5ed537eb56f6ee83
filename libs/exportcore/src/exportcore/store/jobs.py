"""Job transitions (``sql/jobs.sql``): submit, snapshot, claim, renew, finish, reads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from exportcore.db import Conn, Row
from exportcore.sql import q
from psycopg.types.json import Jsonb


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
) -> Row | None:
    """running → succeeded as a compare-and-set on the lease; None if a stale worker."""
    return conn.execute(
        q("jobs", "job_finish_if_leased"),
        {
            "job_id": job_id,
            "lease_token": lease_token,
            "result_ref": result_ref,
            "sha256": sha256,
            "bytes": nbytes,
            "rows": rows,
        },
    ).fetchone()


def job_get(conn: Conn, *, job_id: UUID, tenant_id: str | None = None) -> Row | None:
    """One job; scoped to ``tenant_id`` when given (another tenant's job reads as None)."""
    if tenant_id is None:
        return conn.execute(q("jobs", "job_get"), {"job_id": job_id}).fetchone()
    return conn.execute(
        q("jobs", "job_get_for_tenant"), {"job_id": job_id, "tenant_id": tenant_id}
    ).fetchone()


def job_items_chunk(conn: Conn, *, job_id: UUID, after: int, limit: int) -> list[Row]:
    """Up to ``limit`` snapshot items with ordinal > ``after``, in order."""
    return conn.execute(
        q("jobs", "job_items_chunk"), {"job_id": job_id, "after": after, "limit": limit}
    ).fetchall()


def job_events(conn: Conn, *, job_id: UUID) -> list[Row]:
    """The job's history, oldest first."""
    return conn.execute(q("jobs", "job_events"), {"job_id": job_id}).fetchall()


def job_fail_if_leased(
    conn: Conn, *, job_id: UUID, lease_token: UUID, error_code: str, error_detail: str
) -> Row | None:
    """running → failed by the holder of ``lease_token``; None if it no longer holds it."""
    return conn.execute(
        q("jobs", "job_fail_if_leased"),
        {
            "job_id": job_id,
            "lease_token": lease_token,
            "error_code": error_code,
            "error_detail": error_detail[:1000],
        },
    ).fetchone()
