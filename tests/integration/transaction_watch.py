"""A watch on docs/architecture.md INV-13 no-transaction-across-io, observed from PostgreSQL.

:class:`TransactionWatch` wraps the I/O boundaries of the real code paths (a broker send, an
artifact write or commit, a checkpoint's durable flush or takeover copy, a webhook's HTTP
request). At the instant each call starts, it asks PostgreSQL — over a connection of its
own, not the code's pool — which backends of the test's database hold a transaction open
while their client does something else (``pg_stat_activity.state`` ``idle in transaction``),
and asks again when the call returns: a backend whose same transaction (same ``pid`` and
``xact_start``) was idle in it at the start and is still open at the end was held across the
I/O. The observation does not rest on the code's own bookkeeping (which connection it
borrowed, whether it thinks a transaction is open): a transaction opened on any connection,
in any thread of the process, is seen — one opened on another thread that waits for this
I/O too (the fsync threads of a batch commit, the webhook sender threads).

Each integration test has a database of its own, so every backend on it belongs to the test.
A statement running on another thread (``active``) is not counted: only a transaction whose
client is away while the I/O runs.
"""

from __future__ import annotations

import functools
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

OPEN_TRANSACTIONS = """
SELECT pid, application_name, state, xact_start, backend_xid::text AS backend_xid,
       left(query, 200) AS query
FROM pg_stat_activity
WHERE datname = current_database()
  AND pid <> pg_backend_pid()
  AND xact_start IS NOT NULL
"""
"""Every backend of this database with a transaction open, the watch's own excepted."""

IDLE_IN_TRANSACTION = ("idle in transaction", "idle in transaction (aborted)")


@dataclass(frozen=True)
class Held:
    """A transaction held across one I/O call: where (``boundary``), which backend, its
    application name, when the transaction started, its xid (None while read-only) and its
    last statement."""

    boundary: str
    pid: int
    application_name: str
    xact_start: datetime
    backend_xid: str | None
    query: str


class TransactionWatch:
    """Wraps I/O calls and records every transaction held across one (see the module).

    ``calls`` counts the watched calls per boundary (a test asserts the path it meant to
    watch was taken); ``held`` lists the transactions held across them. Thread-safe: the
    watched calls may run on several threads at once."""

    def __init__(self, database_url: str) -> None:
        self._conn = psycopg.connect(
            database_url, autocommit=True, row_factory=dict_row, application_name="inv13-watch"
        )
        self._lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.held: list[Held] = []

    def close(self) -> None:
        """Close the watch's connection."""
        self._conn.close()

    def open_transactions(self) -> dict[tuple[int, datetime], dict[str, Any]]:
        """The backends of the database with a transaction open now, by (pid, xact_start)."""
        with self._lock:
            rows = self._conn.execute(OPEN_TRANSACTIONS).fetchall()
        return {(r["pid"], r["xact_start"]): r for r in rows}

    def wrap(self, boundary: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, watched as ``boundary``: PostgreSQL is asked before and after each call.
        Nothing is raised into the code under test (it may catch broad exceptions): the
        findings are in :attr:`held`."""

        @functools.wraps(fn)
        def watched(*args: Any, **kwargs: Any) -> Any:
            before = {
                key: row
                for key, row in self.open_transactions().items()
                if row["state"] in IDLE_IN_TRANSACTION
            }
            try:
                return fn(*args, **kwargs)
            finally:
                still = self.open_transactions() if before else {}
                with self._lock:
                    self.calls[boundary] += 1
                    for key in before.keys() & still.keys():
                        row = before[key]
                        self.held.append(
                            Held(
                                boundary,
                                row["pid"],
                                row["application_name"],
                                row["xact_start"],
                                row["backend_xid"],
                                row["query"],
                            )
                        )

        return watched

    def patch(self, monkeypatch: Any, target: Any, name: str, boundary: str) -> None:
        """Replace ``target.name`` (a class or an instance) by its watched self for the test."""
        monkeypatch.setattr(target, name, self.wrap(boundary, getattr(target, name)))

    def report(self) -> str:
        """The transactions held across I/O, one line each (for an assertion message)."""
        return "\n".join(
            f"{h.boundary}: backend {h.pid} ({h.application_name}) held the transaction "
            f"begun at {h.xact_start.isoformat()} (xid {h.backend_xid}) across it; last "
            f"statement: {h.query!r}"
            for h in self.held
        )
