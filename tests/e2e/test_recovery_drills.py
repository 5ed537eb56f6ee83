"""Failure paths on the real processes (gunicorn api, publisher, recovery-scanner, both
Celery workers), on both artifact stores: one job and one fault per test; time moves by
shifting that job's timestamps, never by waiting. The drills of devtools/drills cover the
rest (a SIGKILL mid-export, a cancel while running, a failure before the claim run there on
both stores too: tests/drills)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from uuid import UUID

import httpx
import pytest

from exportcore import faults
from tests.e2e.conftest import E2E, failpoint_stack, moto_for

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


def published_files(e: E2E, job: dict) -> list[str]:
    """Keys of the job's complete artifacts, through the store API (file or S3)."""
    return sorted(a.key for a in e.store.entries(job["tenant_id"], job["id"]) if a.complete)


def test_transient_error_twice_then_success(drill) -> None:
    e, fault_file = drill
    faults.arm(fault_file, "render.chunk", "io", times=2)
    job_id = e.api.submit_ok({"note_ids": e.note_ids(4), "format": "ndjson"})
    done = e.db.wait_terminal(job_id, 30)
    assert (done["status"], done["attempts"]) == ("succeeded", 3)
    assert published_files(e, done) == [done["result_ref"]]
    assert e.db.kinds(job_id).count("retried") == 2


def test_permanent_error_then_replay(drill) -> None:
    e, fault_file = drill
    faults.arm(fault_file, "render.chunk", "permanent", times=1)
    job_id = e.api.submit_ok({"note_ids": e.note_ids(2)})
    failed = e.db.wait_terminal(job_id, 30)
    assert (failed["status"], failed["attempts"], failed["error_code"]) == (
        "failed",
        1,
        "injected_permanent",
    )
    page = httpx.get(
        f"{e.stack.api_url}/v1/admin/dead-letters", headers=e.api.admin, timeout=10
    ).json()
    assert job_id in [d["job_id"] for d in page["items"]]
    r = httpx.post(
        f"{e.stack.api_url}/v1/admin/exports/{job_id}/replay", headers=e.api.admin, timeout=10
    )
    assert r.status_code == 202
    replay = e.db.wait_terminal(r.json()["id"], 30)
    assert replay["status"] == "succeeded" and replay["replay_of"] == UUID(job_id)
    assert e.db.job(job_id)["status"] == "failed"
