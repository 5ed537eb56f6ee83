"""Replay once (docs/architecture.md, "Dead letters"): a failed job has at most one active
replay, a second ask answers with it, concurrent asks write one, a failed replay chains;
dead letters carry a state (open / replayed / resolved, who and when) and a bulk replay per
reason is itself idempotent. Real PostgreSQL; the job protocol runs in-process (failpoints
fail the jobs). The same races over HTTP against the real gunicorn api are in
tests/e2e/test_operations.py."""

from __future__ import annotations

import threading
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest

from exportcore import faults
from exportcore.admission import CapacityExceeded
from exportcore.bulk import replay_dead_letters
from exportcore.cancel import request_cancel
from exportcore.domain import JobStateConflict
from exportcore.replays import Correction, replay_export
from exportcore.store import jobs as job_store
from tests.support import count, events, job, submit


@pytest.fixture
def fail(pool, settings, runner, failpoints, tenant):
    """Run a job (a new one, or ``job_id``) so that it fails permanently; returns its id."""

    def run_failed(job_id: UUID | None = None, reason: str = "permanent") -> UUID:
        tid, ids = tenant
        job_id = job_id or submit(pool, settings, tid, ids[:1])["id"]
        faults.arm(failpoints, "render.chunk", reason, times=1)
        assert runner.run(job_id, uuid4()).result == "failed"
        return job_id

    return run_failed


def replays_of(pool, job_id: Any) -> list[dict[str, Any]]:
    with pool.connection() as conn:
        return conn.execute(
            "SELECT * FROM export_jobs WHERE replay_of = %s ORDER BY created_at", (job_id,)
        ).fetchall()


def dead_letter(pool, job_id: Any) -> dict[str, Any]:
    with pool.connection() as conn:
        row = conn.execute("SELECT * FROM export_dead_letters WHERE job_id = %s", (job_id,))
        found = row.fetchone()
    assert found is not None, f"no dead letter for {job_id}"
    return found


def test_a_second_replay_answers_with_the_first(api, pool, fail) -> None:
    client, _, admin = api
    failed = fail()
    first = client.post(f"/v1/admin/exports/{failed}/replay", headers=admin)
    assert first.status_code == 202, first.text
    assert "idempotent-replayed" not in first.headers
    again = client.post(f"/v1/admin/exports/{failed}/replay", headers=admin)
    assert again.status_code == 200, again.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["location"] == first.headers["location"]
    assert [r["id"] for r in replays_of(pool, failed)] == [UUID(first.json()["id"])]
    # one 'replayed' event on the original: the second ask wrote nothing
    assert [e["kind"] for e in events(pool, failed)].count("replayed") == 1
    dl = dead_letter(pool, failed)
    assert dl["state"] == "replayed" and dl["replay_job_id"] == UUID(first.json()["id"])
    assert dl["replayed_by"] == f"{admin['X-Prefix']} (alice)" and dl["replayed_at"] is not None


def test_concurrent_replays_write_one_job(pool, settings, fail) -> None:
    failed = fail()
    barrier = threading.Barrier(10)
    results: list[Any] = []
    errors: list[BaseException] = []

    def ask() -> None:
        barrier.wait()
        try:
            results.append(replay_export(pool, settings, original_id=failed, actor="race"))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=ask) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sum(r.created for r in results) == 1
    assert len({r.job["id"] for r in results}) == 1
    assert len(replays_of(pool, failed)) == 1
    assert count(pool, "SELECT count(*) FROM export_outbox WHERE reason = 'replay'") == 1


def test_a_failed_replay_chains_and_a_succeeded_one_answers(
    api, pool, settings, runner, fail
) -> None:
    client, _, admin = api
    original = fail()
    first = UUID(client.post(f"/v1/admin/exports/{original}/replay", headers=admin).json()["id"])
    fail(first)  # the replay fails too: it has its own open dead letter
    assert dead_letter(pool, first)["state"] == "open"
    # asking for the original again follows the chain: a replay of the failed replay
    r = client.post(f"/v1/admin/exports/{original}/replay", headers=admin)
    assert r.status_code == 202, r.text
    second = UUID(r.json()["id"])
    assert r.json()["replay_of"] == str(first)
    assert job(pool, second)["replay_of"] == first
    assert dead_letter(pool, first)["state"] == "replayed"
    assert dead_letter(pool, first)["replay_job_id"] == second
    assert dead_letter(pool, original)["replay_job_id"] == first  # its own replay, kept
    assert runner.run(second, uuid4()).result == "succeeded"
    # after success the effect happened: both the original and the failed replay answer
    # with the succeeded replay, nothing new is written
    for asked in (original, first):
        again = client.post(f"/v1/admin/exports/{asked}/replay", headers=admin)
        assert again.status_code == 200 and again.json()["id"] == str(second)
        assert again.json()["status"] == "succeeded"
    assert count(pool, "SELECT count(*) FROM export_jobs WHERE replay_of IS NOT NULL") == 2


def test_a_cancelled_replay_does_not_count(pool, settings, fail) -> None:
    failed = fail()
    first = replay_export(pool, settings, original_id=failed, actor="t").job
    cancelled = request_cancel(pool, tenant_id=first["tenant_id"], job_id=first["id"])
    assert cancelled["status"] == "cancelled"
    again = replay_export(pool, settings, original_id=failed, actor="t")
    assert again.created and again.job["replay_of"] == failed
    assert len(replays_of(pool, failed)) == 2


def test_only_failed_jobs_replay_and_admission_refusals_write_nothing(
    pool, settings, tenant, fail
) -> None:
    tid, ids = tenant
    queued = submit(pool, settings, tid, ids[:1])["id"]
    with pytest.raises(JobStateConflict, match="only failed exports"):
        replay_export(pool, settings, original_id=queued)
    failed = fail()
    full = settings.model_copy(update={"admission_capacity": 1})  # `queued` holds the place
    with pytest.raises(CapacityExceeded):
        replay_export(pool, full, original_id=failed)
    assert replays_of(pool, failed) == [] and dead_letter(pool, failed)["state"] == "open"


def test_the_unique_index_forbids_a_second_active_replay(pool, settings, fail) -> None:
    """The durable guard, whatever path writes: a second queued job replaying one job."""
    failed = fail()
    first = replay_export(pool, settings, original_id=failed).job
    with pool.connection() as conn, pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute(
            "INSERT INTO export_jobs (id, tenant_id, queue, format, payload, note_count,"
            " request_hash, max_attempts, deadline_at, replay_of)"
            " SELECT %s, tenant_id, queue, format, payload, note_count, request_hash,"
            " max_attempts, deadline_at, replay_of FROM export_jobs WHERE id = %s",
            (uuid4(), first["id"]),
        )


def test_dead_letter_states_filter_and_resolve(api, pool, fail) -> None:
    client, auth, admin = api
    replayed, resolved, untouched = fail(), fail(), fail()
    client.post(f"/v1/admin/exports/{replayed}/replay", headers=admin)
    dl_id = dead_letter(pool, resolved)["id"]
    r = client.post(
        f"/v1/admin/dead-letters/{dl_id}/resolve",
        json={"note": "customer re-submitted"},
        headers=admin,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["state"] == "resolved" and body["resolution_note"] == "customer re-submitted"
    assert body["resolved_by"] == f"{admin['X-Prefix']} (alice)" and body["resolved_at"]
    again = client.post(f"/v1/admin/dead-letters/{dl_id}/resolve", headers=admin)
    assert again.status_code == 409 and again.json()["resolved_by"] == body["resolved_by"]
    assert client.post("/v1/admin/dead-letters/999999/resolve", headers=admin).status_code == 404
    assert client.post(f"/v1/admin/dead-letters/{dl_id}/resolve", headers=auth).status_code == 403

    def listed(**params: str) -> list[str]:
        page = client.get("/v1/admin/dead-letters", params=params, headers=admin)
        assert page.status_code == 200, page.text
        return [d["job_id"] for d in page.json()["items"]]

    assert listed(state="open") == [str(untouched)]
    assert listed(state="replayed") == [str(replayed)]
    assert listed(state="resolved") == [str(resolved)]
    assert listed(state="resolved", reason="injected_permanent") == [str(resolved)]
    assert listed(state="open", reason="attempts_exhausted") == []
    assert listed(reason="injected_permanent") == [str(untouched), str(resolved), str(replayed)]
    item = client.get("/v1/admin/dead-letters", params={"state": "replayed"}, headers=admin)
    [d] = item.json()["items"]
    assert d["replay_status"] == "queued" and d["replay_requested_by"].endswith("(alice)")
    one = client.get(f"/v1/admin/dead-letters/{dl_id}", headers=admin).json()
    assert one["state"] == "resolved"
    bad = client.get("/v1/admin/dead-letters", params={"state": "lost"}, headers=admin)
    assert bad.status_code == 422


def test_bulk_replay_is_idempotent_sequentially_and_concurrently(api, pool, settings, fail) -> None:
    client, _, admin = api
    failed = [fail() for _ in range(4)]
    other_reason = fail(reason="permanent")
    with pool.connection() as conn:  # one of them under another reason
        conn.execute(
            "UPDATE export_dead_letters SET reason = 'storage_misconfigured' WHERE job_id = %s",
            (other_reason,),
        )
    resolved = failed.pop()
    client.post(
        f"/v1/admin/dead-letters/{dead_letter(pool, resolved)['id']}/resolve", headers=admin
    )
    r = client.post("/v1/admin/replays", json={"reason": "injected_permanent"}, headers=admin)
    assert r.status_code == 200, r.text
    body = r.json()
    assert sorted(i["job_id"] for i in body["created"]) == sorted(str(f) for f in failed)
    assert body["existing"] == [] and body["refused"] is None and body["more"] is False
    again = client.post(
        "/v1/admin/replays", json={"reason": "injected_permanent"}, headers=admin
    ).json()
    assert again["created"] == [] and again["existing"] == []  # none is open any more
    for f in failed:
        assert len(replays_of(pool, f)) == 1
    assert replays_of(pool, resolved) == [] and replays_of(pool, other_reason) == []

    # two runs at once over fresh dead letters: one replay each
    fresh = [fail() for _ in range(5)]
    barrier = threading.Barrier(2)
    runs: list[Any] = []

    def run() -> None:
        barrier.wait()
        runs.append(replay_dead_letters(pool, settings, reason="injected_permanent", actor="bulk"))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    created = [i["job_id"] for run_ in runs for i in run_.created]
    assert sorted(created) == sorted(fresh)  # each written once, by one of the two runs
    for f in fresh:
        assert len(replays_of(pool, f)) == 1


def test_bulk_replay_stops_at_the_first_admission_refusal(pool, settings, fail) -> None:
    failed = [fail() for _ in range(3)]
    room = settings.model_copy(update={"admission_capacity": 1})
    result = replay_dead_letters(pool, room, reason="injected_permanent", actor="x")
    assert [i["job_id"] for i in result.created] == [failed[0]]
    assert result.refused is not None and result.refused["code"] == "capacity_exceeded"
    assert result.refused["job_id"] == failed[1] and result.more is True
    assert [dead_letter(pool, f)["state"] for f in failed] == ["replayed", "open", "open"]


def test_bulk_replay_validates_its_body(api) -> None:
    client, auth, admin = api
    url = "/v1/admin/replays"
    assert client.post(url, json={"reason": "x"}, headers=auth).status_code == 403
    for body in ({}, {"reason": "Not A Code"}, {"reason": "x", "limit": 0}, {"reason": None}):
        r = client.post(url, json=body, headers=admin)
        assert r.status_code == 422 and r.headers["content-type"].startswith(
            "application/problem+json"
        ), body


def test_a_corrected_redrive_takes_a_new_snapshot_and_keeps_replay_of(
    api, pool, settings, fail, tenant, runner
) -> None:
    """A job that failed on its input is replayed with a corrected format and selection:
    a new job with a new snapshot of the notes as they are now (not the failed job's),
    replay_of the failed one, over the API with an Idempotency-Key as for any submit."""
    client, _, admin = api
    tid, ids = tenant
    failed = fail(submit(pool, settings, tid, ids[:1])["id"])
    with pool.connection() as conn:  # the note changes after the failed job's snapshot
        conn.execute("UPDATE notes SET title = 'corrected title' WHERE id = %s", (ids[1],))
    body = {"format": "ndjson", "note_ids": [ids[1], ids[2]]}
    key = {"Idempotency-Key": '"redrive-1"'}
    first = client.post(f"/v1/admin/exports/{failed}/replay", json=body, headers={**admin, **key})
    assert first.status_code == 202, first.text
    replay = first.json()
    assert replay["replay_of"] == str(failed) and replay["format"] == "ndjson"
    assert replay["note_count"] == 2 and replay["status"] == "queued"
    with pool.connection() as conn:
        snapshot = job_store.job_items_chunk(
            conn, job_id=replay["id"], after=0, limit=100, max_bytes=1 << 20
        )
        original = conn.execute(
            "SELECT request_hash, payload FROM export_jobs WHERE id = %s", (failed,)
        ).fetchone()
        new = conn.execute(
            "SELECT request_hash, payload FROM export_jobs WHERE id = %s", (replay["id"],)
        ).fetchone()
    assert [r["note_id"] for r in snapshot] == sorted([ids[1], ids[2]])
    assert snapshot[0]["title"] == "corrected title"  # taken now, not copied
    assert new["request_hash"] != original["request_hash"]
    assert new["payload"]["format"] == "ndjson"
    [submitted] = [e for e in events(pool, replay["id"]) if e["kind"] == "submitted"]
    assert submitted["detail"]["source"] == "replay" and submitted["detail"]["snapshot"] == "new"
    assert submitted["detail"]["corrected"] == ["format", "selection"]
    [replayed] = [e for e in events(pool, failed) if e["kind"] == "replayed"]
    assert replayed["detail"] == {"replayed_by": replay["id"], "corrected": ["format", "selection"]}
    assert dead_letter(pool, failed)["state"] == "replayed"
    assert submitted["detail"]["requested_by"] == "operator"
    with pool.connection() as conn:  # audited as every replay, with what was corrected
        [audited] = conn.execute(
            "SELECT outcome, detail FROM operator_actions WHERE action = 'replay' AND job_id = %s",
            (failed,),
        ).fetchall()
    assert audited["outcome"] == "done"
    assert audited["detail"] == {"replay_id": replay["id"], "corrected": ["format", "selection"]}
    # the same key and correction: the same replay, nothing new; the same correction without
    # the key: the active replay answers too (one effect); another correction: a conflict
    again = client.post(f"/v1/admin/exports/{failed}/replay", json=body, headers={**admin, **key})
    assert again.status_code == 200 and again.json()["id"] == replay["id"]
    assert (
        client.post(f"/v1/admin/exports/{failed}/replay", json=body, headers=admin).json()["id"]
        == replay["id"]
    )
    other = client.post(
        f"/v1/admin/exports/{failed}/replay", json={"format": "json"}, headers=admin
    )
    assert other.status_code == 409 and "another request" in other.json()["detail"]
    assert [r["id"] for r in replays_of(pool, failed)] == [UUID(replay["id"])]
    # the corrected job runs like any export
    assert runner.run(UUID(replay["id"]), uuid4()).result == "succeeded"


def test_a_corrected_selection_is_validated_like_a_submit(api, pool, settings, fail) -> None:
    client, _, admin = api
    failed = fail()
    for body, status in (
        ({"note_ids": [999_999_999]}, 422),
        ({"note_ids": [1], "all": True}, 422),
        ({"format": "pdf"}, 422),
        ({"note_ids": ["1"]}, 422),
        ({"unknown": 1}, 422),
    ):
        r = client.post(f"/v1/admin/exports/{failed}/replay", json=body, headers=admin)
        assert r.status_code == status, (body, r.text)
    assert replays_of(pool, failed) == []  # nothing written by a refused correction
    assert dead_letter(pool, failed)["state"] == "open"
    # a corrected replay passes admission as any submit does
    capped = settings.model_copy(update={"admission_capacity": 0})
    with pytest.raises(CapacityExceeded):
        replay_export(
            pool,
            capped,
            original_id=failed,
            correction=Correction(select_all=True),
        )
    assert replays_of(pool, failed) == []
