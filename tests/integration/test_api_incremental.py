"""The API of deltas, manifests and checkpoints: ``since`` on POST /v1/exports (202, or
422 ``invalid_base``), the status's ``base`` and ``checkpoint``, and the public
``GET /v1/manifest-keys`` JWK Set."""

from __future__ import annotations

from uuid import UUID, uuid4

from exportcore import manifests
from exportcore.artifacts import open_store
from exportcore.runner import JobRunner
from exportcore.settings import Settings
from tests.support import job


def test_manifest_keys_are_public_and_empty_without_a_key(api) -> None:
    client, _, _ = api
    r = client.get("/v1/manifest-keys")  # no Authorization header
    assert r.status_code == 200 and r.json() == {"keys": []}
    assert r.headers["content-type"].startswith("application/jwk-set+json")


def test_manifest_keys_serve_the_signing_key(settings: Settings, pool, tenant) -> None:
    from fastapi.testclient import TestClient
    from pydantic import SecretStr

    from services.api.app import create_app

    private, public = manifests.new_private_key_text()
    signed = settings.model_copy(update={"manifest_signing_key": SecretStr(private)})
    with TestClient(create_app(signed)) as client:
        [key] = client.get("/v1/manifest-keys").json()["keys"]
    assert (key["kty"], key["crv"], key["alg"]) == ("OKP", "Ed25519", "EdDSA")
    assert key["kid"] == manifests.key_id(manifests.load_public_key(public))
    assert manifests.keys_from_jwks({"keys": [key]}).keys() == {key["kid"]}


def test_a_delta_through_the_api_names_its_base(api, settings: Settings, pool) -> None:
    client, user, _ = api
    r = client.post("/v1/exports", json={"all": True, "format": "ndjson"}, headers=user)
    assert r.status_code == 202
    base = r.json()["id"]
    assert r.json()["base"] is None and r.json()["checkpoint"] is None
    r = client.post(
        "/v1/exports", json={"all": True, "format": "ndjson", "since": base}, headers=user
    )
    assert r.status_code == 422 and r.json()["type"].endswith("/invalid_base")  # not succeeded yet
    assert JobRunner(settings, pool, open_store(settings)).run(UUID(base), uuid4()).result == (
        "succeeded"
    )
    for body in (
        {"all": True, "format": "json", "since": base},  # another format
        {"all": True, "format": "ndjson", "since": str(uuid4())},  # no such export
    ):
        r = client.post("/v1/exports", json=body, headers=user)
        assert r.status_code == 422 and r.json()["type"].endswith("/invalid_base"), body
    r = client.post("/v1/exports", json={"note_ids": [1], "since": base}, headers=user)
    assert r.status_code == 422 and r.json()["type"].endswith("/invalid_selection")
    r = client.post(
        "/v1/exports", json={"all": True, "format": "ndjson", "since": base}, headers=user
    )
    assert r.status_code == 202, r.text
    delta = r.json()
    assert delta["note_count"] == 0  # nothing changed since
    assert delta["base"]["id"] == base and len(delta["base"]["manifest_sha256"]) == 64
    assert client.get(f"/v1/exports/{delta['id']}", headers=user).json()["base"] == delta["base"]
    assert job(pool, UUID(delta["id"]))["base_job_id"] == UUID(base)
