"""Statements that change several jobs lock them in id order (the CTE ``locked``, the
sql/jobs.sql header), against real PostgreSQL.

Without one order, the publisher's dispatch mark of jobs a worker is finishing at that
moment formed a lock cycle with the worker's batch finish: PostgreSQL aborted one of them
("deadlock detected") and the worker's jobs waited for their lease to expire (seen under
``make bench``). Each test holds the lock of the middle job of three from another
connection, runs the statement with its rows in DESCENDING id order, waits until the
statement is blocked on that lock, and then reads which of the three jobs it already
holds: in id order, it holds the lowest and not yet the highest.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest
from psycopg.rows import dict_row

from devtools.waiting import wait_for
from exportcore.store import jobs as job_store
from exportcore.store import outbox as outbox_store
from exportcore.store.jobs import Fail, Finish
from tests.support import running_jobs, submit, waits_on_lock


@pytest.fixture
def dsn(settings) -> str:
    return str(settings.database_url)


class Blocked:
    """Run ``statement(conn)`` on its own connection in a thread while ``held`` is locked
    by another transaction; :meth:`locked` tells which jobs the blocked statement holds."""

    def __init__(self, dsn: str, held: UUID, statement: Callable[[psycopg.Connection[Any]], Any]):
        self.dsn = dsn
        self.blocker = psycopg.connect(dsn)
        self.blocker.execute("SELECT 1 FROM export_jobs WHERE id = %s FOR NO KEY UPDATE", (held,))
        self.conn = psycopg.connect(dsn, autocommit=True, row_factory=dict_row)
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(statement,), daemon=True)

    def _run(self, statement: Callable[[psycopg.Connection[Any]], Any]) -> None:
        try:
            self.result = statement(self.conn)
        except BaseException as exc:  # reported by finish()
            self.error = exc

    def start(self) -> Blocked:
        pid = self.conn.info.backend_pid
        self.thread.start()
        with psycopg.connect(self.dsn, autocommit=True) as watch:
            wait_for(
                lambda: waits_on_lock(watch, pid),
                10,
                "the statement blocked on the held job",
                check=lambda: self._raise(),
            )
        return self

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def free(self, job_ids: list[UUID]) -> set[UUID]:
        """The jobs of ``job_ids`` that no transaction holds now (read with SKIP LOCKED)."""
        with psycopg.connect(self.dsn) as probe:
            rows = probe.execute(
                "SELECT id FROM export_jobs WHERE id = ANY(%s) FOR NO KEY UPDATE SKIP LOCKED",
                (job_ids,),
            ).fetchall()
            probe.rollback()
        return {r[0] for r in rows}

    def finish(self) -> Any:
        """Release the held job; the statement's result once it completed."""
        self.blocker.rollback()
        self.thread.join(10)
        assert not self.thread.is_alive(), "the statement did not complete"
        self.blocker.close()
        self.conn.close()
        self._raise()
        return self.result


@pytest.fixture
def blocked(dsn: str) -> Iterator[Callable[..., Blocked]]:
    made: list[Blocked] = []

    def make(held: UUID, statement: Callable[[psycopg.Connection[Any]], Any]) -> Blocked:
        b = Blocked(dsn, held, statement)
        made.append(b)
        return b.start()

    yield make
    for b in made:
        if b.thread.is_alive():
            b.finish()


def _assert_id_order(b: Blocked, low: UUID, mid: UUID, high: UUID) -> None:
    # the statement holds `low`, waits for `mid` (held by the blocker), and has not taken `high`
    assert b.free([low, mid, high]) == {high}


def test_a_batch_finish_locks_its_jobs_in_id_order(pool, settings, tenant, blocked) -> None:
    low, mid, high = running_jobs(pool, settings, tenant, 3)
    finishes = [
        Finish(
            job_id=r.id, lease_token=r.token, result_ref=f"ref-{r.id}", sha256="s", nbytes=1, rows=1
        )
        for r in (high, mid, low)
    ]
    b = blocked(mid.id, lambda conn: job_store.job_finish_if_leased_many(conn, finishes))
    _assert_id_order(b, low.id, mid.id, high.id)
    assert {r.id for r in b.finish()} == {low.id, mid.id, high.id}


def test_a_batch_failure_locks_its_jobs_in_id_order(pool, settings, tenant, blocked) -> None:
    low, mid, high = running_jobs(pool, settings, tenant, 3)
    failures = [
        Fail(job_id=r.id, lease_token=r.token, error_code="invalid_selection", error_detail="x")
        for r in (high, mid, low)
    ]
    b = blocked(mid.id, lambda conn: job_store.job_fail_if_leased_many(conn, failures))
    _assert_id_order(b, low.id, mid.id, high.id)
    assert {r.id for r in b.finish()} == {low.id, mid.id, high.id}


def test_the_publishers_dispatch_mark_locks_its_jobs_in_id_order(
    pool, settings, tenant, blocked
) -> None:
    tid, ids = tenant
    job_ids = sorted(submit(pool, settings, tid, ids[i : i + 1])["id"] for i in range(3))
    token = uuid4()
    with pool.connection() as conn:
        events = [
            r["id"]
            for r in conn.execute(
                "UPDATE export_outbox SET claim_token = %s, claimed_until = now() + interval"
                " '1 minute' WHERE job_id = ANY(%s) RETURNING id",
                (token, job_ids),
            ).fetchall()
        ]
    low, mid, high = job_ids
    b = blocked(
        mid,
        lambda conn: outbox_store.outbox_mark_sent_many(
            conn, sent=[outbox_store.Sent(e, token, datetime.now(UTC)) for e in events[::-1]]
        ),
    )
    _assert_id_order(b, low, mid, high)
    assert b.finish().marked == 3
