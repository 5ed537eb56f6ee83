"""End to end: submit -> succeeded for small exports (5 notes, json), every system on equal
footing (docs/performance.md, "Equal footing"), alternated run by run.

Per system and run (a fresh database copied from the template, a flushed Redis db, a
CHECKPOINT first so that every system starts from clean pages):

1. start the system's processes with the same number of concurrent job executions
   (``worker_processes``: prefork children, or one process per execution slot); warm up;
   **idle**: single exports, each submitted to an idle system (``idle_jobs``);
2. **saturation**: one producer enqueues ``e2e_jobs`` jobs one at a time (notes-exports over
   HTTP: ``http_concurrency`` keep-alive connections); jobs/s = jobs / (first submit -> last
   succeeded);
3. **at50**, **at80**: open loop at 50 % and 80 % of *this system's own* saturation of this
   run; **noisy**: at50 again with a CPU-bound process busy on one core beside the system;
   **at<rate>**: the fixed ``fixed_rate`` of the earlier reports;
4. per phase: submit -> succeeded as the client sees it (the producer's wall clock at the
   submit call, to the time the system recorded the job as succeeded), CPU of the system's
   own processes and its PostgreSQL backends, write transactions (transaction ids assigned)
   and WAL bytes (insert LSN) per job; in ``sat`` and ``at50`` also what PostgreSQL did
   per export, statement by statement and table by table (:mod:`bench.pgstats`), with
   ``stats_settle_seconds`` of quiet before and after each for the table counters.

Completion is read from each system's own record of success, written in the transaction
that makes the job succeeded (notes-exports: the ``succeeded`` history event; Procrastinate:
its ``succeeded`` event; PgQueuer: its ``successful`` log row; raw Celery, which records
nothing: the end of the task body), after each phase from one harness connection: observing
costs the systems nothing while they run, and no system is polled more than another (the
harness's wait for the phase's last job counts rows once per ``POLL_SECONDS``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import psycopg

from bench import footing, loadgen, pgstats, workload
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

OURS = ("ours-lib", "ours-lib-warning", "ours-http")
PEERS = ("celery", "procrastinate", "pgqueuer-psycopg", "pgqueuer-asyncpg")
ALL_SYSTEMS = OURS + PEERS
# Variants of ours-lib: the same code with settings changed. ours-lib-warning is in the
# default set (equal logging: the peers write no line per job); the others are ablation
# variants, run when named in SYSTEMS.
VARIANTS: dict[str, dict[str, str]] = {
    "ours-lib-warning": {"LOG_LEVEL": "WARNING"},
    "ours-lib-nobatch": {"WORKER_CLAIM_JOBS": "1"},  # one job per claim: no batches
    # one message ahead of the workers instead of two, or four
    "ours-lib-ahead1": {"PUBLISHER_MESSAGES_AHEAD": "1"},
    "ours-lib-ahead4": {"PUBLISHER_MESSAGES_AHEAD": "4"},
}
HARNESS_APP = "bench-harness"  # application_name of the harness's own connections
POLL_SECONDS = 0.2  # how often the harness counts finished jobs while it waits

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


# --- what the harness reads from PostgreSQL ------------------------------------------------


class Observer:
    """The harness's one connection to a system's database (``application_name``
    ``bench-harness``, left out of the system's CPU): completion counts, the system's own
    success records after a phase, its backends, and the cluster's transaction id and WAL
    positions. Every statement is read-only: it assigns no transaction id, writes no WAL."""

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True, application_name=HARNESS_APP)
        pgstats.untracked(self.conn)  # the harness's reads are no system's statements

    def one(self, sql: str, params: Any = None) -> Any:
        row = self.conn.execute(sql, params).fetchone()
        assert row is not None, sql
        return row[0]

    def rows(self, sql: str, params: Any = None) -> list[Any]:
        return self.conn.execute(sql, params).fetchall()

    def counters(self) -> tuple[int, int]:
        """``(next transaction id, WAL insert position in bytes)`` of the cluster. Only write
        transactions get an id (a read-only SELECT does not), so the difference of two
        readings counts write transactions (committed or rolled back, subtransactions with
        writes included); the LSN difference is the WAL written in between, the same
        records ``pg_stat_wal.wal_bytes`` counts, read at once rather than up to a second
        late as backends report their statistics."""
        row = self.conn.execute(
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint,"
            " pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint"
        ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    def backend_pids(self) -> list[int]:
        """Every backend connected to this database but the harness's own: the system's
        client connections and the autovacuum workers busy on its tables."""
        return [
            int(r[0])
            for r in self.rows(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND application_name <> %s",
                (HARNESS_APP,),
            )
        ]

    def close(self) -> None:
        self.conn.close()


def _proc_sample(pid: int) -> footing.ProcSample | None:
    import psutil

    try:
        p = psutil.Process(pid)
        with p.oneshot():
            t = p.cpu_times()
            return footing.ProcSample(started=p.create_time(), cpu=t.user + t.system)
    except psutil.Error:
        return None


def _tree_pids(root: int) -> list[int]:
    import psutil

    try:
        p = psutil.Process(root)
        return [root, *(c.pid for c in p.children(recursive=True))]
    except psutil.Error:
        return []


class OwnCpu:
    """CPU of one system only: the process trees the harness started for it, its Redis when
    it uses one, its PostgreSQL backends (by PID from ``pg_stat_activity`` of its own
    database) and, for a library producer, the harness thread that runs the producer's
    calls (``time.thread_time``). Not the machine: other users' processes and steal time
    are not the system's."""

    def __init__(
        self,
        trees: dict[str, list[int]],
        observer: Observer,
        producer_counts: bool,
    ) -> None:
        self.trees, self.observer, self.producer_counts = trees, observer, producer_counts
        self._before: dict[str, dict[int, footing.ProcSample]] = {}
        self._thread0 = 0.0

    def _snapshot(self) -> dict[str, dict[int, footing.ProcSample]]:
        snap: dict[str, dict[int, footing.ProcSample]] = {}
        for group, roots in self.trees.items():
            pids = [pid for root in roots for pid in _tree_pids(root)]
            snap[group] = {pid: s for pid in pids if (s := _proc_sample(pid)) is not None}
        backends = self.observer.backend_pids()
        snap["postgres backends"] = {
            pid: s for pid in backends if (s := _proc_sample(pid)) is not None
        }
        return snap

    def start(self) -> None:
        self._before = self._snapshot()
        self._thread0 = time.thread_time()

    def stop(self) -> dict[str, Any]:
        """``{"seconds": {group: s}, "total_s", "born", "vanished"}``; the producer thread
        is a group of its own, in the total only for a library producer."""
        thread = time.thread_time() - self._thread0
        delta = footing.cpu_delta(self._before, self._snapshot())
        seconds = dict(delta.seconds)
        seconds["producer thread"] = round(thread, 4)
        total = delta.total + (thread if self.producer_counts else 0.0)
        return {
            "seconds": seconds,
            "total_s": round(total, 4),
            "producer_counted": self.producer_counts,
            "born": delta.born,
            "vanished": delta.vanished,
        }


def noisy_neighbour() -> subprocess.Popen[bytes]:
    """A CPU-bound process busy on the machine's last core (pinned there) until killed."""
    cpu = (os.cpu_count() or 1) - 1
    code = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True:\n    pass\n"
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


# --- the systems ---------------------------------------------------------------------------


class System(ABC):
    """One system under test for one run; a subclass implements every abstract method (a
    missing one fails at construction rather than answering None in the middle of a run).

    Jobs are named by a key (a string) the system's producer returns; :attr:`submitted`
    maps each key to the producer's wall clock just before the submit call (s)."""

    name: str
    uses_redis = False

    def __init__(self, env: BenchEnv, cfg: Config, run_dir: Path) -> None:
        self.env, self.cfg, self.run_dir = env, cfg, run_dir
        self.db = ""
        self.broker = ""
        self.submitted: dict[str, float] = {}
        self.observer: Observer | None = None

    # lifecycle
    @abstractmethod
    def start(self) -> None: ...
    @abstractmethod
    def stop(self) -> None: ...
    @abstractmethod
    def cpu_groups(self) -> dict[str, list[int]]:
        """``{group: [root pid, ...]}`` of the processes the harness started for the system
        (the saturation figure of earlier reports also adds PostgreSQL and Redis whole)."""

    def own_trees(self) -> dict[str, list[int]]:
        """The process trees whose CPU is the system's own (its Redis included when it uses
        one); its PostgreSQL backends are added by :class:`OwnCpu`."""
        groups = {k: v for k, v in self.cpu_groups().items() if k not in ("postgres", "redis")}
        if self.uses_redis:
            groups["redis"] = redis_pids(self.env.redis_dir)
        return groups

    @property
    def producer_counts(self) -> bool:
        """Whether the producer's calls are the system's work (a library call: yes; an HTTP
        load generator: no, the api it calls is measured instead)."""
        return True

    # producing
    @abstractmethod
    def enqueue(self) -> str:
        """Submit one job; returns its key."""

    def submit(self) -> None:
        t = time.time()
        self.submitted[self.enqueue()] = t

    def saturate(self, n: int) -> list[str]:
        """Enqueue ``n`` jobs; returns the keys of those accepted."""
        before = len(self.submitted)
        for _ in range(n):
            self.submit()
        return list(self.submitted)[before:]

    def fixed_rate(self, rate: float, seconds: float) -> tuple[list[str], float]:
        """Open loop from this thread; returns the keys submitted and the achieved rate."""
        n = int(rate * seconds)
        before = len(self.submitted)
        start = time.perf_counter()
        for i in range(n):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            self.submit()
        return list(self.submitted)[before:], n / (time.perf_counter() - start)

    @abstractmethod
    def close_producer(self) -> None:
        """Release the producer's connections and clients."""

    # observing
    def open_observer(self) -> Observer:
        self.observer = Observer(self.db)
        return self.observer

    @abstractmethod
    def completed(self) -> int:
        """Jobs finished so far."""

    def failed(self) -> int:
        return 0

    @abstractmethod
    def finish_times(self, keys: list[str]) -> dict[str, tuple[float | None, float]]:
        """``{key: (started, succeeded)}`` (wall-clock s) of the jobs of ``keys`` that
        succeeded: when the job's execution began (a detail) and when the system recorded
        it as succeeded."""

    def phase_marker(self) -> Any:
        return None

    def batch_sizes(self, marker: Any) -> dict[int, int] | None:
        """Jobs per claim statement since ``marker`` (notes-exports only)."""
        return None


# --- notes-exports -----------------------------------------------------------------------------


class Ours(System):
    uses_redis = True

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

    @property
    def producer_counts(self) -> bool:
        return self.via == "lib"

    def enqueue(self) -> str:
        assert self.settings is not None
        out = submit_export(self.pool, self.settings, tenant_id=TENANT, request=self.request)
        return str(out.job["id"])

    def _accepted(self, res: loadgen.LoadResult) -> list[str]:
        keys = []
        for t, body in res.accepted:
            key = str(json.loads(body)["id"])
            self.submitted[key] = t
            keys.append(key)
        return keys

    def saturate(self, n: int) -> list[str]:
        if self.via == "lib":
            return super().saturate(n)
        res = loadgen.closed_loop(
            self.url, self.body, self.headers, self.cfg.http_concurrency, n, keep_bodies=True
        )
        if res.ok < 0.99 * n:
            raise RuntimeError(
                f"HTTP producer: {res.ok}/{n} accepted, statuses {res.statuses}, "
                f"errors {res.errors}"
            )
        return self._accepted(res)

    def fixed_rate(self, rate: float, seconds: float) -> tuple[list[str], float]:
        if self.via == "lib":
            return super().fixed_rate(rate, seconds)
        res = loadgen.open_loop(self.url, self.body, self.headers, rate, seconds, keep_bodies=True)
        self.producer_report = {
            "sent": res.sent,
            "accepted": res.ok,
            "statuses": res.statuses,
            "errors": res.errors,
            "reconnects": res.reconnects,
        }
        if res.ok < 0.99 * res.sent:
            raise RuntimeError(f"HTTP producer: {res.ok}/{res.sent}, {self.producer_report}")
        return self._accepted(res), res.sent / res.send_elapsed

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

    def completed(self) -> int:
        assert self.observer is not None
        return int(self.observer.one("SELECT count(*) FROM export_jobs WHERE status = 'succeeded'"))

    def failed(self) -> int:
        assert self.observer is not None
        return int(
            self.observer.one(
                "SELECT count(*) FROM export_jobs WHERE status IN ('failed', 'cancelled')"
            )
        )

    def finish_times(self, keys: list[str]) -> dict[str, tuple[float | None, float]]:
        assert self.observer is not None
        rows = self.observer.rows(
            """
            SELECT d.job_id::text, extract(epoch FROM c.at)::float8,
                   extract(epoch FROM d.at)::float8
            FROM export_job_events d
            LEFT JOIN LATERAL (SELECT min(at) AS at FROM export_job_events e
                               WHERE e.job_id = d.job_id AND e.kind = 'claimed') c ON true
            WHERE d.kind = 'succeeded' AND d.job_id = ANY(%s::uuid[])
            """,
            (keys,),
        )
        return {r[0]: (r[1], r[2]) for r in rows}

    def phase_marker(self) -> Any:
        assert self.observer is not None
        return self.observer.one("SELECT clock_timestamp()")

    def batch_sizes(self, marker: Any) -> dict[int, int] | None:
        # The jobs one claim statement took together share its transaction time
        # (started_at = now() of the first claim).
        assert self.observer is not None
        sizes = self.observer.rows(
            """
            SELECT n, count(*) FROM (
                SELECT count(*) AS n FROM export_jobs
                WHERE created_at >= %s AND started_at IS NOT NULL GROUP BY started_at
            ) b GROUP BY n ORDER BY n
            """,
            (marker,),
        )
        return {int(n): int(c) for n, c in sizes}


# --- peers -----------------------------------------------------------------------------------


class Peer(System):
    module: str
    driver = ""
    count_sql: str | None = None  # counts the jobs the system recorded as succeeded

    def __init__(self, env: BenchEnv, cfg: Config, run_dir: Path, name: str) -> None:
        super().__init__(env, cfg, run_dir)
        self.name = name
        self.procs: list[ManagedProcess] = []
        self.producer: Any = None
        self.done_dir = run_dir / "done"

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
                "BENCH_PEER_THREADS": "1",  # one execution per process (PgQueuer)
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

    def enqueue(self) -> str:
        assert self.env.seed is not None
        key = str(uuid.uuid4())
        self.on_enqueued(
            key, self.producer.enqueue(TENANT, self.env.seed.five_note_ids, key, time.time())
        )
        return key

    def on_enqueued(self, key: str, system_id: Any) -> None:
        """Remember the system's own id of job ``key`` where its records name only that."""

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
        """From the system's own success records (``count_sql``) where it keeps them, else
        from the task bodies' done files."""
        if self.count_sql is None:
            return workload.count_done(self.done_dir)
        assert self.observer is not None
        return int(self.observer.one(self.count_sql))

    def bodies(self, keys: list[str]) -> dict[str, tuple[float, float]]:
        """``{key: (body started, body finished)}`` from the task bodies' done files."""
        wanted = set(keys)
        return {r[0]: (r[2], r[3]) for r in workload.read_done(self.done_dir) if r[0] in wanted}

    def finish_times(self, keys: list[str]) -> dict[str, tuple[float | None, float]]:
        # Raw Celery records no success anywhere (no result backend): the end of the task
        # body, just before the late ack, is the closest a client could learn of it.
        return {k: (s, e) for k, (s, e) in self.bodies(keys).items()}


class CeleryPeer(Peer):
    module = "bench.peers.celery_peer"
    uses_redis = True


class ProcrastinatePeer(Peer):
    module = "bench.peers.procrastinate_peer"
    count_sql = "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"

    def finish_times(self, keys: list[str]) -> dict[str, tuple[float | None, float]]:
        assert self.observer is not None
        bodies = self.bodies(keys)
        rows = self.observer.rows(
            """
            SELECT j.args->>'job_id', extract(epoch FROM e.at)::float8
            FROM procrastinate_jobs j
            JOIN procrastinate_events e ON e.job_id = j.id AND e.type = 'succeeded'
            WHERE j.args->>'job_id' = ANY(%s)
            """,
            (keys,),
        )
        return {k: (bodies.get(k, (None, 0.0))[0], t) for k, t in rows}


class PgqPeer(Peer):
    module = "bench.peers.pgqueuer_peer"
    count_sql = "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"

    def __init__(self, env: BenchEnv, cfg: Config, run_dir: Path, name: str) -> None:
        super().__init__(env, cfg, run_dir, name)
        self.driver = name.split("-", 1)[1]
        self.keys_by_id: dict[int, str] = {}

    def on_enqueued(self, key: str, system_id: Any) -> None:
        self.keys_by_id[int(system_id)] = key

    def finish_times(self, keys: list[str]) -> dict[str, tuple[float | None, float]]:
        assert self.observer is not None
        bodies = self.bodies(keys)
        wanted = set(keys)
        ids = [i for i, k in self.keys_by_id.items() if k in wanted]
        rows = self.observer.rows(
            "SELECT job_id, extract(epoch FROM created)::float8 FROM pgqueuer_log"
            " WHERE status = 'successful' AND job_id = ANY(%s::bigint[])",
            (ids,),
        )
        out: dict[str, tuple[float | None, float]] = {}
        for job_id, t in rows:
            key = self.keys_by_id[int(job_id)]
            out[key] = (bodies.get(key, (None, 0.0))[0], t)
        return out


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
    known = ", ".join(dict.fromkeys((*ALL_SYSTEMS, *VARIANTS)))
    raise ValueError(f"unknown system {name!r}; known: {known}")


# --- one measured run --------------------------------------------------------------------------


def _wait_done(sys_: System, target: int, timeout: float) -> bool:
    return became_true(lambda: sys_.completed() >= target, timeout, interval=POLL_SECONDS)


class Phase:
    """One measured phase: CPU of the system's own processes, write transactions and WAL
    bytes from before the first submit to the phase's last job succeeded; with ``named``
    (:func:`bench.pgstats.named_statements`), also what PostgreSQL did per export
    (:meth:`pg`)."""

    def __init__(self, system: System, named: Mapping[str, str] | None = None) -> None:
        assert system.observer is not None
        self.system, self.observer = system, system.observer
        self.cpu = OwnCpu(system.own_trees(), system.observer, system.producer_counts)
        self.stats = None if named is None else pgstats.PhaseStats(system.observer.conn, named)
        self.jobs = 0

    def __enter__(self) -> Phase:
        self.marker = self.system.phase_marker()
        if self.stats is not None:
            self.stats.start()
        self.xid0, self.wal0 = self.observer.counters()
        self.cpu.start()
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def result(self, keys: list[str], expected_total: int, timeout: float) -> dict[str, Any]:
        """Wait until ``expected_total`` jobs of the run finished (within ``timeout`` s), stop
        the counters, then read the phase's jobs' success records; returns its figures."""
        ok = _wait_done(self.system, expected_total, timeout)
        cpu = self.cpu.stop()
        xid1, wal1 = self.observer.counters()
        if self.stats is not None:
            self.stats.statements()  # exact now: a statement counts when it ends
        self.jobs = len(keys)
        times = self.system.finish_times(keys)
        submitted = {k: self.system.submitted[k] for k in keys}
        finished = {k: v[1] for k, v in times.items()}
        e2e, missing = footing.client_latencies(submitted, finished)
        pickup = [
            v[0] - submitted[k] for k, v in times.items() if v[0] is not None and k in submitted
        ]
        n = max(1, len(keys))
        out: dict[str, Any] = {
            "jobs": len(keys),
            "finished": len(keys) - missing,
            "all_finished": ok and missing == 0,
            "kept_up": footing.kept_up(submitted, finished),
            "e2e": latency_summary(e2e),
            "pickup": latency_summary(pickup),
            "own_cpu": cpu,
            "cpu_ms_per_job": round(1000 * cpu["total_s"] / n, 4),
            "write_xacts": xid1 - self.xid0,
            "write_commits_per_job": round((xid1 - self.xid0) / n, 4),
            "wal_bytes": wal1 - self.wal0,
            "wal_bytes_per_job": round((wal1 - self.wal0) / n, 1),
            "saturation_per_s": footing.saturation_rate(submitted, finished),
        }
        sizes = self.system.batch_sizes(self.marker)
        if sizes is not None:
            out["batch_sizes"] = sizes
        if isinstance(self.system, Peer):
            bodies = self.system.bodies(keys)
            out["max_concurrent_executions"] = footing.max_overlap(bodies.values())
        return out

    def pg(self, settle_seconds: float) -> dict[str, Any] | None:
        """After :meth:`result` (and after every other counter of the phase is read): wait
        ``settle_seconds`` for the backends' table counters to arrive, then the phase's
        statements and table writes per export (:meth:`bench.pgstats.PhaseStats.result`);
        None when the phase records none or ran no job."""
        if self.stats is None or self.jobs < 1:
            return None
        time.sleep(settle_seconds)
        return self.stats.result(self.jobs, settle_seconds)


def _open_loop(
    system: System,
    rate: float,
    seconds: float,
    expected_before: int,
    noisy: bool = False,
    pg: tuple[Mapping[str, str], float] | None = None,
) -> tuple[dict[str, Any], int]:
    """One open-loop phase at ``rate`` jobs/s for ``seconds``, optionally with the noisy
    neighbour running; waits for every job of the run so far (``expected_before`` plus this
    phase's) within 60 s + 1 s per 20 jobs. With ``pg`` (named statements, settle seconds)
    it also records what PostgreSQL did per export (``pg``). Returns the figures and the
    jobs submitted."""
    spinner = noisy_neighbour() if noisy else None
    try:
        with Phase(system, None if pg is None else pg[0]) as phase:
            keys, achieved = system.fixed_rate(rate, seconds)
            res = phase.result(keys, expected_before + len(keys), 60 + len(keys) / 20)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    if pg is not None:
        res["pg"] = phase.pg(pg[1])
    res.update({"target_per_s": round(rate, 2), "achieved_per_s": round(achieved, 2)})
    report = getattr(system, "producer_report", None)
    if report is not None:
        res["http_producer"] = report
    return res, len(keys)


IDLE_GAP_SECONDS = 0.5  # how long the system stays without work before each idle export


def _idle(system: System, jobs: int, expected_before: int) -> tuple[dict[str, Any], int]:
    """The ``idle`` phase: ``jobs`` single exports, each submitted when the previous one has
    succeeded and the system then had nothing to do for ``IDLE_GAP_SECONDS``, so that every
    one meets idle workers and an empty queue (no backlog to batch with, every timer at
    rest): the latency of one export on its own. Returns the figures and the jobs submitted.
    """
    keys: list[str] = []
    with Phase(system) as phase:
        for _ in range(jobs):
            time.sleep(IDLE_GAP_SECONDS)
            keys += system.saturate(1)
            if not _wait_done(system, expected_before + len(keys), 30):
                break  # reported below as not all finished
        res = phase.result(keys, expected_before + len(keys), 30)
    return res, len(keys)


def run_system(
    name: str, env: BenchEnv, cfg: Config, run_dir: Path, log: Callable[[str], None]
) -> dict[str, Any]:
    """Start, warm up, saturate, the fixed-rate phases, stop; returns this run's figures."""
    run_dir.mkdir(parents=True, exist_ok=True)
    system = make_system(name, env, cfg, run_dir)
    out: dict[str, Any] = {
        "system": name,
        "concurrency": cfg.worker_processes,
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        system.start()
        with psycopg.connect(system.db, autocommit=True) as conn:
            conn.execute("CHECKPOINT")  # every system starts from clean pages (WAL per job)
        observer = system.open_observer()
        commits0 = xact_commits(system.db)
        expected = 0
        # warm-up (also waits until every process is up)
        expected += len(system.saturate(cfg.e2e_warmup))
        if not _wait_done(system, expected, 120):
            raise RuntimeError(f"warm-up did not finish: {system.completed()}/{expected}")
        # one export at a time on an idle system
        if cfg.idle_jobs > 0:
            idle, n = _idle(system, cfg.idle_jobs, expected)
            expected += n
            out["idle"] = idle
            if not idle["all_finished"]:
                out["error"] = f"idle: {idle['finished']}/{n} finished in time"
            log(f"  {name}: idle e2e p50 {idle['e2e']['p50_ms']} ms")
        # what PostgreSQL does per export (sat and at50): the table counters of the work so
        # far arrive in the quiet before the phase (docs/performance.md)
        named = pgstats.named_statements()
        settle = cfg.stats_settle_seconds
        time.sleep(settle)
        # saturation: the old whole-process meter beside the system's own accounting
        meter = CpuMeter(system.cpu_groups())
        meter.start()
        t0 = time.time()
        with Phase(system, named) as phase:
            keys = system.saturate(cfg.e2e_jobs)
            t_enq = time.time() - t0
            expected += len(keys)
            sat = phase.result(keys, expected, 60 + cfg.e2e_jobs / 20)
        cpu = meter.stop()
        sat["pg"] = phase.pg(settle)
        out["sat"] = sat
        rate = sat["saturation_per_s"]
        if rate is None:
            out["error"] = f"saturation: {sat['finished']}/{len(keys)} finished"
        else:
            out["jobs_per_s"] = rate
            out["enqueue_per_s"] = len(keys) / t_enq
            out["saturation_pickup"] = sat["pickup"]
            out["saturation_e2e"] = sat["e2e"]
            total = sum(v for k, v in cpu.items() if k not in ("wall", "machine (all processes)"))
            out["cpu_ms_per_job"] = 1000 * total / len(keys)
            out["machine_cpu_ms_per_job"] = 1000 * cpu["machine (all processes)"] / len(keys)
            out["cpu_seconds"] = cpu
            if "batch_sizes" in sat:
                out["saturation_batch_sizes"] = sat["batch_sizes"]
        log(f"  {name}: saturation {out.get('jobs_per_s', 0):.0f} jobs/s")
        # at 50 % and 80 % of this run's own saturation, and at 50 % beside a noisy neighbour
        if rate is not None:
            rates = footing.fraction_rates(rate)
            for phase_name, r, secs, noisy in (
                ("at50", rates["at50"], cfg.at50_seconds, False),
                ("noisy", rates["at50"], cfg.at50_seconds, True),
                ("at80", rates["at80"], cfg.open80_seconds, False),
            ):
                if secs <= 0:
                    continue
                pg = (named, settle) if phase_name == "at50" else None
                res, n = _open_loop(system, r, secs, expected, noisy=noisy, pg=pg)
                expected += n
                out[phase_name] = res
                if not res["all_finished"]:
                    out["error"] = f"{phase_name}: {res['finished']}/{n} finished in time"
                log(
                    f"  {name}: {phase_name} {res['achieved_per_s']:.0f}/s e2e p50 "
                    f"{res['e2e']['p50_ms']} p99 {res['e2e']['p99_ms']} ms"
                )
            if "at80" in out:
                out["open80"] = out["at80"]  # the phase earlier reports called open80
        # the fixed rate of earlier reports
        if cfg.fixed_seconds > 0:
            fixed, n = _open_loop(system, cfg.fixed_rate, cfg.fixed_seconds, expected)
            expected += n
            out["fixed_rate"] = fixed
            if not fixed["all_finished"]:
                out["error"] = f"fixed rate: {fixed['finished']}/{n} finished in time"
        out["failed_jobs"] = system.failed()
        observer.close()
        system.close_producer()
        system.stop()
        time.sleep(0.5)
        out["pg_commits_per_job"] = (xact_commits(system.db) - commits0 - 1) / max(1, expected)
    except Exception as exc:  # a broken system is reported, not fatal to the others
        out["error"] = f"{type(exc).__name__}: {exc}"
        log(f"  {name}: ERROR {out['error']}")
    finally:
        if system.observer is not None:
            with contextlib.suppress(Exception):
                system.observer.close()
        with contextlib.suppress(Exception):
            system.stop()
        if system.db:
            env.discard(system.db)
        out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    return out
