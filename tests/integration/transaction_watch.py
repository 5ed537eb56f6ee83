"""A watch on docs/architecture.md INV-13 no-transaction-across-io, observed from PostgreSQL.

:class:`TransactionWatch` wraps the I/O boundaries of the real code paths (a broker send, an
artifact write or commit, a checkpoint's durable flush or takeover copy, a webhook's HTTP
request). At the instant each call starts, it asks PostgreSQL — over a connection of its
own, not the code's pool — which backends of the test's database hold a transaction open
while their client does something else (``pg_stat_activity.state`` ``idle in transaction``),
and asks again when the call returns: a backend that sat idle in the same transaction from
the call's start to its end (same ``pid``, ``xact_start`` and ``state_change``: not one
statement ran on it meanwhile) held that transaction across the I/O. The observation does not rest on the code's own bookkeeping (which connection it
borrowed, whether it thinks a transaction is open): a transaction opened on any connection,
in any thread of the process, is seen — one opened on another thread that waits for this
I/O too (the fsync threads of a batch commit, the webhook sender threads).

Each integration test has a database of its own, so every backend on it belongs to the test.
A statement running on another thread (``active``) is not counted, nor a transaction of
another thread that moves on during the call (its next statement changes ``state_change``):
only a transaction whose client stays away for the whole I/O.
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

IDLE_IN_TRANSACTION = """
SELECT pid, application_name, state, state_change, xact_start,
       backend_xid::text AS backend_xid, left(query, 200) AS query
FROM pg_stat_activity
WHERE datname = current_database()
  AND pid <> pg_backend_pid()
  AND state IN ('idle in transaction', 'idle in transaction (aborted)')
"""
"""Every backend of this database idle in an open transaction, the watch's own excepted."""


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

    def idle_in_transaction(self) -> dict[tuple[int, datetime, datetime], dict[str, Any]]:
        """The backends of the database idle in a transaction now, by (pid, xact_start,
        state_change)."""
        with self._lock:
            rows = self._conn.execute(IDLE_IN_TRANSACTION).fetchall()
        return {(r["pid"], r["xact_start"], r["state_change"]): r for r in rows}

    def wrap(self, boundary: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, watched as ``boundary``: PostgreSQL is asked before and after each call.
        Nothing is raised into the code under test (it may catch broad exceptions): the
        findings are in :attr:`held`."""

        @functools.wraps(fn)
        def watched(*args: Any, **kwargs: Any) -> Any:
            before = self.idle_in_transaction()
            try:
                return fn(*args, **kwargs)
            finally:
                still = self.idle_in_transaction() if before else {}
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
