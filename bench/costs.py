"""Costs: CPU and PostgreSQL commits per job of each hot-path stage, measured in-process so
that the figures do not depend on how loaded the machine is (no throughput, no latency).

For each variant, on a fresh database: ``costs_jobs`` library submits (5 notes); the
publisher's passes over them (real ``Publisher.run_once`` against the bench Redis, without
a NOTIFY wait: every pass sees whatever is due), allowed one message ahead of the workers
per ``WORKER_CLAIM_JOBS`` jobs of the backlog, as a saturated system keeps them; then the
messages it sent are read back from Redis and run by a real ``JobRunner`` (``run_batch``
per message on ``exports.fast``: each claim takes the due jobs the publisher left in the
outbox beside its message's, file artifacts with fsync), as a worker child would, without
the Celery consumer around it (its own cost per message is in the e2e figures of raw
Celery). Per stage: CPU ms per job of this process
(the client) and of PostgreSQL (every backend and helper of the cluster, psutil), and
commits per job (``pg_stat_database.xact_commit``, read after the stage's connections
closed). Variants switch one of the hot path's changes (docs/performance.md) at a time:

- ``batched`` — defaults (up to ``WORKER_CLAIM_JOBS`` = 8 jobs per claim);
- ``one_per_message`` — ``WORKER_CLAIM_JOBS=1``: no batch claims or finishes;
- ``no_fillfactor`` — batched, with ``export_jobs`` / ``export_outbox`` back to the default
  fill factor (100): no room for heap-only updates;
- ``sequential_fsync`` — batched, the artifacts of a batch committed one after the other;
- ``submit_alone`` — ``API_SUBMIT_BATCH=1``: no submit coalescer.

Beside the stages, ``submit_concurrent``: the same number of submits from
``COALESCE_THREADS`` (8) threads at once, as the threads of one api process serve
concurrent requests, through the process's submit coalescer (``exportcore.coalesce``; none
in ``submit_alone``): its CPU, commits and wall time per job compare the coalescer against
submits written alone. It is not part of ``total``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import redis

from bench.common import Config, CpuMeter, postgres_pids, xact_commits
from bench.e2e import ours_settings
from bench.env import TENANT, BenchEnv
from exportcore.artifacts import ArtifactStore, FileArtifactStore, StoredArtifact
from exportcore.broker import EXPORT_TASK, make_celery
from exportcore.coalesce import SubmitCoalescer
from exportcore.db import make_pool
from exportcore.domain import FAST_QUEUE, ExportFormat, ExportRequest
from exportcore.publisher import Publisher, PublisherConfig
from exportcore.runner import JobRunner
from exportcore.settings import Settings
from exportcore.submit import submit_export

VARIANTS: dict[str, dict[str, Any]] = {
    "batched": {},
    "one_per_message": {"worker_claim_jobs": 1},
    "no_fillfactor": {
        "_sql": "ALTER TABLE export_jobs RESET (fillfactor);"
        " ALTER TABLE export_outbox RESET (fillfactor)"
    },
    "sequential_fsync": {"_store": "sequential"},
    "submit_alone": {"api_submit_batch": 1},
}
COALESCE_THREADS = 8


class _SequentialStore(FileArtifactStore):
    """The file store committing a batch one artifact after the other (the ablation)."""

    def commit_all(self, writers: Any) -> list[StoredArtifact | Exception]:
        """One after the other: the base class's commit."""
        return ArtifactStore.commit_all(self, writers)


def _messages(broker: str, queue: str) -> list[list[tuple[UUID, UUID]]]:
    """The deliveries the publisher sent, as ``[(job id, message id), ...]`` per message."""
    r = redis.Redis.from_url(broker)
    out = []
    for raw in reversed(r.lrange(queue, 0, -1)):  # LPUSH: oldest last
        msg = json.loads(raw)
        args, _, _ = json.loads(base64.b64decode(msg["body"]))
        if msg["headers"]["task"] == EXPORT_TASK:
            out.append([(UUID(args[0]), UUID(msg["headers"]["id"]))])
        else:
            out.append([(UUID(j), UUID(m)) for j, m in zip(args[0], args[1], strict=True)])
    r.delete(queue)
    return out


@contextlib.contextmanager
def _stage(
    env: BenchEnv, settings: Settings, n: int, out: dict[str, Any], name: str, connections: int = 2
) -> Iterator[Any]:
    """Measure the block, which gets a fresh connection pool: CPU ms per job of this process
    and of PostgreSQL, and commits per job (read once the pool's backends have exited, since
    a backend reports its counters at exit)."""
    db = settings.database_dsn
    commits0 = xact_commits(db)
    pool = make_pool(
        settings, f"bench-costs-{name}", min_size=1, max_size=connections, open_wait=True
    )
    meter = CpuMeter({"postgres": postgres_pids(env.pg_dir)})
    meter.start()
    t0 = time.perf_counter()
    try:
        yield pool
        wall = time.perf_counter() - t0
        cpu = meter.stop()
    finally:
        pool.close()
    time.sleep(0.3)
    out[name] = {
        "client_cpu_ms_per_job": round(1000 * cpu["producer (harness)"] / n, 3),
        "postgres_cpu_ms_per_job": round(1000 * cpu["postgres"] / n, 3),
        "commits_per_job": round((xact_commits(db) - commits0 - 1) / n, 3),
        "wall_ms_per_job": round(1000 * wall / n, 3),
    }


def measure(env: BenchEnv, cfg: Config, run_dir: Path, variant: str) -> dict[str, Any]:
    opts = dict(VARIANTS[variant])
    sql, store_kind = opts.pop("_sql", None), opts.pop("_store", None)
    db = env.fresh_database(f"costs_{variant}")
    broker = env.broker_url(3)
    redis.Redis.from_url(broker).flushdb()
    # The publish stage runs alone here: one message ahead per claim's worth of the backlog
    # (a saturated system's publisher sends one each time a claim reports), and the claims
    # mark what they deliver (the publisher's own mark never comes within the stage).
    claim_jobs = int(opts.get("worker_claim_jobs", Settings().worker_claim_jobs))
    settings: Settings = ours_settings(
        db,
        broker,
        artifact_dir=run_dir / variant / "artifacts",
        **{
            "publisher_messages_ahead": -(-max(2 * cfg.costs_jobs, 10) // claim_jobs),
            **opts,
        },
    )
    out: dict[str, Any] = {"variant": variant}
    if sql:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute(sql)
    n = cfg.costs_jobs
    try:
        assert env.seed is not None
        request = ExportRequest.build(ExportFormat.JSON, env.seed.five_note_ids, False)
        store: FileArtifactStore = (
            _SequentialStore(settings.artifact_dir)
            if store_kind == "sequential"
            else FileArtifactStore(settings.artifact_dir)
        )
        with _stage(env, settings, 10, {}, "warm-up") as pool:  # caches, plans
            for _ in range(10):
                submit_export(pool, settings, tenant_id=TENANT, request=request)
            _drain(settings, pool, store)
        with _stage(env, settings, n, out, "submit") as pool:
            for _ in range(n):
                submit_export(pool, settings, tenant_id=TENANT, request=request)
        with _stage(env, settings, n, out, "submit_concurrent", COALESCE_THREADS) as pool:
            _submit_concurrently(pool, settings, request, n)
        with _stage(env, settings, 2 * n, out, "publish") as pool:
            publisher = _publisher(settings, pool)
            while publisher.run_once()["claimed"]:
                pass
        messages = _messages(broker, "exports.fast")
        sizes: dict[int, int] = {}
        for m in messages:
            sizes[len(m)] = sizes.get(len(m), 0) + 1
        out["batch_sizes"] = dict(sorted(sizes.items()))
        with _stage(env, settings, 2 * n, out, "work") as pool:
            runner = JobRunner(settings, pool, store)
            results = [o.result for m in messages for o in _deliver(runner, m)]
        out["succeeded"] = results.count("succeeded")
        total: dict[str, float] = {}
        for stage in ("submit", "publish", "work"):
            for k, v in out[stage].items():
                total[k] = round(total.get(k, 0.0) + v, 3)
        out["total"] = total
    finally:
        env.discard(db)
    return out


def _submit_concurrently(pool: Any, settings: Settings, request: ExportRequest, n: int) -> None:
    """``n`` submits from :data:`COALESCE_THREADS` threads at once, through one submit
    coalescer as an api process has (none with ``API_SUBMIT_BATCH=1``)."""
    coalescer = SubmitCoalescer(pool, settings) if settings.api_submit_batch > 1 else None

    def send(k: int) -> None:
        for _ in range(k):
            submit_export(pool, settings, tenant_id=TENANT, request=request, coalescer=coalescer)

    share = [n // COALESCE_THREADS + (i < n % COALESCE_THREADS) for i in range(COALESCE_THREADS)]
    threads = [threading.Thread(target=send, args=(k,)) for k in share]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _publisher(settings: Settings, pool: Any) -> Publisher:
    """The stages' publisher: its own mark never comes within a stage (5 s), the claims
    mark what they deliver."""
    config = replace(PublisherConfig.from_settings(settings), mark_delay=5.0)
    return Publisher(settings, pool, make_celery(settings), config=config)


def _drain(settings: Settings, pool: Any, store: ArtifactStore) -> None:
    """Publish and run everything pending (the warm-up's jobs)."""
    publisher = _publisher(settings, pool)
    while publisher.run_once()["claimed"]:
        pass
    runner = JobRunner(settings, pool, store)
    for m in _messages(settings.broker_url, "exports.fast"):
        _deliver(runner, m)


def _deliver(runner: JobRunner, message: list[tuple[UUID, UUID]]) -> list[Any]:
    """What a fast worker child does with one message: its claim takes the backlog."""
    return runner.run_batch(message, queue=FAST_QUEUE, carrier=message[0][1])


def run_costs(
    env: BenchEnv, cfg: Config, run_root: Path, log: Callable[[str], None]
) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": [], "errors": []}
    names = list(VARIANTS)
    for i in range(cfg.runs):
        run: dict[str, Any] = {"run": i}
        for variant in names[i % len(names) :] + names[: i % len(names)]:
            try:
                res = measure(env, cfg, run_root / f"costs-{i}", variant)
            except Exception as exc:
                out["errors"].append(f"{variant}: {type(exc).__name__}: {exc}")
                log(f"  costs {variant}: ERROR {exc}")
                continue
            run[variant] = res
            t = res["total"]
            log(
                f"  costs {variant}: client {t['client_cpu_ms_per_job']:.2f} + PostgreSQL "
                f"{t['postgres_cpu_ms_per_job']:.2f} CPU-ms/job, {t['commits_per_job']:.2f} "
                f"commits/job, batches {res['batch_sizes']}"
            )
        out["runs"].append(run)
    return out
