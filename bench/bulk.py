"""Bulk: one export of ``bulk_notes`` notes per format through the real bulk-worker.

The notes are the real notes imported into the template (``/usr/share/doc``), those of at
most ``bulk_note_max_bytes`` (notes, not manuals), repeated in id order up to the count,
so that their lengths follow the real distribution (the JSON records mean and median).
Each format gets a fresh bulk-worker (publisher + ``bulk-worker``, one prefork child), so
the peak RSS (``VmHWM`` of the child that ran the job, read from /proc before the worker
stops) belongs to that export alone. Rendering speed = notes / (claimed → succeeded, from
``export_job_events``). The submit (validation + snapshot copy of every note in one
transaction) is timed separately.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from bench.common import Config, vm_hwm_kb
from bench.e2e import build_stack, ours_settings
from bench.env import TENANT, BenchEnv
from devtools.waiting import became_true
from exportcore.db import make_pool
from exportcore.domain import ExportFormat, ExportRequest
from exportcore.store import tenants as tenant_store
from exportcore.submit import submit_export

BULK_TENANT = "bulk"

FILL = """
WITH src AS (
    SELECT row_number() OVER (ORDER BY id) AS rn, title, content, pinned
    FROM notes WHERE tenant_id = %(src)s AND octet_length(content) <= %(max_bytes)s
), cnt AS (SELECT count(*) AS c FROM src)
INSERT INTO notes (tenant_id, source_path, title, content, pinned, updated_at)
SELECT %(tenant)s, 'bench/' || g, s.title, s.content, s.pinned,
       now() - g * interval '1 second'
FROM generate_series(1, %(n)s) AS g
CROSS JOIN cnt
JOIN src s ON s.rn = 1 + (g %% cnt.c)
"""


def fill_notes(db: str, n: int, max_bytes: int) -> dict[str, Any]:
    t = time.monotonic()
    with psycopg.connect(db, autocommit=True) as conn:
        with conn.transaction():
            tenant_store.tenant_upsert(conn, tenant_id=BULK_TENANT, name="Bulk")  # type: ignore[arg-type]
            conn.execute(
                FILL, {"src": TENANT, "tenant": BULK_TENANT, "n": n, "max_bytes": max_bytes}
            )
        conn.execute("VACUUM ANALYZE notes")
        row = conn.execute(
            "SELECT count(*), avg(octet_length(content))::int, "
            "percentile_cont(0.5) WITHIN GROUP (ORDER BY octet_length(content))::int, "
            "max(octet_length(content)), sum(octet_length(content) + octet_length(title)) "
            "FROM notes WHERE tenant_id = %s",
            (BULK_TENANT,),
        ).fetchone()
    assert row is not None
    return {
        "notes": row[0],
        "mean_bytes": row[1],
        "median_bytes": row[2],
        "max_bytes": row[3],
        "total_mb": round(row[4] / 2**20, 1),
        "fill_seconds": round(time.monotonic() - t, 1),
    }


def _events(db: str, job_id: Any) -> dict[str, Any]:
    with psycopg.connect(db, autocommit=True) as conn:
        row = conn.execute(
            """
            SELECT j.status, j.result_bytes, j.error_code,
                   extract(epoch FROM (SELECT max(at) FROM export_job_events
                                       WHERE job_id = j.id AND kind = 'succeeded')
                                    - (SELECT max(at) FROM export_job_events
                                       WHERE job_id = j.id AND kind = 'claimed'))
            FROM export_jobs j WHERE j.id = %s
            """,
            (job_id,),
        ).fetchone()
    assert row is not None
    return {"status": row[0], "bytes": row[1], "error_code": row[2], "render_seconds": row[3]}


def run_bulk(
    env: BenchEnv, cfg: Config, run_root: Path, log: Callable[[str], None]
) -> dict[str, Any]:
    db = env.fresh_database("bulk")
    out: dict[str, Any] = {"formats": {}, "errors": []}
    try:
        out["notes"] = fill_notes(db, cfg.bulk_notes, cfg.bulk_note_max_bytes)
        log(f"  bulk: {out['notes']}")
        broker = env.broker_url(4)
        for i in range(cfg.runs):
            for fmt in ExportFormat:
                out["formats"].setdefault(fmt.value, []).append(
                    _one(env, cfg, db, broker, fmt, run_root / f"bulk-{i}-{fmt.value}", log)
                )
    finally:
        env.discard(db)
    from bench.incremental import run_delta  # its own account (bench.incremental)

    out["delta"] = run_delta(env, cfg, run_root, log)
    return out


def _one(
    env: BenchEnv,
    cfg: Config,
    db: str,
    broker: str,
    fmt: ExportFormat,
    run_dir: Path,
    log: Callable[[str], None],
) -> dict[str, Any]:
    res: dict[str, Any] = {}
    stack = build_stack(
        env, db, broker, run_dir, ("publisher", "bulk-worker"), {"BULK_WORKER_CONCURRENCY": "1"}
    )
    settings = ours_settings(db, broker)
    try:
        stack.start()
        pool = make_pool(settings, "bench-bulk", min_size=1, max_size=1)
        request = ExportRequest.build(fmt, None, True)
        t = time.monotonic()
        try:
            job = submit_export(pool, settings, tenant_id=BULK_TENANT, request=request).job
        except psycopg.errors.QueryCanceled:
            res["submit_error"] = (
                f"submit exceeded DB_STATEMENT_TIMEOUT_MS={settings.db_statement_timeout_ms}; "
                "retried with the timeout off"
            )
            pool.close()
            settings = ours_settings(db, broker, db_statement_timeout_ms=0)
            pool = make_pool(settings, "bench-bulk", min_size=1, max_size=1)
            t = time.monotonic()
            job = submit_export(pool, settings, tenant_id=BULK_TENANT, request=request).job
        res["submit_seconds"] = time.monotonic() - t
        pool.close()
        worker = stack.procs["bulk-worker"]
        peak: dict[int, int] = {}

        def finished() -> bool:
            for pid in [worker.pid, *worker.children()]:
                hwm = vm_hwm_kb(pid)
                if hwm:
                    peak[pid] = max(peak.get(pid, 0), hwm)
            return _events(db, job["id"])["status"] in ("succeeded", "failed", "cancelled")

        became_true(finished, timeout=1800, interval=0.5)
        ev = _events(db, job["id"])
        children = [p for p in peak if p != worker.pid]
        res.update(ev)
        res["notes"] = job["note_count"]
        res["peak_rss_mb"] = round(max((peak[p] for p in children), default=0) / 1024, 1)
        res["main_process_peak_rss_mb"] = round(peak.get(worker.pid, 0) / 1024, 1)
        if ev["status"] == "succeeded" and ev["render_seconds"]:
            res["notes_per_s"] = job["note_count"] / float(ev["render_seconds"])
            res["render_seconds"] = float(ev["render_seconds"])
        else:
            res["error"] = f"job {ev['status']} ({ev['error_code']})"
        log(
            f"  bulk {fmt.value}: {res.get('notes_per_s', 0):.0f} notes/s, peak RSS "
            f"{res['peak_rss_mb']} MB, submit {res['submit_seconds']:.1f} s, "
            f"{(ev['bytes'] or 0) / 2**20:.0f} MB"
        )
    except Exception as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
        log(f"  bulk {fmt.value}: ERROR {res['error']}")
    finally:
        stack.stop()
    return res
