"""The database probe of a real stack: what the e2e tests and the drills read back from
PostgreSQL (a job's row, its history, its outbox events, a tenant's notes) and the waits
for a job to reach a status, a terminal state or a history event.

PostgreSQL is the only source of truth of a job (docs/architecture.md), so what a test or a
drill concludes about a job it reads here, not from the api's answer. The waits poll through
:func:`devtools.waiting.wait_for`; they never stand in for letting time pass.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row

from devtools import waiting
from exportcore.domain import TERMINAL_STATES

Row = dict[str, Any]
Params = Sequence[Any] | dict[str, Any]


class DatabaseProbe:
    """Statements and waits on one stack's database, rows as dicts.

    Each thread runs its statements on its own autocommit connection (session time zone
    UTC, as every process of the stack: ``exportcore.db``), opened on first use and opened
    again once when it is found broken (the server restarted since). ``retry_on`` and
    ``error`` are passed to :func:`devtools.waiting.wait_for` by every wait: the drills
    count connection errors as "not yet" (they stop the servers on purpose) and raise their
    own timeout type; the e2e tests keep the defaults (any error fails the wait at once, a
    timeout raises :class:`devtools.waiting.WaitTimeout`, an ``AssertionError``).
    """

    def __init__(
        self,
        database_url: str,
        *,
        retry_on: tuple[type[BaseException], ...] = (),
        error: type[Exception] = waiting.WaitTimeout,
        connect_timeout: int = 3,
    ) -> None:
        self.database_url = database_url
        self.retry_on = retry_on
        self.error = error
        self.connect_timeout = connect_timeout
        self._local = threading.local()
        self._lock = threading.Lock()
        self._opened: list[psycopg.Connection[Row]] = []

    # --- connections and statements -----------------------------------------------------------

    def connect(self) -> psycopg.Connection[Row]:
        """A new autocommit connection (rows as dicts, time zone UTC) that the caller
        closes (``with probe.connect() as conn``); for transactions and locks of its own."""
        return psycopg.connect(
            self.database_url,
            autocommit=True,
            row_factory=dict_row,
            connect_timeout=self.connect_timeout,
            options="-c timezone=UTC",
        )

    def _conn(self) -> psycopg.Connection[Row]:
        conn: psycopg.Connection[Row] | None = getattr(self._local, "conn", None)
        if conn is None or conn.closed or conn.broken:
            conn = self.connect()
            self._local.conn = conn
            with self._lock:
                self._opened.append(conn)
        return conn

    def close(self) -> None:
        """Close the connection of every thread (a later statement opens a new one)."""
        with self._lock:
            for conn in self._opened:
                with contextlib.suppress(Exception):
                    conn.close()
            self._opened.clear()

    def sql(self, query: str, params: Params = ()) -> list[Row]:
        """Run one statement on this thread's connection; its rows (empty without a result).

        Raises ``psycopg.OperationalError`` when the server does not answer twice in a row
        (a connection broken while idle is replaced once)."""
        for attempt in (1, 2):
            conn = self._conn()
            try:
                cur = conn.execute(query, params)
                return cur.fetchall() if cur.description else []
            except psycopg.OperationalError:
                with contextlib.suppress(Exception):
                    conn.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def one(self, query: str, params: Params = ()) -> Row:
        """The first row of a query; raises ``LookupError`` when there is none."""
        rows = self.sql(query, params)
        if not rows:
            raise LookupError(f"no row for {query!r} {params!r}")
        return rows[0]

    def scalar(self, query: str, params: Params = ()) -> Any:
        """The first column of the first row of a query (``LookupError`` without a row)."""
        return next(iter(self.one(query, params).values()))

    # --- a job and its records ----------------------------------------------------------------

    def job(self, job_id: Any) -> Row:
        """The job's ``export_jobs`` row as it is now; ``LookupError`` when there is none."""
        return self.one("SELECT * FROM export_jobs WHERE id = %s", (job_id,))

    def history(self, job_id: Any) -> list[Row]:
        """The job's ``export_job_events``, oldest first: ``id, at, kind, from_status,
        to_status, attempt, lease_token, message_id, detail``."""
        return self.sql(
            "SELECT id, at, kind, from_status, to_status, attempt, lease_token, message_id,"
            " detail FROM export_job_events WHERE job_id = %s ORDER BY id",
            (job_id,),
        )

    def kinds(self, job_id: Any) -> list[str]:
        """The kinds of the job's history events, oldest first."""
        return [e["kind"] for e in self.history(job_id)]

    def outbox(self, job_id: Any) -> list[Row]:
        """The job's ``export_outbox`` events, oldest first: ``id, reason, available_at,
        claim_token, claimed_until, sent_at, publish_attempts, last_error, created_at``."""
        return self.sql(
            "SELECT id, reason, available_at, claim_token, claimed_until, sent_at,"
            " publish_attempts, last_error, created_at FROM export_outbox"
            " WHERE job_id = %s ORDER BY created_at, id",
            (job_id,),
        )

    def note_ids(self, tenant_id: str, limit: int | None = None) -> list[int]:
        """The ids of the tenant's notes in id order (the first ``limit``, or all)."""
        rows = self.sql(
            "SELECT id FROM notes WHERE tenant_id = %s ORDER BY id LIMIT %s", (tenant_id, limit)
        )
        return [r["id"] for r in rows]

    # --- waits ----------------------------------------------------------------------------------

    def wait(
        self, predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05
    ) -> Any:
        """:func:`devtools.waiting.wait_for` with this probe's ``retry_on`` and ``error``:
        the first truthy value of ``predicate``."""
        return waiting.wait_for(
            predicate, timeout, what, interval=interval, retry_on=self.retry_on, error=self.error
        )

    def wait_job(
        self, job_id: Any, predicate: Callable[[Row], bool], timeout: float, what: str
    ) -> Row:
        """Poll the job's row until ``predicate(row)``; returns that row."""
        found: Row = self.wait(
            lambda: (row := self.job(job_id)) and predicate(row) and row,
            timeout,
            f"job {job_id}: {what}",
        )
        return found

    def wait_status(self, job_id: Any, status: str, timeout: float) -> Row:
        """The job's row once its status is ``status``."""
        return self.wait_job(job_id, lambda r: r["status"] == status, timeout, status)

    def wait_terminal(self, job_id: Any, timeout: float = 60.0) -> Row:
        """The job's row once it is succeeded, failed or cancelled."""
        return self.wait_job(job_id, lambda r: r["status"] in TERMINAL_STATES, timeout, "terminal")

    def wait_event(self, job_id: Any, kind: str, timeout: float, count: int = 1) -> list[Row]:
        """The job's history events of ``kind`` once there are ``count`` of them."""
        events: list[Row] = self.wait(
            lambda: (
                (evs := [e for e in self.history(job_id) if e["kind"] == kind])
                and len(evs) >= count
                and evs
            ),
            timeout,
            f"{count} '{kind}' event(s) of job {job_id}",
        )
        return events
