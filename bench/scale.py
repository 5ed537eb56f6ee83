"""Scale: submit, claim (and finish) latency and the recovery-scanner's pass time with
``scale_jobs`` finished jobs in the tables, and with ``scale_active_jobs`` (10,000) active
(queued) jobs, against an empty database; rotated run by run. Admission costs the same with
10 or 10,000 active jobs (its counters, migration 0008): the ``active`` case shows it.

The finished jobs are generated with set-based SQL (``INSERT ... SELECT generate_series``),
one every 2 seconds back in time (1,000,000 jobs span 23 days: all inside the default 30-day
retention, so none is pruned while measuring), each with the history a real one has
(``submitted``, ``dispatched``, ``claimed``, ``succeeded``), five snapshot items, and a sent
outbox event for those of the last 24 hours (older ones are pruned in a real system). The
snapshot items carry 200-byte contents instead of real notes: 5,000,000 real notes would be
~10 GB, while the items' index (what the submit writes into) is the same either way.

Per database, after 10 unmeasured submits and claims: K serial library submits (5 notes)
timed one by one; then each of those jobs
claimed with the real ``job_claim`` transition and finished with ``job_finish_if_leased``,
each timed with its commit; the scanner's first pass (with hygiene: orphan files,
retention pruning) and the median of 5 passes of the rules alone.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from bench.common import Config, latency_summary
from bench.e2e import ours_settings
from bench.env import TENANT, BenchEnv
from exportcore.artifacts import open_store
from exportcore.db import make_pool
from exportcore.domain import ExportFormat, ExportRequest
from exportcore.recovery import RecoveryScanner
from exportcore.sql import q
from exportcore.store import jobs as job_store
from exportcore.submit import submit_export

SPACING_SECONDS = 2

FILL = [
    """
    CREATE TEMP TABLE bench_filler AS
    SELECT gen_random_uuid() AS id, gen_random_uuid() AS token,
           now() - make_interval(secs => g * {spacing}) - interval '1 minute' AS t, g
    FROM generate_series(1, {n}) AS g
    """,
    """
    INSERT INTO export_jobs (
        id, tenant_id, status, queue, format, payload, note_count, request_hash,
        attempts, max_attempts, dispatch_count, lease_token, next_attempt_at,
        last_dispatched_at, deadline_at, result_ref, result_sha256, result_bytes, result_rows,
        created_at, started_at, finished_at, updated_at)
    SELECT f.id, '{tenant}', 'succeeded', 'exports.fast', 'json',
           '{{"selection": {{"note_ids": [1, 2, 3, 4, 5]}}, "format": "json", "options": {{}}}}',
           5, md5(f.g::text), 1, 3, 1, f.token, f.t, f.t + interval '2 ms',
           f.t + interval '1 hour', '{tenant}/' || f.id || '/' || f.token || '.json',
           md5(f.id::text) || md5(f.token::text), 9000, 5,
           f.t, f.t + interval '3 ms', f.t + interval '20 ms', f.t + interval '20 ms'
    FROM bench_filler f
    """,
    """
    INSERT INTO export_job_events (job_id, at, kind, from_status, to_status, attempt,
                                   lease_token, message_id, detail)
    SELECT f.id, f.t + k.off, k.kind, k.fs, k.ts, k.att,
           CASE WHEN k.tok THEN f.token END,
           CASE WHEN k.msg THEN f.token END, k.detail::jsonb
    FROM bench_filler f
    CROSS JOIN (VALUES
        (1, interval '0 ms', 'submitted', NULL, 'queued', NULL::int, false, true,
         '{{"source": "api", "note_count": 5}}'),
        (2, interval '2 ms', 'dispatched', NULL, NULL, NULL, false, true,
         '{{"reason": "submit", "dispatch_count": 1}}'),
        (3, interval '3 ms', 'claimed', 'queued', 'running', 1, true, true, '{{}}'),
        (4, interval '20 ms', 'succeeded', 'running', 'succeeded', 1, true, false,
         '{{"bytes": 9000, "rows": 5}}')
    ) AS k (n, off, kind, fs, ts, att, tok, msg, detail)
    ORDER BY f.g DESC, k.n
    """,
    """
    INSERT INTO export_job_items (job_id, ordinal, note_id, version)
    SELECT f.id, o, o, 1
    FROM bench_filler f CROSS JOIN generate_series(1, 5) AS o
    """,
    """
    INSERT INTO export_outbox (id, job_id, tenant_id, queue, reason, available_at, sent_at,
                               publish_attempts, created_at)
    SELECT f.token, f.id, '{tenant}', 'exports.fast', 'submit', f.t, f.t + interval '2 ms',
           1, f.t
    FROM bench_filler f WHERE f.t > now() - interval '23 hours'
    """,
    "DROP TABLE bench_filler",
]


ACTIVE_FILL = [
    """
    WITH jobs AS (
        INSERT INTO export_jobs (
            id, tenant_id, status, queue, format, payload, note_count, request_hash,
            attempts, max_attempts, dispatch_count, next_attempt_at, last_dispatched_at,
            deadline_at, created_at, updated_at)
        SELECT gen_random_uuid(), '{tenant}', 'queued', 'exports.fast', 'json',
               '{{"selection": {{"note_ids": [1, 2, 3, 4, 5]}}, "format": "json"}}',
               5, md5(g::text), 0, 3, 1, now() + interval '1 day', now(),
               now() + interval '2 days', now() - make_interval(secs => g), now()
        FROM generate_series(1, {n}) AS g
        RETURNING id, created_at
    ), items AS (
        INSERT INTO export_job_items (job_id, ordinal, note_id, version)
        SELECT j.id, o, o, 1
        FROM jobs j CROSS JOIN generate_series(1, 5) AS o
    )
    INSERT INTO export_outbox (id, job_id, tenant_id, queue, reason, available_at, sent_at,
                               publish_attempts, created_at)
    SELECT gen_random_uuid(), j.id, '{tenant}', 'exports.fast', 'submit', j.created_at,
           j.created_at, 1, j.created_at
    FROM jobs j
    """,
]


def fill_active(db: str, n: int) -> dict[str, Any]:
    """``n`` queued jobs (active: they count against admission), not due for a day, then the
    admission counters reconciled with them (set-based SQL bypasses the admission path)."""
    t0 = time.monotonic()
    with psycopg.connect(db, autocommit=True) as conn:
        for sql in ACTIVE_FILL:
            conn.execute(sql.format(n=n, tenant=TENANT))
        conn.execute(q("admission", "admission_reconcile"))
        conn.execute("VACUUM ANALYZE")
        active = conn.execute(
            "SELECT count(*) FROM export_jobs WHERE status IN ('queued', 'running')"
        ).fetchone()
    return {"active_jobs": active[0] if active else 0, "seconds": round(time.monotonic() - t0, 1)}


def fill(db: str, n: int) -> dict[str, Any]:
    t0 = time.monotonic()
    steps = []
    with psycopg.connect(db, autocommit=True) as conn:
        for sql in FILL:
            t = time.monotonic()
            conn.execute(sql.format(n=n, spacing=SPACING_SECONDS, tenant=TENANT))
            steps.append(round(time.monotonic() - t, 1))
        t = time.monotonic()
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")
        steps.append(round(time.monotonic() - t, 1))
        sizes = conn.execute(
            "SELECT relname, reltuples::bigint, pg_size_pretty(pg_total_relation_size(oid)) "
            "FROM pg_class WHERE relkind = 'r' AND relname LIKE 'export_%' ORDER BY relname"
        ).fetchall()
    return {
        "jobs": n,
        "seconds": round(time.monotonic() - t0, 1),
        "step_seconds": steps,
        "tables": {r[0]: {"rows": r[1], "size": r[2]} for r in sizes},
    }


def measure(db: str, samples: int, artifact_dir: Path) -> dict[str, Any]:
    settings = ours_settings(db, "redis://127.0.0.1:1/0", artifact_dir=artifact_dir)
    pool = make_pool(settings, "bench-scale", min_size=1, max_size=2, open_wait=True)
    out: dict[str, Any] = {}
    try:
        scanner = RecoveryScanner(settings, pool, open_store(settings))
        t = time.perf_counter()
        scanner.run_once()  # the first pass runs the hygiene too
        out["scanner_hygiene_pass_ms"] = 1000 * (time.perf_counter() - t)
        passes = []
        for _ in range(5):
            t = time.perf_counter()
            scanner.run_once()
            passes.append(1000 * (time.perf_counter() - t))
        out["scanner_pass_ms"] = statistics.median(passes)
        with psycopg.connect(db) as conn:
            five = [
                r[0]
                for r in conn.execute(
                    "SELECT id FROM notes WHERE tenant_id = %s ORDER BY id LIMIT 5", (TENANT,)
                )
            ]
        request = ExportRequest.build(ExportFormat.JSON, five, False)
        submit: list[float] = []
        claim: list[float] = []
        finish: list[float] = []
        ids: list[Any] = []
        for _ in range(10):  # warm-up (pool, caches), not measured
            ids.append(submit_export(pool, settings, tenant_id=TENANT, request=request).job["id"])
        _claim_finish(pool, ids, [], [])
        ids.clear()
        for _ in range(samples):
            t = time.perf_counter()
            ids.append(submit_export(pool, settings, tenant_id=TENANT, request=request).job["id"])
            submit.append(time.perf_counter() - t)
        _claim_finish(pool, ids, claim, finish)
        out["submit"] = latency_summary(submit)
        out["claim"] = latency_summary(claim)
        out["finish"] = latency_summary(finish)
    finally:
        pool.close()
    return out


def _claim_finish(pool: Any, ids: list[Any], claim: list[float], finish: list[float]) -> None:
    """Claim then finish each job, timing each transition with its commit."""
    for job_id in ids:
        t = time.perf_counter()
        with pool.connection() as conn:
            job = job_store.job_claim(
                conn, job_id=job_id, message_id=uuid.uuid4(), lease_seconds=30
            )
        claim.append(time.perf_counter() - t)
        assert job is not None, "claim refused"
        t = time.perf_counter()
        with pool.connection() as conn:
            done = job_store.job_finish_if_leased(
                conn,
                job_id=job_id,
                lease_token=job.token,
                result_ref=f"{TENANT}/{job_id}/{job.token}.json",
                sha256="0" * 64,
                nbytes=1,
                rows=5,
            )
        finish.append(time.perf_counter() - t)
        assert done is not None, "finish refused"


def run_scale(
    env: BenchEnv,
    cfg: Config,
    run_root: Path,
    log: Callable[[str], None],
    scale: bool = True,
    console: bool = False,
) -> dict[str, Any]:
    """The scale measurements (``scale``) and, after them on the same filled database,
    the console case (``console``, bench/console.py; its results under ``"console"``)."""
    out: dict[str, Any] = {"runs": [], "errors": []}
    empty = env.fresh_database("scale_empty")
    full = env.fresh_database("scale_full")
    active = env.fresh_database("scale_active")
    dbs = {"empty": empty, "full": full, "active": active}
    try:
        log(f"  scale: generating {cfg.scale_jobs:,} finished jobs with their history")
        out["fill"] = fill(full, cfg.scale_jobs)
        log(f"  scale: filled in {out['fill']['seconds']} s")
        if scale:
            out["fill_active"] = fill_active(active, cfg.scale_active_jobs)
            log(f"  scale: {out['fill_active']['active_jobs']:,} active (queued) jobs")
        for i in range(cfg.runs if scale else 0):
            run: dict[str, Any] = {"run": i}
            names = ("empty", "full", "active")
            order = names[i % 3 :] + names[: i % 3]
            for which in order:
                db = dbs[which]
                run[which] = measure(db, cfg.scale_samples, run_root / f"scale-{i}-{which}")
                log(
                    f"  scale {which}: submit p50 {run[which]['submit']['p50_ms']:.2f} ms, "
                    f"claim p50 {run[which]['claim']['p50_ms']:.2f} ms, scanner pass "
                    f"{run[which]['scanner_pass_ms']:.1f} ms "
                    f"(with hygiene {run[which]['scanner_hygiene_pass_ms']:.0f} ms)"
                )
            out["runs"].append(run)
        if console:
            from bench.console import run_console

            out["console"] = run_console(env, cfg, full, run_root, log)
    except Exception as exc:
        out["errors"].append(f"{type(exc).__name__}: {exc}")
        log(f"  scale: ERROR {exc}")
    finally:
        for db in dbs.values():
            env.discard(db)
    return out
