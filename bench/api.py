"""API accept: POST /v1/exports (the fixed 5-note selection, json) against the api process
alone (gunicorn with its default worker count, services/api/gunicorn_conf.py).

- highest sustained rate: closed loop at each of ``api_connections`` connections for
  ``api_seconds``; the best rate with no non-2xx answer and no socket error wins, with its
  p50 / p99. Tool: ``wrk`` (C, negligible CPU next to the server) when installed, else the
  harness's asyncio client.
- p99 at a fixed ``api_fixed_rate`` req/s: the open-loop asyncio generator
  (:func:`bench.loadgen.open_loop`; latency from the scheduled send time). ``wrk`` is closed
  loop and cannot hold a fixed arrival rate.

No publisher or worker runs, so accepted jobs pile up as ``queued``: the tables are emptied
(TRUNCATE) before each measurement so that every one starts from the same backlog (0), and
quota and capacity are raised so that nothing is refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from bench import loadgen
from bench.common import Config, CpuMeter, latency_summary, postgres_pids
from bench.e2e import build_stack
from bench.env import BenchEnv
from devtools.api_client import bearer


def _truncate(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(
            "TRUNCATE export_jobs, export_job_items, export_outbox, export_job_events, "
            "export_dead_letters, export_idempotency_keys CASCADE"
        )


def run_api(
    env: BenchEnv, cfg: Config, run_root: Path, log: Callable[[str], None]
) -> dict[str, Any]:
    assert env.seed is not None
    body = {"note_ids": env.seed.five_note_ids, "format": "json"}
    headers = bearer(env.seed.api_key)
    tool = "wrk" if loadgen.have_wrk() else "asyncio client (wrk not installed)"
    out: dict[str, Any] = {
        "tool_max": tool,
        "tool_fixed": "asyncio open-loop client",
        "body": body,
        "runs": [],
        "errors": [],
    }
    for i in range(cfg.runs):
        run_dir = run_root / f"api-{i}"
        db = env.fresh_database("api")
        stack = build_stack(env, db, env.broker_url(1), run_dir, ("api",))
        try:
            stack.start()
            url = stack.api_url + "/v1/exports"
            workers = len(stack.procs["api"].children())
            # warm-up: every gunicorn worker opens its pool and imports lazily
            loadgen.closed_loop(url, body, headers, 8, 200)
            sweep = []
            for conns in cfg.api_connections:
                _truncate(db)
                meter = CpuMeter(
                    {"api": [stack.procs["api"].pid], "postgres": postgres_pids(env.pg_dir)}
                )
                meter.start()
                if tool == "wrk":
                    r = loadgen.wrk(url, body, headers, conns, cfg.api_seconds)
                    r.pop("raw", None)
                else:
                    res = loadgen.closed_loop(url, body, headers, conns, int(400 * cfg.api_seconds))
                    lat = latency_summary(res.latencies)
                    r = {
                        "connections": conns,
                        "rate": res.rate,
                        "p50_ms": lat["p50_ms"],
                        "p99_ms": lat["p99_ms"],
                        "non_2xx": res.sent - res.ok - res.errors,
                        "socket_errors": res.errors,
                        "requests": res.sent,
                    }
                r["cpu_seconds"] = meter.stop()
                sweep.append(r)
                log(f"  api: {conns} connections → {r['rate']:.0f} req/s p99 {r['p99_ms']:.1f} ms")
            clean = [r for r in sweep if not r["non_2xx"] and not r["socket_errors"] and r["rate"]]
            best = max(clean, key=lambda r: r["rate"]) if clean else None
            _truncate(db)
            time.sleep(0.5)
            res = loadgen.open_loop(url, body, headers, cfg.api_fixed_rate, cfg.api_fixed_seconds)
            fixed = {
                "target_per_s": cfg.api_fixed_rate,
                "achieved_per_s": res.sent / res.send_elapsed if res.send_elapsed else None,
                "seconds_to_last_answer": res.elapsed,
                "statuses": res.statuses,
                "errors": res.errors,
                "reconnects": res.reconnects,
                **latency_summary(res.latencies),
            }
            log(f"  api: fixed {cfg.api_fixed_rate:.0f} req/s p99 {fixed['p99_ms']} ms")
            out["runs"].append(
                {
                    "run": i,
                    "gunicorn_workers": workers,
                    "max": {"best": best, "sweep": sweep},
                    "fixed": fixed,
                }
            )
        except Exception as exc:
            out["errors"].append(f"run {i}: {type(exc).__name__}: {exc}")
            log(f"  api: ERROR {exc}")
        finally:
            stack.stop()
            env.discard(db)
    return out
