"""Shared parts of the harness: configuration, statistics, CPU and commit accounting."""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psycopg

from devtools.stack import ROOT

BENCH_DIR = Path(os.environ.get("BENCH_HOME", str(ROOT / ".bench"))).resolve()


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, str(default)))


def env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, str(default)))


@dataclass
class Config:
    """Sizes of every scenario; QUICK shrinks them to validate the harness in minutes."""

    quick: bool
    runs: int
    # end to end
    e2e_jobs: int  # jobs per saturation run (one producer, one job at a time)
    e2e_warmup: int
    fixed_rate: float  # jobs/s of the fixed-rate phase of earlier reports
    fixed_seconds: float  # (0: skipped)
    at50_seconds: float  # open loop at 50 % of the system's own saturation, quiet and noisy
    open80_seconds: float  # open loop at 80 % of the measured saturation (0: skipped)
    idle_jobs: int  # single exports, each submitted to an idle system (0: skipped)
    http_concurrency: int  # connections of the HTTP producer at saturation
    worker_processes: int  # concurrent job executions of every system (e2e.<system>.concurrency)
    # quiet before and after each phase whose table writes are counted (sat, at50): an idle
    # backend sends its table counters up to 10 s late (PGSTAT_IDLE_INTERVAL)
    stats_settle_seconds: float
    # api accept
    api_seconds: float
    api_connections: tuple[int, ...]
    api_fixed_rate: float
    api_fixed_seconds: float
    # bulk
    bulk_notes: int
    bulk_note_max_bytes: int
    bulk_delta_notes: int  # the account of the incremental (delta vs full) figure
    # scale
    scale_jobs: int
    scale_samples: int
    scale_active_jobs: int  # queued (active) jobs of the scale case's third database
    costs_jobs: int  # jobs per variant of the costs scenario
    # console (on the scale data)
    console_failed: int
    console_active: int
    console_samples: int
    # recovery
    recovery_leases: int
    recovery_rate: float
    recovery_lease_seconds: float
    recovery_scanner_seconds: float
    recovery_retry_cap_seconds: float
    # webhooks
    webhook_rate: float
    webhook_seconds: float
    webhook_down_seconds: float
    webhook_trigger_jobs: int
    # fairness
    fairness_flood: int  # tenant A's bulk-ish exports, submitted at once
    fairness_seconds: float  # tenant B submits one export per second this long, per phase
    fairness_notes: int  # notes per export (over FAST_QUEUE_MAX_NOTES: exports.bulk)
    # profiles
    profile_seconds: float
    profile_rate: float
    systems: tuple[str, ...] = field(default_factory=tuple)

    @classmethod
    def from_env(cls, quick: bool | None = None, runs: int | None = None) -> Config:
        q = quick if quick is not None else os.environ.get("BENCH_QUICK", "") not in ("", "0")
        r = runs if runs is not None else env_int("BENCH_RUNS", 1 if q else 3)
        systems = os.environ.get("BENCH_SYSTEMS", "")
        return cls(
            quick=q,
            runs=r,
            e2e_jobs=env_int("BENCH_E2E_JOBS", 300 if q else 3000),
            e2e_warmup=env_int("BENCH_E2E_WARMUP", 20 if q else 100),
            fixed_rate=env_float("BENCH_FIXED_RATE", 100.0),
            fixed_seconds=env_float("BENCH_FIXED_SECONDS", 4.0 if q else 20.0),
            at50_seconds=env_float("BENCH_AT50_SECONDS", 3.0 if q else 20.0),
            open80_seconds=env_float("BENCH_OPEN80_SECONDS", 3.0 if q else 10.0),
            idle_jobs=env_int("BENCH_IDLE_JOBS", 5 if q else 20),
            http_concurrency=env_int("BENCH_HTTP_CONCURRENCY", 8),
            worker_processes=env_int("BENCH_WORKER_PROCESSES", 2),
            stats_settle_seconds=env_float("BENCH_STATS_SETTLE_SECONDS", 11.0),
            api_seconds=env_float("BENCH_API_SECONDS", 4.0 if q else 10.0),
            api_connections=tuple(
                int(c)
                for c in os.environ.get("BENCH_API_CONNECTIONS", "8" if q else "4,8,16,32").split(
                    ","
                )
            ),
            api_fixed_rate=env_float("BENCH_API_FIXED_RATE", 200.0),
            api_fixed_seconds=env_float("BENCH_API_FIXED_SECONDS", 4.0 if q else 15.0),
            bulk_notes=env_int("BENCH_BULK_NOTES", 5_000 if q else 100_000),
            bulk_note_max_bytes=env_int("BENCH_BULK_NOTE_MAX_BYTES", 16_384),
            bulk_delta_notes=env_int("BENCH_DELTA_NOTES", 5_000 if q else 200_000),
            scale_jobs=env_int("BENCH_SCALE_JOBS", 20_000 if q else 1_000_000),
            scale_samples=env_int("BENCH_SCALE_SAMPLES", 60 if q else 300),
            scale_active_jobs=env_int("BENCH_SCALE_ACTIVE_JOBS", 10_000),
            costs_jobs=env_int("BENCH_COSTS_JOBS", 200 if q else 1000),
            console_failed=env_int("BENCH_CONSOLE_FAILED", 2_000 if q else 20_000),
            console_active=env_int("BENCH_CONSOLE_ACTIVE", 200),
            console_samples=env_int("BENCH_CONSOLE_SAMPLES", 30 if q else 200),
            recovery_leases=env_int("BENCH_RECOVERY_LEASES", 2),
            recovery_rate=env_float("BENCH_RECOVERY_RATE", 20.0),
            recovery_lease_seconds=env_float("BENCH_RECOVERY_LEASE_SECONDS", 5.0 if q else 30.0),
            recovery_scanner_seconds=env_float("BENCH_RECOVERY_SCANNER_SECONDS", 1.0 if q else 5.0),
            recovery_retry_cap_seconds=env_float(
                "BENCH_RECOVERY_RETRY_CAP_SECONDS", 2.0 if q else 10.0
            ),
            webhook_rate=env_float("BENCH_WEBHOOK_RATE", 100.0),
            webhook_seconds=env_float("BENCH_WEBHOOK_SECONDS", 5.0 if q else 20.0),
            webhook_down_seconds=env_float("BENCH_WEBHOOK_DOWN_SECONDS", 15.0 if q else 60.0),
            webhook_trigger_jobs=env_int("BENCH_WEBHOOK_TRIGGER_JOBS", 500 if q else 2000),
            fairness_flood=env_int("BENCH_FAIRNESS_FLOOD", 60 if q else 500),
            fairness_seconds=env_float("BENCH_FAIRNESS_SECONDS", 5.0 if q else 30.0),
            fairness_notes=env_int("BENCH_FAIRNESS_NOTES", 400),
            profile_seconds=env_float("BENCH_PROFILE_SECONDS", 8.0 if q else 30.0),
            profile_rate=env_float("BENCH_PROFILE_RATE", 100.0),
            systems=tuple(s for s in systems.split(",") if s),
        )


# --- statistics ------------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100) of ``values``; None when empty."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))
    return float(s[k])


def latency_summary(seconds: Iterable[float]) -> dict[str, Any]:
    """p50/p90/p99/p99.9/max in milliseconds and the sample count."""
    ms = [v * 1000 for v in seconds]
    return {
        "n": len(ms),
        "p50_ms": percentile(ms, 50),
        "p90_ms": percentile(ms, 90),
        "p99_ms": percentile(ms, 99),
        "p999_ms": percentile(ms, 99.9),
        "max_ms": max(ms) if ms else None,
    }


def spread(values: Sequence[float | None]) -> dict[str, Any]:
    """min / median / max over repeated runs (None values are dropped)."""
    vs = [float(v) for v in values if v is not None]
    if not vs:
        return {"values": list(values), "min": None, "median": None, "max": None}
    return {
        "values": [round(v, 4) for v in vs],
        "min": round(min(vs), 4),
        "median": round(statistics.median(vs), 4),
        "max": round(max(vs), 4),
    }


# --- CPU accounting --------------------------------------------------------------------------


class _MachineCpuTimes(Protocol):
    """The fields of ``psutil.cpu_times()`` summed as busy time (seconds since boot)."""

    user: float
    nice: float
    system: float
    irq: float
    softirq: float
    steal: float


def _busy_seconds(t: _MachineCpuTimes) -> float:
    """CPU seconds the machine spent busy: every mode but idle and iowait."""
    return t.user + t.nice + t.system + t.irq + t.softirq + t.steal


def _tree(pid: int) -> list[Any]:
    import psutil

    try:
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    except psutil.Error:
        return []


class CpuMeter:
    """CPU seconds (user + system) used by named process trees between start() and stop().

    Trees are re-read at both ends, so children that appear later (prefork children,
    PostgreSQL backends) are counted from their birth; children that exit in between are
    missed (the harness keeps every measured process alive through a measurement).
    """

    def __init__(self, groups: dict[str, list[int]], include_self: bool = True) -> None:
        self.groups = groups
        self.include_self = include_self
        self._start: dict[str, dict[int, float]] = {}
        self._t0 = 0.0
        self._machine0: _MachineCpuTimes | None = None

    def _sample(self) -> dict[str, dict[int, float]]:
        import psutil

        out: dict[str, dict[int, float]] = {}
        for name, roots in self.groups.items():
            seen: dict[int, float] = {}
            for root in roots:
                for proc in _tree(root):
                    try:
                        t = proc.cpu_times()
                        seen[proc.pid] = t.user + t.system
                    except psutil.Error:
                        pass
            out[name] = seen
        if self.include_self:
            t = psutil.Process().cpu_times()
            out["producer (harness)"] = {os.getpid(): t.user + t.system}
        return out

    def start(self) -> None:
        import psutil

        self._start = self._sample()
        self._t0 = time.monotonic()
        self._machine0 = psutil.cpu_times()

    def stop(self) -> dict[str, float]:
        """CPU seconds per group, plus ``machine`` (all processes, other users too) and
        ``wall``."""
        import psutil

        end = self._sample()
        res: dict[str, float] = {}
        for name, procs in end.items():
            before = self._start.get(name, {})
            res[name] = round(sum(v - before.get(pid, 0.0) for pid, v in procs.items()), 4)
        assert self._machine0 is not None, "stop() before start()"
        m1: _MachineCpuTimes = psutil.cpu_times()
        res["machine (all processes)"] = round(_busy_seconds(m1) - _busy_seconds(self._machine0), 4)
        res["wall"] = round(time.monotonic() - self._t0, 4)
        return res


def postgres_pids(pg_dir: Path) -> list[int]:
    """The postmaster PID of the cluster under ``pg_dir`` (its backends are children)."""
    pidfile = pg_dir / "data" / "postmaster.pid"
    try:
        return [int(pidfile.read_text().split()[0])]
    except (OSError, ValueError, IndexError):
        return []


def redis_pids(redis_dir: Path) -> list[int]:
    try:
        return [int((redis_dir / "redis.pid").read_text().strip())]
    except (OSError, ValueError):
        return []


def xact_commits(dsn: str) -> int:
    """Committed transactions of the current database so far (pg_stat_database).

    Backends report their counts when they exit (and when idle for a while): read it before
    starting and after stopping the measured processes."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        return int(row[0]) if row else 0


def vm_hwm_kb(pid: int) -> int | None:
    """Peak resident set size (VmHWM, kB) of a live process."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None
