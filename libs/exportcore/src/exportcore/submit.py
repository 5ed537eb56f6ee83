"""Accepting an export: validate the selection, snapshot the notes, write the job, its outbox
event and its history event in ONE transaction (DESIGN.md invariant 1).

The same path serves the API, the CLI, replays and schedules, so every entry point gets the
same validation (and, later, the same admission control).
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID, uuid4

from psycopg_pool import ConnectionPool

from exportcore.db import Conn, Row
from exportcore.domain import (
    ExportRequest,
    InvalidSelection,
    JobNotFound,
    JobStateConflict,
    UnknownNotes,
    route_queue,
)
from exportcore.settings import Settings
from exportcore.store import jobs as job_store
from exportcore.store import notes as note_store

log = logging.getLogger(__name__)

_SNAPSHOT_RETRIES = 3


class _SelectionChanged(Exception):
    """Notes were added or deleted between counting and snapshotting; retry the submit."""


def _selection_size(conn: Conn, tenant_id: str, request: ExportRequest, limit: int) -> int:
    if request.note_ids is None:
        count = note_store.notes_count(conn, tenant_id=tenant_id)
        if count == 0:
            raise InvalidSelection("the tenant has no notes to export")
    else:
        found = note_store.notes_existing_ids(conn, tenant_id=tenant_id, note_ids=request.note_ids)
        unknown = [i for i in request.note_ids if i not in found]
        if unknown:
            raise UnknownNotes(
                f"{len(unknown)} note id(s) do not exist for this tenant",
                unknown_note_ids=unknown[:1000],
            )
        count = len(request.note_ids)
    if count > limit:
        raise InvalidSelection(f"the selection has {count} notes; the limit is {limit}")
    return count


def submit_export(
    pool: ConnectionPool[Conn],
    settings: Settings,
    *,
    tenant_id: str,
    request: ExportRequest,
    idempotency_key: str | None = None,
    trace_context: dict[str, str] | None = None,
    source: str = "api",
) -> Row:
    """Accept one export and return the committed job row.

    The row is returned only after the transaction that wrote the job, its snapshot, its
    outbox event and its ``submitted`` history event has committed; when anything fails
    nothing is written. Raises ``InvalidSelection`` / ``UnknownNotes`` for bad input and
    ``psycopg.Error`` when the database fails.
    """
    for attempt in range(1, _SNAPSHOT_RETRIES + 1):
        try:
            with pool.connection() as conn:
                return _submit_once(
                    conn, settings, tenant_id, request, idempotency_key, trace_context, source
                )
        except _SelectionChanged:
            log.info("notes changed during submit; retrying", extra={"attempt": attempt})
    raise InvalidSelection("the notes kept changing while the export was accepted; try again")


def _submit_once(
    conn: Conn,
    settings: Settings,
    tenant_id: str,
    request: ExportRequest,
    idempotency_key: str | None,
    trace_context: dict[str, str] | None,
    source: str,
) -> Row:
    count = _selection_size(conn, tenant_id, request, settings.max_selection)
    job_id, message_id = uuid4(), uuid4()
    job = job_store.job_submit(
        conn,
        job_id=job_id,
        message_id=message_id,
        tenant_id=tenant_id,
        queue=route_queue(count, settings.fast_queue_max_notes),
        fmt=request.format.value,
        payload=request.canonical(),
        note_count=count,
        request_hash=request.request_hash(),
        max_attempts=settings.max_attempts,
        deadline_seconds=settings.job_deadline_seconds,
        idempotency_key=idempotency_key,
        trace_context=trace_context,
        event_detail=_event_detail(source, count),
    )
    written = job_store.job_snapshot_notes(
        conn, job_id=job_id, tenant_id=tenant_id, note_ids=request.note_ids
    )
    if written != count:
        raise _SelectionChanged()  # leaving the pool's block rolls everything back
    return job


def _event_detail(source: str, count: int) -> dict[str, Any]:
    return {"source": source, "note_count": count}


def replay_export(
    pool: ConnectionPool[Conn],
    settings: Settings,
    *,
    original_id: UUID,
    trace_context: dict[str, str] | None = None,
) -> Row:
    """Accept a NEW job with a failed job's snapshot and ``replay_of`` = the original.

    The original job and its dead letter stay as they are. Raises ``JobNotFound`` for an
    unknown id and ``JobStateConflict`` when the original is not failed.
    """
    with pool.connection() as conn:
        job = job_store.job_replay(
            conn,
            original_id=original_id,
            job_id=uuid4(),
            message_id=uuid4(),
            max_attempts=settings.max_attempts,
            deadline_seconds=settings.job_deadline_seconds,
            trace_context=trace_context,
        )
        if job is None:
            original = job_store.job_get(conn, job_id=original_id)
            if original is None:
                raise JobNotFound(f"no export {original_id}")
            raise JobStateConflict(
                f"export {original_id} is {original['status']}; only failed exports can be replayed"
            )
    log.info("replay accepted", extra={"job_id": str(job["id"]), "replay_of": str(original_id)})
    return job


def request_cancel(pool: ConnectionPool[Conn], *, tenant_id: str, job_id: UUID) -> Row:
    """Ask to cancel a job of ``tenant_id``; returns the job as it is now.

    A queued job is cancelled in the same transaction; a running job keeps running with
    ``cancel_requested`` until its worker stops at the next chunk boundary (or its lease
    expires) and it becomes ``cancelled``. Asking again is harmless. Raises ``JobNotFound``
    (also for another tenant's job) and ``JobStateConflict`` for a finished job.
    """
    with pool.connection() as conn:
        job = job_store.job_request_cancel(conn, job_id=job_id, tenant_id=tenant_id)
        if job is None:
            job = job_store.job_get(conn, job_id=job_id, tenant_id=tenant_id)
            if job is None:
                raise JobNotFound(f"no export {job_id}")
            if job["status"] in ("succeeded", "failed", "cancelled"):
                raise JobStateConflict(f"export {job_id} is already {job['status']}")
    return job
