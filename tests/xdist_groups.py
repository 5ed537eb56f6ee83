"""How ``make test`` spreads the suite over pytest-xdist workers (``--dist loadscope``).

Every xdist worker is a pytest session of its own, with its own session fixtures (its own
PostgreSQL and Redis: ``tests/conftest.py``). xdist hands out whole modules (a test class
is a unit of its own), so a module's module-scoped fixture (an e2e module's stack of seven
processes, the chart's rendered deployment) is built once per module, as in a serial run,
and the drills module keeps its two drill environments on one worker.

(``--dist loadgroup`` would let a module's file and S3 halves run on two workers; xdist
3.8 marks a group by rewriting ``item._nodeid``, which pytest 9 no longer reads, so its
groups are silently ignored: loadscope is what works.)

xdist gives each worker its next unit, in the order of the collection, when the worker is
nearly done (``--no-loadscope-reorder`` keeps that order): :func:`order_longest_first` sorts
the modules by their expected duration so that the longest start first and the short ones
fill the gaps at the end. Serial runs (``-n 0``) are left exactly as collected.
"""

from __future__ import annotations

import os
from collections import defaultdict

import pytest

# Seconds per test by the directory under tests/ (a serial run's order of magnitude on a
# 2-core machine): drills and e2e tests wait for processes and recoveries, the rest is quick.
ESTIMATE_PER_TEST = {"drills": 30.0, "e2e": 8.0, "chart": 1.0, "integration": 0.5}
DEFAULT_PER_TEST = 0.05


def under_xdist() -> bool:
    """True in an xdist worker (where the collection is scheduled)."""
    return bool(os.environ.get("PYTEST_XDIST_WORKER"))


def scope_of(item: pytest.Item) -> str:
    """xdist's unit of work for ``item``: the node id up to its last ``::`` (the module, or
    the module and class)."""
    return item.nodeid.rsplit("::", 1)[0]


def _seconds(item: pytest.Item) -> float:
    parts = item.nodeid.split("/")
    directory = parts[1] if len(parts) > 2 and parts[0] == "tests" else ""
    return ESTIMATE_PER_TEST.get(directory, DEFAULT_PER_TEST)


def order_longest_first(items: list[pytest.Item]) -> None:
    """Reorder ``items`` in place so that xdist's units come longest first (stable: within
    a unit, the order pytest chose for its fixtures stays)."""
    if not under_xdist():
        return
    seconds: dict[str, float] = defaultdict(float)
    for item in items:
        seconds[scope_of(item)] += _seconds(item)
    rank = {s: i for i, s in enumerate(sorted(seconds, key=lambda s: -seconds[s]))}
    items.sort(key=lambda i: rank[scope_of(i)])
