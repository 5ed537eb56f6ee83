"""Dispatch pauses through the admin API and the console's forms, in this process against
real PostgreSQL: the roles (a viewer reads, an admin pauses and resumes), the problems of
what cannot be done (RFC 9457), and the audit trail of who, when and why."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from exportcore.auth import create_operator_key
from exportcore.domain import BULK_QUEUE, FAST_QUEUE
from services.api.app import create_app
from tests.support import console_sign_in as sign_in
from tests.support import count, submit

PAUSES = "SELECT count(*) FROM dispatch_pauses"
AUDITED = "SELECT count(*) FROM operator_actions WHERE target_kind = 'queue'"


@pytest.fixture
def viewer(pool) -> dict[str, str]:
    with pool.connection() as conn:
        key, _ = create_operator_key(conn, label="vera", role="viewer")
    return {"Authorization": f"Bearer {key}"}


def problem(r: Any, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = r.json()
    assert body["type"].endswith("/" + code), body
    return body


def test_an_admin_pauses_and_resumes_with_a_reason_and_a_viewer_only_reads(
    api, viewer, pool, tenant
) -> None:
    client, user, admin = api
    tid, _ = tenant
    assert client.get("/v1/admin/queues/pauses", headers=viewer).json() == {"pauses": []}

    refused = client.post(
        f"/v1/admin/queues/{BULK_QUEUE}/pause", json={"reason": "x"}, headers=viewer
    )
    assert problem(refused, 403, "role_insufficient")["required_role"] == "admin"
    tenant_key = client.post(
        f"/v1/admin/queues/{BULK_QUEUE}/pause", json={"reason": "x"}, headers=user
    )
    problem(tenant_key, 403, "operator_key_required")
    assert count(pool, PAUSES) == 0 and count(pool, AUDITED) == 0

    r = client.post(
        f"/v1/admin/queues/{FAST_QUEUE}/pause",
        json={"reason": "bad release 1.4.2", "tenant": tid},
        headers=admin,
    )
    assert r.status_code == 201, r.text
    paused = r.json()
    who = f"{admin['X-Prefix']} (alice)"
    assert (paused["queue"], paused["tenant"], paused["reason"]) == (
        FAST_QUEUE,
        tid,
        "bad release 1.4.2",
    )
    assert paused["paused_by"] == who

    listed = client.get("/v1/admin/queues/pauses", headers=viewer).json()["pauses"]
    assert [(p["queue"], p["tenant"], p["waiting"]) for p in listed] == [(FAST_QUEUE, tid, 0)]
    assert listed[0]["paused_seconds"] >= 0

    again = client.post(
        f"/v1/admin/queues/{FAST_QUEUE}/pause",
        json={"reason": "again", "tenant": tid},
        headers=admin,
    )
    body = problem(again, 409, "dispatch_already_paused")
    assert body["paused_by"] == who and body["reason"] == "bad release 1.4.2"
    assert who in body["detail"]

    # the queue-wide scope is another one: not paused, so nothing to resume
    problem(
        client.post(f"/v1/admin/queues/{FAST_QUEUE}/resume", json={"reason": "r"}, headers=admin),
        409,
        "dispatch_not_paused",
    )
    resumed = client.post(
        f"/v1/admin/queues/{FAST_QUEUE}/resume",
        json={"reason": "1.4.3 is out", "tenant": tid},
        headers=admin,
    )
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["resumed_at"] >= resumed.json()["paused_at"]
    assert count(pool, PAUSES) == 0

    trail = client.get("/v1/admin/audit?target_kind=queue", headers=viewer).json()["items"]
    assert [(a["action"], a["actor"], a["target_id"], a["detail"]["reason"]) for a in trail] == [
        ("queue_resume", who, f"{FAST_QUEUE}/{tid}", "1.4.3 is out"),
        ("queue_pause", who, f"{FAST_QUEUE}/{tid}", "bad release 1.4.2"),
    ]
    assert all(a["tenant_id"] == tid for a in trail)


def test_a_tenant_sees_its_queued_export_held_by_a_pause_in_its_status(
    api, pool, settings, tenant
) -> None:
    client, user, admin = api
    tid, ids = tenant
    job_id = submit(pool, settings, tid, ids[:1])["id"]
    assert client.get(f"/v1/exports/{job_id}", headers=user).json()["dispatch_paused"] is False
    for scope in ({"tenant": tid}, {}):  # its own pause, then the whole queue's
        body = {"reason": "held", **scope}
        r = client.post(f"/v1/admin/queues/{FAST_QUEUE}/pause", json=body, headers=admin)
        assert r.status_code == 201, r.text
        status = client.get(f"/v1/exports/{job_id}", headers=user).json()
        assert status["status"] == "queued" and status["dispatch_paused"] is True
        # the operator's reason and name are not the tenant's to read
        assert "held" not in str(status) and "alice" not in str(status)
        r = client.post(f"/v1/admin/queues/{FAST_QUEUE}/resume", json=body, headers=admin)
        assert r.status_code == 200, r.text
    assert client.get(f"/v1/exports/{job_id}", headers=user).json()["dispatch_paused"] is False
    listed = client.get("/v1/exports", headers=user).json()["items"]
    assert [item["dispatch_paused"] for item in listed] == [None]


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/admin/queues/exports.slow/pause", {"reason": "r"}, "queue"),
        (f"/v1/admin/queues/{BULK_QUEUE}/pause", {}, "reason"),
        (f"/v1/admin/queues/{BULK_QUEUE}/pause", {"reason": ""}, "reason"),
        (f"/v1/admin/queues/{BULK_QUEUE}/pause", {"reason": "r" * 501}, "reason"),
        (f"/v1/admin/queues/{BULK_QUEUE}/resume", {"reason": "r", "tenant": "Not Valid"}, "tenant"),
        (f"/v1/admin/queues/{BULK_QUEUE}/pause", {"reason": "r", "until": "soon"}, "until"),
    ],
)
def test_bad_input_is_a_422_problem_that_names_the_field(api, pool, path, body, field) -> None:
    client, _, admin = api
    r = client.post(path, json=body, headers=admin)
    found = problem(r, 422, "invalid_request")
    assert field in r.text, found
    assert count(pool, PAUSES) == 0 and count(pool, AUDITED) == 0


def test_a_blank_reason_is_refused_by_the_library_too(api, pool) -> None:
    client, _, admin = api
    r = client.post(f"/v1/admin/queues/{BULK_QUEUE}/pause", json={"reason": "   "}, headers=admin)
    assert "reason" in problem(r, 422, "invalid_pause")["detail"]
    assert count(pool, PAUSES) == 0


def test_the_console_form_pauses_for_an_admin_and_a_viewers_forged_post_is_refused(
    settings, pool, tenant
) -> None:
    tid, _ = tenant
    with pool.connection() as conn:
        admin_key, _ = create_operator_key(conn, label="alice")
        viewer_key, _ = create_operator_key(conn, label="vera", role="viewer")
    with TestClient(create_app(settings), base_url="http://testserver") as client:
        csrf = sign_in(client, viewer_key)
        page = client.get("/console/").text
        assert "nothing is paused" in page and "Pause dispatch" not in page
        form = {"csrf_token": csrf, "queue": BULK_QUEUE, "tenant": "", "reason": "x"}
        r = client.post("/console/dispatch/pause", data=form, follow_redirects=False)
        assert r.status_code == 403 and "viewer" in r.text
        assert count(pool, PAUSES) == 0
    with TestClient(create_app(settings), base_url="http://testserver") as client:
        csrf = sign_in(client, admin_key)
        form = {"csrf_token": csrf, "queue": BULK_QUEUE, "tenant": tid, "reason": "disk full"}
        r = client.post("/console/dispatch/pause", data=form, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].endswith("#dispatch")
        page = client.get(r.headers["location"]).text
        assert "Dispatch paused" in page and "disk full" in page and "1 tenant paused" in page
        assert "(alice)" in page and "[redacted]" not in page  # who paused: the key's prefix
        twice = client.post("/console/dispatch/pause", data=form, follow_redirects=False)
        assert twice.status_code == 409 and "was paused by" in twice.text
        blank = client.post(
            "/console/dispatch/resume",
            data={**form, "reason": " "},
            follow_redirects=False,
        )
        assert blank.status_code == 422 and count(pool, PAUSES) == 1
        no_csrf = client.post(
            "/console/dispatch/resume", data={**form, "csrf_token": "x"}, follow_redirects=False
        )
        assert no_csrf.status_code == 403 and count(pool, PAUSES) == 1
    assert count(pool, AUDITED) == 1
