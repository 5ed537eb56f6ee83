"""``GET /v1/exports/{id}/download`` in-process (FastAPI TestClient) on both artifact
backends and both download modes: real PostgreSQL, and a real S3 server (moto) reached over
HTTP by boto3 and by the test when it follows a presigned redirect."""

from __future__ import annotations

import hashlib
from pathlib import Path
from uuid import uuid4

import httpx
import pytest
from fastapi.testclient import TestClient

from devtools.stack import free_port
from exportcore.artifacts import missing_counts, open_store
from exportcore.auth import create_api_key
from exportcore.runner import JobRunner
from exportcore.settings import Settings
from services.api.app import create_app
from tests.support import tenant_with_notes

PROBLEM = "application/problem+json"


@pytest.fixture(params=["file", "s3"])
def backend_settings(request: pytest.FixtureRequest) -> Settings:
    name = "settings" if request.param == "file" else "s3_settings"
    return request.getfixturevalue(name)


def keyed_tenant(pool, notes_dir: Path) -> tuple[str, list[int], dict[str, str]]:
    tid, ids = tenant_with_notes(pool, notes_dir)
    with pool.connection() as conn:
        key, _ = create_api_key(conn, tenant_id=tid, scopes=["exports:read", "exports:write"])
    return tid, ids, {"Authorization": f"Bearer {key}"}


@pytest.fixture
def tenant(pool, notes_dir: Path) -> tuple[str, list[int], dict[str, str]]:
    return keyed_tenant(pool, notes_dir)


@pytest.fixture(params=["stream", "redirect"])
def mode(request: pytest.FixtureRequest) -> str:
    """Each DOWNLOAD_MODE: the api streams the file, or redirects to a presigned URL (the
    file backend, which cannot presign, streams in both)."""
    return str(request.param)


def app_client(settings: Settings, mode: str) -> TestClient:
    return TestClient(
        create_app(settings.model_copy(update={"download_mode": mode, "presign_seconds": 30})),
        follow_redirects=False,
    )


def finished_export(client: TestClient, pool, settings: Settings, auth, ids, fmt="ndjson"):
    r = client.post("/v1/exports", json={"note_ids": ids[:4], "format": fmt}, headers=auth)
    job_id = r.json()["id"]
    store = open_store(settings)
    assert JobRunner(settings, pool, store).run(job_id, uuid4()).result == "succeeded"
    return job_id, client.get(f"/v1/exports/{job_id}", headers=auth).json(), store


def test_the_owner_downloads_the_recorded_artifact(
    pool, backend_settings: Settings, tenant, mode: str
) -> None:
    _, ids, auth = tenant
    with app_client(backend_settings, mode) as client:
        job_id, status, store = finished_export(client, pool, backend_settings, auth, ids)
        r = client.get(f"/v1/exports/{job_id}/download", headers=auth)
    sha = status["result"]["sha256"]
    if mode == "redirect" and store.backend == "s3":
        assert r.status_code == 307
        assert r.headers["etag"] == f'"{sha}"' and r.headers["cache-control"] == "no-store"
        location = r.headers["location"]
        assert "X-Amz-Signature=" in location and "X-Amz-Expires=30" in location
        assert backend_settings.s3_endpoint_url in location
        got = httpx.get(location)  # a plain client: no API key, the URL authorises itself
        assert got.status_code == 200
        assert got.headers["content-type"] == "application/x-ndjson"
        assert (
            got.headers["content-disposition"] == f'attachment; filename="export-{job_id}.ndjson"'
        )
        data = got.content
    else:  # streaming, and the file backend's fallback in redirect mode
        assert r.status_code == 200, r.text
        assert r.headers["etag"] == f'"{sha}"'
        assert r.headers["content-disposition"] == f'attachment; filename="export-{job_id}.ndjson"'
        data = r.content
    assert hashlib.sha256(data).hexdigest() == sha and len(data) == status["result"]["bytes"]
    assert len(data.decode().splitlines()) == 4 + 1  # the notes, then the manifest line


def test_another_tenant_gets_404_and_an_unfinished_export_409(
    pool, notes_dir: Path, backend_settings: Settings, tenant, mode: str
) -> None:
    _, ids, auth = tenant
    _, _, other_auth = keyed_tenant(pool, notes_dir)
    with app_client(backend_settings, mode) as client:
        job_id, _, _ = finished_export(client, pool, backend_settings, auth, ids)
        r = client.get(f"/v1/exports/{job_id}/download", headers=other_auth)
        assert r.status_code == 404 and r.headers["content-type"].startswith(PROBLEM)
        assert "location" not in r.headers
        queued = client.post("/v1/exports", json={"note_ids": ids[:1]}, headers=auth).json()
        r = client.get(f"/v1/exports/{queued['id']}/download", headers=auth)
        assert r.status_code == 409 and "location" not in r.headers


def test_a_missing_object_is_410_and_counted(
    pool, backend_settings: Settings, tenant, mode: str
) -> None:
    _, ids, auth = tenant
    with app_client(backend_settings, mode) as client:
        job_id, _, store = finished_export(client, pool, backend_settings, auth, ids)
        with pool.connection() as conn:
            ref = conn.execute(
                "SELECT result_ref FROM export_jobs WHERE id = %s", (job_id,)
            ).fetchone()["result_ref"]
        assert store.delete(ref)  # lost by an operator, a lifecycle rule, a wrong restore...
        before = missing_counts().get(store.backend, 0)
        r = client.get(f"/v1/exports/{job_id}/download", headers=auth)
    assert r.status_code == 410 and r.headers["content-type"].startswith(PROBLEM)
    assert r.json()["type"].endswith("/artifact_missing")
    assert missing_counts()[store.backend] == before + 1


def test_storage_unreachable_at_download_is_503_not_500(
    pool, s3_settings: Settings, tenant, mode: str
) -> None:
    _, ids, auth = tenant
    with app_client(s3_settings, mode) as client:
        job_id, _, _ = finished_export(client, pool, s3_settings, auth, ids)
    down = s3_settings.model_copy(
        update={"s3_endpoint_url": f"http://127.0.0.1:{free_port()}", "s3_max_attempts": 1}
    )
    with app_client(down, mode) as client:
        r = client.get(f"/v1/exports/{job_id}/download", headers=auth)
    assert r.status_code == 503 and r.headers["content-type"].startswith(PROBLEM)
    assert r.json()["type"].endswith("/storage_unavailable")
    assert r.headers["retry-after"] == "5"


def test_presigned_urls_can_name_a_public_endpoint(pool, s3_settings: Settings, tenant) -> None:
    _, ids, auth = tenant
    public = s3_settings.model_copy(update={"s3_presign_endpoint_url": "https://files.example.com"})
    with app_client(public, "redirect") as client:
        job_id, _, _ = finished_export(client, pool, public, auth, ids)
        r = client.get(f"/v1/exports/{job_id}/download", headers=auth)
    assert r.status_code == 307
    assert r.headers["location"].startswith("https://files.example.com/")


def test_openapi_documents_the_redirect(settings: Settings) -> None:
    with TestClient(create_app(settings)) as client:
        spec = client.get("/openapi.json").json()
    responses = spec["paths"]["/v1/exports/{job_id}/download"]["get"]["responses"]
    assert {"200", "304", "307", "404", "409", "410", "503"} <= set(responses)
