"""The console case's bulk replay (``make bench ONLY=console``): 10,000 open dead letters of
one tenant replayed by one bulk action through the real api, publisher and workers, while
another tenant keeps exporting. Targets: the bulk action done within 60 s, and the other
tenant's exports during it within their usual p99 + 1 s (fair dispatch: the 10,000 replays
go through the outbox like any export, and never queue the other tenant behind them)."""

from __future__ import annotations

import os
import subprocess
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

FAIR_DISPATCH_DEFAULTS = {
    env: str(Settings.model_fields[field].default)
    for env, field in (
        ("TENANT_FAST_IN_FLIGHT", "tenant_fast_in_flight"),
        ("TENANT_BULK_IN_FLIGHT", "tenant_bulk_in_flight"),
    )
}
"""The fair-dispatch in-flight caps at their defaults (the e2e stacks lift them to measure
raw throughput): the target is about another tenant's export while one tenant's 10,000
replays go through fair dispatch, so the caps must apply. ``BENCH_BULK_REPLAY_CAPS=lifted``
keeps the e2e stacks' lifted caps instead."""

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
    """INSERT INTO export_job_items (job_id, ordinal, note_id, version)
       SELECT f.id, 0, 1, 1 FROM bulk_failed f""",
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
    env: BenchEnv,
    cfg: Config,
    db: str,
    run_dir: Path,
    log: Callable[[str], None],
    extra_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Fill 10,000 open dead letters, start the stack (``extra_env`` added to its
    environment), measure the other tenant's export latency alone, then during one bulk
    replay of all of them; returns the figures."""
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
    caps = {} if os.environ.get("BENCH_BULK_REPLAY_CAPS") == "lifted" else FAIR_DISPATCH_DEFAULTS
    stack = build_stack(
        env,
        db,
        env.broker_url(3),
        run_dir,
        ("api", "publisher", "fast-worker", "bulk-worker"),
        extra_env={"ADMISSION_CAPACITY": "100000", **caps, **(extra_env or {})},
    )
    out: dict[str, Any] = {"dead_letters": DEAD_LETTERS, "in_flight_caps": caps or "lifted"}
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


BASELINE_REF_ENV = "BENCH_BASELINE_REF"


def baseline_source(ref: str, into: Path) -> Path:
    """The ``exportcore`` library of git ``ref`` exported under ``into`` (for a stack whose
    PYTHONPATH puts it before the installed one); returns its ``src`` folder."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "archive", ref, "libs/exportcore/src"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "libs" / "exportcore" / "src"


def run_bulk_replay(
    env: BenchEnv, cfg: Config, run_root: Path, log: Callable[[str], None]
) -> dict[str, Any]:
    """The console case's bulk replay alone (``make bench ONLY=bulk_replay``), baseline and
    ours in one run: each on a fresh copy of the template, the baseline's stack running the
    ``exportcore`` of ``BENCH_BASELINE_REF`` (default ``main``; empty to skip it)."""
    ref = os.environ.get(BASELINE_REF_ENV, "main")
    out: dict[str, Any] = {"baseline_ref": ref or None, "errors": []}
    cases: list[tuple[str, dict[str, str]]] = [("ours", {})]
    if ref:
        src = baseline_source(ref, run_root / "bulk-replay-baseline-src")
        cases.append(("baseline", {"PYTHONPATH": str(src)}))
    for label, extra in cases:
        db = env.fresh_database(f"bulk-replay-{label}")
        try:
            log(f"  bulk replay ({label}): {DEAD_LETTERS:,} dead letters")
            out[label] = measure_bulk_replay(
                env, cfg, db, run_root / f"bulk-replay-{label}", log, extra_env=extra
            )
        except Exception as exc:
            out["errors"].append(f"{label}: {type(exc).__name__}: {exc}")
            log(f"  bulk replay ({label}): ERROR {exc}")
        finally:
            env.discard(db)
    base, ours = out.get("baseline"), out.get("ours")
    if base and ours and base.get("bulk_seconds") and ours.get("bulk_seconds"):
        out["ratios"] = {
            "bulk_seconds_ours_over_baseline": round(
                ours["bulk_seconds"] / base["bulk_seconds"], 3
            ),
        }
        if base.get("other_during") and ours.get("other_during"):
            out["ratios"]["other_p99_during_ours_over_baseline"] = round(
                ours["other_during"]["p99_ms"] / base["other_during"]["p99_ms"], 3
            )
    return out
