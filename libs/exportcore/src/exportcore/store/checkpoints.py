"""Checkpoints of bulk renders (``sql/checkpoints.sql``): save, take over, discard, read.

Every write is guarded by the job's current lease token (an unexpired lease): no row back
means refused (docs/architecture.md "Checkpoints").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from exportcore.db import Conn, Row
from exportcore.sql import q


def checkpoint_get(conn: Conn, *, job_id: UUID) -> Row | None:
    """The job's checkpoint row, or None."""
    return conn.execute(q("checkpoints", "checkpoint_get"), {"job_id": job_id}).fetchone()


def checkpoint_segments(conn: Conn, *, job_id: UUID, ordinal: int) -> list[bytes]:
    """The renderer state segments of the job's checkpoint up to cursor ``ordinal``."""
    rows = conn.execute(
        q("checkpoints", "checkpoint_segments"), {"job_id": job_id, "ordinal": ordinal}
    ).fetchall()
    return [bytes(r["state"]) for r in rows]


def checkpoint_save(
    conn: Conn,
    *,
    job_id: UUID,
    lease_token: UUID,
    layout: int,
    artifact_key: str,
    ordinal: int,
    rows: int,
    nbytes: int,
    sha256: str,
    upload_id: str | None,
    parts: Sequence[Sequence[Any]],
    renderer: dict[str, Any],
    state: bytes,
) -> Row | None:
    """Save the checkpoint at cursor ``ordinal`` with its renderer segment ``state``;
    ``{job_id, ordinal, rows, bytes}``, or None when refused (lease lost)."""
    return conn.execute(
        q("checkpoints", "checkpoint_save"),
        {
            "job_id": job_id,
            "lease_token": lease_token,
            "layout": layout,
            "artifact_key": artifact_key,
            "ordinal": ordinal,
            "rows": rows,
            "nbytes": nbytes,
            "sha256": sha256,
            "upload_id": upload_id,
            "parts": Jsonb([list(p) for p in parts]),
            "renderer": Jsonb(renderer),
            "state": state,
        },
    ).fetchone()


def checkpoint_take_over(
    conn: Conn,
    *,
    job_id: UUID,
    lease_token: UUID,
    old_token: UUID,
    ordinal: int,
    artifact_key: str,
    upload_id: str | None,
    parts: Sequence[Sequence[Any]],
    seconds: float,
) -> Row | None:
    """Make the checkpoint written under ``old_token`` (at cursor ``ordinal``) this
    token's, naming its copy of the prefix (``seconds``: what the takeover took, for its
    ``resumed`` event); ``{job_id, ordinal, rows, bytes, resumes}``, or None when refused
    (lease lost, or the checkpoint changed)."""
    return conn.execute(
        q("checkpoints", "checkpoint_take_over"),
        {
            "job_id": job_id,
            "lease_token": lease_token,
            "old_token": old_token,
            "ordinal": ordinal,
            "artifact_key": artifact_key,
            "upload_id": upload_id,
            "parts": Jsonb([list(p) for p in parts]),
            "seconds": seconds,
        },
    ).fetchone()


def checkpoint_discard(conn: Conn, *, job_id: UUID, lease_token: UUID) -> Row | None:
    """Drop the job's checkpoint and segments (by the lease holder); the dropped row, or
    None."""
    return conn.execute(
        q("checkpoints", "checkpoint_discard"), {"job_id": job_id, "lease_token": lease_token}
    ).fetchone()


def checkpoint_delete_finished(conn: Conn, *, job_id: UUID, lease_token: UUID) -> bool:
    """Delete the checkpoint of a job that succeeded under ``lease_token``; True if one
    was deleted."""
    row = conn.execute(
        q("checkpoints", "checkpoint_delete_finished"),
        {"job_id": job_id, "lease_token": lease_token},
    ).fetchone()
    return row is not None


def checkpoint_keys_in_use_many(conn: Conn, *, job_ids: Sequence[UUID]) -> set[str]:
    """The artifact keys that checkpoints of queued or running jobs among ``job_ids``
    hold (orphan cleanup keeps them)."""
    rows = conn.execute(
        q("checkpoints", "checkpoint_keys_in_use_many"), {"job_ids": list(job_ids)}
    ).fetchall()
    return {r["artifact_key"] for r in rows}


def checkpoint_progress(conn: Conn, *, job_id: UUID) -> Row | None:
    """``{rows, bytes, resumes, carried_rows, updated_at}`` of the job's checkpoint."""
    return conn.execute(q("checkpoints", "checkpoint_progress"), {"job_id": job_id}).fetchone()
