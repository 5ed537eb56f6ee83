"""The benchmark harness end to end at tiny sizes: every scenario runs on its own servers
and writes valid JSON with the figures and targets. Opt-in (``make bench-smoke``, or
``BENCH_SMOKE=1 pytest -m bench``): it installs nothing itself but needs the peers from
``make bench-install``, starts its own PostgreSQL and Redis and takes a few minutes on two
cores, which ``make test`` cannot afford; the harness's logic is covered in make test by
tests/unit/test_bench_harness.py. It never asserts a speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from devtools.stack import ROOT, free_port

# every scenario at tiny sizes; the e2e's per-statement phases add about 35 s of quiet per
# system (BENCH_STATS_SETTLE_SECONDS, docs/performance.md)
pytestmark = [
    pytest.mark.bench,
    pytest.mark.timeout(1200),
]

TINY = {
    "BENCH_E2E_JOBS": "40",
    "BENCH_E2E_WARMUP": "5",
    "BENCH_FIXED_RATE": "20",
    "BENCH_FIXED_SECONDS": "1",
    "BENCH_AT50_SECONDS": "1",
    "BENCH_OPEN80_SECONDS": "1",
    "BENCH_API_SECONDS": "1",
    "BENCH_API_CONNECTIONS": "4",
    "BENCH_API_FIXED_RATE": "20",
    "BENCH_API_FIXED_SECONDS": "1",
    "BENCH_BULK_NOTES": "300",
    "BENCH_SCALE_JOBS": "2000",
    "BENCH_SCALE_SAMPLES": "10",
    "BENCH_CONSOLE_FAILED": "100",
    "BENCH_CONSOLE_ACTIVE": "20",
    "BENCH_CONSOLE_SAMPLES": "3",
    "BENCH_RECOVERY_LEASE_SECONDS": "3",
    "BENCH_RECOVERY_SCANNER_SECONDS": "0.5",
    "BENCH_RECOVERY_RETRY_CAP_SECONDS": "1",
    "BENCH_FAIRNESS_FLOOD": "10",
    "BENCH_FAIRNESS_SECONDS": "2",
    "BENCH_FAIRNESS_NOTES": "40",
}


def test_quick_run_writes_valid_json(tmp_path: Path) -> None:
    home = tmp_path / "bench"
    env = {
        **os.environ,
        **TINY,
        "BENCH_HOME": str(home),
        "BENCH_PG_PORT": str(free_port()),
        "BENCH_REDIS_PORT": str(free_port()),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "run",
            "--quick",
            "--runs",
            "1",
            "--systems",
            "ours-lib,celery,pgqueuer-psycopg",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((home / "results" / "latest.json").read_text())
    assert results["meta"]["versions"]["celery"] and results["meta"]["postgres"]["fsync"] == "on"
    assert results["meta"]["postgres"]["synchronous_commit"] == "on"
    figs = results["figures"]
    for name in (
        "e2e.ours-lib.jobs_per_s",
        "e2e.celery.jobs_per_s",
        "e2e.pgqueuer-psycopg.jobs_per_s",
        "e2e.ours-lib.at20.pickup_p99_ms",
        # the equal-footing figures (docs/performance.md), for ours and a peer
        *(
            f"e2e.{system}.{name}"
            for system in ("ours-lib", "celery", "pgqueuer-psycopg")
            for name in (
                "concurrency",
                "cpu_ms_per_job_at50",
                "write_commits_per_job",
                "e2e_p50_ms_at50",
                "e2e_p99_ms_at50",
                "e2e_p99_ms_at80",
                "e2e_p99_noisy_ratio",
            )
        ),
        "e2e.ours-lib.wal_bytes_per_job",
        "e2e.pgqueuer-psycopg.wal_bytes_per_job",
        "e2e.pgqueuer-psycopg.max_concurrent_executions",
        "api.max.rate",
        "api.at20.p99_ms",
        "bulk.json.peak_rss_mb",
        "bulk.markdown_zip.notes_per_s",
        "scale.full.claim_p50_ms",
        "scale.full.scanner_pass_ms",
        "console.job_timeline_failed.p99_ms",
        "console.jobs_state_failed.p99_ms",
        "console.seq_scans_of_big_tables",
        "recovery.seconds_to_all_succeeded",
        "fairness.backlog.victim_pickup_p99_s",
        "fairness.bulk_run_p50_s",
    ):
        assert figs[name]["median"] is not None, name
    assert "ours-lib/celery.jobs_per_s" in results["ratios"]
    assert "ours-lib/best-durable.cpu_ms_per_job_at50" in results["ratios"]
    # every system ran the same number of job executions at once, PgQueuer's threads too
    assert figs["e2e.pgqueuer-psycopg.max_concurrent_executions"]["max"] <= 2
    assert "| ours-lib / raw Celery |" in results["e2e_table"]
    assert all(t["met"] in (True, False) for t in results["targets"])
    assert "Targets" in proc.stdout
    check_postgres_per_export(results, proc.stdout)


def check_postgres_per_export(results: dict[str, Any], stdout: str) -> None:
    """What PostgreSQL did per export (bench/pgstats.py): recorded for every system's
    saturation and 50 % phases, and plausible where the count is known: one submit
    statement and one job row per export, history rows, WAL written, the statements that
    exports_admit runs seen as nested ones, none of the harness's own reads."""
    assert results["meta"]["postgres"]["pg_stat_statements.track"] == "all"
    per_export = results["pg_per_export"]
    systems = results["scenarios"]["e2e"]["systems"]
    for system in ("ours-lib", "celery", "pgqueuer-psycopg"):
        for phase in ("sat", "at50"):
            rec = systems[system][0][phase]["pg"]
            assert rec["exports"] == systems[system][0][phase]["jobs"] > 0, (system, phase)
            assert rec["statements"] and rec["evicted"] == 0, (system, phase)
            assert per_export[system][phase]["runs"] == 1
            assert not any("bench-harness" in s["query"] for s in rec["statements"])
            assert not any("pg_stat_statements" in s["query"] for s in rec["statements"])
        assert f"PostgreSQL per export: {system}, sat" in stdout
    for phase in ("sat", "at50"):
        rec = systems["ours-lib"][0][phase]["pg"]
        stmts = {(s["statement"], s["level"]): s for s in rec["statements"]}
        submit = stmts[("jobs.job_submit", "top")]
        assert submit["per_export"]["calls"] == pytest.approx(1, abs=0.05), phase
        assert submit["per_export"]["wal_bytes"] > 0
        assert submit["per_export"]["total_exec_time"] > 0
        assert ("jobs.job_claim_many", "top") in stmts
        assert any(n.startswith("exports_admit(): ") and lv == "nested" for n, lv in stmts)
        top = rec["statements_top_level"]
        assert 0 < top["wal_bytes"] <= systems["ours-lib"][0][phase]["wal_bytes_per_job"]
        tables = {t["table"]: t["per_export"] for t in rec["tables"]}
        assert tables["export_jobs"]["n_tup_ins"] == pytest.approx(1, abs=0.05), phase
        assert tables["export_jobs"]["n_tup_upd"] >= 1  # claimed, succeeded
        assert tables["export_job_events"]["n_tup_ins"] >= 3
        assert tables["export_job_items"]["n_tup_ins"] == pytest.approx(5, abs=0.25)
    pgq = systems["pgqueuer-psycopg"][0]["sat"]["pg"]
    assert any(t["table"].startswith("pgqueuer") for t in pgq["tables"])
    assert pgq["statements_top_level"]["wal_bytes"] > 0
