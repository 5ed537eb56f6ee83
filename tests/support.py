"""Helpers shared by integration and e2e tests (real database, no mocks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

from psycopg_pool import ConnectionPool

from exportcore.db import Conn, Row
from exportcore.domain import ExportFormat, ExportRequest
from exportcore.importer import import_notes
from exportcore.settings import Settings
from exportcore.store.tenants import tenant_upsert
from exportcore.submit import submit_export


def create_tenant(pool: ConnectionPool[Conn], tenant_id: str | None = None) -> str:
    """A new tenant with a unique id; returns the id."""
    tid = tenant_id or f"t-{uuid4().hex[:10]}"
    with pool.connection() as conn:
        tenant_upsert(conn, tenant_id=tid, name=tid)
    return tid


def tenant_with_notes(pool: ConnectionPool[Conn], notes_dir: Path) -> tuple[str, list[int]]:
    """A new tenant holding the real notes of ``notes_dir``; returns (tenant id, note ids)."""
    tid = create_tenant(pool)
    import_notes(pool, tid, notes_dir)
    with pool.connection() as conn:
        ids = [
            r["id"]
            for r in conn.execute("SELECT id FROM notes WHERE tenant_id = %s ORDER BY id", (tid,))
        ]
    return tid, ids


def submit(
    pool: ConnectionPool[Conn],
    settings: Settings,
    tenant_id: str,
    note_ids: list[int] | None,
    fmt: str = "json",
) -> Row:
    """Submit through the library path the API uses; returns the committed job row."""
    request = ExportRequest.build(ExportFormat(fmt), note_ids, note_ids is None)
    return submit_export(pool, settings, tenant_id=tenant_id, request=request, source="test").job


def job(pool: ConnectionPool[Conn], job_id: UUID) -> Row:
    """The current job row (raises if missing)."""
    with pool.connection() as conn:
        row = conn.execute("SELECT * FROM export_jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None, f"job {job_id} does not exist"
    return row


def shift_job(pool: ConnectionPool[Conn], job_id: UUID, **intervals: str) -> None:
    """Move one job's timestamps, e.g. ``shift_job(p, id, lease_expires_at='-1 hour')``.

    This is how tests make time pass for one job without sleeping.
    """
    allowed = {
        "lease_expires_at",
        "next_attempt_at",
        "deadline_at",
        "last_dispatched_at",
        "created_at",
    }
    assert set(intervals) <= allowed, set(intervals) - allowed
    sets = ", ".join(f"{col} = {col} + %s::interval" for col in intervals)
    with pool.connection() as conn:
        conn.execute(f"UPDATE export_jobs SET {sets} WHERE id = %s", (*intervals.values(), job_id))  # type: ignore[arg-type]


def events(pool: ConnectionPool[Conn], job_id: UUID) -> list[Row]:
    """The job's history rows, oldest first."""
    with pool.connection() as conn:
        return conn.execute(
            "SELECT * FROM export_job_events WHERE job_id = %s ORDER BY id", (job_id,)
        ).fetchall()


def count(pool: ConnectionPool[Conn], sql: str, *params: Any) -> int:
    """The single integer a counting query returns."""
    with pool.connection() as conn:
        row = conn.execute(sql, params).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return int(next(iter(row.values())))
