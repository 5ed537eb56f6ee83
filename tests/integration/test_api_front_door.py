"""The API's front door in-process on real PostgreSQL: admission answers, idempotency keys,
keys and scopes, tenant isolation on every endpoint, listing with cursors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

import pytest
from fastapi.testclient import TestClient

from exportcore.auth import create_api_key, create_operator_key
from exportcore.settings import Settings
from exportcore.store.api_keys import api_key_revoke
from services.api.app import create_app
from tests.support import count, key_cache_clock, tenant_with_notes

PROBLEM = "application/problem+json"


def key_for(pool, tenant: str, *scopes: str) -> dict[str, str]:
    with pool.connection() as conn:
        key, _ = create_api_key(conn, tenant_id=tenant, scopes=list(scopes))
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def tenant(pool, notes_dir: Path) -> tuple[str, list[int], dict[str, str]]:
    tid, ids = tenant_with_notes(pool, notes_dir)
    return tid, ids, key_for(pool, tid, "exports:read", "exports:write")


def client_for(settings: Settings) -> TestClient:
    return TestClient(create_app(settings))


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with client_for(settings) as c:
        yield c


def test_capacity_and_quota_refusals_are_503_and_429_with_retry_after(
    settings, pool, tenant
) -> None:
    _, ids, auth = tenant
    with client_for(settings.model_copy(update={"admission_capacity": 1})) as c:
        assert c.post("/v1/exports", json={"note_ids": ids[:1]}, headers=auth).status_code == 202
        r = c.post("/v1/exports", json={"note_ids": ids[:1]}, headers=auth)
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        assert r.headers["content-type"].startswith(PROBLEM) and r.json()["type"].endswith(
            "/capacity_exceeded"
        )
        assert "id" not in r.json()
    with client_for(settings.model_copy(update={"tenant_active_quota": 1})) as c:
        r = c.post("/v1/exports", json={"note_ids": ids[:1]}, headers=auth)
        assert r.status_code == 429 and r.headers["retry-after"] == "5"
        assert r.json()["type"].endswith("/quota_exceeded")
    assert count(pool, "SELECT count(*) FROM export_jobs") == 1


def test_idempotency_key_header(client, pool, tenant) -> None:
    _, ids, auth = tenant
    body = {"note_ids": ids[:2], "format": "json"}
    first = client.post("/v1/exports", json=body, headers={**auth, "Idempotency-Key": '"order-7"'})
    assert first.status_code == 202 and "idempotent-replayed" not in first.headers
    same = client.post(
        "/v1/exports",
        json={"format": "json", "note_ids": [ids[1], ids[0], ids[0]]},
        headers={**auth, "Idempotency-Key": "order-7"},
    )
    assert same.status_code == 202 and same.headers["idempotent-replayed"] == "true"
    assert same.json() == first.json() and same.headers["location"] == first.headers["location"]
    other = client.post(
        "/v1/exports", json={"note_ids": ids[:3]}, headers={**auth, "Idempotency-Key": "order-7"}
    )
    assert other.status_code == 409 and other.json()["type"].endswith("/idempotency_key_reused")
    for bad in ("", '""', "x" * 256, "caf\u00e9".encode(), '"unterminated', '"x";a=1', "a b"):
        r = client.post("/v1/exports", json=body, headers={**auth, "Idempotency-Key": bad})
        assert r.status_code == 400 and r.json()["type"].endswith("/invalid_idempotency_key"), bad
    assert count(pool, "SELECT count(*) FROM export_jobs") == 1


def test_request_bodies_over_the_limit_are_refused_whole_or_streamed(
    settings, pool, tenant
) -> None:
    _, ids, auth = tenant
    small = settings.model_copy(update={"max_request_bytes": 64 * 1024})
    headers = {**auth, "Content-Type": "application/json"}
    padded = b'{"note_ids": [%d], "format": "json"}' % ids[0] + b" " * (64 * 1024)

    def streamed() -> Iterator[bytes]:  # no Content-Length: cut off while it is read
        for start in range(0, len(padded), 8192):
            yield padded[start : start + 8192]

    with client_for(small) as client:
        for body in (padded, streamed()):
            r = client.post("/v1/exports", content=body, headers=headers)
            assert r.status_code == 413, r.text
            assert r.headers["content-type"] == "application/problem+json"
            assert r.json()["type"].endswith("/request_too_large")
        fits = client.post("/v1/exports", content=padded[:1000], headers=headers)
        assert fits.status_code == 202, fits.text
    assert count(pool, "SELECT count(*) FROM export_jobs") == 1


def test_keys_scopes_and_revocation(client, pool, tenant) -> None:
    tid, ids, auth = tenant
    clock = key_cache_clock(client.app)  # before the keys are first looked up
    reader = key_for(pool, tid, "exports:read")
    writer = key_for(pool, tid, "exports:write")
    job_id = client.post("/v1/exports", json={"note_ids": ids[:1]}, headers=writer).json()["id"]
    assert client.get(f"/v1/exports/{job_id}", headers=writer).status_code == 403
    assert client.get("/v1/exports", headers=writer).status_code == 403
    assert client.post("/v1/exports", json={"all": True}, headers=reader).status_code == 403
    assert client.post(f"/v1/exports/{job_id}/cancel", headers=reader).status_code == 403
    assert client.get("/v1/admin/dead-letters", headers=auth).status_code == 403
    assert client.get(f"/v1/exports/{job_id}", headers=reader).status_code == 200
    token = reader["Authorization"].split()[1]
    with pool.connection() as conn:
        [revoked] = api_key_revoke(conn, key=token.split("_")[0] + "_" + token.split("_")[1])
    assert revoked["tenant_id"] == tid
    # the api process trusts a key it looked up for API_KEY_CACHE_SECONDS (1 s) at most
    clock.advance(0.5)
    assert client.get(f"/v1/exports/{job_id}", headers=reader).status_code == 200
    clock.advance(0.5)
    r = client.get(f"/v1/exports/{job_id}", headers=reader)
    assert r.status_code == 401 and r.headers["content-type"].startswith(PROBLEM)


def test_another_tenants_job_is_404_on_every_endpoint(client, pool, tenant, notes_dir) -> None:
    _, ids, auth = tenant
    job_id = client.post("/v1/exports", json={"note_ids": ids[:1]}, headers=auth).json()["id"]
    other, _ = tenant_with_notes(pool, notes_dir)
    intruder = key_for(pool, other, "exports:read", "exports:write")
    for method, path in (
        ("GET", f"/v1/exports/{job_id}"),
        ("GET", f"/v1/exports/{job_id}/events"),
        ("GET", f"/v1/exports/{job_id}/download"),
        ("POST", f"/v1/exports/{job_id}/cancel"),
    ):
        r = client.request(method, path, headers=intruder)
        assert r.status_code == 404, (method, path, r.status_code)
        assert r.headers["content-type"].startswith(PROBLEM)
    assert client.get("/v1/exports", headers=intruder).json()["items"] == []
    assert client.get(f"/v1/exports/{job_id}", headers=auth).json()["cancel_requested"] is False


def test_list_is_newest_first_with_cursor_and_status_filter(client, tenant) -> None:
    _, ids, auth = tenant
    created = [
        client.post("/v1/exports", json={"note_ids": ids[i : i + 1]}, headers=auth).json()["id"]
        for i in range(7)
    ]
    client.post(f"/v1/exports/{created[0]}/cancel", headers=auth)
    seen, cursor = [], None
    while True:
        params = {"limit": 3} | ({"cursor": cursor} if cursor else {})
        page = client.get("/v1/exports", params=params, headers=auth).json()
        seen += [j["id"] for j in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == created[::-1]
    cancelled = client.get("/v1/exports", params={"status": "cancelled"}, headers=auth).json()[
        "items"
    ]
    assert [j["id"] for j in cancelled] == [created[0]]
    r = client.get("/v1/exports", params={"cursor": "not-a-cursor"}, headers=auth)
    assert r.status_code == 400 and r.json()["type"].endswith("/invalid_cursor")
    assert client.get("/v1/exports", params={"status": "lost"}, headers=auth).status_code == 422
    assert client.get(f"/v1/exports/{uuid4()}", headers=auth).status_code == 404


def test_values_the_database_cannot_store_are_422_not_500(client, pool, tenant) -> None:
    """Found by the schemathesis run: a NUL byte or a number past bigint reached SQL."""
    _, _, auth = tenant
    with pool.connection() as conn:
        operator, _ = create_operator_key(conn, label="front-door")
    admin = {"Authorization": f"Bearer {operator}"}
    for params in ({"reason": "bad\x00reason"}, {"cursor": str(2**70)}, {"reason": "Not A Code"}):
        r = client.get("/v1/admin/dead-letters", params=params, headers=admin)
        assert r.status_code == 422 and r.headers["content-type"].startswith(PROBLEM), params
    r = client.post(
        "/v1/schedules", json={"name": "a\x00b", "interval_seconds": 60, "all": True}, headers=auth
    )
    assert r.status_code == 422 and r.headers["content-type"].startswith(PROBLEM)
