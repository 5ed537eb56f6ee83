"""Beat, the tick on a worker, and the workers together: a schedule every two seconds
produces succeeded exports, one per slot; ``exportctl schedule`` against the real api (run
now, preview, and ``runs`` paged by ``--before`` or read whole with ``--all``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.e2e.conftest import E2E, exportctl, running_stack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def beat_stack(servers, template_db, notes_dir, tmp_path_factory) -> Iterator[E2E]:
    env = {"SCHEDULER_TICK_SECONDS": "0.5", "SCHEDULE_MIN_INTERVAL_SECONDS": "1"}
    with running_stack(servers, template_db, notes_dir, tmp_path_factory.mktemp("beat"), env) as e:
        yield e


def test_a_schedule_every_two_seconds_makes_one_succeeded_export_per_slot(beat_stack: E2E) -> None:
    e = beat_stack
    api = httpx.Client(base_url=e.stack.api_url, headers=e.api.auth, timeout=10)
    with psycopg.connect(e.database_url) as conn:
        ids = [
            r[0]
            for r in conn.execute(
                "SELECT id FROM notes WHERE tenant_id = %s ORDER BY id LIMIT 3", (e.tenant,)
            )
        ]
    r = api.post("/v1/schedules", json={"interval_seconds": 2, "note_ids": ids, "format": "ndjson"})
    assert r.status_code == 201, r.text
    sched = r.json()

    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        runs = api.get(f"/v1/schedules/{sched['id']}/runs").json()
        done = [x for x in runs if x["job_status"] == "succeeded"]
        if len(done) >= 3:
            break
        time.sleep(0.2)
    assert len(done) >= 3, runs
    assert api.patch(f"/v1/schedules/{sched['id']}", json={"enabled": False}).status_code == 200
    with psycopg.connect(e.database_url) as conn:  # one snapshot: slots and jobs agree
        slots, distinct_slots, distinct_jobs, submitted = conn.execute(
            "SELECT count(*), count(DISTINCT scheduled_at), count(DISTINCT job_id),"
            " (SELECT count(*) FROM export_job_events WHERE kind = 'submitted'"
            "   AND detail->>'schedule_id' = %(id)s)"
            " FROM export_schedule_slots WHERE schedule_id = %(id)s::uuid AND outcome = 'created'",
            {"id": sched["id"]},
        ).fetchone()
    assert slots == distinct_slots == distinct_jobs == submitted >= 3  # one job per slot
    assert "schedules advanced" in e.stack.procs["fast-worker"].log_text()
    assert e.stack.procs["beat"].alive
    # the CLI shows whole ids even in an 80-column terminal, so they can be copied on
    cli_env = {**e.stack.env, "API_URL": e.stack.api_url, "API_KEY": e.api.api_key, "COLUMNS": "80"}
    assert sched["id"] in exportctl(cli_env, "schedule", "list")
    shown_runs = exportctl(cli_env, "schedule", "runs", sched["id"])
    assert all(x["job_id"] in shown_runs for x in done)
    exportctl(cli_env, "schedule", "resume", sched["id"])
    exportctl(cli_env, "schedule", "pause", sched["id"])


def test_run_now_and_preview_from_the_cli(beat_stack: E2E) -> None:
    e = beat_stack
    cli_env = {
        **e.stack.env,
        "API_URL": e.stack.api_url,
        "API_KEY": e.api.api_key,
        "COLUMNS": "120",
    }
    api = httpx.Client(base_url=e.stack.api_url, headers=e.api.auth, timeout=10)
    r = api.post(
        "/v1/schedules",
        json={"cron": "@daily", "timezone": "Europe/Berlin", "all": True, "enabled": False},
    )
    assert r.status_code == 201, r.text
    sched = r.json()
    assert sched["paused_reason"] == "requested" and sched["cron"] == "@daily"
    # a paused schedule runs by hand: one manual slot, its export succeeds like any other
    job_id = exportctl(cli_env, "schedule", "run", sched["id"]).strip().splitlines()[-1]
    assert e.db.wait_terminal(job_id)["status"] == "succeeded"
    runs = api.get(f"/v1/schedules/{sched['id']}/runs").json()
    assert [(x["trigger"], x["job_id"]) for x in runs] == [("manual", job_id)]
    shown = exportctl(cli_env, "schedule", "preview", sched["id"], "-n", "3")
    assert shown.count("+01:00") + shown.count("+02:00") == 3  # Berlin midnights
    unsaved = exportctl(cli_env, "schedule", "preview", "--every", "3600", "-n", "2")
    assert "UTC" in unsaved
    listed = exportctl({**cli_env, "COLUMNS": "300"}, "schedule", "list")
    assert "paused (requested)" in listed


def test_schedule_runs_pages_by_before_and_takes_every_page_with_all(beat_stack: E2E) -> None:
    e = beat_stack
    cli_env = {**e.stack.env, "API_URL": e.stack.api_url, "API_KEY": e.api.api_key}
    api = httpx.Client(base_url=e.stack.api_url, headers=e.api.auth, timeout=10)
    r = api.post(
        "/v1/schedules",
        json={"cron": "@daily", "timezone": "UTC", "note_ids": e.note_ids(1), "enabled": False},
    )
    assert r.status_code == 201, r.text
    sched = r.json()
    for _ in range(5):  # paused: only these manual slots, newest first
        exportctl(cli_env, "schedule", "run", sched["id"])
    every = api.get(f"/v1/schedules/{sched['id']}/runs?limit=500").json()
    assert len(every) == 5

    def runs(*args: str) -> tuple[list[tuple[str, str]], str]:
        """The slots ``schedule runs`` printed (instant, export) and its stderr."""
        exe = Path(sys.executable).parent / "exportctl"
        proc = subprocess.run(
            [str(exe), "schedule", "runs", sched["id"], "--limit", "2", "--json", *args],
            env=cli_env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        return [(x["scheduled_at"], x["job_id"]) for x in json.loads(proc.stdout)], proc.stderr

    slots = [(x["scheduled_at"], x["job_id"]) for x in every]
    first, told = runs()
    assert first == slots[:2] and f"more: --before {slots[1][0]}" in told
    second, told = runs("--before", slots[1][0])
    assert second == slots[2:4] and f"more: --before {slots[3][0]}" in told
    last, told = runs("--before", slots[3][0])
    assert last == slots[4:] and "more:" not in told
    # --all: every page, one JSON array (the pages met at their boundaries, none lost)
    whole, told = runs("--all")
    assert whole == slots and "more:" not in told
