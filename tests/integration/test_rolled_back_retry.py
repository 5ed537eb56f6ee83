"""A batch statement PostgreSQL rolls back as a deadlock victim runs again
(``exportcore.db.retry_rolled_back``), against real PostgreSQL and a real lock cycle.

With one lock order no cycle is left among our own statements (test_lock_order.py), but a
finish can still meet another transaction that takes the same jobs in another order (an
operator's SQL, a future statement). Before, the worker's batch finish then raised
``DeadlockDetected`` and its jobs waited for their lease to expire and rendered again.

The cycle is built so that the finish is the victim every time: PostgreSQL's deadlock check
runs in the session whose ``deadlock_timeout`` passes first while it waits, and finds a
cycle only if the other session already waits. So the other transaction waits first (on
the lower job, behind a third one that holds it) with a long ``deadlock_timeout``; when the
third one lets go, the finish takes the lower job and waits for the higher one, which the
other transaction holds, and its own short timeout finds the cycle.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from devtools.waiting import wait_for
from exportcore.db import retry_rolled_back
from exportcore.store import jobs as job_store
from exportcore.store.jobs import Finish
from tests.support import job, running_jobs, waits_on_lock

ROLLED_BACK = "statement rolled back by the database; running it again"


def _in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = fn()
        except BaseException as exc:  # read by the test
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


@pytest.mark.parametrize("retried", [True, False], ids=["retried", "without_retry"])
def test_a_batch_finish_chosen_as_deadlock_victim_runs_again_and_finishes(
    pool, settings, tenant, caplog, retried: bool
) -> None:
    low, high = running_jobs(pool, settings, tenant, 2)
    finishes = [
        Finish(
            job_id=r.id, lease_token=r.token, result_ref=f"ref-{r.id}", sha256="s", nbytes=1, rows=1
        )
        for r in (high, low)
    ]
    dsn = str(settings.database_url)
    third = psycopg.connect(dsn)
    other = psycopg.connect(dsn)
    finisher = psycopg.connect(dsn, autocommit=True, row_factory=dict_row)
    watch = psycopg.connect(dsn, autocommit=True)
    lock = "SELECT 1 FROM export_jobs WHERE id = %s FOR NO KEY UPDATE"
    try:
        third.execute(lock, (low.id,))
        other.execute("SET deadlock_timeout = '60s'")  # it never runs the check first
        other.execute(lock, (high.id,))
        finisher.execute("SET deadlock_timeout = '100ms'")

        def statement() -> list[job_store.JobRow]:
            return job_store.job_finish_if_leased_many(finisher, finishes)

        run = (
            (lambda: retry_rolled_back(finisher, statement, what="job_finish_if_leased_many"))
            if retried
            else statement
        )
        caplog.set_level(logging.WARNING, logger="exportcore.db")
        t_finish, finished = _in_thread(run)
        wait_for(lambda: waits_on_lock(watch, finisher.info.backend_pid), 10, "the finish to wait")
        t_other, _ = _in_thread(lambda: other.execute(lock, (low.id,)))
        wait_for(lambda: waits_on_lock(watch, other.info.backend_pid), 10, "the other to wait")
        third.rollback()  # the finish takes the lower job and waits for the higher one
        t_other.join(10)  # granted once PostgreSQL rolled the finish back
        assert not t_other.is_alive(), "no deadlock was detected"
        other.rollback()
        t_finish.join(10)
        assert not t_finish.is_alive()
    finally:
        for c in (third, other, finisher, watch):
            c.close()
    if not retried:
        assert isinstance(finished.get("error"), psycopg.errors.DeadlockDetected)
        assert {job(pool, r.id)["status"] for r in (low, high)} == {"running"}
        return
    assert "error" not in finished, finished.get("error")
    assert {r.id for r in finished["result"]} == {low.id, high.id}
    assert {job(pool, r.id)["status"] for r in (low, high)} == {"succeeded"}
    retries = [r for r in caplog.records if r.getMessage() == ROLLED_BACK]
    assert [(r.statement, r.sqlstate, r.attempt) for r in retries] == [  # type: ignore[attr-defined]
        ("job_finish_if_leased_many", "40P01", 1)
    ]
