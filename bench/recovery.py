"""Recovery: under steady load, kill a worker that holds N leases and time until all N jobs
have succeeded, against the lease + scan + backoff budget of the settings used.

The stack runs publisher, recovery-scanner and one fast-worker with N prefork children
(``recovery_leases``, at least 2). Library submits arrive at ``recovery_rate`` jobs/s
throughout. To make the worker hold N leases at a known moment, the ``render.chunk``
failpoint (exportcore.faults) stalls the next N renders for several lease lengths; once N
jobs are running, the worker's whole process group (main process and children, as when a
pod is killed) gets SIGKILL at time T, and the worker is started again at once (as
Kubernetes restarts a pod). Reported: seconds from T to the last of the N jobs
``succeeded`` (database clock), per job the time to ``lease_expired`` and to the new
claim, and the budget lease + scanner interval x 1.2 (its jitter) + retry cap. Quick mode
shortens the lease, the scan interval and the backoff so that a run takes seconds.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from bench.common import Config
from bench.e2e import build_stack, ours_settings
from bench.env import BenchEnv
from bench.feeder import SteadySubmits
from devtools.waiting import became_true
from exportcore import faults
from exportcore.db import make_pool
from exportcore.domain import ExportFormat, ExportRequest


def run_recovery(
    env: BenchEnv, cfg: Config, run_root: Path, log: Callable[[str], None]
) -> dict[str, Any]:
    assert env.seed is not None
    lease = cfg.recovery_lease_seconds
    scan = cfg.recovery_scanner_seconds
    cap = cfg.recovery_retry_cap_seconds
    n = max(1, cfg.recovery_leases)
    product = {
        "LEASE_SECONDS": str(lease),
        "SCANNER_INTERVAL_SECONDS": str(scan),
        "RETRY_CAP_SECONDS": str(cap),
        "RETRY_BASE_SECONDS": str(min(2.0, cap)),
        "FAST_WORKER_CONCURRENCY": str(max(2, n)),
    }
    budget = lease + 1.2 * scan + cap
    out: dict[str, Any] = {"settings": product, "budget_seconds": budget, "runs": [], "errors": []}
    for i in range(cfg.runs):
        run_dir = run_root / f"recovery-{i}"
        run_dir.mkdir(parents=True, exist_ok=True)
        fault_file = run_dir / "faults.json"
        fault_file.write_text("{}")
        db = env.fresh_database("recovery")
        broker = env.broker_url(5)
        stack = build_stack(
            env,
            db,
            broker,
            run_dir,
            ("publisher", "recovery-scanner", "fast-worker"),
            {**product, "EXPORTS_FAULTS_FILE": str(fault_file)},
        )
        settings = ours_settings(db, broker)
        cleanup = contextlib.ExitStack()  # closed last to first: feeder, pool, stack, db
        cleanup.callback(env.discard, db)
        cleanup.callback(stack.stop)
        try:
            stack.start()
            pool = make_pool(settings, "bench-recovery", min_size=1, max_size=1)
            cleanup.callback(pool.close)
            request = ExportRequest.build(ExportFormat.JSON, env.seed.five_note_ids, False)
            cleanup.enter_context(SteadySubmits(pool, settings, request, cfg.recovery_rate))

            def count(sql: str, db: str = db) -> int:
                with psycopg.connect(db, autocommit=True) as conn:
                    row = conn.execute(sql).fetchone()
                    return int(row[0]) if row else 0

            if not became_true(
                lambda: count("SELECT count(*) FROM export_jobs WHERE status = 'succeeded'") >= 20,
                60,
            ):
                raise RuntimeError("the stack did not start finishing jobs")
            faults.arm(fault_file, "render.chunk", f"sleep:{lease * 4}", times=n)

            def stalled(f: Path = fault_file) -> bool:
                return (
                    faults.remaining(f, "render.chunk") == 0
                    and count("SELECT count(*) FROM export_jobs WHERE status = 'running'") >= n
                )

            if not became_true(stalled, 60):
                raise RuntimeError("the worker never held the stalled leases")
            worker = stack.procs["fast-worker"]
            worker.signal(signal.SIGKILL, group=True)
            with psycopg.connect(db, autocommit=True) as conn:
                now = conn.execute("SELECT clock_timestamp()").fetchone()
                assert now is not None
                t_kill = now[0]
                held = [
                    r[0]
                    for r in conn.execute(
                        "SELECT id FROM export_jobs WHERE status = 'running'"
                    ).fetchall()
                ]
            worker.wait(5)
            stack.restart("fast-worker")
            log(f"  recovery: killed the worker holding {len(held)} leases; restarted it")

            def all_done(db: str = db, held: list[Any] = held) -> bool:
                with psycopg.connect(db, autocommit=True) as conn:
                    row = conn.execute(
                        "SELECT count(*) FROM export_jobs WHERE id = ANY(%s) "
                        "AND status IN ('succeeded', 'failed', 'cancelled')",
                        (held,),
                    ).fetchone()
                return bool(row and row[0] == len(held))

            ok = became_true(all_done, timeout=max(120.0, 4 * budget), interval=0.2)
            with psycopg.connect(db, autocommit=True) as conn:
                rows = conn.execute(
                    """
                    SELECT j.id, j.status, j.attempts,
                      extract(epoch FROM (SELECT min(at) FROM export_job_events e
                          WHERE e.job_id = j.id AND e.kind = 'lease_expired') - %(t)s),
                      extract(epoch FROM (SELECT max(at) FROM export_job_events e
                          WHERE e.job_id = j.id AND e.kind = 'claimed') - %(t)s),
                      extract(epoch FROM (SELECT max(at) FROM export_job_events e
                          WHERE e.job_id = j.id AND e.kind = 'succeeded') - %(t)s)
                    FROM export_jobs j WHERE j.id = ANY(%(ids)s)
                    """,
                    {"t": t_kill, "ids": held},
                ).fetchall()
            jobs = [
                {
                    "status": r[1],
                    "attempts": r[2],
                    "lease_expired_after_s": _f(r[3]),
                    "claimed_again_after_s": _f(r[4]),
                    "succeeded_after_s": _f(r[5]),
                }
                for r in rows
            ]
            done = [j["succeeded_after_s"] for j in jobs if j["succeeded_after_s"] is not None]
            seconds: float | None = max(done) if ok and done else None
            res: dict[str, Any] = {
                "run": i,
                "leases": len(held),
                "all_succeeded": ok and all(j["status"] == "succeeded" for j in jobs),
                "seconds_to_all_succeeded": seconds,
                "budget_seconds": budget,
                "jobs": jobs,
                "within_budget": seconds is not None and seconds <= budget,
            }
            out["runs"].append(res)
            log(
                f"  recovery: {len(held)} leases → all succeeded after "
                f"{res['seconds_to_all_succeeded']} s (budget {budget:.1f} s)"
            )
        except Exception as exc:
            out["errors"].append(f"run {i}: {type(exc).__name__}: {exc}")
            log(f"  recovery: ERROR {exc}")
        finally:
            cleanup.close()
    return out


def _f(v: Any) -> float | None:
    return None if v is None else round(float(v), 3)
