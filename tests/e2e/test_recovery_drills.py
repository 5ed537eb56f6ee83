"""Failure drills on the real processes (gunicorn api, publisher, recovery-scanner, both
Celery workers): one job and one fault per drill; time moves by shifting that job's
timestamps, never by waiting for a real lease to expire."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from uuid import UUID

import httpx
import pytest

from exportcore import faults
from tests.e2e.conftest import E2E, failpoint_stack, moto_for
from tests.support import wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def drill(
    request, servers, template_db, notes_dir, tmp_path_factory, backend
) -> Iterator[tuple[E2E, Path]]:
    base = tmp_path_factory.mktemp(f"drills-{backend}")
    with failpoint_stack(
        servers, template_db, notes_dir, base, backend=backend, s3=moto_for(request, backend)
    ) as stack:
        yield stack


def kinds(e: E2E, job_id: str) -> list[str]:
    with e.connect() as conn:
        return [
            r["kind"]
            for r in conn.execute(
                "SELECT kind FROM export_job_events WHERE job_id = %s ORDER BY id", (job_id,)
            )
        ]


def submit(e: E2E, body: dict) -> str:
    r = httpx.post(f"{e.stack.api_url}/v1/exports", json=body, headers=e.auth, timeout=10)
    assert r.status_code == 202, r.text
    return r.json()["id"]


def published_files(e: E2E, job: dict) -> list[str]:
    """Keys of the job's complete artifacts, through the store API (file or S3)."""
    return sorted(a.key for a in e.store.entries(job["tenant_id"], job["id"]) if a.complete)


def test_sigkill_of_a_worker_child_mid_export_finishes_through_recovery(drill) -> None:
    e, fault_file = drill
    faults.arm(fault_file, "render.chunk", "sleep:60", times=1)
    job_id = submit(e, {"note_ids": e.note_ids(3)})
    first = wait_for(
        lambda: (r := e.job(job_id))["status"] == "running" and r, timeout=30, what="running"
    )
    wait_for(
        lambda: faults.remaining(fault_file, "render.chunk") == 0,
        timeout=30,
        what="the stalled chunk",
    )
    children = e.stack.procs["fast-worker"].children()
    assert children, "the fast-worker has no prefork children"
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    # The dead child never renews; make its lease run out now instead of waiting 5 s.
    with e.connect() as conn:
        conn.execute(
            "UPDATE export_jobs SET lease_expires_at = now() - interval '1 second' WHERE id = %s",
            (job_id,),
        )
    done = e.wait_terminal(job_id, 30)
    assert done["status"] == "succeeded" and done["attempts"] == 2
    assert done["lease_token"] != first["lease_token"]
    assert published_files(e, done) == [done["result_ref"]]
    history = kinds(e, job_id)
    assert history.count("claimed") == 2 and history.count("succeeded") == 1
    assert "lease_expired" in history


def test_cancel_while_running(drill) -> None:
    e, fault_file = drill
    faults.arm(fault_file, "render.chunk", "sleep:4", times=1)
    job_id = submit(e, {"note_ids": e.note_ids(3)})
    wait_for(lambda: e.job(job_id)["status"] == "running", timeout=30, what="running")
    r = httpx.post(f"{e.stack.api_url}/v1/exports/{job_id}/cancel", headers=e.auth, timeout=10)
    assert r.status_code == 202 and r.json()["status"] == "running" and r.json()["cancel_requested"]
    done = e.wait_terminal(job_id, 30)
    assert done["status"] == "cancelled" and done["result_ref"] is None
    assert published_files(e, done) == []
    assert kinds(e, job_id)[-1] == "cancelled"


def test_transient_error_twice_then_success(drill) -> None:
    e, fault_file = drill
    faults.arm(fault_file, "render.chunk", "io", times=2)
    job_id = submit(e, {"note_ids": e.note_ids(4), "format": "ndjson"})
    done = e.wait_terminal(job_id, 30)
    assert (done["status"], done["attempts"]) == ("succeeded", 3)
    assert published_files(e, done) == [done["result_ref"]]
    assert kinds(e, job_id).count("retried") == 2


def test_permanent_error_then_replay(drill) -> None:
    e, fault_file = drill
    faults.arm(fault_file, "render.chunk", "permanent", times=1)
    job_id = submit(e, {"note_ids": e.note_ids(2)})
    failed = e.wait_terminal(job_id, 30)
    assert (failed["status"], failed["attempts"], failed["error_code"]) == (
        "failed",
        1,
        "injected_permanent",
    )
    page = httpx.get(f"{e.stack.api_url}/v1/admin/dead-letters", headers=e.admin, timeout=10).json()
    assert job_id in [d["job_id"] for d in page["items"]]
    r = httpx.post(
        f"{e.stack.api_url}/v1/admin/exports/{job_id}/replay", headers=e.admin, timeout=10
    )
    assert r.status_code == 202
    replay = e.wait_terminal(r.json()["id"], 30)
    assert replay["status"] == "succeeded" and replay["replay_of"] == UUID(job_id)
    assert e.job(job_id)["status"] == "failed"


def test_failure_before_claim_is_redispatched_by_the_scanner(drill) -> None:
    e, fault_file = drill
    faults.arm(fault_file, "worker.before_claim", "db", times=1)
    job_id = submit(e, {"note_ids": e.note_ids(1)})
    wait_for(
        lambda: faults.remaining(fault_file, "worker.before_claim") == 0,
        timeout=30,
        what="the failed delivery",
    )
    wait_for(lambda: e.job(job_id)["dispatch_count"] == 1, timeout=30, what="the dispatch mark")
    row = e.job(job_id)
    assert row["status"] == "queued" and row["attempts"] == 0
    # The message is gone; a minute passes for this job only.
    with e.connect() as conn:
        conn.execute(
            "UPDATE export_jobs SET last_dispatched_at = now() - interval '2 minutes',"
            " created_at = now() - interval '2 minutes' WHERE id = %s",
            (job_id,),
        )
    done = e.wait_terminal(job_id, 30)
    assert (done["status"], done["attempts"], done["dispatch_count"]) == ("succeeded", 1, 2)
    assert "redispatched" in kinds(e, job_id)
