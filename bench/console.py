"""Console: every page and filter of the operator console, over HTTP with a signed-in session,
on the ``scale`` data (``scale_jobs`` finished jobs with their history, bench/scale.py).

On top of that data (after the scale measurements, so they are not affected) it adds what
an operator has to look at: ``console_failed`` failed jobs of five reasons, spread over the
same weeks, each with a dead letter and a real failure history (submitted, dispatched,
claimed, retried with a backoff, claimed again, failed, dead-lettered); a replay (succeeded)
for one in ten; ``console_active`` queued and running jobs; 200 more tenants; 20 schedules
with slots. Then the api alone (gunicorn, the Procfile line) is started on that database,
an operator signs in through the form, and each page below is requested
``console_samples`` times one after another (after 3 unmeasured requests): p50 / p99 of
the full response (the page rendered, read to the end). Target: p99 ≤ 300 ms per page.

Every console statement is also EXPLAINed (ANALYZE, BUFFERS) with the parameters the pages
use, and the plan is checked: no sequential scan of export_jobs, export_job_events,
export_job_items or export_outbox (``plans`` in the JSON; ``seq_scans`` must be empty).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import psycopg
from psycopg.types.json import Jsonb

from bench.bulk_replay import DEAD_LETTERS, measure_bulk_replay
from bench.common import Config, latency_summary
from bench.e2e import build_stack
from bench.env import TENANT, BenchEnv
from exportcore.auth import create_operator_key
from exportcore.db import make_pool
from exportcore.settings import Settings
from exportcore.sql import q

REASONS = (
    "render_timeout",
    "storage_denied",
    "attempts_exhausted",
    "deadline_exceeded",
    "bad_note",
)
BIG_TABLES = ("export_jobs", "export_job_events", "export_job_items", "export_outbox")

FILL = [
    # failed jobs: one every `spacing` seconds back in time, five reasons in turn
    """
    CREATE TEMP TABLE console_failed AS
    SELECT gen_random_uuid() AS id, gen_random_uuid() AS t1, gen_random_uuid() AS t2,
           now() - make_interval(secs => g * {spacing}) - interval '30 seconds' AS t,
           (ARRAY{reasons})[1 + g % {n_reasons}] AS reason, g
    FROM generate_series(1, {failed}) AS g
    """,
    """
    INSERT INTO export_jobs (
        id, tenant_id, status, queue, format, payload, note_count, request_hash, attempts,
        max_attempts, dispatch_count, next_attempt_at, last_dispatched_at, deadline_at,
        error_code, error_detail, created_at, started_at, finished_at, updated_at)
    SELECT f.id, '{tenant}', 'failed', CASE WHEN f.g % 7 = 0 THEN 'exports.bulk'
           ELSE 'exports.fast' END, 'json',
           '{{"selection": {{"note_ids": [1, 2, 3, 4, 5]}}, "format": "json", "options": {{}}}}',
           5, md5(f.g::text), 2, 3, 2, f.t + interval '2 s', f.t + interval '2 s',
           f.t + interval '1 hour', f.reason, 'the renderer gave up: ' || f.reason,
           f.t, f.t + interval '3 ms', f.t + interval '3 s', f.t + interval '3 s'
    FROM console_failed f
    """,
    """
    INSERT INTO export_job_events (job_id, at, kind, from_status, to_status, attempt,
                                   lease_token, message_id, detail)
    SELECT f.id, f.t + k.off, k.kind, k.fs, k.ts, k.att,
           CASE k.tok WHEN 1 THEN f.t1 WHEN 2 THEN f.t2 END, f.t1,
           replace(k.detail, '$REASON', f.reason)::jsonb
    FROM console_failed f
    CROSS JOIN (VALUES
        (1, interval '0 ms', 'submitted', NULL, 'queued', NULL::int, 0,
         '{{"source": "api", "note_count": 5}}'),
        (2, interval '2 ms', 'dispatched', NULL, NULL, NULL, 0, '{{"reason": "submit"}}'),
        (3, interval '3 ms', 'claimed', 'queued', 'running', 1, 1, '{{}}'),
        (4, interval '900 ms', 'retried', 'running', 'queued', 1, 1,
         '{{"error_code": "io_error"}}'),
        (5, interval '2 s', 'claimed', 'queued', 'running', 2, 2, '{{}}'),
        (6, interval '3 s', 'failed', 'running', 'failed', 2, 2,
         '{{"error_code": "$REASON"}}'),
        (7, interval '3 s', 'dead_lettered', 'failed', 'failed', 2, 2, '{{}}')
    ) AS k (n, off, kind, fs, ts, att, tok, detail)
    ORDER BY f.g DESC, k.n
    """,
    """
    INSERT INTO export_dead_letters (job_id, tenant_id, reason, detail, attempts, created_at)
    SELECT f.id, '{tenant}', f.reason, 'the renderer gave up: ' || f.reason, 2,
           f.t + interval '3 s'
    FROM console_failed f ORDER BY f.g DESC
    """,
    # one in ten was replayed, and the replay succeeded
    """
    INSERT INTO export_jobs (
        id, tenant_id, status, queue, format, payload, note_count, request_hash, attempts,
        max_attempts, dispatch_count, lease_token, next_attempt_at, deadline_at, result_ref,
        result_sha256, result_bytes, result_rows, replay_of, created_at, started_at,
        finished_at, updated_at)
    SELECT gen_random_uuid(), '{tenant}', 'succeeded', 'exports.fast', 'json',
           '{{"selection": {{"note_ids": [1, 2, 3, 4, 5]}}, "format": "json", "options": {{}}}}',
           5, md5(f.g::text), 1, 3, 1, f.t2, f.t + interval '1 min', f.t + interval '1 hour',
           'replayed', md5(f.id::text) || md5(f.t2::text), 9000, 5, f.id,
           f.t + interval '1 min', f.t + interval '1 min', f.t + interval '61 s',
           f.t + interval '61 s'
    FROM console_failed f WHERE f.g % 10 = 0
    """,
    # active work: queued (some waiting for a retry) and running jobs
    """
    INSERT INTO export_jobs (
        id, tenant_id, status, queue, format, payload, note_count, request_hash, attempts,
        max_attempts, lease_token, lease_expires_at, next_attempt_at, deadline_at,
        created_at, started_at, updated_at)
    SELECT gen_random_uuid(), '{tenant}', CASE WHEN g % 3 = 0 THEN 'running' ELSE 'queued' END,
           'exports.fast', 'json',
           '{{"selection": {{"note_ids": [1, 2, 3, 4, 5]}}, "format": "json", "options": {{}}}}',
           5, md5(g::text), CASE WHEN g % 3 = 0 THEN 1 ELSE 0 END, 3,
           CASE WHEN g % 3 = 0 THEN gen_random_uuid() END,
           CASE WHEN g % 3 = 0 THEN now() + interval '30 s' END,
           now() + make_interval(secs => g % 5), now() + interval '1 hour',
           now() - make_interval(secs => g), now() - make_interval(secs => g), now()
    FROM generate_series(1, {active}) AS g
    """,
    """
    INSERT INTO tenants (id, name, max_active_jobs)
    SELECT 'bench-t' || lpad(g::text, 4, '0'), 'Tenant ' || g,
           CASE WHEN g % 4 = 0 THEN 50 END
    FROM generate_series(1, 200) AS g
    """,
    """
    INSERT INTO export_schedules (id, tenant_id, name, interval_seconds, payload, format,
                                  next_due_at, catch_up, enabled)
    SELECT gen_random_uuid(), CASE WHEN g % 2 = 0 THEN '{tenant}' ELSE 'bench-t0001' END,
           'every ' || g || ' h', g * 3600,
           '{{"selection": {{"all": true}}, "format": "json", "options": {{}}}}', 'json',
           now() + make_interval(secs => g * 60), 'skip', g % 5 <> 0
    FROM generate_series(1, 20) AS g
    """,
    """
    INSERT INTO export_schedule_slots (schedule_id, scheduled_at, outcome, job_id)
    SELECT s.id, now() - make_interval(hours => k), 'created', NULL
    FROM export_schedules s CROSS JOIN generate_series(1, 50) AS k
    """,
    "DROP TABLE console_failed",
    "VACUUM ANALYZE",
]


def fill_console(db: str, cfg: Config) -> dict[str, Any]:
    """Add the console's data to a filled scale database; returns counts and seconds."""
    t0 = time.monotonic()
    spacing = max(1, (23 * 86400) // max(cfg.console_failed, 1))
    reasons = "[" + ", ".join(f"'{r}'" for r in REASONS) + "]"
    with psycopg.connect(db, autocommit=True) as conn:
        for sql in FILL:
            conn.execute(
                sql.format(
                    spacing=spacing,
                    reasons=reasons,
                    n_reasons=len(REASONS),
                    failed=cfg.console_failed,
                    active=cfg.console_active,
                    tenant=TENANT,
                )
            )
        counts = conn.execute(
            "SELECT (SELECT count(*) FROM export_jobs) AS jobs,"
            " (SELECT count(*) FROM export_job_events) AS events,"
            " (SELECT count(*) FROM export_dead_letters) AS dead_letters"
        ).fetchone()
    assert counts is not None
    return {
        "seconds": round(time.monotonic() - t0, 1),
        "jobs": counts[0],
        "events": counts[1],
        "dead_letters": counts[2],
    }


def samples(db: str) -> dict[str, Any]:
    """Ids the pages are asked about: a failed job with its history, a succeeded one."""
    with psycopg.connect(db, autocommit=True) as conn:
        failed = conn.execute(
            "SELECT id FROM export_jobs WHERE status = 'failed' ORDER BY created_at LIMIT 1"
        ).fetchone()
        succeeded = conn.execute(
            "SELECT id FROM export_jobs WHERE status = 'succeeded' AND replay_of IS NULL"
            " ORDER BY created_at LIMIT 1"
        ).fetchone()
    assert failed and succeeded, "the console data is missing"
    return {"failed": str(failed[0]), "succeeded": str(succeeded[0])}


def pages(sample: dict[str, Any]) -> dict[str, str]:
    """``{case: path}``: every page, and the jobs page with each filter."""
    jobs = "/console/jobs?"
    return {
        "overview": "/console/",
        "overview_live": "/console/overview/live",
        "jobs": "/console/jobs",
        "jobs_state_failed": jobs + urlencode({"status": "failed"}),
        "jobs_state_succeeded": jobs + urlencode({"status": "succeeded"}),
        "jobs_state_running": jobs + urlencode({"status": "running"}),
        "jobs_tenant": jobs + urlencode({"tenant": TENANT}),
        "jobs_tenant_failed": jobs + urlencode({"tenant": TENANT, "status": "failed"}),
        "jobs_error_code": jobs + urlencode({"error_code": REASONS[2]}),
        "jobs_queue_bulk": jobs + urlencode({"queue": "exports.bulk"}),
        "jobs_last_hour": jobs + urlencode({"since": "1h"}),
        "jobs_week_range": jobs
        + urlencode({"from": "2000-01-01T00:00:00Z", "to": "2999-01-01T00:00:00Z"}),
        "job_timeline_failed": f"/console/jobs/{sample['failed']}",
        "job_succeeded": f"/console/jobs/{sample['succeeded']}",
        "dead_letters": "/console/dead-letters",
        "dead_letters_reason": f"/console/dead-letters/{REASONS[0]}",
        "schedules": "/console/schedules",
        "tenants": "/console/tenants",
    }


def sign_in(client: httpx.Client, key: str) -> None:
    """Sign in through the form, as a browser does."""
    form = client.get("/console/login")
    token = re.search(r'name="login_token" value="([^"]+)"', form.text)
    assert token, "no sign-in form"
    r = client.post(
        "/console/login", data={"key": key, "login_token": token.group(1), "next": "/console/"}
    )
    assert r.status_code == 303, r.text[:500]


def _plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    out = [plan]
    for child in plan.get("Plans", []):
        out.extend(_plan_nodes(child))
    return out


def plan_cases(sample: dict[str, Any]) -> list[tuple[str, str, str, dict[str, Any]]]:
    """``(case, sql file, statement, parameters)`` for every statement the console runs."""
    none = {
        "status": None,
        "queue": None,
        "tenant_id": None,
        "error_code": None,
        "created_from": None,
        "created_to": None,
        "labels": None,
        "before_created_at": None,
        "before_id": None,
        "limit": 51,
    }
    failed = sample["failed"]
    return [
        ("queue_counts", "console", "console_queue_counts", {}),
        ("finished_by_minute", "console", "console_finished_by_minute", {"minutes": 61}),
        ("oldest_queued", "metrics", "metrics_oldest_queued", {}),
        ("outbox", "metrics", "metrics_outbox", {}),
        ("admission_usage", "admission", "admission_usage", {"default_quota": 1000}),
        ("open_dead_letters", "console", "console_open_dead_letters", {}),
        ("jobs", "console", "console_jobs_page", none),
        ("jobs_state", "console", "console_jobs_page", {**none, "status": "failed"}),
        ("jobs_tenant", "console", "console_jobs_page", {**none, "tenant_id": TENANT}),
        (
            "jobs_tenant_state",
            "console",
            "console_jobs_page",
            {**none, "tenant_id": TENANT, "status": "failed"},
        ),
        ("jobs_error", "console", "console_jobs_page", {**none, "error_code": REASONS[2]}),
        ("jobs_queue", "console", "console_jobs_page", {**none, "queue": "exports.bulk"}),
        (
            "jobs_labels",
            "console",
            "console_jobs_page",
            {**none, "labels": Jsonb({"tags": ["nightly"], "metadata": {"team": "a"}})},
        ),
        (
            "jobs_page2",
            "console",
            "console_jobs_page",
            {
                **none,
                "status": "succeeded",
                "before_created_at": "2026-01-01T00:00:00Z",
                "before_id": sample["succeeded"],
            },
        ),
        ("job", "console", "console_job", {"job_id": failed}),
        ("job_events", "console", "console_job_events", {"job_id": failed, "limit": 2001}),
        ("replay_chain", "console", "console_replay_chain", {"job_id": failed, "max_depth": 50}),
        ("dead_letter_groups", "console", "console_dead_letter_groups", {"reason": None}),
        ("dead_letter_group", "console", "console_dead_letter_groups", {"reason": REASONS[0]}),
        (
            "dead_letters_page",
            "dead_letters",
            "dead_letters_page",
            {"reason": REASONS[0], "limit": 51, "before": None, "state": None, "tenant_id": None},
        ),
        ("reasons", "console", "console_reasons", {}),
        (
            "schedules",
            "console",
            "console_schedules_page",
            {
                "limit": 51,
                "runs": 5,
                "tenant_id": None,
                "after_tenant": None,
                "after_created_at": None,
                "after_id": None,
            },
        ),
        (
            "tenants",
            "console",
            "console_tenants_page",
            {"limit": 101, "default_quota": 1000, "after": None, "prefix": None},
        ),
    ]


def explain_all(
    db: str, sample: dict[str, Any], analyze: bool = True, index_paths_only: bool = False
) -> dict[str, Any]:
    """EXPLAIN every console statement; per case the plan's time, the buffers it touched,
    and the sequential scans of the big tables (which must be none).

    ``index_paths_only`` plans with ``enable_seqscan = off``: on a small database (a test)
    the planner then still picks a sequential scan only where no index can serve the
    statement at all, which is what a missing index looks like at any size."""
    out: dict[str, Any] = {}
    options = "ANALYZE, BUFFERS, FORMAT JSON" if analyze else "FORMAT JSON"
    with psycopg.connect(db, autocommit=True) as conn:
        if index_paths_only:
            conn.execute("SET enable_seqscan = off")
        for case, aggregate, name, params in plan_cases(sample):
            sql = f"EXPLAIN ({options}) {q(aggregate, name)}"
            row = conn.execute(sql, params, prepare=False).fetchone()
            assert row is not None, f"EXPLAIN returned no row for {case}"
            plan = row[0][0]
            nodes = _plan_nodes(plan["Plan"])
            out[case] = {
                "ms": plan.get("Execution Time"),
                "shared_buffers": plan["Plan"].get("Shared Hit Blocks", 0)
                + plan["Plan"].get("Shared Read Blocks", 0),
                "seq_scans": sorted(
                    {
                        n["Relation Name"]
                        for n in nodes
                        if n["Node Type"] == "Seq Scan" and n.get("Relation Name") in BIG_TABLES
                    }
                ),
            }
    return out


def measure(
    env: BenchEnv, cfg: Config, db: str, run_dir: Path, log: Callable[[str], None]
) -> dict[str, Any]:
    """Start the api on ``db``, sign in, and time every page."""
    settings = Settings.model_validate({"database_url": db})
    pool = make_pool(settings, "bench-console", min_size=1, max_size=1, open_wait=True)
    try:
        with pool.connection() as conn:
            key, _ = create_operator_key(conn, label="bench console")
    finally:
        pool.close()
    sample = samples(db)
    stack = build_stack(env, db, env.broker_url(2), run_dir, ("api",))
    out: dict[str, Any] = {"pages": {}, "sample": sample}
    try:
        stack.start(wait=False)
        stack.wait_ready(timeout=120.0)  # four workers booting on a busy machine
        with httpx.Client(base_url=stack.api_url, timeout=30.0) as client:
            sign_in(client, key)
            for case, path in pages(sample).items():
                for _ in range(3):  # warm-up: connections, caches
                    client.get(path).raise_for_status()
                times = []
                for _ in range(cfg.console_samples):
                    t = time.perf_counter()
                    r = client.get(path)
                    r.read()
                    times.append(time.perf_counter() - t)
                    if r.status_code != 200:
                        raise RuntimeError(f"{path}: {r.status_code} {r.text[:300]}")
                out["pages"][case] = {"path": path, **latency_summary(times)}
                log(
                    f"  console {case}: p50 {out['pages'][case]['p50_ms']:.1f} ms, "
                    f"p99 {out['pages'][case]['p99_ms']:.1f} ms"
                )
    finally:
        stack.stop()
    out["plans"] = explain_all(db, sample)
    scans = {c: p["seq_scans"] for c, p in out["plans"].items() if p["seq_scans"]}
    out["seq_scans"] = scans
    if scans:
        log(f"  console: SEQUENTIAL SCANS of big tables: {json.dumps(scans)}")
    return out


def run_console(
    env: BenchEnv, cfg: Config, db: str, run_root: Path, log: Callable[[str], None]
) -> dict[str, Any]:
    """The console case on the filled scale database ``db`` (``runs`` times)."""
    out: dict[str, Any] = {"runs": [], "errors": []}
    try:
        log(f"  console: adding {cfg.console_failed:,} failed jobs with dead letters")
        out["fill"] = fill_console(db, cfg)
        for i in range(cfg.runs):
            run = measure(env, cfg, db, run_root / f"console-{i}", log)
            run["run"] = i
            out["runs"].append(run)
        log(f"  console: bulk replay of {DEAD_LETTERS:,} dead letters")
        out["bulk_replay"] = measure_bulk_replay(env, cfg, db, run_root / "console-bulk", log)
    except Exception as exc:
        out["errors"].append(f"{type(exc).__name__}: {exc}")
        log(f"  console: ERROR {exc}")
    return out
