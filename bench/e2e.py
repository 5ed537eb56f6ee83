"""End to end: submit → succeeded for small exports (5 notes, json), with the same number of
worker processes for every system, on the same PostgreSQL and Redis, alternated run by run.

Per system and run (fresh database copied from the template, flushed Redis db):

1. start the system's processes; warm up (``e2e_warmup`` jobs, waited for);
2. **saturation**: one producer enqueues ``e2e_jobs`` jobs one at a time (notes-exports over
   HTTP: ``http_concurrency`` keep-alive connections, since one serial HTTP client measures
   its own round trip); jobs/s = jobs / (first enqueue → last job finished); pickup and
   submit → finished latency percentiles of those jobs (mostly queueing at saturation);
3. **fixed rate**: ``fixed_rate`` jobs/s for ``fixed_seconds`` (open loop), latency
   percentiles;
4. stop; PostgreSQL commits per job over the processes' lifetime.

notes-exports' latencies come from the database's own timestamps (``export_job_events``:
``submitted`` → first ``claimed`` → ``succeeded``); the peers' from the wall clock the
producer stamps into the job and the worker records (same machine clock).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from bench import loadgen, workload
from bench.common import (
    Config,
    CpuMeter,
    latency_summary,
    postgres_pids,
    redis_pids,
    xact_commits,
)
from bench.env import TENANT, BenchEnv
from devtools.api_client import bearer
from devtools.stack import ManagedProcess, Stack
from devtools.waiting import became_true
from exportcore.db import make_pool
from exportcore.domain import ExportFormat, ExportRequest
from exportcore.settings import Settings
from exportcore.submit import submit_export

OURS = ("ours-lib", "ours-http")
PEERS = ("celery", "procrastinate", "pgqueuer-psycopg", "pgqueuer-asyncpg")
ALL_SYSTEMS = OURS + PEERS
# Ablation variants of ours-lib (run with SYSTEMS=...; not part of the default set): the same
# code with one change switched off through its setting.
VARIANTS: dict[str, dict[str, str]] = {
    "ours-lib-nobatch": {"WORKER_CLAIM_JOBS": "1"},  # one job per claim: no batches
    # one message ahead of the workers instead of two, or four
    "ours-lib-ahead1": {"PUBLISHER_MESSAGES_AHEAD": "1"},
    "ours-lib-ahead4": {"PUBLISHER_MESSAGES_AHEAD": "4"},
}

# Raised so that a backlog of thousands of queued jobs is admitted (defaults: 10000 / 1000)
# and submitted as fast as the producer can (rate limit defaults: 10/s, bursts of 50), and
# so that one tenant may keep every worker busy (fair dispatch defaults: 1 bulk / 8 fast in
# flight per tenant): the benchmark measures throughput, not the quota, the rate limit
# (whose Redis call it pays) or the per-tenant caps (whose counting the claim still does).
# The fairness scenario (bench/fairness.py) keeps the caps at their defaults.
OURS_ENV = {
    "TENANT_ACTIVE_QUOTA": "1000000",
    "ADMISSION_CAPACITY": "1000000",
    "TENANT_SUBMIT_RATE": "1000000",
    "TENANT_SUBMIT_BURST": "1000000",
    "TENANT_BULK_IN_FLIGHT": "1000000",
    "TENANT_FAST_IN_FLIGHT": "1000000",
}


def ours_settings(db: str, broker: str, **extra: Any) -> Settings:
    """Settings of the library-side producer on ``db`` and ``broker`` (DSN strings, validated
    by Settings), with the raised limits of ``OURS_ENV`` and any ``extra`` field."""
    return Settings.model_validate(
        {
            "database_url": db,
            "celery_broker_url": broker,
            "tenant_active_quota": int(OURS_ENV["TENANT_ACTIVE_QUOTA"]),
            "admission_capacity": int(OURS_ENV["ADMISSION_CAPACITY"]),
            "tenant_submit_rate": float(OURS_ENV["TENANT_SUBMIT_RATE"]),
            "tenant_submit_burst": int(OURS_ENV["TENANT_SUBMIT_BURST"]),
            "tenant_bulk_in_flight": int(OURS_ENV["TENANT_BULK_IN_FLIGHT"]),
            "tenant_fast_in_flight": int(OURS_ENV["TENANT_FAST_IN_FLIGHT"]),
            **extra,
        }
    )


def build_stack(
    env: BenchEnv,
    db: str,
    broker: str,
    run_dir: Path,
    names: tuple[str, ...],
    extra_env: dict[str, str] | None = None,
) -> Stack:
    stack = Stack.build(
        database_url=db,
        broker_url=broker,
        artifact_dir=run_dir / "artifacts",
        log_dir=run_dir / "logs",
        names=names,
        extra_env={**OURS_ENV, **(extra_env or {})},
    )
    # gunicorn's own default worker count (services/api/gunicorn_conf.py), not the test
    # harness's 2, unless the caller set API_WORKERS
    if "API_WORKERS" not in os.environ and "API_WORKERS" not in (extra_env or {}):
        stack.env.pop("API_WORKERS", None)
    return stack


class System(ABC):
    """One system under test for one run; a subclass implements every abstract method (a
    missing one fails at construction rather than answering None in the middle of a run)."""

    name: str

    def __init__(self, env: BenchEnv, cfg: Config, run_dir: Path) -> None:
        self.env, self.cfg, self.run_dir = env, cfg, run_dir
        self.db = ""
        self.broker = ""

    # lifecycle
    @abstractmethod
    def start(self) -> None: ...
    @abstractmethod
    def stop(self) -> None: ...
    @abstractmethod
    def cpu_groups(self) -> dict[str, list[int]]:
        """``{group: [root pid, ...]}`` of the processes whose CPU time is measured."""

    # producing
    @abstractmethod
    def enqueue(self) -> None: ...
    def saturate(self, n: int) -> int:
        """Enqueue ``n`` jobs; returns how many were accepted."""
        for _ in range(n):
            self.enqueue()
        return n

    def fixed_rate(self, rate: float, seconds: float) -> float:
        """Open loop from this thread; returns the achieved enqueue rate."""
        n = int(rate * seconds)
        start = time.perf_counter()
        for i in range(n):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            self.enqueue()
        return n / (time.perf_counter() - start)

    @abstractmethod
    def close_producer(self) -> None:
        """Release the producer's connections and clients."""

    # observing
    @abstractmethod
    def completed(self) -> int:
        """Jobs finished so far."""

    def failed(self) -> int:
        return 0

    @abstractmethod
    def phase_marker(self) -> Any: ...
    @abstractmethod
    def phase_results(self, marker: Any) -> dict[str, Any]:
        """``first_enqueue``, ``last_done`` (epoch s), ``pickup`` and ``e2e`` (lists, s)."""


# --- notes-exports -----------------------------------------------------------------------------


class Ours(System):
    def __init__(
        self,
        env: BenchEnv,
        cfg: Config,
        run_dir: Path,
        via: str,
        name: str | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(env, cfg, run_dir)
        self.via = via
        self.name = name or f"ours-{via}"
        self.extra_env = extra_env or {}
        self.stack: Stack | None = None
        self.pool: Any = None
        self.settings: Settings | None = None

    def start(self) -> None:
        self.db = self.env.fresh_database(self.name)
        self.broker = self.env.broker_url(1)
        names: tuple[str, ...] = ("publisher", "recovery-scanner", "fast-worker")
        if self.via == "http":
            names = ("api", *names)
        self.stack = build_stack(
            self.env,
            self.db,
            self.broker,
            self.run_dir,
            names,
            {"FAST_WORKER_CONCURRENCY": str(self.cfg.worker_processes), **self.extra_env},
        )
        self.stack.start()
        self.settings = ours_settings(self.db, self.broker)
        if self.via == "lib":
            self.pool = make_pool(self.settings, "bench-producer", min_size=1, max_size=1)
            seed = self.env.seed
            assert seed is not None
            self.request = ExportRequest.build(ExportFormat.JSON, seed.five_note_ids, False)
        else:
            assert self.env.seed is not None
            self.url = self.stack.api_url + "/v1/exports"
            self.body = {"note_ids": self.env.seed.five_note_ids, "format": "json"}
            self.headers = bearer(self.env.seed.api_key)

    def enqueue(self) -> None:
        assert self.settings is not None
        submit_export(self.pool, self.settings, tenant_id=TENANT, request=self.request)

    def saturate(self, n: int) -> int:
        if self.via == "lib":
            return super().saturate(n)
        res = loadgen.closed_loop(self.url, self.body, self.headers, self.cfg.http_concurrency, n)
        if res.ok < 0.99 * n:
            raise RuntimeError(
                f"HTTP producer: {res.ok}/{n} accepted, statuses {res.statuses}, "
                f"errors {res.errors}"
            )
        return res.ok

    def fixed_rate(self, rate: float, seconds: float) -> float:
        if self.via == "lib":
            return super().fixed_rate(rate, seconds)
        res = loadgen.open_loop(self.url, self.body, self.headers, rate, seconds)
        self.producer_report = {
            "sent": res.sent,
            "accepted": res.ok,
            "statuses": res.statuses,
            "errors": res.errors,
            "reconnects": res.reconnects,
        }
        if res.ok < 0.99 * res.sent:
            raise RuntimeError(f"HTTP producer: {res.ok}/{res.sent}, {self.producer_report}")
        return res.sent / res.send_elapsed

    def close_producer(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def stop(self) -> None:
        self.close_producer()
        if self.stack is not None:
            self.stack.stop()

    def cpu_groups(self) -> dict[str, list[int]]:
        assert self.stack is not None
        groups = {name: [p.pid] for name, p in self.stack.procs.items()}
        groups["postgres"] = postgres_pids(self.env.pg_dir)
        groups["redis"] = redis_pids(self.env.redis_dir)
        return groups

    def _one(self, sql: str, params: Any = None) -> Any:
        with psycopg.connect(self.db, autocommit=True) as conn:
            return conn.execute(sql, params).fetchone()

    def completed(self) -> int:
        return int(self._one("SELECT count(*) FROM export_jobs WHERE status = 'succeeded'")[0])

    def failed(self) -> int:
        return int(
            self._one("SELECT count(*) FROM export_jobs WHERE status IN ('failed', 'cancelled')")[0]
        )

    def phase_marker(self) -> Any:
        return self._one("SELECT clock_timestamp()")[0]

    def phase_results(self, marker: Any) -> dict[str, Any]:
        with psycopg.connect(self.db, autocommit=True) as conn:
            rows = conn.execute(
                """
                SELECT extract(epoch FROM s.at), extract(epoch FROM c.at), extract(epoch FROM d.at)
                FROM export_jobs j
                JOIN export_job_events s ON s.job_id = j.id AND s.kind = 'submitted'
                LEFT JOIN LATERAL (SELECT min(at) AS at FROM export_job_events e
                                   WHERE e.job_id = j.id AND e.kind = 'claimed') c ON true
                LEFT JOIN export_job_events d ON d.job_id = j.id AND d.kind = 'succeeded'
                WHERE j.created_at >= %s
                """,
                (marker,),
            ).fetchall()
            # Batch sizes: the jobs one claim statement took together share its transaction
            # time (started_at = now() of the first claim).
            sizes = conn.execute(
                """
                SELECT n, count(*) FROM (
                    SELECT count(*) AS n FROM export_jobs
                    WHERE created_at >= %s AND started_at IS NOT NULL GROUP BY started_at
                ) b GROUP BY n ORDER BY n
                """,
                (marker,),
            ).fetchall()
        done = [r for r in rows if r[2] is not None]
        return {
            "jobs": len(rows),
            "finished": len(done),
            "last_done": max((float(r[2]) for r in done), default=None),
            "pickup": [float(r[1] - r[0]) for r in rows if r[1] is not None],
            "e2e": [float(r[2] - r[0]) for r in done],
            "batch_sizes": {int(n): int(c) for n, c in sizes},
        }


# --- peers -----------------------------------------------------------------------------------


class Peer(System):
    module: str
    driver = ""

    def __init__(self, env: BenchEnv, cfg: Config, run_dir: Path, name: str) -> None:
        super().__init__(env, cfg, run_dir)
        self.name = name
        self.procs: list[ManagedProcess] = []
        self.producer: Any = None
        self.done_dir = run_dir / "done"
        self.ids: list[str] = []
        self.t_enq: dict[str, float] = {}

    def start(self) -> None:
        import importlib

        self.db = self.env.fresh_database(self.name)
        self.broker = self.env.broker_url(2)
        penv = dict(os.environ)
        penv.update(
            {
                "PATH": str(Path(sys.executable).parent) + os.pathsep + penv.get("PATH", ""),
                "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
                "PYTHONUNBUFFERED": "1",
                "BENCH_DATABASE_URL": self.db,
                "BENCH_BROKER_URL": self.broker,
                "BENCH_ARTIFACT_DIR": str(self.run_dir / "artifacts"),
                "BENCH_DONE_DIR": str(self.done_dir),
                "BENCH_PGQ_DRIVER": self.driver or "psycopg",
            }
        )
        # the producer in this process reads the same variables
        os.environ.update({k: v for k, v in penv.items() if k.startswith("BENCH_")})
        mod = importlib.import_module(self.module)
        n = self.cfg.worker_processes
        if self.name == "celery":
            commands = [mod.worker_command(n)]
        else:
            commands = [mod.worker_command(1) for _ in range(n)]
        for i, cmd in enumerate(commands):
            p = ManagedProcess(
                name=f"{self.name}-{i}",
                command=cmd,
                env=penv,
                log_path=self.run_dir / "logs" / f"{self.name}-worker-{i}.log",
            )
            p.start()
            self.procs.append(p)
        if self.name == "celery":
            mod.app.conf.broker_url = self.broker
        self.producer = mod.Producer()

    def enqueue(self) -> None:
        assert self.env.seed is not None
        job_id = str(uuid.uuid4())
        t = time.time()
        self.ids.append(job_id)
        self.t_enq[job_id] = t
        self.producer.enqueue(TENANT, self.env.seed.five_note_ids, job_id, t)

    def close_producer(self) -> None:
        if self.producer is not None:
            with contextlib.suppress(Exception):
                self.producer.close()
            self.producer = None

    def stop(self) -> None:
        self.close_producer()
        for p in self.procs:
            p.stop(timeout=10)

    def cpu_groups(self) -> dict[str, list[int]]:
        return {
            "workers": [p.pid for p in self.procs],
            "postgres": postgres_pids(self.env.pg_dir),
            "redis": redis_pids(self.env.redis_dir),
        }

    def completed(self) -> int:
        return workload.count_done(self.done_dir)

    def phase_marker(self) -> Any:
        return len(self.ids)

    def phase_results(self, marker: Any) -> dict[str, Any]:
        ids = set(self.ids[marker:])
        rows = [r for r in workload.read_done(self.done_dir) if r[0] in ids]
        return {
            "jobs": len(ids),
            "finished": len(rows),
            "last_done": max((r[3] for r in rows), default=None),
            "pickup": [r[2] - r[1] for r in rows],
            "e2e": [r[3] - r[1] for r in rows],
        }


class CeleryPeer(Peer):
    module = "bench.peers.celery_peer"


class ProcrastinatePeer(Peer):
    module = "bench.peers.procrastinate_peer"


class PgqPeer(Peer):
    module = "bench.peers.pgqueuer_peer"

    def __init__(self, env: BenchEnv, cfg: Config, run_dir: Path, name: str) -> None:
        super().__init__(env, cfg, run_dir, name)
        self.driver = name.split("-", 1)[1]


def make_system(name: str, env: BenchEnv, cfg: Config, run_dir: Path) -> System:
    if name == "ours-lib":
        return Ours(env, cfg, run_dir, "lib")
    if name == "ours-http":
        return Ours(env, cfg, run_dir, "http")
    if name in VARIANTS:
        return Ours(env, cfg, run_dir, "lib", name=name, extra_env=VARIANTS[name])
    if name == "celery":
        return CeleryPeer(env, cfg, run_dir, name)
    if name == "procrastinate":
        return ProcrastinatePeer(env, cfg, run_dir, name)
    if name.startswith("pgqueuer-"):
        return PgqPeer(env, cfg, run_dir, name)
    known = ", ".join((*ALL_SYSTEMS, *VARIANTS))
    raise ValueError(f"unknown system {name!r}; known: {known}")


# --- one measured run --------------------------------------------------------------------------


def _wait_done(sys_: System, target: int, timeout: float) -> bool:
    return became_true(lambda: sys_.completed() >= target, timeout, interval=0.1)


def _open_loop_phase(
    system: System, rate: float, seconds: float, expected_before: int
) -> tuple[dict[str, Any], int, bool]:
    """One open-loop phase: the system's producer submits at ``rate`` jobs/s for ``seconds``,
    then waits until every job of the run so far (``expected_before`` plus this phase's) has
    finished, within 60 s + 1 s per 20 jobs.

    Returns ``(figures, submitted, all_finished)``: figures are the target and achieved rate
    (jobs/s), pickup and submit-to-finished latency (:func:`latency_summary`), the finished
    count, the job count and, where the system reports them, its batch sizes; submitted is
    what the HTTP producer had accepted when the system has one (``producer_report``), else
    ``rate x seconds``.
    """
    marker = system.phase_marker()
    achieved = system.fixed_rate(rate, seconds)
    report = getattr(system, "producer_report", None)
    submitted = int(rate * seconds) if report is None else report["accepted"]
    ok = _wait_done(system, expected_before + submitted, 60 + submitted / 20)
    res = system.phase_results(marker)
    figures = {
        "target_per_s": rate,
        "achieved_per_s": achieved,
        "pickup": latency_summary(res["pickup"]),
        "e2e": latency_summary(res["e2e"]),
        "finished": res["finished"],
        "jobs": res["jobs"],
        **({"batch_sizes": res["batch_sizes"]} if "batch_sizes" in res else {}),
    }
    return figures, submitted, ok


def run_system(
    name: str, env: BenchEnv, cfg: Config, run_dir: Path, log: Callable[[str], None]
) -> dict[str, Any]:
    """Start, warm up, saturate, fixed rate, stop; returns this run's figures."""
    run_dir.mkdir(parents=True, exist_ok=True)
    system = make_system(name, env, cfg, run_dir)
    out: dict[str, Any] = {"system": name}
    admin = env.servers.admin_dsn
    try:
        system.start()
        commits0 = xact_commits(system.db)
        expected = 0
        # warm-up (also waits until every process is up)
        expected += system.saturate(cfg.e2e_warmup)
        if not _wait_done(system, expected, 120):
            raise RuntimeError(f"warm-up did not finish: {system.completed()}/{expected}")
        # saturation
        marker = system.phase_marker()
        meter = CpuMeter(system.cpu_groups())
        meter.start()
        t0 = time.time()
        n_sat = system.saturate(cfg.e2e_jobs)
        t_enq = time.time() - t0
        expected += n_sat
        ok = _wait_done(system, expected, 60 + cfg.e2e_jobs / 20)
        cpu = meter.stop()
        res = system.phase_results(marker)
        if not ok or res["last_done"] is None:
            out["error"] = f"saturation: {res['finished']}/{n_sat} finished"
        else:
            span = res["last_done"] - t0
            out["jobs_per_s"] = n_sat / span
            out["enqueue_per_s"] = n_sat / t_enq
            out["saturation_pickup"] = latency_summary(res["pickup"])
            out["saturation_e2e"] = latency_summary(res["e2e"])
            total = sum(v for k, v in cpu.items() if k not in ("wall", "machine (all processes)"))
            out["cpu_ms_per_job"] = 1000 * total / n_sat
            out["machine_cpu_ms_per_job"] = 1000 * cpu["machine (all processes)"] / n_sat
            out["cpu_seconds"] = cpu
            if "batch_sizes" in res:
                out["saturation_batch_sizes"] = res["batch_sizes"]
        log(f"  {name}: saturation {out.get('jobs_per_s', 0):.0f} jobs/s")
        # fixed rate
        fixed, n_fixed, ok = _open_loop_phase(system, cfg.fixed_rate, cfg.fixed_seconds, expected)
        expected += n_fixed
        report = getattr(system, "producer_report", None)
        if report is not None:
            out["http_producer"] = report
        if not ok:
            out["error"] = f"fixed rate: {fixed['finished']}/{n_fixed} finished in time"
        out["fixed_rate"] = fixed
        # open loop at 80 % of this run's measured saturation
        if out.get("jobs_per_s") and cfg.open80_seconds > 0:
            open80, n80, ok = _open_loop_phase(
                system, 0.8 * out["jobs_per_s"], cfg.open80_seconds, expected
            )
            expected += n80
            if not ok:
                out["error"] = f"open loop at 80 %: {open80['finished']}/{n80} finished in time"
            out["open80"] = open80
        out["failed_jobs"] = system.failed()
        system.close_producer()
        system.stop()
        time.sleep(0.5)
        out["pg_commits_per_job"] = (xact_commits(system.db) - commits0 - 1) / expected
        log(
            f"  {name}: fixed {fixed['achieved_per_s']:.0f}/s pickup p99 "
            f"{fixed['pickup']['p99_ms']} ms, e2e p99 {fixed['e2e']['p99_ms']} ms"
        )
    except Exception as exc:  # a broken system is reported, not fatal to the others
        out["error"] = f"{type(exc).__name__}: {exc}"
        log(f"  {name}: ERROR {out['error']}")
    finally:
        with contextlib.suppress(Exception):
            system.stop()
        if system.db:
            env.discard(system.db)
        del admin
    return out
