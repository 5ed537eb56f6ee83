"""Every statement of the operator console can be answered through an index: none of them
scans export_jobs, export_job_events, export_job_items or export_outbox.

The data is the benchmark's own (bench/scale.py and bench/console.py, at a small size);
planning with ``enable_seqscan = off`` makes PostgreSQL choose a sequential scan only where
no index can serve a statement, so the check does not depend on the table sizes. `make
bench` repeats it with EXPLAIN ANALYZE on 1,000,000 jobs (the console case's ``plans``).
"""

from __future__ import annotations

import dataclasses

import psycopg

from bench import console, scale
from bench.common import Config
from bench.env import TENANT


def test_no_console_statement_scans_a_big_table(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO tenants (id, name) VALUES (%s, 'Benchmark')", (TENANT,))
    scale.fill(database_url, 3000)
    cfg = dataclasses.replace(Config.from_env(quick=True), console_failed=500, console_active=50)
    console.fill_console(database_url, cfg)
    sample = console.samples(database_url)
    plans = console.explain_all(database_url, sample, analyze=False, index_paths_only=True)
    assert len(plans) == len(console.plan_cases(sample))
    scans = {case: p["seq_scans"] for case, p in plans.items() if p["seq_scans"]}
    assert scans == {}
