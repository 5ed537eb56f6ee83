"""``/v1/webhooks`` in-process (FastAPI TestClient) against real PostgreSQL, with the
delivery process run pass by pass against a real receiver on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from devtools.webhook_receiver import Receiver
from exportcore.auth import create_api_key
from exportcore.settings import Settings
from exportcore.webhooks.delivery import WebhookDelivery
from services.api.app import create_app
from tests.integration.test_webhooks import finish, pump
from tests.support import create_tenant, submit, tenant_with_notes

PROBLEM = "application/problem+json"


def _settings(settings: Settings, **over: object) -> Settings:
    return Settings(**{**settings.model_dump(), **over})


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    return _settings(
        settings,
        webhook_allow_http=True,
        webhook_allow_private_networks=True,
        webhook_max_endpoints=3,
        webhook_poll_seconds=0.05,
    )


@pytest.fixture
def client(api_settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(api_settings)) as c:
        yield c


def _key(pool, tenant_id: str) -> dict[str, str]:
    with pool.connection() as conn:
        key, _ = create_api_key(conn, tenant_id=tenant_id, scopes=["exports:read", "exports:write"])
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def tenant(pool, notes_dir: Path) -> tuple[str, list[int], dict[str, str]]:
    tid, ids = tenant_with_notes(pool, notes_dir)
    return tid, ids, _key(pool, tid)


def test_register_with_one_call_and_receive_a_verified_notification(
    client, pool, api_settings: Settings, tenant
) -> None:
    tid, ids, auth = tenant
    with Receiver() as receiver:
        r = client.post("/v1/webhooks", json={"url": receiver.url + "/in"}, headers=auth)
        assert r.status_code == 201, r.text
        created = r.json()
        assert r.headers["location"] == f"/v1/webhooks/{created['id']}"
        assert created["secret"].startswith("whsec_")
        assert created["events"] == [
            "export.succeeded",
            "export.failed",
            "export.cancelled",
            "schedule.paused",
        ]
        receiver.secrets = [created["secret"]]
        job = submit(pool, api_settings, tid, ids[:2])
        finish(pool, api_settings, job["id"])
        d = WebhookDelivery(api_settings, pool)
        try:
            pump(d, lambda: receiver.received)
            # the test message, whatever the subscription
            t = client.post(f"/v1/webhooks/{created['id']}/test", headers=auth)
            assert t.status_code == 202, t.text
            assert t.json()["webhook_id"].startswith("msg_")
            pump(d, lambda: len(receiver.received) == 2)
            page = pump(
                d,
                lambda: (
                    (
                        p := client.get(
                            f"/v1/webhooks/{created['id']}/deliveries", headers=auth
                        ).json()
                    )["items"]
                    and all(i["message_status"] == "delivered" for i in p["items"])
                    and len(p["items"]) == 2
                    and p
                ),
            )
        finally:
            d.close(timeout=5)
    first, second = receiver.received
    assert first.verified_by == (0,) and second.verified_by == (0,)
    assert first.payload["type"] == "export.succeeded"
    assert first.payload["data"]["export"]["id"] == str(job["id"])
    assert second.payload["type"] == "webhook.test"
    items = page["items"]
    assert [i["event_type"] for i in items] == ["webhook.test", "export.succeeded"]
    assert {i["webhook_id"] for i in items} == {first.webhook_id, second.webhook_id}
    assert all(i["status_code"] == 204 and i["outcome"] == "delivered" for i in items)
    # the secret is never shown again
    listed = client.get("/v1/webhooks", headers=auth).json()
    assert [w["id"] for w in listed] == [created["id"]]
    assert "secret" not in listed[0] and listed[0]["secret_hint"].startswith("whsec_")
    one = client.get(f"/v1/webhooks/{created['id']}", headers=auth).json()
    assert created["secret"] not in str(one) and one["pending_messages"] == 0


def test_update_rotate_redeliver_delete(client, tenant) -> None:
    _, _, auth = tenant
    created = client.post(
        "/v1/webhooks",
        json={"url": "http://127.0.0.1:9/x", "events": ["export.failed"], "description": "ops"},
        headers=auth,
    ).json()
    wid = created["id"]
    r = client.patch(
        f"/v1/webhooks/{wid}", json={"events": ["export.succeeded", "export.failed"]}, headers=auth
    )
    assert r.status_code == 200 and r.json()["events"] == ["export.succeeded", "export.failed"]
    r = client.patch(f"/v1/webhooks/{wid}", json={"enabled": False}, headers=auth)
    assert r.json()["enabled"] is False and r.json()["disabled_reason"] == "disabled by the client"
    assert client.post(f"/v1/webhooks/{wid}/test", headers=auth).status_code == 409
    r = client.patch(f"/v1/webhooks/{wid}", json={"enabled": True}, headers=auth)
    assert r.json()["enabled"] is True and r.json()["disabled_reason"] is None
    rot = client.post(
        f"/v1/webhooks/{wid}/rotate-secret", json={"overlap_seconds": 60}, headers=auth
    )
    assert rot.status_code == 200, rot.text
    assert rot.json()["secret"] != created["secret"]
    assert rot.json()["previous_secret_expires_at"] is not None
    rot0 = client.post(
        f"/v1/webhooks/{wid}/rotate-secret", json={"overlap_seconds": 0}, headers=auth
    )
    assert rot0.json()["previous_secret_expires_at"] is None
    assert (
        client.post(f"/v1/webhooks/{wid}/deliveries/999/redeliver", headers=auth).status_code == 404
    )
    assert client.delete(f"/v1/webhooks/{wid}", headers=auth).status_code == 204
    assert client.get(f"/v1/webhooks/{wid}", headers=auth).status_code == 404


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"url": "ftp://example.com/hook"}, 422, "invalid_webhook_url"),
        ({"url": "https://user:pw@example.com/hook"}, 422, "invalid_webhook_url"),
        ({"url": "https://example.com/hook#frag"}, 422, "invalid_webhook_url"),
        ({"url": "https://example.com/", "events": []}, 422, "invalid_request"),
        ({"url": "https://example.com/", "events": ["export.exploded"]}, 422, "invalid_request"),
        ({"url": "https://example.com/", "extra": 1}, 422, "invalid_request"),
        ({"events": ["export.failed"]}, 422, "invalid_request"),
    ],
)
def test_bad_registrations_are_problems(client, tenant, body, status, code) -> None:
    _, _, auth = tenant
    r = client.post("/v1/webhooks", json=body, headers=auth)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == PROBLEM and r.json()["type"].endswith(code)


def test_http_and_private_addresses_need_the_allow_settings(pool, settings, tenant) -> None:
    _, _, auth = tenant
    strict = _settings(settings)
    with TestClient(create_app(strict)) as c:
        r = c.post("/v1/webhooks", json={"url": "http://example.com/hook"}, headers=auth)
        assert r.status_code == 422 and "WEBHOOK_ALLOW_HTTP" in r.json()["detail"]
        for url in (
            "https://127.0.0.1/",
            "https://169.254.169.254/",
            "https://[::1]/",
            "https://10.1.2.3/",
            "https://100.64.0.1/",
        ):
            r = c.post("/v1/webhooks", json={"url": url}, headers=auth)
            assert r.status_code == 422, url
            assert "WEBHOOK_ALLOW_PRIVATE_NETWORKS" in r.json()["detail"]
        assert (
            c.post(
                "/v1/webhooks", json={"url": "https://hooks.example.com/"}, headers=auth
            ).status_code
            == 201
        )


def test_limit_per_tenant_and_tenant_isolation(client, pool, tenant) -> None:
    _, _, auth = tenant
    for i in range(3):
        assert (
            client.post(
                "/v1/webhooks", json={"url": f"http://127.0.0.1:9/{i}"}, headers=auth
            ).status_code
            == 201
        )
    r = client.post("/v1/webhooks", json={"url": "http://127.0.0.1:9/3"}, headers=auth)
    assert r.status_code == 409 and r.json()["type"].endswith("too_many_webhooks")
    mine = client.get("/v1/webhooks", headers=auth).json()[0]["id"]
    other = _key(pool, create_tenant(pool))
    assert client.get("/v1/webhooks", headers=other).json() == []
    for method, path in (
        ("GET", f"/v1/webhooks/{mine}"),
        ("PATCH", f"/v1/webhooks/{mine}"),
        ("DELETE", f"/v1/webhooks/{mine}"),
        ("POST", f"/v1/webhooks/{mine}/test"),
        ("POST", f"/v1/webhooks/{mine}/rotate-secret"),
        ("GET", f"/v1/webhooks/{mine}/deliveries"),
    ):
        r = client.request(method, path, headers=other, json={} if method == "PATCH" else None)
        assert r.status_code == 404, (method, path, r.text)
