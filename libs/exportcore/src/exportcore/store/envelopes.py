"""Envelopes of encrypted artifacts and the recipients of jobs (``sql/envelopes.sql``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from exportcore.db import Conn, Row
from exportcore.sql import q


def envelope_recipients_many(conn: Conn, *, job_ids: Sequence[UUID]) -> dict[UUID, tuple[str, ...]]:
    """``{job id: sorted age recipients}`` of the jobs that have any (the request's and
    the tenant's); a job without recipients is absent."""
    rows = conn.execute(
        q("envelopes", "envelope_recipients_many"), {"job_ids": list(job_ids)}
    ).fetchall()
    return {row["job_id"]: tuple(row["recipients"]) for row in rows}


def envelope_record_many(
    conn: Conn, rendered: Sequence[tuple[Any, dict[str, Any], dict[str, str] | None]]
) -> list[Row]:
    """Record the envelope of each ``(job row, envelope header, signature or None)`` of a
    batch, each only while its job still runs under the row's lease token; a row per
    envelope recorded."""
    if not rendered:
        return []
    return conn.execute(
        q("envelopes", "envelope_record_many"),
        {
            "job_ids": [job.id for job, _, _ in rendered],
            "lease_tokens": [job.token for job, _, _ in rendered],
            "headers": [Jsonb(header) for _, header, _ in rendered],
            "signatures": [Jsonb(sig) if sig is not None else None for _, _, sig in rendered],
        },
    ).fetchall()


def envelope_get(conn: Conn, *, job_id: UUID, tenant_id: str) -> Row | None:
    """``{header, signature, created_at}`` of a tenant's succeeded encrypted export, or
    None (not encrypted, not succeeded, not this tenant's)."""
    return conn.execute(
        q("envelopes", "envelope_get"), {"job_id": job_id, "tenant_id": tenant_id}
    ).fetchone()
