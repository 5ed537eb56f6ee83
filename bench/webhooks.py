"""Webhooks: delivery latency at a fixed export rate, the backlog drain after a receiver
outage, and the cost of the outbox trigger per job.

The stack runs publisher, recovery-scanner, fast-worker and webhook-delivery (default
settings, local http receivers allowed); one endpoint of the bench tenant points at a real
receiver in its own process (``python -m devtools.webhook_receiver``), which verifies every
signature and logs the arrival time and the requests it holds at once.

1. **latency**: library submits at ``webhook_rate`` exports/s for ``webhook_seconds``;
   per export, the terminal commit (the job's ``finished_at``, set by the finishing
   statement, which is its own transaction) to the receiver having read the request
   (same machine clock): p50 / p99;
2. **backlog**: the same rate continues, the receiver is stopped (connection refused) for
   ``webhook_down_seconds`` and started again; drain time = receiver back → every message
   written before that moment delivered; the most requests the receiver saw in flight at
   once, against ``WEBHOOK_ENDPOINT_CONCURRENCY``;
3. **trigger cost**: terminal UPDATEs of jobs one at a time, trigger on vs off (interleaved
   blocks), for a tenant without endpoints and one with an endpoint: microseconds per job.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from bench.common import Config, latency_summary
from bench.e2e import build_stack, ours_settings
from bench.env import TENANT, BenchEnv
from bench.feeder import SteadySubmits
from devtools.stack import ROOT, free_port
from devtools.waiting import became_true
from exportcore.db import make_pool
from exportcore.domain import ExportFormat, ExportRequest
from exportcore.submit import submit_export
from exportcore.webhooks import endpoints

WEBHOOK_ENV = {"WEBHOOK_ALLOW_HTTP": "true", "WEBHOOK_ALLOW_PRIVATE_NETWORKS": "true"}


class ReceiverProcess:
    """The receiver in its own process, logging JSON lines to ``log``."""

    def __init__(self, port: int, secret: str, log: Path) -> None:
        self.port, self.secret, self.log = port, secret, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "devtools.webhook_receiver",
                "--port",
                str(self.port),
                "--secret",
                self.secret,
                "--log",
                str(self.log),
            ],
            env=env,
            cwd=ROOT,
            stderr=subprocess.DEVNULL,
        )
        import socket

        def listening() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", self.port)) == 0

        if not became_true(listening, 10, 0.05):
            raise RuntimeError("the receiver did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None

    def lines(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        out = []
        for line in self.log.read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out


def _latencies(db: str, arrivals: dict[str, float], since: Any, until: Any) -> list[float]:
    with psycopg.connect(db, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT 'msg_' || replace(m.id::text, '-', ''), extract(epoch FROM j.finished_at)"
            " FROM webhook_messages m JOIN export_jobs j ON j.id = m.subject_id"
            " WHERE m.created_at >= %s AND m.created_at < %s",
            (since, until),
        ).fetchall()
    return [arrivals[w] - float(f) for w, f in rows if w in arrivals]


def _scalar(db: str, sql: str, *params: Any) -> Any:
    with psycopg.connect(db, autocommit=True) as conn:
        row = conn.execute(sql, params).fetchone()
    return None if row is None else row[0]


def trigger_cost(db: str, jobs: int, repeats: int = 4) -> dict[str, Any]:
    """Server-side cost of the outbox trigger per terminal update, in microseconds: blocks
    of ``jobs`` rows made terminal by one UPDATE, timed with the server's clock inside the
    transaction (no commit, no network), trigger on and off alternately, ``repeats`` each;
    for a tenant without endpoints and one with an endpoint (which writes a message)."""
    out: dict[str, Any] = {"jobs_per_block": jobs, "blocks_per_variant": repeats}
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO tenants (id, name) VALUES ('bench-noep', 'x'), ('bench-ep', 'x')"
            " ON CONFLICT DO NOTHING"
        )
        conn.execute(
            "INSERT INTO webhook_endpoints (id, tenant_id, url, events, secret) VALUES"
            " (gen_random_uuid(), 'bench-ep', 'http://127.0.0.1:9/', ARRAY['export.cancelled'],"
            "  'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw')"
        )
        for tenant, key in (("bench-noep", "no_endpoint"), ("bench-ep", "one_endpoint")):
            timings: dict[str, list[float]] = {"on": [], "off": []}
            for k in range(2 * repeats):
                variant = "on" if k % 2 == 0 else "off"
                with conn.transaction():
                    ids = [
                        r[0]
                        for r in conn.execute(
                            "INSERT INTO export_jobs (id, tenant_id, queue, format, payload,"
                            " note_count, request_hash, max_attempts, deadline_at)"
                            " SELECT gen_random_uuid(), %s, 'exports.fast', 'json', '{}', 1, 'h',"
                            " 3, now() + interval '1 day' FROM generate_series(1, %s)"
                            " RETURNING id",
                            (tenant, jobs),
                        ).fetchall()
                    ]
                    if variant == "off":
                        conn.execute(
                            "ALTER TABLE export_jobs DISABLE TRIGGER export_jobs_webhook_terminal"
                        )
                    row = conn.execute(
                        "WITH t0 AS MATERIALIZED (SELECT clock_timestamp() AS at),"
                        " u AS (UPDATE export_jobs SET status = 'cancelled',"
                        "   cancel_requested = true, finished_at = now(), updated_at = now()"
                        "   WHERE id = ANY(%s) AND (SELECT at FROM t0) IS NOT NULL RETURNING id)"
                        " SELECT count(*), (SELECT at FROM t0) FROM u",
                        (ids,),
                    ).fetchone()
                    assert row is not None and row[0] == jobs
                    end = conn.execute("SELECT clock_timestamp()").fetchone()
                    assert end is not None
                    timings[variant].append((end[0] - row[1]).total_seconds() / jobs)
                    if variant == "off":
                        conn.execute(
                            "ALTER TABLE export_jobs ENABLE TRIGGER export_jobs_webhook_terminal"
                        )
            on = statistics.median(timings["on"])
            off = statistics.median(timings["off"])
            out[key] = {
                "update_us_per_job_trigger_on": round(on * 1e6, 2),
                "update_us_per_job_trigger_off": round(off * 1e6, 2),
                "trigger_us_per_job": round((on - off) * 1e6, 2),
            }
        conn.execute("DELETE FROM webhook_messages WHERE tenant_id = 'bench-ep'")
    return out


def run_webhooks(
    env: BenchEnv, cfg: Config, run_root: Path, log: Callable[[str], None]
) -> dict[str, Any]:
    out: dict[str, Any] = {"settings": WEBHOOK_ENV, "runs": [], "errors": []}
    for i in range(cfg.runs):
        run_dir = run_root / f"webhooks-{i}"
        run_dir.mkdir(parents=True, exist_ok=True)
        try:
            res = _one_run(env, cfg, run_dir)
        except Exception as exc:
            out["errors"].append(f"run {i}: {type(exc).__name__}: {exc}")
            log(f"  webhooks: ERROR {exc}")
            continue
        res["run"] = i
        out["runs"].append(res)
        log(
            f"  webhooks: p50 {res['latency']['p50_ms']} ms, p99 {res['latency']['p99_ms']} ms "
            f"at {cfg.webhook_rate:g}/s; backlog {res['backlog_at_return']} drained in "
            f"{res['drain_seconds']} s (max {res['max_concurrent_at_receiver']} in flight, "
            f"bound {res['endpoint_concurrency_bound']}); trigger "
            f"{res['trigger_cost']['no_endpoint']['trigger_us_per_job']} us/job without "
            "endpoints"
        )
    return out


def _one_run(env: BenchEnv, cfg: Config, run_dir: Path) -> dict[str, Any]:
    assert env.seed is not None
    db = env.fresh_database("webhooks")
    broker = env.broker_url(6)
    stack = build_stack(
        env,
        db,
        broker,
        run_dir,
        ("publisher", "recovery-scanner", "fast-worker", "webhook-delivery"),
        {**WEBHOOK_ENV, "FAST_WORKER_CONCURRENCY": str(cfg.worker_processes)},
    )
    settings = ours_settings(
        db,
        broker,
        # the stack's key: this process encrypts the endpoint's secret, the stack decrypts it
        webhook_secret_keys=stack.env["WEBHOOK_SECRET_KEYS"],
        **{k.lower(): v for k, v in WEBHOOK_ENV.items()},
    )
    cleanup = contextlib.ExitStack()  # closed last to first: feeders, receiver, pool, stack, db
    cleanup.callback(env.discard, db)
    cleanup.callback(stack.stop)

    def now() -> Any:
        return _scalar(db, "SELECT clock_timestamp()")

    def pending() -> int:
        return int(_scalar(db, "SELECT count(*) FROM webhook_messages WHERE status = 'pending'"))

    try:
        pool = make_pool(settings, "bench-webhooks", min_size=1, max_size=2)
        cleanup.callback(pool.close)
        port = free_port()
        ep = endpoints.create_endpoint(
            pool, settings, tenant_id=TENANT, url=f"http://127.0.0.1:{port}/hook"
        )
        receiver = ReceiverProcess(port, ep["secret"], run_dir / "receiver.jsonl")
        cleanup.callback(receiver.stop)
        receiver.start()
        stack.start()
        request = ExportRequest.build(ExportFormat.JSON, env.seed.five_note_ids, False)
        # warm up: a few exports through every process
        for _ in range(20):
            submit_export(pool, settings, tenant_id=TENANT, request=request)
        if not became_true(lambda: len(receiver.lines()) >= 20, 60):
            raise RuntimeError("no webhook reached the receiver during the warm-up")
        # 1. latency at a fixed rate
        t0 = now()
        feeder = cleanup.enter_context(SteadySubmits(pool, settings, request, cfg.webhook_rate))
        time.sleep(cfg.webhook_seconds)
        feeder.stop()
        t1 = now()
        if not became_true(lambda: pending() == 0, 60, 0.1):
            raise RuntimeError("the fixed-rate messages were not all delivered within 60 s")
        arrivals: dict[str, float] = {}
        for line in receiver.lines():
            arrivals.setdefault(line["webhook_id"], line["at"])
        lat = _latencies(db, arrivals, t0, t1)
        # 2. the receiver goes down while the rate continues, and comes back
        feeder = cleanup.enter_context(SteadySubmits(pool, settings, request, cfg.webhook_rate))
        time.sleep(1.0)
        receiver.stop()
        time.sleep(cfg.webhook_down_seconds)
        backlog_at_return = pending()
        t_back_db = now()
        receiver.start()
        t_back = time.time()

        def drained() -> bool:
            n = _scalar(
                db,
                "SELECT count(*) FROM webhook_messages WHERE status <> 'delivered'"
                " AND created_at < %s",
                t_back_db,
            )
            return int(n) == 0

        ok = became_true(drained, max(120.0, 6 * cfg.webhook_down_seconds), 0.1)
        drain_seconds = time.time() - t_back if ok else None
        feeder.stop()
        became_true(lambda: pending() == 0, 120, 0.2)
        lines = receiver.lines()
        after_return = [x for x in lines if x["at"] >= t_back]
        res: dict[str, Any] = {
            "rate": cfg.webhook_rate,
            "latency": latency_summary(lat),
            "down_seconds": cfg.webhook_down_seconds,
            "backlog_at_return": backlog_at_return,
            "drain_seconds": None if drain_seconds is None else round(drain_seconds, 2),
            "max_concurrent_at_receiver": max((x["concurrent"] for x in lines), default=0),
            "endpoint_concurrency_bound": settings.webhook_endpoint_concurrency,
            "drain_rate_per_s": (
                round(len(after_return) / drain_seconds, 1) if drain_seconds else None
            ),
            "requests": len(lines),
            "verified": sum(1 for line in lines if line["verified"]),
            "messages_delivered": int(
                _scalar(db, "SELECT count(*) FROM webhook_messages WHERE status = 'delivered'")
            ),
            "duplicates": len(lines) - len({x["webhook_id"] for x in lines}),
        }
        stack.stop()
        res["trigger_cost"] = trigger_cost(db, cfg.webhook_trigger_jobs)
        res["exports_per_s_during_outage"] = round(
            int(
                _scalar(
                    db,
                    "SELECT count(*) FROM webhook_messages WHERE created_at >= %s"
                    " AND created_at < %s",
                    t1,
                    t_back_db,
                )
            )
            / max(1.0, (t_back_db - t1).total_seconds()),
            1,
        )
        return res
    finally:
        cleanup.close()
