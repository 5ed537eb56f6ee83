"""The HTTP API in-process (FastAPI TestClient) against real PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

import pytest
from fastapi.testclient import TestClient

from exportcore.artifacts import FileArtifactStore
from exportcore.auth import create_api_key
from exportcore.runner import JobRunner
from exportcore.settings import Settings
from exportcore.store import jobs as job_store
from services.api.app import create_app
from tests.support import count, tenant_with_notes

PROBLEM = "application/problem+json"


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c


@pytest.fixture
def tenant(pool, notes_dir: Path) -> tuple[str, list[int], dict[str, str]]:
    tid, ids = tenant_with_notes(pool, notes_dir)
    with pool.connection() as conn:
        key, _ = create_api_key(conn, tenant_id=tid, scopes=["exports:read", "exports:write"])
    return tid, ids, {"Authorization": f"Bearer {key}"}


def test_submit_answers_202_with_location_after_commit(client, pool, tenant) -> None:
    _, ids, auth = tenant
    r = client.post("/v1/exports", json={"note_ids": ids[:2], "format": "ndjson"}, headers=auth)
    assert r.status_code == 202, r.text
    body = r.json()
    assert r.headers["location"] == f"/v1/exports/{body['id']}" == body["links"]["self"]
    assert (
        body["status"] == "queued" and body["queue"] == "exports.fast" and body["note_count"] == 2
    )
    assert count(pool, "SELECT count(*) FROM export_outbox WHERE job_id = %s", body["id"]) == 1
    status = client.get(body["links"]["self"], headers=auth)
    assert status.status_code == 200 and status.json()["id"] == body["id"]


@pytest.mark.parametrize(
    ("payload", "status", "code"),
    [
        ({"note_ids": []}, 422, "invalid_request"),
        ({}, 422, "invalid_selection"),
        ({"all": True, "note_ids": [1]}, 422, "invalid_selection"),
        ({"all": True, "format": "pdf"}, 422, "invalid_request"),
        ({"note_ids": ["1"]}, 422, "invalid_request"),
        ({"all": "true"}, 422, "invalid_request"),
        ({"all": True, "extra": 1}, 422, "invalid_request"),
    ],
)
def test_bad_requests_are_problems_and_write_nothing(
    client, pool, tenant, payload, status, code
) -> None:
    _, _, auth = tenant
    r = client.post("/v1/exports", json=payload, headers=auth)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    assert r.json()["type"].endswith("/" + code) and r.json()["status"] == status
    assert count(pool, "SELECT count(*) FROM export_jobs") == 0


@pytest.mark.parametrize(
    ("method", "path", "payload", "detail"),
    [
        (
            "POST",
            "/v1/exports",
            {"all": True, "format": "csv"},
            "format must be one of json, ndjson or markdown_zip, not 'csv'",
        ),
        (
            "POST",
            "/v1/exports",
            {"note_ids": []},
            'note_ids must not be empty: give at least one note id, or "all": true',
        ),
        ("GET", "/v1/exports/abc", None, "job_id in the path must be a UUID, not 'abc'"),
        (
            "POST",
            "/v1/exports",
            {"note_ids": ["1"], "all": "true"},
            "note_ids[0] must be an integer (a number, not a string); all must be true or "
            "false (a boolean, not a string)",
        ),
        ("GET", "/v1/exports?limit=0", None, "limit in the query must be at least 1"),
    ],
)
def test_a_refused_request_says_in_words_what_to_fix(
    client, tenant, method, path, payload, detail
) -> None:
    _, _, auth = tenant
    r = client.request(method, path, json=payload, headers=auth)
    assert r.status_code == 422 and r.headers["content-type"].startswith(PROBLEM), r.text
    problem = r.json()
    assert problem["type"].endswith("/invalid_request") and problem["detail"] == detail
    # each error says the same in its msg, with its loc and pydantic's type for programs
    assert "; ".join(e["msg"] for e in problem["errors"]) == detail
    assert all(e["loc"] and e["type"] for e in problem["errors"])
    for pydantic_words in ("Input should", "List should", "valid dictionary", "after validation"):
        assert pydantic_words not in r.text


def test_a_cut_list_of_unknown_note_ids_says_so(client, tenant) -> None:
    _, ids, auth = tenant
    unknown = list(range(10**9, 10**9 + 1500))
    r = client.post("/v1/exports", json={"note_ids": [ids[0], *unknown]}, headers=auth)
    assert r.status_code == 422, r.text
    problem = r.json()
    assert problem["type"].endswith("/unknown_notes")
    assert problem["unknown_note_ids"] == unknown[:1000]
    assert problem["unknown_note_count"] == 1500 and problem["unknown_note_ids_truncated"] is True
    assert problem["detail"] == (
        "1,500 note ids do not exist for this tenant; unknown_note_ids lists the first 1,000"
    )
    one = client.post("/v1/exports", json={"note_ids": [ids[0], 10**9]}, headers=auth).json()
    assert one["detail"] == "1 note id does not exist for this tenant"
    assert one["unknown_note_count"] == 1 and one["unknown_note_ids_truncated"] is False


def test_malformed_json_and_wrong_media_type(client, tenant) -> None:
    _, _, auth = tenant
    r = client.post(
        "/v1/exports", content=b"{bad", headers={**auth, "content-type": "application/json"}
    )
    assert r.status_code == 400 and r.headers["content-type"].startswith(PROBLEM)
    r = client.post(
        "/v1/exports", content=b"all=true", headers={**auth, "content-type": "text/plain"}
    )
    assert r.status_code == 415 and r.headers["content-type"].startswith(PROBLEM)


def test_unknown_note_ids_are_listed(client, tenant) -> None:
    _, ids, auth = tenant
    r = client.post("/v1/exports", json={"note_ids": [ids[0], 987654321]}, headers=auth)
    assert r.status_code == 422 and r.json()["unknown_note_ids"] == [987654321]


def test_missing_or_unknown_key_is_401(client, tenant) -> None:
    for headers in ({}, {"Authorization": "Bearer nex_nope_nope"}, {"Authorization": "Basic abc"}):
        r = client.post("/v1/exports", json={"all": True}, headers=headers)
        assert r.status_code == 401 and r.headers["content-type"].startswith(PROBLEM)
        assert r.headers["www-authenticate"].startswith("Bearer")


def test_other_tenants_job_is_404_everywhere(client, pool, tenant, notes_dir) -> None:
    _, ids, auth = tenant
    job_id = client.post("/v1/exports", json={"note_ids": ids[:1]}, headers=auth).json()["id"]
    other, _ = tenant_with_notes(pool, notes_dir)
    with pool.connection() as conn:
        key, _ = create_api_key(conn, tenant_id=other, scopes=["exports:read", "exports:write"])
    other_auth = {"Authorization": f"Bearer {key}"}
    for path in ("", "/events", "/download"):
        r = client.get(f"/v1/exports/{job_id}{path}", headers=other_auth)
        assert r.status_code == 404 and r.headers["content-type"].startswith(PROBLEM), path
    assert client.get(f"/v1/exports/{uuid4()}", headers=auth).status_code == 404


def test_download_is_409_until_succeeded_then_streams_with_etag(
    client, pool, settings, tenant
) -> None:
    _, ids, auth = tenant
    job_id = client.post("/v1/exports", json={"note_ids": ids[:3]}, headers=auth).json()["id"]
    r = client.get(f"/v1/exports/{job_id}/download", headers=auth)
    assert r.status_code == 409 and r.json()["type"].endswith("/job_not_ready")
    JobRunner(settings, pool, FileArtifactStore(settings.artifact_dir)).run(job_id, uuid4())
    status = client.get(f"/v1/exports/{job_id}", headers=auth).json()
    assert status["status"] == "succeeded"
    r = client.get(f"/v1/exports/{job_id}/download", headers=auth)
    assert r.status_code == 200
    assert r.headers["etag"] == f'"{status["result"]["sha256"]}"'
    assert r.headers["content-type"] == "application/json"
    assert f'filename="export-{job_id}.json"' in r.headers["content-disposition"]
    assert len(r.content) == status["result"]["bytes"]
    assert [n["id"] for n in r.json()["notes"]] == sorted(ids[:3])
    cached = client.get(
        f"/v1/exports/{job_id}/download", headers={**auth, "If-None-Match": r.headers["etag"]}
    )
    assert cached.status_code == 304
    events = client.get(f"/v1/exports/{job_id}/events", headers=auth).json()
    assert [e["kind"] for e in events] == ["submitted", "claimed", "succeeded"]


def test_status_says_whether_it_is_final_and_how_far_it_got(client, pool, settings, tenant) -> None:
    """``terminal`` is derived from the status; ``progress`` is what the worker reported at
    its last lease renewal of the current attempt (read from the history it wrote)."""
    _, ids, auth = tenant
    job_id = client.post("/v1/exports", json={"note_ids": ids[:5]}, headers=auth).json()["id"]
    body = client.get(f"/v1/exports/{job_id}", headers=auth).json()
    assert body["terminal"] is False and body["progress"] == {"done": 0, "total": 5}
    with pool.connection() as conn:
        job = job_store.job_claim(conn, job_id=job_id, message_id=None, lease_seconds=30)
        assert job is not None
        body = client.get(f"/v1/exports/{job_id}", headers=auth).json()
        assert body["status"] == "running" and body["progress"] == {"done": 0, "total": 5}
        job_store.job_renew_lease(
            conn, job_id=job.id, lease_token=job.token, lease_seconds=30, progress=3
        )
    body = client.get(f"/v1/exports/{job_id}", headers=auth).json()
    assert body["terminal"] is False and body["progress"] == {"done": 3, "total": 5}
    [listed] = client.get("/v1/exports?status=running", headers=auth).json()["items"]
    assert listed["progress"] == {"done": 3, "total": 5}
    cancelling = client.post(f"/v1/exports/{job_id}/cancel", headers=auth).json()
    assert cancelling["status"] == "running" and cancelling["progress"]["done"] == 3
    # the running attempt is abandoned (its lease expires and the job is requeued): the
    # next attempt's progress starts over instead of showing the old attempt's
    with pool.connection() as conn:
        conn.execute(
            "UPDATE export_jobs SET status = 'queued', lease_token = NULL,"
            " lease_expires_at = NULL, cancel_requested = false WHERE id = %s",
            (job_id,),
        )
        job = job_store.job_claim(conn, job_id=job_id, message_id=None, lease_seconds=30)
        assert job is not None and job.attempts == 2
    body = client.get(f"/v1/exports/{job_id}", headers=auth).json()
    assert body["progress"] == {"done": 0, "total": 5}
    with pool.connection() as conn:
        conn.execute(
            "UPDATE export_jobs SET status = 'queued', lease_token = NULL,"
            " lease_expires_at = NULL WHERE id = %s",
            (job_id,),
        )
    JobRunner(settings, pool, FileArtifactStore(settings.artifact_dir)).run(job_id, uuid4())
    body = client.get(f"/v1/exports/{job_id}", headers=auth).json()
    assert body["status"] == "succeeded"
    assert body["terminal"] is True and body["progress"] == {"done": 5, "total": 5}
    cancelled = client.post("/v1/exports", json={"note_ids": ids[:2]}, headers=auth).json()
    body = client.post(f"/v1/exports/{cancelled['id']}/cancel", headers=auth).json()
    assert body["status"] == "cancelled" and body["terminal"] is True
    assert body["progress"] is None


def test_missing_artifact_is_410_not_500(client, pool, settings, tenant) -> None:
    _, ids, auth = tenant
    job_id = client.post("/v1/exports", json={"note_ids": ids[:1]}, headers=auth).json()["id"]
    JobRunner(settings, pool, FileArtifactStore(settings.artifact_dir)).run(job_id, uuid4())
    for f in settings.artifact_dir.rglob("*.json"):
        f.unlink()
    r = client.get(f"/v1/exports/{job_id}/download", headers=auth)
    assert r.status_code == 410 and r.headers["content-type"].startswith(PROBLEM)


def test_health_and_openapi(client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200
    spec = client.get("/openapi.json").json()
    post = spec["paths"]["/v1/exports"]["post"]
    assert {"202", "400", "401", "415", "422", "503"} <= set(post["responses"])
    assert PROBLEM in post["responses"]["422"]["content"]
