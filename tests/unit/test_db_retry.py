"""``exportcore.db.retry_rolled_back``: which errors run a statement again, how often, and
with what backoff (pure: a stand-in for the connection's two flags; the real deadlock is
tests/integration/test_rolled_back_retry.py)."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest

from exportcore.db import retry_rolled_back

IDLE = psycopg.pq.TransactionStatus.IDLE
INTRANS = psycopg.pq.TransactionStatus.INTRANS


def _conn(autocommit: bool = True, status: Any = IDLE) -> Any:
    return SimpleNamespace(autocommit=autocommit, info=SimpleNamespace(transaction_status=status))


class Flaky:
    """Raises the given errors in turn, then returns "done"."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"


def test_a_deadlock_victim_and_a_serialization_failure_run_again() -> None:
    waits: list[float] = []
    fn = Flaky(psycopg.errors.DeadlockDetected("x"), psycopg.errors.SerializationFailure("y"))
    out = retry_rolled_back(
        _conn(), fn, what="s", base_delay=0.1, rng=random.Random(7), sleep=waits.append
    )
    assert (out, fn.calls) == ("done", 3)
    assert len(waits) == 2 and 0 <= waits[0] <= 0.1 and 0 <= waits[1] <= 0.2  # full jitter


def test_the_last_rollback_is_raised_after_every_attempt() -> None:
    fn = Flaky(*[psycopg.errors.DeadlockDetected(str(i)) for i in range(5)])
    with pytest.raises(psycopg.errors.DeadlockDetected, match="2"):
        retry_rolled_back(_conn(), fn, what="s", attempts=3, sleep=lambda _: None)
    assert fn.calls == 3


@pytest.mark.parametrize(
    "conn", [_conn(autocommit=False), _conn(status=INTRANS)], ids=["not_autocommit", "in_block"]
)
def test_inside_a_transaction_block_the_rollback_is_raised_at_once(conn: Any) -> None:
    fn = Flaky(psycopg.errors.DeadlockDetected("x"))
    with pytest.raises(psycopg.errors.DeadlockDetected):
        retry_rolled_back(conn, fn, what="s", sleep=lambda _: None)
    assert fn.calls == 1


@pytest.mark.parametrize(
    "error",
    [
        psycopg.errors.LockNotAvailable("lock_timeout"),
        psycopg.errors.lookup("40003")("statement completion unknown"),
        psycopg.OperationalError("gone"),
    ],
    ids=["lock_timeout", "completion_unknown", "connection_lost"],
)
def test_other_errors_are_raised_at_once(error: Exception) -> None:
    # a lost connection, or a completion PostgreSQL cannot vouch for, may have committed:
    # running the statement again could misread a finish that happened as a refusal
    fn = Flaky(error)
    with pytest.raises(type(error)):
        retry_rolled_back(_conn(), fn, what="s", sleep=lambda _: None)
    assert fn.calls == 1
