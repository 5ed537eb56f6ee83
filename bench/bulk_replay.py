"""The console case's bulk replay (``make bench ONLY=console``): 10,000 open dead letters of
one tenant replayed by one bulk action through the real api, publisher and workers, while
another tenant keeps exporting. Targets: the bulk action done within 60 s, and the other
tenant's exports during it within their usual p99 + 1 s (fair dispatch: the 10,000 replays
go through the outbox like any export, and never queue the other tenant behind them)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import uuid4

import httpx
import psycopg

from bench.common import Config, latency_summary
from bench.e2e import build_stack
from bench.env import TENANT, BenchEnv
from devtools.api_client import bearer
from exportcore.auth import create_operator_key
from exportcore.db import make_pool
from exportcore.settings import Settings

DEAD_LETTERS = 10_000
BULK_TENANT = "bench-bulk"
TARGET_SECONDS = 60.0
TARGET_EXTRA_P99 = 1.0
BASELINE_EXPORTS = 20

FILL = [
    """INSERT INTO tenants (id, name, max_active_jobs) VALUES ('{tenant}', 'Bulk replay', 100000)
       ON CONFLICT (id) DO UPDATE SET max_active_jobs = 100000""",
    """CREATE TEMP TABLE bulk_failed AS
       SELECT gen_random_uuid() AS id, now() - make_interval(secs => g) AS t, g
       FROM generate_series(1, {n}) AS g""",
    """INSERT INTO export_jobs (
           id, tenant_id, status, queue, format, payload, note_count, request_hash, attempts,
           max_attempts, deadline_at, error_code, error_detail, created_at, finished_at,
           updated_at)
       SELECT f.id, '{tenant}', 'failed', 'exports.fast', 'json',
              '{{"selection": {{"note_ids": [1]}}, "format": "json", "options": {{}}}}', 1,
              md5(f.g::text), 3, 3, f.t + interval '1 hour', 'bench_bulk', 'gave up',
              f.t, f.t, f.t
       FROM bulk_failed f""",
    """INSERT INTO export_job_items (job_id, ordinal, note_id, title, content, pinned,
                                     updated_at)
       SELECT f.id, 0, 1, 'a note', 'its text', false, f.t FROM bulk_failed f""",
    """INSERT INTO export_dead_letters (job_id, tenant_id, reason, detail, attempts, created_at)
       SELECT f.id, '{tenant}', 'bench_bulk', 'gave up', 3, f.t FROM bulk_failed f
       ORDER BY f.g DESC""",
    "DROP TABLE bulk_failed",
    "ANALYZE export_jobs, export_dead_letters, export_job_items",
]


def _export_seconds(client: httpx.Client, note_id: int, timeout: float = 120.0) -> float:
    """One export of the other tenant, from submit to succeeded (polled every 20 ms)."""
    t0 = time.perf_counter()
    r = client.post("/v1/exports", json={"note_ids": [note_id], "format": "json"})
    r.raise_for_status()
    job_id = r.json()["id"]
    while time.perf_counter() - t0 < timeout:
        status = client.get(f"/v1/exports/{job_id}").json()["status"]
        if status == "succeeded":
            return time.perf_counter() - t0
        if status in ("failed", "cancelled"):
            raise RuntimeError(f"the other tenant's export {job_id} ended {status}")
        time.sleep(0.02)
    raise RuntimeError(f"the other tenant's export {job_id} did not finish in {timeout} s")


def measure_bulk_replay(
    env: BenchEnv, cfg: Config, db: str, run_dir: Path, log: Callable[[str], None]
) -> dict[str, Any]:
    """Fill 10,000 open dead letters, start the stack, measure the other tenant's export
    latency alone, then during one bulk replay of all of them; returns the figures."""
    with psycopg.connect(db, autocommit=True) as conn:
        for sql in FILL:
            conn.execute(sql.format(tenant=BULK_TENANT, n=DEAD_LETTERS))
        row = conn.execute("SELECT min(id) FROM notes WHERE tenant_id = %s", (TENANT,)).fetchone()
    assert row is not None and row[0] is not None
    note_id = int(row[0])
    settings = Settings.model_validate({"database_url": db})
    pool = make_pool(settings, "bench-bulk", min_size=1, max_size=1, open_wait=True)
    try:
        with pool.connection() as conn:
            operator, _ = create_operator_key(conn, label="bench bulk replay")
    finally:
        pool.close()
    assert env.seed is not None, "the bench template (env.prepare_template) comes first"
    tenant_key = env.seed.api_key
    stack = build_stack(
        env,
        db,
        env.broker_url(3),
        run_dir,
        ("api", "publisher", "fast-worker", "bulk-worker"),
        extra_env={"ADMISSION_CAPACITY": "100000"},
    )
    out: dict[str, Any] = {"dead_letters": DEAD_LETTERS}
    try:
        stack.start(wait=False)
        stack.wait_ready(timeout=180.0)
        base = stack.api_url
        with (
            httpx.Client(base_url=base, headers=bearer(tenant_key), timeout=30) as other,
            httpx.Client(base_url=base, headers=bearer(operator), timeout=60) as admin,
        ):
            for _ in range(3):  # warm-up
                _export_seconds(other, note_id)
            baseline = [_export_seconds(other, note_id) for _ in range(BASELINE_EXPORTS)]
            out["other_alone"] = latency_summary(baseline)
            body = {"action": "replay", "filter": {"reason": "bench_bulk"}}
            seen = admin.post("/v1/admin/bulk-actions/preview", json=body).json()
            started = admin.post(
                "/v1/admin/bulk-actions",
                json={
                    **body,
                    "as_of": seen["as_of"],
                    "confirmed_count": seen["count"],
                    "request_id": str(uuid4()),
                },
            )
            started.raise_for_status()
            bulk_id = started.json()["id"]
            t0 = time.perf_counter()
            during: list[float] = []
            while True:
                run = admin.get(f"/v1/admin/bulk-actions/{bulk_id}").json()
                if run["state"] != "running" or time.perf_counter() - t0 > 600:
                    break
                during.append(_export_seconds(other, note_id))
            wall = time.perf_counter() - t0
        with psycopg.connect(db, autocommit=True) as conn:
            ran = conn.execute(
                "SELECT extract(epoch FROM finished_at - created_at)::float8, acted, state, "
                "batches FROM bulk_actions WHERE id = %s",
                (bulk_id,),
            ).fetchone()
        assert ran is not None
        out.update(
            matched=seen["count"],
            bulk_seconds=round(ran[0], 2) if ran[0] is not None else None,
            bulk_seen_by_client_seconds=round(wall, 2),
            acted=ran[1],
            state=ran[2],
            batches=ran[3],
            other_during=latency_summary(during) if during else None,
        )
        alone_p99 = out["other_alone"]["p99_ms"] / 1000
        during_p99 = out["other_during"]["p99_ms"] / 1000 if during else 0.0
        out["targets"] = {
            "bulk_within_60_s": out["bulk_seconds"] is not None
            and out["bulk_seconds"] <= TARGET_SECONDS,
            "other_within_p99_plus_1_s": during_p99 <= alone_p99 + TARGET_EXTRA_P99,
        }
        log(
            f"  console bulk replay: {out['acted']:,} of {out['matched']:,} replayed in "
            f"{out['bulk_seconds']} s ({out['batches']} batches); the other tenant's export "
            f"p99 {alone_p99 * 1000:.0f} ms alone, {during_p99 * 1000:.0f} ms during "
            f"({len(during)} exports)"
        )
    finally:
        stack.stop()
    return out
