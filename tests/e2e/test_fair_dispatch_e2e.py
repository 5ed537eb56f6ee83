"""Fair dispatch on a real stack (docs/architecture.md INV-16): one tenant floods the bulk
queue, and another tenant's single bulk export still starts within about one bulk export's
run time.

Every bulk export is made to take about a second (the ``worker.before_finish`` failpoint
stalls each attempt), so a first-come-first-served queue would make tenant B wait behind all
of tenant A's 30. The bound is checked on the jobs' history timestamps, never on sleeps."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest

from devtools.api_client import bearer
from tests.e2e.conftest import E2E, exportctl, running_stack
from tests.support import wait_for

pytestmark = pytest.mark.e2e

FLOOD = 30
STALL_SECONDS = 1.0


@pytest.fixture(scope="module")
def fair(servers, template_db, notes_dir, tmp_path_factory) -> Iterator[tuple[E2E, str]]:
    """A stack with the default caps (bulk 1 per tenant, one bulk worker process) where
    every attempt stalls STALL_SECONDS before it finishes; yields it and tenant B's key."""
    base = tmp_path_factory.mktemp("fair")
    fault_file = base / "faults.json"
    fault_file.write_text(
        json.dumps(
            {"worker.before_finish": {"remaining": 10_000, "fault": f"sleep:{STALL_SECONDS}"}}
        )
    )
    env = {"EXPORTS_FAULTS_FILE": str(fault_file)}
    with running_stack(servers, template_db, notes_dir, base, env) as e:
        exportctl(e.stack.env, "tenant", "create", "victim-b")
        key_b = exportctl(e.stack.env, "apikey", "create", "victim-b", "--quiet").strip()
        exportctl(e.stack.env, "notes", "import", str(notes_dir), "--tenant", "victim-b")
        yield e, key_b


def history(e: E2E, job_id: Any) -> dict[str, datetime]:
    """The first time of each event kind of a job."""
    with e.db.connect() as conn:
        rows = conn.execute(
            "SELECT kind, min(at) AS at FROM export_job_events WHERE job_id = %s GROUP BY kind",
            (job_id,),
        ).fetchall()
    return {r["kind"]: r["at"] for r in rows}


def test_a_flooding_tenant_does_not_delay_anothers_first_bulk_export(fair) -> None:
    e, key_b = fair
    with httpx.Client(base_url=e.stack.api_url, timeout=30) as client:
        flood = []
        for _ in range(FLOOD):
            r = client.post("/v1/exports", json={"all": True}, headers=e.api.auth)
            assert r.status_code == 202, r.text
            flood.append(r.json()["id"])
        assert e.db.job(flood[0])["queue"] == "exports.bulk"
        # B comes once A's backlog is there and A's first export runs.
        wait_for(lambda: e.db.job(flood[0])["status"] != "queued", 30, "A's first export running")
        r = client.post("/v1/exports", json={"all": True}, headers=bearer(key_b))
        assert r.status_code == 202, r.text
        victim = r.json()["id"]
    assert e.db.wait_terminal(victim, timeout=60)["status"] == "succeeded"

    b = history(e, victim)
    pickup = (b["claimed"] - b["submitted"]).total_seconds()
    runs = []
    for job_id in flood:
        h = history(e, job_id)
        if "succeeded" in h:
            runs.append((h["succeeded"] - h["claimed"]).total_seconds())
    assert runs, "none of A's exports finished"
    bound = max(runs) + 1.0
    assert pickup <= bound, f"B waited {pickup:.2f} s (bound {bound:.2f} s)"
    # ... while most of A's flood was still waiting: B did not simply come after it.
    with e.db.connect() as conn:
        started_before_b = conn.execute(
            "SELECT count(DISTINCT job_id) AS n FROM export_job_events "
            "WHERE job_id = ANY(%s::uuid[]) AND kind = 'claimed' AND at < %s",
            (flood, b["claimed"]),
        ).fetchone()["n"]
    assert started_before_b <= 5, started_before_b


def test_tenant_a_never_had_more_than_its_cap_in_flight(fair) -> None:
    """From the history: A's running intervals (claimed to terminal) never overlap (the
    default bulk cap is 1), and the publisher reported held passes in its metrics."""
    e, _ = fair
    with e.db.connect() as conn:
        rows = conn.execute(
            """
            SELECT j.id,
                   min(ev.at) FILTER (WHERE ev.kind = 'claimed') AS started,
                   max(ev.at) FILTER (WHERE ev.kind IN ('succeeded', 'failed', 'cancelled'))
                       AS ended
            FROM export_jobs j JOIN export_job_events ev ON ev.job_id = j.id
            WHERE j.tenant_id = %s
            GROUP BY j.id
            """,
            (e.tenant,),
        ).fetchall()
    intervals = sorted(
        (r["started"], r["ended"] or datetime.max.replace(tzinfo=r["started"].tzinfo))
        for r in rows
        if r["started"] is not None
    )
    assert len(intervals) >= 2
    for (_, end), (start, _) in itertools.pairwise(intervals):
        assert start >= end, "two of A's bulk exports ran at once"
    metrics = httpx.get(e.stack.metrics_url("publisher"), timeout=10).text
    held = [
        line
        for line in metrics.splitlines()
        if line.startswith('exports_publisher_passes_total{outcome="held"}')
    ]
    assert held and float(held[0].split()[-1]) > 0, held
