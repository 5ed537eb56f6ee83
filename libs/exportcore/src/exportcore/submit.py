"""Accepting an export: validate the selection, snapshot the notes, write the job, its outbox
event and its history event, and pass admission control, in ONE transaction
(docs/architecture.md INV-1 accepted-means-committed, INV-9 admission-is-serialised and
INV-11 idempotency-key).

The same path serves the API, the CLI, replays and schedules, so every entry point gets the
same validation and the same admission control.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn
from uuid import UUID

import psycopg
from psycopg_pool import ConnectionPool

from exportcore import faults, metrics, telemetry
from exportcore.admission import AdmissionRefused, admission_error, record_refusal
from exportcore.coalesce import SubmitCoalescer, pending_row, request_columns
from exportcore.db import Conn, Row, transaction
from exportcore.domain import (
    ExportError,
    ExportRequest,
    IdempotencyConflict,
    InvalidSelection,
    UnknownNotes,
    UnusableBase,
    new_id,
)
from exportcore.settings import Settings
from exportcore.store import idempotency_keys as idempotency_store
from exportcore.store import jobs as job_store
from exportcore.store import notes as note_store

log = logging.getLogger(__name__)


class SelectionChanged(Exception):
    """Notes changed while a submit was taken (retry the submit). The one-statement submit
    reads the selection and copies it from one snapshot, so this is raised only when the
    statement missed explicit ids that all exist a moment later (a note deleted and its id
    written again in between); the schedule tick catches it and tries the slot again."""


def _refuse_selection(
    conn: Conn, tenant_id: str, request: ExportRequest, selected: int, limit: int
) -> NoReturn:
    """Raise the error for a selection the submit statement did not accept: no notes, more
    than ``limit`` notes, or ids that do not exist for the tenant (listed)."""
    if request.note_ids is None:
        if selected == 0:
            raise InvalidSelection("the tenant has no notes to export")
        raise InvalidSelection(f"the selection has {selected} notes; the limit is {limit}")
    check_note_ids(conn, tenant_id, request.note_ids)
    raise SelectionChanged()  # every id exists now: notes changed while the submit ran


UNKNOWN_NOTE_IDS_LISTED = 1000
"""At most this many unknown note ids are listed in an ``unknown_notes`` problem (a selection
may hold 100,000); ``unknown_note_count`` and ``unknown_note_ids_truncated`` say when there
were more."""


def check_note_ids(conn: Conn, tenant_id: str, note_ids: tuple[int, ...]) -> None:
    """Raise ``UnknownNotes`` for the ``note_ids`` that are not notes of the tenant; return
    when all are. Its extension members: ``unknown_note_ids`` (the first
    :data:`UNKNOWN_NOTE_IDS_LISTED`, in the request's order), ``unknown_note_count`` (all of
    them) and ``unknown_note_ids_truncated`` (true when the list is cut); the detail says
    how many and whether the list is cut."""
    found = note_store.notes_existing_ids(conn, tenant_id=tenant_id, note_ids=note_ids)
    unknown = [i for i in note_ids if i not in found]
    if unknown:
        total = len(unknown)
        cut = total > UNKNOWN_NOTE_IDS_LISTED
        detail = (
            "1 note id does not exist for this tenant"
            if total == 1
            else f"{total:,} note ids do not exist for this tenant"
        )
        if cut:
            detail += f"; unknown_note_ids lists the first {UNKNOWN_NOTE_IDS_LISTED:,}"
        raise UnknownNotes(
            detail,
            unknown_note_ids=unknown[:UNKNOWN_NOTE_IDS_LISTED],
            unknown_note_count=total,
            unknown_note_ids_truncated=cut,
        )


@dataclass(frozen=True)
class Submitted:
    """The accepted job, and whether it was an earlier job returned for a repeated
    Idempotency-Key (``replayed``) rather than a new one."""

    job: Row
    replayed: bool = False

    @property
    def message_id(self) -> Any:
        """The id of the job's first outbox event (= Celery task id); None for a replay."""
        return None if self.replayed else self.job.get("message_id")


def submit_export(
    pool: ConnectionPool[Conn],
    settings: Settings,
    *,
    tenant_id: str,
    request: ExportRequest,
    idempotency_key: str | None = None,
    trace_context: dict[str, str] | None = None,
    source: str = "api",
    coalescer: SubmitCoalescer | None = None,
) -> Submitted:
    """Accept one export; returns the committed job.

    The job is returned only after the transaction that wrote it, its snapshot, its outbox
    event and its ``submitted`` history event, and passed admission, has committed; when
    anything fails nothing is written. With ``idempotency_key``, the same key and the same
    canonical request return the original job (``replayed``) for
    ``IDEMPOTENCY_RETENTION_HOURS``; concurrent requests with one new key create one job.

    With ``coalescer`` (the api process's), a submit of explicit note ids without a key may
    share its statement and its commit with concurrent ones (:mod:`exportcore.coalesce`);
    it still returns only once its own row is committed, and fails only for its own reasons.

    Raises ``InvalidSelection`` / ``UnknownNotes`` for bad input, ``IdempotencyConflict``
    for a key reused with another request, ``CapacityExceeded`` / ``QuotaExceeded`` when
    admission refuses, and ``psycopg.Error`` when the database fails.
    """
    with (
        telemetry.span(
            "exports.submit", attributes={"tenant_id": tenant_id, "source": source}
        ) as current,
        counted(source) as count,
    ):
        # The submit span's context is stored with the job and its outbox events, so the
        # publisher and the worker join this trace.
        trace_context = trace_context or telemetry.current_context()
        # Without an Idempotency-Key the submit is ONE statement in its own transaction, sent
        # in one round trip with one commit. With a key (reserved first) or with failpoints
        # armed (a drill fails the transaction after every write) it runs inside the
        # caller's BEGIN ... COMMIT.
        explicit = idempotency_key is not None or faults.enabled()
        try:
            if (
                coalescer is not None
                and not explicit
                and request.note_ids is not None
                and request.since is None
            ):
                submitted = _submit_shared(
                    pool, settings, coalescer, tenant_id, request, trace_context, source
                )
            else:
                with transaction(pool) if explicit else pool.connection() as conn:
                    submitted = submit_in_transaction(
                        conn,
                        settings,
                        tenant_id=tenant_id,
                        request=request,
                        idempotency_key=idempotency_key,
                        trace_context=trace_context,
                        source=source,
                        committed=not explicit,
                    )
        except AdmissionRefused as exc:
            record_refusal(pool, tenant_id=tenant_id, exc=exc)
            raise
        if telemetry.enabled():
            telemetry.set_attributes(
                current, telemetry.job_attributes(submitted.job, submitted.message_id)
            )
        count("idempotent_replay" if submitted.replayed else "accepted")
        return submitted


@contextmanager
def counted(source: str) -> Iterator[Callable[[str], None]]:
    """Count one submission in ``exports_submits_total``: the block reports success through
    the callable it gets; refusals and bad input are counted from the exception."""
    outcomes: list[str] = []
    try:
        yield outcomes.append
    except AdmissionRefused as exc:
        metrics.SUBMITS.labels(exc.code, source).inc()
        raise
    except IdempotencyConflict:
        metrics.SUBMITS.labels("conflict", source).inc()
        raise
    except ExportError:
        metrics.SUBMITS.labels("invalid", source).inc()
        raise
    for outcome in outcomes:
        metrics.SUBMITS.labels(outcome, source).inc()


def submit_in_transaction(
    conn: Conn,
    settings: Settings,
    *,
    tenant_id: str,
    request: ExportRequest,
    source: str,
    idempotency_key: str | None = None,
    trace_context: dict[str, str] | None = None,
    job_id: UUID | None = None,
    event_detail: dict[str, Any] | None = None,
    replay_of: UUID | None = None,
    committed: bool = False,
) -> Submitted:
    """Write one accepted job on ``conn``: the job, its snapshot, its first outbox event,
    its ``submitted`` event and its admission in ONE statement (``job_submit``).
    ``replay_of`` names the failed job a corrected replay redrives
    (:func:`exportcore.replays.replay_export`).

    With ``committed`` (``conn`` in autocommit, no transaction open) that statement is its
    own transaction, sent in one round trip; otherwise it runs inside the caller's open
    transaction (the schedule tick, an Idempotency-Key), where admission is the last thing
    it does and the caller must commit right after (the admission row locks are held until
    then). Raises like :func:`submit_export`.
    """
    job_id = job_id or new_id()
    message_id = new_id()
    if idempotency_key is not None:
        earlier = earlier_job_for_key(conn, settings, tenant_id, request, idempotency_key, job_id)
        if earlier is not None:
            return Submitted(earlier, replayed=True)
    if request.note_ids is not None and len(request.note_ids) > settings.max_selection:
        size, limit = len(request.note_ids), settings.max_selection
        raise InvalidSelection(f"the selection has {size} notes; the limit is {limit}")
    write = job_store.job_submit_committed if committed else job_store.job_submit
    try:
        job = write(
            conn,
            job_id=job_id,
            message_id=message_id,
            tenant_id=tenant_id,
            **request_columns(request),
            idempotency_key=idempotency_key,
            replay_of=replay_of,
            trace_context=trace_context,
            event_detail={"source": source, **(event_detail or {})},
            **job_store.submit_limits(settings),
            since=request.since,
        )
    except psycopg.Error as exc:
        raise admission_error(exc, settings) from None
    if job["id"] is None:
        if request.since is not None and not job["base_found"]:
            raise UnusableBase(
                f"export {request.since} is not a succeeded export of all notes of this "
                f"tenant in the {request.format.value} format: a delta needs one as its base"
            )
        _refuse_selection(conn, tenant_id, request, job["selected"], settings.max_selection)
    faults.hit("submit.before_commit")  # drills: the transaction fails after every write
    return Submitted(job)


def _submit_shared(
    pool: ConnectionPool[Conn],
    settings: Settings,
    coalescer: SubmitCoalescer,
    tenant_id: str,
    request: ExportRequest,
    trace_context: dict[str, str] | None,
    source: str,
) -> Submitted:
    """One submit through the process's coalescer (explicit ids, no key): the same checks
    and errors as :func:`submit_in_transaction`, with the statement possibly shared."""
    assert request.note_ids is not None
    if len(request.note_ids) > settings.max_selection:
        size, limit = len(request.note_ids), settings.max_selection
        raise InvalidSelection(f"the selection has {size} notes; the limit is {limit}")
    row = pending_row(
        job_id=new_id(),
        message_id=new_id(),
        tenant_id=tenant_id,
        request=request,
        trace_context=trace_context,
        event_detail={"source": source},
    )
    try:
        job = coalescer.submit(row)
    except psycopg.Error as exc:
        raise admission_error(exc, settings) from None
    if job["id"] is None:
        with pool.connection() as conn:
            _refuse_selection(conn, tenant_id, request, job["selected"], settings.max_selection)
    return Submitted(job)


def earlier_job_for_key(
    conn: Conn,
    settings: Settings,
    tenant_id: str,
    request: ExportRequest,
    key: str,
    job_id: UUID,
) -> Row | None:
    """Reserve the tenant's Idempotency-Key ``key`` for ``job_id`` and ``request`` (None:
    the caller writes that job now, in this transaction), or return the job it already
    names. Raises ``IdempotencyConflict`` when it names another request (docs/architecture.md
    INV-11 idempotency-key)."""
    reserved = idempotency_store.idempotency_key_reserve(
        conn,
        tenant_id=tenant_id,
        key=key,
        request_hash=request.request_hash(),
        job_id=job_id,
        retention_seconds=settings.idempotency_retention_hours * 3600,
    )
    if reserved is not None:
        return None
    stored = idempotency_store.idempotency_key_get(conn, tenant_id=tenant_id, key=key)
    assert stored is not None  # the conflicting row is live and committed
    if stored["request_hash"] != request.request_hash():
        raise IdempotencyConflict(
            "this Idempotency-Key was already used with a different request; "
            "use a new key for a new export"
        )
    job = job_store.job_get(conn, job_id=stored["job_id"], tenant_id=tenant_id)
    assert job is not None  # the key row is deleted with its job
    return job
