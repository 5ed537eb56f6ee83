"""devtools.waiting: the one poll loop (pure logic; timeout 0 means one poll, no waiting)."""

from __future__ import annotations

import itertools

import pytest

from devtools.drills.harness import DrillTimeout
from devtools.drills.harness import wait_for as drill_wait_for
from devtools.waiting import WaitTimeout, became_true, wait_for


def test_returns_the_first_truthy_value() -> None:
    values = iter([None, 0, "", {"status": "running"}])
    assert wait_for(lambda: next(values), 5, interval=0) == {"status": "running"}


def test_times_out_naming_what_and_the_last_value() -> None:
    with pytest.raises(WaitTimeout, match=r"waiting for the job \(last: \[\]\)"):
        wait_for(lambda: [], 0, "the job")


def test_retry_on_errors_mean_not_yet_and_the_last_is_named() -> None:
    calls = itertools.count()

    def flaky() -> int:
        if next(calls) < 3:
            raise ConnectionError("refused")
        return 7

    assert wait_for(flaky, 5, interval=0, retry_on=(ConnectionError,)) == 7
    with pytest.raises(WaitTimeout, match="last error: ConnectionError: down"):
        wait_for(lambda: (_ for _ in ()).throw(ConnectionError("down")), 0, retry_on=(OSError,))


def test_other_errors_propagate_at_once() -> None:
    with pytest.raises(KeyError):
        wait_for(lambda: {}["x"], 5, retry_on=(ConnectionError,))


def test_check_ends_the_wait_early_and_detail_is_appended() -> None:
    def dead() -> None:
        raise RuntimeError("worker exited")

    with pytest.raises(RuntimeError, match="worker exited"):
        wait_for(lambda: False, 5, check=dead)
    with pytest.raises(ValueError, match=r"(?s)waiting for probe.*\nlog tail"):
        wait_for(lambda: False, 0, "probe", detail=lambda: "log tail", error=ValueError)


def test_became_true_reports_instead_of_raising() -> None:
    assert became_true(lambda: True, 0) is True
    assert became_true(lambda: False, 0) is False


def test_drills_wait_through_a_server_that_is_down_and_raise_their_own_timeout() -> None:
    import psycopg

    def down() -> None:
        raise psycopg.OperationalError("connection refused")

    with pytest.raises(DrillTimeout, match="OperationalError"):
        drill_wait_for(down, 0, "postgres")
    assert issubclass(DrillTimeout, AssertionError)
