"""Waiting for a state another process or session brings about: the one poll loop of the
tests, the drills, the benchmarks and the test cluster.

It polls; it never stands in for letting time pass (tests that need time move timestamps in
the database or use a controllable clock).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class WaitTimeout(AssertionError):
    """A state did not arrive before its deadline (an ``AssertionError``, so a test that
    waits fails rather than errors)."""


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 60.0,
    what: str = "condition",
    *,
    interval: float = 0.05,
    retry_on: tuple[type[BaseException], ...] = (),
    check: Callable[[], None] | None = None,
    detail: Callable[[], str] | None = None,
    error: type[Exception] = WaitTimeout,
) -> Any:
    """Call ``predicate`` every ``interval`` seconds until it returns something truthy, and
    return that value.

    - ``retry_on``: exception types that mean "not yet" (e.g. a server that is down on
      purpose); the last one is named in the timeout message.
    - ``check``: called after each unsuccessful poll; it raises to end the wait early (e.g.
      the process being waited on has exited).
    - ``detail``: extra text for the timeout message (e.g. the tail of a log).

    Raises ``error`` (default :class:`WaitTimeout`) after ``timeout`` seconds, naming
    ``what`` and the last value or error.
    """
    deadline = time.monotonic() + timeout
    value: Any = None
    last_error: BaseException | None = None
    while True:
        try:
            value = predicate()
        except retry_on as exc:
            value, last_error = None, exc
        if value:
            return value
        if check is not None:
            check()
        if time.monotonic() >= deadline:
            last = (
                f"last error: {type(last_error).__name__}: {last_error}"
                if last_error is not None
                else f"last: {value!r}"
            )
            extra = f"\n{detail()}" if detail is not None else ""
            raise error(f"timed out after {timeout:.1f} s waiting for {what} ({last}){extra}")
        time.sleep(interval)


def became_true(predicate: Callable[[], Any], timeout: float, interval: float = 0.1) -> bool:
    """Whether ``predicate`` became truthy within ``timeout`` seconds (polled every
    ``interval``); for callers that report a miss instead of failing (the benchmarks)."""
    try:
        wait_for(predicate, timeout, interval=interval)
    except WaitTimeout:
        return False
    return True
