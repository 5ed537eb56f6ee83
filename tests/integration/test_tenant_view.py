"""What a tenant sees (SECURITY.md: operator details are never a tenant's): no lease tokens,
message ids, storage keys, store ETags or recorded error details in its history or status;
no storage key in a 410; every answer of the download route (file, 304, redirect, problems)
with ``Cache-Control: no-store`` and ``X-Content-Type-Options: nosniff``. Operators read the
internals through ``/v1/admin/exports/{id}`` and ``/events``. Real PostgreSQL, real S3
(moto) for redirects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from fastapi.testclient import TestClient

from exportcore import faults
from exportcore.artifacts import open_store
from exportcore.auth import create_api_key, create_operator_key
from exportcore.runner import JobRunner
from exportcore.settings import Settings
from services.api.app import create_app
from tests.support import tenant_with_notes

PROBLEM = "application/problem+json"
SECURITY = {"cache-control": "no-store", "x-content-type-options": "nosniff"}


@pytest.fixture(params=["file", "s3"])
def backend_settings(request: pytest.FixtureRequest) -> Settings:
    name = "settings" if request.param == "file" else "s3_settings"
    return request.getfixturevalue(name)


@pytest.fixture
def keys(pool, notes_dir: Path) -> tuple[list[int], dict[str, str], dict[str, str]]:
    tid, ids = tenant_with_notes(pool, notes_dir)
    with pool.connection() as conn:
        key, _ = create_api_key(conn, tenant_id=tid, scopes=["exports:read", "exports:write"])
        operator, _ = create_operator_key(conn, label="view")
    return ids, {"Authorization": f"Bearer {key}"}, {"Authorization": f"Bearer {operator}"}


def client_for(settings: Settings, mode: str = "stream") -> TestClient:
    return TestClient(
        create_app(settings.model_copy(update={"download_mode": mode})), follow_redirects=False
    )


def run_job(settings: Settings, pool, job_id: str) -> str:
    return JobRunner(settings, pool, open_store(settings)).run(job_id, uuid4()).result


def row(pool, job_id: str) -> dict[str, Any]:
    with pool.connection() as conn:
        found = conn.execute("SELECT * FROM export_jobs WHERE id = %s", (job_id,)).fetchone()
    assert found is not None
    return found


def secrets_of(job: dict[str, Any]) -> list[str]:
    """The internals of a job that must never reach its tenant."""
    values = [job["result_ref"], job["result_etag"], job["error_detail"]]
    with_tokens = [str(job["lease_token"])] if job["lease_token"] else []
    return [str(v) for v in values if v] + with_tokens


def test_history_and_status_hide_internals_from_tenants_not_operators(
    pool, backend_settings: Settings, keys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids, auth, admin = keys
    with client_for(backend_settings) as client:
        done = client.post("/v1/exports", json={"note_ids": ids[:3]}, headers=auth).json()["id"]
        assert run_job(backend_settings, pool, done) == "succeeded"
        fault_file = tmp_path / "faults.json"
        monkeypatch.setenv(faults.ENV, str(fault_file))
        faults.arm(fault_file, "render.chunk", "permanent", times=1)
        failed = client.post("/v1/exports", json={"note_ids": ids[:1]}, headers=auth).json()["id"]
        assert run_job(backend_settings, pool, failed) == "failed"
        with pool.connection() as conn:
            tokens = [
                str(r["lease_token"])
                for r in conn.execute(
                    "SELECT lease_token FROM export_job_events WHERE lease_token IS NOT NULL"
                )
            ]
            message_ids = [str(r["id"]) for r in conn.execute("SELECT id FROM export_outbox")]
        assert tokens and message_ids
        for job_id in (done, failed):
            internals = secrets_of(row(pool, job_id)) + tokens + message_ids
            for path in ("", "/events"):
                r = client.get(f"/v1/exports/{job_id}{path}", headers=auth)
                assert r.status_code == 200, r.text
                leaked = [v for v in internals if v in r.text]
                assert leaked == [], (path, leaked)
            events = client.get(f"/v1/exports/{job_id}/events", headers=auth).json()
            assert all("lease_token" not in e and "message_id" not in e for e in events)
            # operators see everything
            full = client.get(f"/v1/admin/exports/{job_id}/events", headers=admin)
            assert full.status_code == 200
            assert all(t in full.text for t in secrets_of(row(pool, job_id)))
            assert any(e["lease_token"] for e in full.json())
        status = client.get(f"/v1/exports/{failed}", headers=auth).json()
        assert status["error"] == {
            "code": "injected_permanent",
            "detail": "the export failed; an operator can see the details",
        }
        succeeded = [e for e in client.get(f"/v1/exports/{done}/events", headers=auth).json()][-1]
        assert succeeded["kind"] == "succeeded"
        assert set(succeeded["detail"]) == {"sha256", "bytes", "rows"}
        internal = client.get(f"/v1/admin/exports/{failed}", headers=admin).json()
        assert internal["error"]["detail"] == row(pool, failed)["error_detail"]
        assert (
            client.get(f"/v1/admin/exports/{done}", headers=admin).json()["result_ref"]
            == (row(pool, done)["result_ref"])
        )
        assert client.get(f"/v1/admin/exports/{done}/events", headers=auth).status_code == 403


def assert_security_headers(r: Any) -> None:
    got = {k: r.headers.get(k) for k in SECURITY}
    assert got == SECURITY, (r.status_code, dict(r.headers))


@pytest.mark.parametrize("mode", ["stream", "redirect"])
def test_every_download_answer_is_no_store_and_nosniff(
    pool, backend_settings: Settings, keys, notes_dir: Path, mode: str
) -> None:
    ids, auth, _ = keys
    _, other_ids = tenant_with_notes(pool, notes_dir)
    with client_for(backend_settings, mode) as client:
        job_id = client.post("/v1/exports", json={"note_ids": ids[:2]}, headers=auth).json()["id"]
        not_ready = client.get(f"/v1/exports/{job_id}/download", headers=auth)
        assert not_ready.status_code == 409
        assert_security_headers(not_ready)
        assert run_job(backend_settings, pool, job_id) == "succeeded"
        r = client.get(f"/v1/exports/{job_id}/download", headers=auth)
        redirect = mode == "redirect" and backend_settings.artifact_location().scheme == "s3"
        assert r.status_code == (307 if redirect else 200), r.text
        assert_security_headers(r)
        cached = client.get(
            f"/v1/exports/{job_id}/download", headers={**auth, "If-None-Match": r.headers["etag"]}
        )
        assert cached.status_code == 304
        assert_security_headers(cached)
        for headers in ({}, {"Authorization": "Bearer nex_00000000_unknown"}):
            anonymous = client.get(f"/v1/exports/{job_id}/download", headers=headers)
            assert anonymous.status_code == 401
            assert_security_headers(anonymous)
        unknown = client.get(f"/v1/exports/{uuid4()}/download", headers=auth)
        assert unknown.status_code == 404
        assert_security_headers(unknown)
        ref = row(pool, job_id)["result_ref"]
        assert open_store(backend_settings).delete(ref)
        gone = client.get(f"/v1/exports/{job_id}/download", headers=auth)
        assert gone.status_code == 410 and gone.headers["content-type"].startswith(PROBLEM)
        assert_security_headers(gone)
        body = json.dumps(gone.json())
        assert ref not in body and ref.rsplit("/", 1)[-1] not in body, body
        assert str(row(pool, job_id)["lease_token"]) not in body
        assert other_ids  # another tenant exists; its exports stay invisible (404 above)


def test_a_capacity_refusal_does_not_tell_other_tenants_load(
    pool, settings: Settings, keys, notes_dir: Path
) -> None:
    ids, auth, _ = keys
    other, other_ids = tenant_with_notes(pool, notes_dir)
    with pool.connection() as conn:
        other_key, _ = create_api_key(conn, tenant_id=other, scopes=["exports:write"])
    full = settings.model_copy(update={"admission_capacity": 3})
    with client_for(full) as client:
        for i in range(3):  # another tenant's load fills the service
            r = client.post(
                "/v1/exports",
                json={"note_ids": other_ids[i : i + 1]},
                headers={"Authorization": f"Bearer {other_key}"},
            )
            assert r.status_code == 202
        refused = client.post("/v1/exports", json={"note_ids": ids[:1]}, headers=auth)
    assert refused.status_code == 503 and refused.json()["type"].endswith("/capacity_exceeded")
    detail = refused.json()["detail"]
    assert detail == "the service's export capacity is full; nothing was accepted, retry later"
    assert "3" not in detail
