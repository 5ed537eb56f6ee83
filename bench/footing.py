"""The equal-footing rules of the e2e benchmark as plain functions (no servers): the
saturation rate and the fractions of it every system is loaded at, latency as the client
sees it, the concurrency a run actually reached, and CPU accounting by process.

The measuring side (psutil, ``pg_stat_activity``, the counters of PostgreSQL) lives in
:mod:`bench.e2e`; what is decided here is unit-tested (tests/unit/test_bench_harness.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# The fixed-rate phases, as fractions of each system's own measured saturation.
FRACTIONS: dict[str, float] = {"at50": 0.5, "at80": 0.8}


def saturation_rate(submitted: Mapping[str, float], finished: Mapping[str, float]) -> float | None:
    """Jobs per second of a burst: every job of ``submitted`` (key -> wall-clock submit
    time, s) divided by first submit -> last finish (``finished``: key -> the time the
    system recorded the job as succeeded, s). None when a job did not finish or the span is
    not positive: a burst that lost jobs measures no saturation."""
    if not submitted or any(k not in finished for k in submitted):
        return None
    span = max(finished[k] for k in submitted) - min(submitted.values())
    return len(submitted) / span if span > 0 else None


def fraction_rates(
    saturation: float, fractions: Mapping[str, float] = FRACTIONS
) -> dict[str, float]:
    """``{phase: jobs/s}``: each fraction of ``saturation`` (jobs/s, > 0), the open-loop
    rates of the fixed-rate phases. Raises ValueError for a saturation that is not > 0 or a
    fraction outside (0, 1]."""
    if not saturation > 0:
        raise ValueError(f"saturation must be > 0 jobs/s, got {saturation}")
    out = {}
    for name, f in fractions.items():
        if not 0 < f <= 1:
            raise ValueError(f"fraction {name}={f} is not in (0, 1]")
        out[name] = f * saturation
    return out


def client_latencies(
    submitted: Mapping[str, float], finished: Mapping[str, float]
) -> tuple[list[float], int]:
    """Submit -> succeeded (s) of every submitted job that finished, and how many did not
    finish. Both maps are key -> wall-clock seconds of the same machine clock."""
    lat = [finished[k] - t for k, t in submitted.items() if k in finished]
    return lat, len(submitted) - len(lat)


def kept_up(submitted: Mapping[str, float], finished: Mapping[str, float]) -> bool:
    """True when an open-loop phase was served at its rate: every job finished and the
    completions kept pace (first submit -> last finish no longer than the submit window by
    more than a quarter, plus one second of pipeline), i.e. no backlog grew over the phase."""
    if not submitted or any(k not in finished for k in submitted):
        return False
    first, last_submit = min(submitted.values()), max(submitted.values())
    last_finish = max(finished[k] for k in submitted)
    window = last_submit - first
    return last_finish - first <= 1.25 * window + 1.0


def max_overlap(intervals: Iterable[tuple[float, float]]) -> int:
    """The largest number of ``(start, end)`` intervals open at one instant (an interval
    that ends exactly when another starts does not overlap it): the concurrency a run of
    job executions actually reached."""
    events: list[tuple[float, int]] = []
    for start, end in intervals:
        events.append((start, 1))
        events.append((end, -1))
    events.sort(key=lambda e: (e[0], e[1]))  # ends (-1) before starts at the same instant
    best = cur = 0
    for _, step in events:
        cur += step
        best = max(best, cur)
    return best


@dataclass(frozen=True)
class ProcSample:
    """One process at one instant: its start time (s since the epoch, which tells a reused
    PID apart) and its CPU time so far (user + system, s)."""

    started: float
    cpu: float


Snapshot = Mapping[str, Mapping[int, ProcSample]]  # group -> pid -> sample


@dataclass
class CpuDelta:
    """CPU seconds per group between two snapshots, and what the accounting could not see."""

    seconds: dict[str, float] = field(default_factory=dict)
    born: int = 0  # processes that appeared in between, counted from their birth
    vanished: int = 0  # processes that exited in between: their last interval is not counted

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


def cpu_delta(before: Snapshot, after: Snapshot) -> CpuDelta:
    """CPU seconds each group used from ``before`` to ``after``.

    A process present in both (same PID, same start time) counts the difference; one that
    appears only in ``after`` (or under a reused PID) started in between and counts from
    its birth; one present only in ``before`` exited in between, and what it used after
    ``before`` is lost (counted in ``vanished``). Groups absent from ``after`` count 0.
    """
    out = CpuDelta()
    for group in {*before, *after}:
        b = before.get(group, {})
        a = after.get(group, {})
        total = 0.0
        for pid, s in a.items():
            prev = b.get(pid)
            if prev is not None and abs(prev.started - s.started) < 1e-3:
                total += max(0.0, s.cpu - prev.cpu)
            else:
                total += s.cpu
                out.born += 1
        out.vanished += sum(
            1 for pid, s in b.items() if pid not in a or abs(a[pid].started - s.started) >= 1e-3
        )
        out.seconds[group] = round(total, 4)
    return out
