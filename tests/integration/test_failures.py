"""Retries with cause/wait/budget/limit, cancellation, dead letters and replay, with the
job protocol running in-process against real PostgreSQL (failpoints inject the faults)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path
from uuid import uuid4

from exportcore import faults
from exportcore.artifacts import FileArtifactStore
from exportcore.runner import JobRunner
from exportcore.settings import Settings
from tests.support import assert_attempts_exhausted, count, events, job, kinds, shift_job, submit


def published(settings: Settings) -> list[Path]:
    return sorted(
        p for p in settings.artifact_dir.rglob("*") if p.is_file() and not p.name.endswith(".tmp")
    )


def run_until_terminal(runner: JobRunner, pool, job_id, limit: int = 10) -> list[str]:
    """Deliver the job's message again and again, skipping each backoff by moving time."""
    results = []
    for _ in range(limit):
        results.append(runner.run(job_id, uuid4()).result)
        if job(pool, job_id)["status"] in ("succeeded", "failed", "cancelled"):
            return results
        shift_job(pool, job_id, next_attempt_at="-1 hour")
    raise AssertionError(f"not terminal after {limit} deliveries: {results}")


def test_transient_error_twice_then_success(pool, settings, runner, tenant, failpoints) -> None:
    tid, ids = tenant
    job_id = submit(pool, settings, tid, ids[:4])["id"]
    faults.arm(failpoints, "render.chunk", "io", times=2)
    assert run_until_terminal(runner, pool, job_id) == ["retry", "retry", "succeeded"]
    row = job(pool, job_id)
    assert (row["status"], row["attempts"]) == ("succeeded", 3)
    assert [p.relative_to(settings.artifact_dir).as_posix() for p in published(settings)] == [
        row["result_ref"]
    ]
    retried = [e for e in events(pool, job_id) if e["kind"] == "retried"]
    assert [e["detail"]["error_code"] for e in retried] == ["storage_io_error"] * 2
    assert all(e["detail"]["next_attempt_at"] for e in retried)
    with pool.connection() as conn:
        reasons = [
            r["reason"]
            for r in conn.execute(
                "SELECT reason FROM export_outbox WHERE job_id = %s ORDER BY created_at", (job_id,)
            )
        ]
    assert reasons == ["submit", "retry", "retry"]


def test_retry_waits_with_backoff_and_never_past_the_deadline(
    pool, settings, runner, tenant, failpoints
) -> None:
    tid, ids = tenant
    job_id = submit(pool, settings, tid, ids[:1])["id"]
    shift_job(pool, job_id, deadline_at="-3595 seconds")  # 5 s left
    slow = JobRunner(
        settings.model_copy(update={"retry_base_seconds": 600, "retry_cap_seconds": 600}),
        pool,
        runner.store,
    )
    faults.arm(failpoints, "render.chunk", "io", times=1)
    assert slow.run(job_id, uuid4()).result == "retry"
    row = job(pool, job_id)
    assert row["next_attempt_at"] <= row["deadline_at"] - timedelta(seconds=1)
    assert slow.run(job_id, uuid4()).reason == "not_due"  # early message: refused, no attempt
    assert job(pool, job_id)["attempts"] == 1


def test_transient_error_without_budget_fails_with_dead_letter(
    pool, settings, runner, tenant, failpoints
) -> None:
    tid, ids = tenant
    job_id = submit(pool, settings, tid, ids[:1])["id"]
    faults.arm(failpoints, "render.chunk", "db", times=5)
    assert run_until_terminal(runner, pool, job_id) == ["retry", "retry", "failed"]
    dead = assert_attempts_exhausted(pool, job_id, attempts=3)
    assert dead["reason"] == "attempts_exhausted" and "database_unavailable" in dead["detail"]
    assert published(settings) == []


def test_permanent_error_fails_at_first_attempt(pool, settings, runner, tenant) -> None:
    """A real permanent fault: the job's snapshot lost rows, so it can never render."""
    tid, ids = tenant
    job_id = submit(pool, settings, tid, ids[:3])["id"]
    with pool.connection() as conn:
        conn.execute("DELETE FROM export_job_items WHERE job_id = %s AND ordinal = 2", (job_id,))
    outcome = runner.run(job_id, uuid4())
    assert (outcome.result, outcome.reason) == ("failed", "invalid_snapshot")
    row = job(pool, job_id)
    assert (row["status"], row["attempts"], row["error_code"]) == ("failed", 1, "invalid_snapshot")
    assert kinds(pool, job_id)[-2:] == ["failed", "dead_lettered"]
    assert published(settings) == [] and list(settings.artifact_dir.rglob("*.tmp")) == []


def test_unknown_errors_consume_attempts(
    pool, settings, runner, tenant, failpoints, monkeypatch
) -> None:
    tid, ids = tenant
    job_id = submit(pool, settings, tid, ids[:1])["id"]

    def boom(*a, **k):
        raise RuntimeError("a bug")

    monkeypatch.setattr("exportcore.runner.make_renderer", boom)
    assert run_until_terminal(runner, pool, job_id) == ["retry", "retry", "failed"]
    assert job(pool, job_id)["error_code"] == "attempts_exhausted"


def test_long_chunk_keeps_its_lease_through_the_renewal_thread(
    pool, settings, tenant, failpoints
) -> None:
    """One chunk stalls longer than the whole lease; the lease renewal thread renews it."""
    tid, ids = tenant
    job_id = submit(pool, settings, tid, ids[:3])["id"]
    short = settings.model_copy(update={"lease_seconds": 1.5})
    faults.arm(failpoints, "render.chunk", "sleep:3", times=1)
    outcome = JobRunner(short, pool, FileArtifactStore(settings.artifact_dir)).run(job_id, uuid4())
    assert outcome.result == "succeeded"
    assert kinds(pool, job_id).count("renewed") >= 2


def test_cancel_while_queued_is_immediate_and_terminal_is_409(api, pool, runner, tenant) -> None:
    client, auth, _ = api
    _, ids = tenant
    job_id = client.post("/v1/exports", json={"note_ids": ids[:1]}, headers=auth).json()["id"]
    r = client.post(f"/v1/exports/{job_id}/cancel", headers=auth)
    assert (
        r.status_code == 202 and r.json()["status"] == "cancelled" and r.json()["cancel_requested"]
    )
    assert kinds(pool, job_id)[-2:] == ["cancel_requested", "cancelled"]
    assert runner.run(job_id, uuid4()).reason == "terminal"
    again = client.post(f"/v1/exports/{job_id}/cancel", headers=auth)
    assert again.status_code == 409 and again.json()["type"].endswith("/job_state_conflict")
    assert again.json()["detail"] == (
        f"export {job_id} was already cancelled; only a queued or running export can be cancelled"
    )
    assert client.post(f"/v1/exports/{uuid4()}/cancel", headers=auth).status_code == 404


def test_cancel_while_running_stops_the_worker_and_publishes_nothing(
    api, pool, settings, tenant, failpoints
) -> None:
    client, auth, _ = api
    _, ids = tenant
    job_id = client.post("/v1/exports", json={"note_ids": ids[:5]}, headers=auth).json()["id"]
    short = settings.model_copy(update={"lease_seconds": 1.5, "render_chunk_size": 1})
    faults.arm(failpoints, "render.chunk", "sleep:1.5", times=1)
    result: list[str] = []
    worker = threading.Thread(
        target=lambda: result.append(
            JobRunner(short, pool, FileArtifactStore(settings.artifact_dir))
            .run(job_id, uuid4())
            .result
        )
    )
    worker.start()
    deadline = time.monotonic() + 10
    while job(pool, job_id)["status"] != "running":
        assert time.monotonic() < deadline, "the worker never claimed the job"
    r = client.post(f"/v1/exports/{job_id}/cancel", headers=auth)
    assert r.status_code == 202
    assert (
        r.json()["status"] == "running" and r.json()["cancel_requested"] is True
    )  # not yet cancelled
    worker.join()
    assert result == ["cancelled"]
    row = job(pool, job_id)
    assert row["status"] == "cancelled" and row["result_ref"] is None
    assert published(settings) == [] and list(settings.artifact_dir.rglob("*.tmp")) == []
    assert kinds(pool, job_id)[-1] == "cancelled"


def test_dead_letters_and_replay(api, pool, settings, runner, tenant) -> None:
    client, auth, admin = api
    tid, ids = tenant
    failed_id = submit(pool, settings, tid, ids[:3])["id"]
    with pool.connection() as conn:
        conn.execute("DELETE FROM export_job_items WHERE job_id = %s AND ordinal = 3", (failed_id,))
    runner.run(failed_id, uuid4())
    done_id = submit(pool, settings, tid, ids[:1])["id"]
    runner.run(done_id, uuid4())

    assert client.get("/v1/admin/dead-letters", headers=auth).status_code == 403
    page = client.get("/v1/admin/dead-letters", headers=admin).json()
    assert [d["job_id"] for d in page["items"]] == [str(failed_id)]
    assert (
        page["items"][0]["reason"] == "invalid_snapshot" and page["items"][0]["replayed_by"] is None
    )
    assert client.get("/v1/admin/dead-letters?reason=other", headers=admin).json()["items"] == []

    done = client.post(f"/v1/admin/exports/{done_id}/replay", headers=admin)
    assert done.status_code == 409
    assert f"export {done_id} has succeeded; only failed exports" in done.json()["detail"]
    finished = client.post(f"/v1/exports/{done_id}/cancel", headers=auth)
    assert "has already succeeded" in finished.json()["detail"], finished.text
    assert "is already succeeded" not in finished.text
    assert client.post(f"/v1/admin/exports/{failed_id}/replay", headers=auth).status_code == 403
    r = client.post(f"/v1/admin/exports/{failed_id}/replay", headers=admin)
    assert r.status_code == 202, r.text
    replay = r.json()
    assert replay["replay_of"] == str(failed_id) and replay["status"] == "queued"
    # the replay copies the (damaged) snapshot as it is: it is the same work, done again
    assert count(pool, "SELECT count(*) FROM export_job_items WHERE job_id = %s", replay["id"]) == 2
    original = job(pool, failed_id)
    assert original["status"] == "failed" and original["error_code"] == "invalid_snapshot"
    assert count(pool, "SELECT count(*) FROM export_dead_letters WHERE job_id = %s", failed_id) == 1
    assert kinds(pool, failed_id)[-1] == "replayed"
    assert (
        client.get("/v1/admin/dead-letters", headers=admin).json()["items"][0]["replayed_by"]
        == replay["id"]
    )


def test_replay_of_a_repaired_failure_succeeds(pool, settings, runner, tenant, failpoints) -> None:
    from exportcore.replays import replay_export

    tid, ids = tenant
    job_id = submit(pool, settings, tid, ids[:2])["id"]
    faults.arm(failpoints, "render.chunk", "permanent", times=1)
    assert runner.run(job_id, uuid4()).result == "failed"
    new = replay_export(pool, settings, original_id=job_id).job
    assert runner.run(new["id"], uuid4()).result == "succeeded"
    assert job(pool, job_id)["status"] == "failed"
    assert job(pool, new["id"])["replay_of"] == job_id


def test_dead_letter_pagination(api, pool, settings, runner, tenant, failpoints) -> None:
    client, _, admin = api
    tid, ids = tenant
    faults.arm(failpoints, "render.chunk", "permanent", times=5)
    failed = []
    for _ in range(5):
        job_id = submit(pool, settings, tid, ids[:1])["id"]
        runner.run(job_id, uuid4())
        failed.append(str(job_id))
    seen, cursor = [], None
    while True:
        url = "/v1/admin/dead-letters?limit=2" + (f"&cursor={cursor}" if cursor else "")
        page = client.get(url, headers=admin).json()
        seen += [d["job_id"] for d in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == failed[::-1]
