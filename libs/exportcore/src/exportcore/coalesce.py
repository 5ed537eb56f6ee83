"""The submit coalescer of an api process: concurrent submits share one statement and one
commit (group commit), each request answering only after its own row is committed.

A submit (explicit note ids, no Idempotency-Key) joins the queue. If no submit of this
process is writing, it writes at once, alone, through the one-row statement (``job_submit``):
at low concurrency nothing changes and nothing waits. Submits that arrive while a write is
in flight wait for it; when it returns, the first of them writes every waiting one in ONE
statement (``job_submit_many``, at most ``API_SUBMIT_BATCH`` rows) and hands the turn to the
next waiting one. Batches come only from requests that were really concurrent: nothing is
ever held to fill one.

Each row of a shared statement is its own submit: its selection checked, admitted or
refused on its own (``exports_admit_each``, docs/architecture.md INV-9), its job written
only when admitted. A refused row (admission, unknown ids) gets its own error and the
others commit. When the statement itself fails (a deadlock, any error PostgreSQL
reported: it rolled back, nothing was written) every row is written again alone, so one
request's failure never fails or loses the others; a lost connection (the outcome of the
commit unknown) is reported to each of its requests, as the one-row path reports it.
Requests with an Idempotency-Key (their key is reserved in its own statement, and a
conflict would abort a shared one) and exports of every note always write alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import psycopg
from psycopg_pool import ConnectionPool

from exportcore import metrics
from exportcore.admission import refusal_error
from exportcore.db import Conn, Row
from exportcore.domain import ExportRequest
from exportcore.settings import Settings
from exportcore.store import jobs as job_store
from exportcore.store.jobs import SubmitRow


@dataclass(eq=False)
class _Pending:
    """One submit waiting for its row to be committed."""

    row: SubmitRow
    done: threading.Event = field(default_factory=threading.Event)
    lead: bool = False  # woken to write the next batch
    result: Row | None = None
    error: BaseException | None = None


class SubmitCoalescer:
    """Concurrent one-row submits of this process, written together (see the module).

    ``write_one(row)`` is the one-row path (a committed ``job_submit``, returning its row);
    the default runs it on ``pool``. Thread-safe; one per process.
    """

    def __init__(
        self,
        pool: ConnectionPool[Conn],
        settings: Settings,
        write_one: Callable[[SubmitRow], Row] | None = None,
    ) -> None:
        self.pool = pool
        self.settings = settings
        self.max_batch = settings.api_submit_batch
        self.write_one = write_one or self._write_one
        self._lock = threading.Lock()
        self._waiting: list[_Pending] = []
        self._writing = False

    def submit(self, row: SubmitRow) -> Row:
        """Write ``row`` (alone or with concurrent ones) and return its committed job row,
        as ``job_submit`` returns it (``id`` None when its selection was refused). Raises
        ``CapacityExceeded`` / ``QuotaExceeded`` when admission refused it, and
        ``psycopg.Error`` when the database failed it."""
        pending = _Pending(row)
        with self._lock:
            if self._writing:
                self._waiting.append(pending)
                leader = False
            else:
                self._writing = True
                leader = True
        if leader:
            self._write([pending])
        else:
            pending.done.wait()
            if pending.lead:  # our turn to write every request waiting now
                with self._lock:
                    batch = [pending, *self._waiting[: self.max_batch - 1]]
                    del self._waiting[: self.max_batch - 1]
                self._write(batch)
        if pending.error is not None:
            raise pending.error
        assert pending.result is not None
        return pending.result

    def _write(self, batch: list[_Pending]) -> None:
        """Write ``batch``, settle each of its requests, and hand the turn on."""
        try:
            if len(batch) == 1:
                self._settle_one(batch[0])
            else:
                self._write_many(batch)
        finally:
            metrics.SUBMIT_STATEMENT_ROWS.observe(len(batch))
            with self._lock:
                nxt = self._waiting.pop(0) if self._waiting else None
                self._writing = nxt is not None
            for p in batch:
                p.done.set()
            if nxt is not None:
                nxt.lead = True
                nxt.done.set()

    def _settle_one(self, p: _Pending) -> None:
        try:
            p.result = self.write_one(p.row)
        except BaseException as exc:
            p.error = exc

    def _write_many(self, batch: list[_Pending]) -> None:
        s = self.settings
        try:
            with self.pool.connection() as conn:
                rows = job_store.job_submit_many(
                    conn, [p.row for p in batch], **job_store.submit_limits(s)
                )
        except psycopg.Error as exc:
            if exc.sqlstate is None:  # no answer from the server: the commit may have
                for p in batch:  # happened, so nothing is written again
                    p.error = exc
                return
            for p in batch:  # rolled back: nothing of it was written; each on its own
                self._settle_one(p)
            return
        for p, row in zip(batch, rows, strict=True):
            if row["refusal"] is not None:
                p.error = refusal_error(row["refusal"], row["detail"] or "", s)
            else:
                p.result = row

    def _write_one(self, row: SubmitRow) -> Row:
        with self.pool.connection() as conn:
            return job_store.job_submit_committed(
                conn,
                job_id=row.job_id,
                message_id=row.message_id,
                tenant_id=row.tenant_id,
                fmt=row.fmt,
                payload=row.payload,
                note_ids=row.note_ids,
                request_hash=row.request_hash,
                trace_context=row.trace_context,
                event_detail=row.event_detail,
                **job_store.submit_limits(self.settings),
            )


def pending_row(
    *,
    job_id: UUID,
    message_id: UUID,
    tenant_id: str,
    request: ExportRequest,
    trace_context: dict[str, str] | None,
    event_detail: dict[str, Any],
) -> SubmitRow:
    """The :class:`SubmitRow` of an :class:`~exportcore.domain.ExportRequest` with explicit
    note ids."""
    assert request.note_ids is not None
    return SubmitRow(
        job_id=job_id,
        message_id=message_id,
        tenant_id=tenant_id,
        trace_context=trace_context,
        event_detail=event_detail,
        **request_columns(request),
    )


def request_columns(request: ExportRequest) -> dict[str, Any]:
    """What an export request writes into its job, as the submit statements' parameters
    (``job_submit``, ``job_submit_many``): ``fmt`` (the format's value), ``payload`` (the
    canonical request), ``note_ids`` (None: every note of the tenant) and ``request_hash``
    (SHA-256 of the canonical request, which an Idempotency-Key is compared by)."""
    return {
        "fmt": request.format.value,
        "payload": request.canonical(),
        "note_ids": request.note_ids,
        "request_hash": request.request_hash(),
    }
