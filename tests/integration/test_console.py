"""The operator console in-process (FastAPI TestClient) against real PostgreSQL: sign-in,
sessions, CSRF, every page, and the actions (cancel, replay, bulk replay, resolve, pause).
The browser tests (tests/e2e/test_console_browser.py) drive the same pages in Chromium."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from dataclasses import asdict
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import pytest
from fastapi.testclient import TestClient

from exportcore import bulk
from exportcore.auth import create_api_key, create_operator_key, hash_key
from exportcore.schedules.management import create_schedule
from exportcore.schedules.ticker import ScheduleTicker
from exportcore.settings import Settings
from exportcore.store import jobs as job_store
from exportcore.store import operator_keys as operator_store
from exportcore.store import tenants as tenant_store
from services.api.app import create_app
from tests.support import count, create_tenant, job, submit

CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
LOGIN_TOKEN = re.compile(r'name="login_token" value="([^"]+)"')


@pytest.fixture
def app_settings(settings: Settings) -> Settings:
    return settings


@pytest.fixture
def client(app_settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(app_settings), base_url="http://testserver") as c:
        yield c


def make_key(pool, tenant_id: str, scopes: list[str], label: str = "") -> str:
    with pool.connection() as conn:
        key, _ = create_api_key(conn, tenant_id=tenant_id, scopes=scopes, label=label)
    return key


@pytest.fixture
def operator_key(pool) -> str:
    with pool.connection() as conn:
        key, _ = create_operator_key(conn, label="ops")
    return key


def sign_in(client: TestClient, key: str, **headers: str) -> Any:
    form = client.get("/console/login")
    token = LOGIN_TOKEN.search(form.text)
    assert token, form.text
    return client.post(
        "/console/login",
        data={"key": key, "login_token": token.group(1), "next": "/console/"},
        headers=headers,
        follow_redirects=False,
    )


@pytest.fixture
def signed_in(client: TestClient, operator_key: str) -> str:
    """The client signed in; returns the session's CSRF token."""
    r = sign_in(client, operator_key)
    assert r.status_code == 303, r.text
    page = client.get("/console/")
    assert page.status_code == 200, page.text
    m = CSRF.search(page.text)
    assert m
    return m.group(1)


def failed_job(pool, settings: Settings, tenant_id: str, ids: list[int], code: str = "boom") -> Row:
    """A job failed through the real transitions (claim, then a permanent failure)."""
    j = submit(pool, settings, tenant_id, ids[:2])
    with pool.connection() as conn:
        claimed = job_store.job_claim(conn, job_id=j["id"], message_id=None, lease_seconds=30)
        assert claimed is not None
        done = job_store.job_fail_if_leased(
            conn,
            job_id=j["id"],
            lease_token=claimed.token,
            error_code=code,
            error_detail="renderer said no; password=hunter2 at postgresql://u:pw@db/x",
        )
        assert done is not None
    return asdict(done)


Row = dict[str, Any]


# --- sign-in, sessions ----------------------------------------------------------------


PAGES = (
    "/console/",
    "/console/jobs",
    "/console/dead-letters",
    "/console/schedules",
    "/console/tenants",
    "/console/jobs/0197a4b2-5c3d-7e8f-9a0b-1c2d3e4f5a6b",  # fixed: xdist workers collect alike
)


@pytest.mark.parametrize("path", PAGES)
def test_every_page_needs_a_session(client, path) -> None:
    r = client.get(path, follow_redirects=False)
    assert r.status_code == 303
    assert r.headers["location"].startswith("/console/login?next=/console")
    htmx = client.get(path, headers={"HX-Request": "true"}, follow_redirects=False)
    assert htmx.status_code == 401 and htmx.headers["hx-redirect"].startswith("/console/login")


def test_actions_need_a_session(client, pool, settings, tenant) -> None:
    j = submit(pool, settings, tenant[0], tenant[1][:1])
    r = client.post(f"/console/jobs/{j['id']}/cancel", data={"csrf_token": "x" * 43})
    assert r.status_code == 401
    assert job(pool, j["id"])["status"] == "queued"


def test_sign_in_with_an_operator_key_sets_a_strict_httponly_cookie(client, operator_key) -> None:
    r = sign_in(client, operator_key)
    assert r.status_code == 303 and r.headers["location"] == "/console/"
    cookie = next(h for h in r.headers.get_list("set-cookie") if h.startswith("nex_console="))
    attrs = {a.strip().split("=")[0].lower() for a in cookie.split(";")}
    assert {"httponly", "samesite", "path"} <= attrs
    assert "samesite=strict" in cookie.lower() and "path=/console" in cookie.lower()
    assert "secure" not in attrs  # plain http: a Secure cookie would never come back
    assert client.get("/console/").status_code == 200


def test_the_cookie_is_secure_behind_tls(client, operator_key) -> None:
    r = sign_in(client, operator_key, **{"X-Forwarded-Proto": "https"})
    cookie = next(h for h in r.headers.get_list("set-cookie") if h.startswith("nex_console="))
    assert "secure" in {a.strip().lower() for a in cookie.split(";")}


def test_the_cookie_is_secure_when_configured(settings, operator_key) -> None:
    s = settings.model_copy(update={"console_cookie_secure": "always"})
    # a Secure cookie only comes back over https
    with TestClient(create_app(s), base_url="https://testserver") as c:
        r = sign_in(c, operator_key)
        assert r.status_code == 303
        cookie = next(h for h in r.headers.get_list("set-cookie") if h.startswith("nex_console="))
        assert "secure" in {a.strip().lower() for a in cookie.split(";")}
        assert c.get("/console/").status_code == 200
    with TestClient(create_app(s), base_url="http://testserver") as c:
        assert sign_in(c, operator_key).status_code == 403  # the login cookie never came back


def test_sign_in_refuses_unknown_tenant_and_malformed_keys(client, pool, tenant) -> None:
    tenant_key = make_key(pool, tenant[0], ["exports:read", "exports:write"])
    for key, status, text in (
        ("nex_00000000_" + "x" * 43, 401, "unknown or revoked"),
        ("not a key", 401, "unknown or revoked"),
        (tenant_key, 403, "not an operator key"),
    ):
        r = sign_in(client, key)
        assert r.status_code == status and text in r.text
        assert "nex_console=" not in "".join(r.headers.get_list("set-cookie")).replace(
            "nex_console_login=", ""
        )
    assert client.get("/console/", follow_redirects=False).status_code == 303


def test_sign_in_attempts_are_throttled_per_address_and_failures_are_warnings(
    settings: Settings, operator_key: str, caplog: pytest.LogCaptureFixture
) -> None:
    throttled = settings.model_copy(
        update={"console_sign_in_rate": 0.001, "console_sign_in_burst": 3}
    )
    wrong = "nex_op_00000000_" + "w" * 43
    with caplog.at_level("INFO"), TestClient(create_app(throttled)) as c:
        answers = [sign_in(c, wrong).status_code for _ in range(3)]
        limited = sign_in(c, wrong)
        # the right key too: the address has used its attempts
        right = sign_in(c, operator_key)
    assert answers == [401, 401, 401]
    assert limited.status_code == right.status_code == 429
    assert int(limited.headers["retry-after"]) > 100
    assert "Too many sign-in attempts" in limited.text
    assert "nex_console=" not in "".join(right.headers.get_list("set-cookie")).replace(
        "nex_console_login=", ""
    )
    refused = [r for r in caplog.records if r.getMessage().startswith("console sign-in")]
    assert [r.levelname for r in refused] == ["WARNING"] * 5
    assert {getattr(r, "reason", "throttled") for r in refused} == {"unknown_key", "throttled"}
    assert all(getattr(r, "client", None) == "testclient" for r in refused)
    logged = " ".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert wrong not in logged and operator_key not in logged and "wwwww" not in logged


def test_the_sign_in_form_is_protected_against_login_csrf(client, operator_key) -> None:
    client.get("/console/login")  # sets the login cookie
    forged = client.post(
        "/console/login",
        data={"key": operator_key, "login_token": "forged", "next": "/console/"},
        follow_redirects=False,
    )
    assert forged.status_code == 403
    other_site = sign_in(client, operator_key, Origin="https://evil.example")
    assert other_site.status_code == 403
    assert client.get("/console/", follow_redirects=False).status_code == 303


def test_next_never_leaves_the_console(client, operator_key) -> None:
    for target in ("https://evil.example/", "//evil.example", "/v1/exports", "/console//x"):
        form = client.get("/console/login")
        token = LOGIN_TOKEN.search(form.text).group(1)  # type: ignore[union-attr]
        r = client.post(
            "/console/login",
            data={"key": operator_key, "login_token": token, "next": target},
            follow_redirects=False,
        )
        assert r.headers["location"] == "/console/"


def test_logout_ends_the_session_on_the_server(client, signed_in, pool) -> None:
    cookie = client.cookies.get("nex_console")
    r = client.post("/console/logout", data={"csrf_token": signed_in}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/console/login")
    assert count(pool, "SELECT count(*) FROM console_sessions") == 0
    # the old cookie, replayed, signs nobody in
    client.cookies.set("nex_console", cookie, path="/console")
    assert client.get("/console/", follow_redirects=False).status_code == 303


def test_a_revoked_key_ends_its_sessions(client, signed_in, pool, operator_key) -> None:
    with pool.connection() as conn:
        row = operator_store.operator_key_lookup(conn, key_hash=hash_key(operator_key))
        assert row and operator_store.operator_key_revoke(conn, key=str(row["id"]))
    assert client.get("/console/", follow_redirects=False).status_code == 303


def test_use_keeps_a_session_and_idle_or_expired_sessions_end(client, signed_in, pool) -> None:
    def seen() -> Any:
        with pool.connection() as conn:
            return conn.execute(
                "SELECT now() - last_seen_at AS ago FROM console_sessions"
            ).fetchone()["ago"]

    with pool.connection() as conn:
        conn.execute("UPDATE console_sessions SET last_seen_at = now() - interval '29 minutes'")
    assert client.get("/console/", follow_redirects=False).status_code == 200
    assert seen().total_seconds() < 60  # marked seen again
    client.get("/console/")
    assert seen().total_seconds() < 60
    with pool.connection() as conn:
        conn.execute("UPDATE console_sessions SET last_seen_at = now() - interval '31 minutes'")
    assert client.get("/console/", follow_redirects=False).status_code == 303
    sign_in_again = client.get("/console/login")
    assert sign_in_again.status_code == 200
    with pool.connection() as conn:
        conn.execute("UPDATE console_sessions SET expires_at = now() - interval '1 second'")
    assert client.get("/console/", follow_redirects=False).status_code == 303


def test_only_the_token_hash_is_stored(client, signed_in, pool) -> None:
    cookie = client.cookies.get("nex_console")
    with pool.connection() as conn:
        row = conn.execute("SELECT token_hash::text AS h FROM console_sessions").fetchone()
    assert cookie and cookie not in row["h"] and len(bytes.fromhex(row["h"][2:])) == 32


# --- CSRF -----------------------------------------------------------------------------------


def test_actions_without_the_csrf_token_are_refused_and_change_nothing(
    client, signed_in, pool, settings, tenant
) -> None:
    j = submit(pool, settings, tenant[0], tenant[1][:1])
    url = f"/console/jobs/{j['id']}/cancel"
    for data, headers in (
        ({}, {}),
        ({"csrf_token": "wrong"}, {}),
        ({}, {"X-CSRF-Token": "wrong"}),
        ({"csrf_token": signed_in}, {"Origin": "https://evil.example"}),
    ):
        r = client.post(url, data=data, headers=headers, follow_redirects=False)
        assert r.status_code == 403, (data, headers)
        assert "Nothing was changed" in r.text
        assert job(pool, j["id"])["status"] == "queued"
    # every form of the console carries the session's token
    confirm = client.get(url)
    assert CSRF.findall(confirm.text) == [signed_in, signed_in]  # sign-out and cancel
    ok = client.post(url, data={"csrf_token": signed_in}, follow_redirects=False)
    assert ok.status_code == 303
    assert job(pool, j["id"])["status"] == "cancelled"


def test_the_htmx_header_carries_the_token(client, signed_in, pool, settings, tenant) -> None:
    j = submit(pool, settings, tenant[0], tenant[1][:1])
    r = client.post(
        f"/console/jobs/{j['id']}/cancel",
        headers={"X-CSRF-Token": signed_in, "Origin": "http://testserver"},
        follow_redirects=False,
    )
    assert r.status_code == 303 and job(pool, j["id"])["status"] == "cancelled"


def test_pages_carry_security_headers_and_load_nothing_from_elsewhere(client, signed_in) -> None:
    r = client.get("/console/")
    assert r.headers["cache-control"] == "no-store"
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp
    assert "frame-ancestors 'none'" in csp
    assert r.headers["x-frame-options"] == "DENY"
    for src in re.findall(r'(?:src|href)="([^"]+)"', r.text):
        assert src.startswith(("/", "#", "data:")), src
    static = client.get(re.search(r'src="(/console/static/htmx[^"]+)"', r.text).group(1))  # type: ignore[union-attr]
    assert static.status_code == 200 and "htmx" in static.text[:2000]


# --- pages ----------------------------------------------------------------------------------


def test_overview_counts_queues_outbox_and_dead_letters(
    client, signed_in, pool, settings, tenant
) -> None:
    submit(pool, settings, tenant[0], tenant[1][:1])
    failed_job(pool, settings, tenant[0], tenant[1])
    r = client.get("/console/")
    assert r.status_code == 200
    text = re.sub(r"\s+", " ", r.text)
    assert 'href="/console/jobs?queue=exports.fast&amp;status=queued">1<' in text
    assert 'href="/console/jobs?queue=exports.fast&amp;status=failed&amp;since=1h">1<' in text
    assert '<a href="/console/dead-letters">1</a>' in text
    assert "2 unpublished" in text.replace('<small class="muted">', "")
    assert "1 failed" in text  # the sparkline's summary
    live = client.get("/console/overview/live", headers={"HX-Request": "true"})
    assert live.status_code == 200 and live.text.lstrip().startswith('<div id="overview-live"')


def test_overview_links_grafana_when_configured(settings, operator_key) -> None:
    s = settings.model_copy(update={"console_grafana_url": "https://grafana.example"})
    with TestClient(create_app(s)) as c:
        sign_in(c, operator_key)
        r = c.get("/console/")
    assert 'href="https://grafana.example/d/exports-backlog"' in r.text


def test_jobs_filters_and_keyset_pages(client, signed_in, pool, settings, tenant) -> None:
    other = create_tenant(pool)
    jobs = [submit(pool, settings, tenant[0], tenant[1][:1]) for _ in range(55)]
    bad = failed_job(pool, settings, tenant[0], tenant[1], code="render_crashed")
    page1 = client.get("/console/jobs", params={"tenant": tenant[0]})
    ids1 = set(re.findall(r'href="/console/jobs/([0-9a-f-]{36})"', page1.text))
    assert len(ids1) == 50
    nxt = re.search(r'href="(/console/jobs\?[^"]*after=[^"]+)" rel="next"', page1.text)
    assert nxt
    page2 = client.get(nxt.group(1).replace("&amp;", "&"))
    ids2 = set(re.findall(r'href="/console/jobs/([0-9a-f-]{36})"', page2.text))
    assert ids1.isdisjoint(ids2) and ids1 | ids2 == {str(j["id"]) for j in jobs} | {str(bad["id"])}
    failed = client.get("/console/jobs", params={"status": "failed"})
    assert set(re.findall(r'href="/console/jobs/([0-9a-f-]{36})"', failed.text)) == {str(bad["id"])}
    by_code = client.get("/console/jobs", params={"error_code": "render_crashed"})
    assert str(bad["id"]) in by_code.text and str(jobs[0]["id"]) not in by_code.text
    none = client.get("/console/jobs", params={"tenant": other})
    assert "No job matches" in none.text
    future = client.get("/console/jobs", params={"from": "2999-01-01T00:00:00Z"})
    assert "No job matches" in future.text
    window = client.get(
        "/console/jobs", params={"from_local": "2000-01-01T00:00", "queue": "exports.fast"}
    )
    assert str(bad["id"]) in window.text
    invalid = client.get("/console/jobs", params={"status": "lost", "from": "yesterday"})
    assert invalid.status_code == 400
    assert "unknown state" in invalid.text and "is not a date and time" in invalid.text
    bad_cursor = client.get("/console/jobs", params={"after": "garbage"})
    assert bad_cursor.status_code == 400 and "page link is not valid" in bad_cursor.text


def test_job_page_explains_a_failure_with_a_sanitised_dead_letter(
    client, signed_in, pool, settings, tenant
) -> None:
    bad = failed_job(pool, settings, tenant[0], tenant[1])
    r = client.get(f"/console/jobs/{bad['id']}")
    assert r.status_code == 200
    text = r.text
    assert "Failed with boom after 1 attempt(s)" in text and "dead letter is open" in text
    for step in ("Submitted", "Claimed: attempt 1 of 3", "Failed: boom", "Dead-lettered"):
        assert step in text
    assert "hunter2" not in text and "u:pw@" not in text and "password=[redacted]" in text
    assert f'href="/console/jobs/{bad["id"]}/replay"' in text
    assert 'hx-trigger="every 2s"' not in text  # terminal: no polling
    queued = submit(pool, settings, tenant[0], tenant[1][:1])
    live = client.get(f"/console/jobs/{queued['id']}")
    assert 'hx-trigger="every 2s"' in live.text and "waiting for a worker" in live.text
    assert client.get("/console/jobs/not-a-uuid").status_code == 404
    assert client.get(f"/console/jobs/{uuid4()}").status_code == 404


@pytest.mark.parametrize(
    ("method", "path", "title", "named"),
    [
        ("get", "/console/jobs/{}", "No such job", "export job"),
        ("get", "/console/jobs/{}/live", "No such job", "export job"),
        ("post", "/console/schedules/{}/pause", "No such schedule", "schedule"),
        ("get", "/console/webhooks/{}", "No such webhook", "webhook"),
        ("post", "/console/webhooks/{}/recover", "No such webhook", "webhook"),
    ],
)
def test_an_unknown_or_malformed_id_is_the_consoles_404_page(
    client, signed_in, method, path, title, named
) -> None:
    for raw in ("not-a-uuid", str(uuid4())):
        form = {"csrf_token": signed_in} if method == "post" else None
        r = client.request(method, path.format(raw), data=form)
        assert r.status_code == 404, (path, raw, r.text)
        assert f"<h1>{title}</h1>" in r.text and f"There is no {named} {raw}." in r.text


def test_an_unknown_audit_entry_is_the_consoles_404_page(client, signed_in) -> None:
    for raw in ("12x", "9" * 19, "987654321"):
        for path in (f"/console/audit/{raw}", f"/console/audit/{raw}/live"):
            r = client.get(path)
            assert r.status_code == 404, (path, r.text)
            assert "No such entry" in r.text and f"There is no audit entry {raw[:20]}." in r.text


def test_replay_from_the_console_once(client, signed_in, pool, settings, tenant) -> None:
    bad = failed_job(pool, settings, tenant[0], tenant[1])
    confirm = client.get(f"/console/jobs/{bad['id']}/replay")
    assert "create a <strong>new job</strong>" in confirm.text
    r = client.post(
        f"/console/jobs/{bad['id']}/replay", data={"csrf_token": signed_in}, follow_redirects=False
    )
    assert r.status_code == 303
    new_id = r.headers["location"].split("/")[3].split("?")[0]
    assert job(pool, UUID(new_id))["replay_of"] == bad["id"]
    again = client.post(
        f"/console/jobs/{bad['id']}/replay", data={"csrf_token": signed_in}, follow_redirects=False
    )
    assert again.headers["location"] == f"/console/jobs/{new_id}?done=already_replayed"
    assert count(pool, "SELECT count(*) FROM export_jobs WHERE replay_of = %s", bad["id"]) == 1
    page = client.get(f"/console/jobs/{new_id}?done=replayed")
    assert "Replay accepted" in page.text and "Replay of" in page.text
    original = client.get(f"/console/jobs/{bad['id']}")
    assert "Replayed as" in original.text and new_id[:8] in original.text


def test_replay_from_the_console_with_a_corrected_input(
    client, signed_in, pool, settings, tenant
) -> None:
    bad = failed_job(pool, settings, tenant[0], tenant[1])
    confirm = client.get(f"/console/jobs/{bad['id']}/replay")
    assert 'name="format"' in confirm.text and 'name="note_ids"' in confirm.text
    wrong = client.post(
        f"/console/jobs/{bad['id']}/replay",
        data={"csrf_token": signed_in, "selection": "ids", "note_ids": "12, x"},
        follow_redirects=False,
    )
    assert wrong.status_code == 422 and "whole numbers" in wrong.text
    picked = sorted(tenant[1][2:5])
    r = client.post(
        f"/console/jobs/{bad['id']}/replay",
        data={
            "csrf_token": signed_in,
            "format": "markdown_zip",
            "selection": "ids",
            "note_ids": "\n".join(str(i) for i in picked),
        },
        follow_redirects=False,
    )
    assert r.status_code == 303, r.text
    new = job(pool, UUID(r.headers["location"].split("/")[3].split("?")[0]))
    assert new["replay_of"] == bad["id"] and new["format"] == "markdown_zip"
    assert new["payload"]["selection"] == {"note_ids": picked} and new["note_count"] == 3


def test_replaying_a_job_that_did_not_fail_is_refused(
    client, signed_in, pool, settings, tenant
) -> None:
    j = submit(pool, settings, tenant[0], tenant[1][:1])
    r = client.post(f"/console/jobs/{j['id']}/replay", data={"csrf_token": signed_in})
    assert r.status_code == 409 and "only failed exports can be replayed" in r.text


def test_bulk_replay_of_a_reason_is_idempotent_even_when_concurrent(
    client, signed_in, pool, settings, tenant
) -> None:
    bad = [failed_job(pool, settings, tenant[0], tenant[1], code="io_broke") for _ in range(6)]
    other = failed_job(pool, settings, tenant[0], tenant[1], code="other_reason")
    results: list[bulk.BulkReplay] = []
    threads = [
        threading.Thread(
            target=lambda: results.append(
                bulk.replay_dead_letters(pool, settings, reason="io_broke", actor="test")
            )
        )
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3 and sum(len(r.created) for r in results) == 6
    for b in bad:
        assert count(pool, "SELECT count(*) FROM export_jobs WHERE replay_of = %s", b["id"]) == 1
    assert count(pool, "SELECT count(*) FROM export_jobs WHERE replay_of = %s", other["id"]) == 0
    # the console's "replay a reason" is a bulk replay by filter: it counts first
    r = client.get("/console/dead-letters/io_broke/replay", follow_redirects=False)
    assert r.headers["location"] == "/console/bulk/replay?error_code=io_broke"
    confirm = client.get(r.headers["location"])
    assert "nothing to replay" in confirm.text
    groups = client.get("/console/dead-letters").text
    assert "io_broke" in groups and "other_reason" in groups


def test_bulk_replay_stops_at_an_admission_refusal(
    client, signed_in, pool, settings, tenant
) -> None:
    for _ in range(3):
        failed_job(pool, settings, tenant[0], tenant[1], code="quota_case")
    with pool.connection() as conn:
        tenant_store.tenant_set_quota(conn, tenant_id=tenant[0], quota=1)
    done = bulk.replay_dead_letters(pool, settings, reason="quota_case", actor="test")
    assert len(done.created) == 1 and done.refused and done.more
    page = client.get("/console/dead-letters/quota_case")
    assert "2 open, 1 replayed" in page.text


def test_mark_resolved_records_who(client, signed_in, pool, settings, tenant) -> None:
    bad = failed_job(pool, settings, tenant[0], tenant[1])
    with pool.connection() as conn:
        dl = conn.execute(
            "SELECT id FROM export_dead_letters WHERE job_id = %s", (bad["id"],)
        ).fetchone()
    r = client.post(
        f"/console/dead-letters/{dl['id']}/resolve",
        data={"csrf_token": signed_in, "next": f"/console/jobs/{bad['id']}"},
        follow_redirects=False,
    )
    assert r.headers["location"] == f"/console/jobs/{bad['id']}?done=resolved"
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT * FROM export_dead_letters WHERE id = %s", (dl["id"],)
        ).fetchone()
    assert row["state"] == "resolved" and row["resolved_by"].endswith("(ops)")
    page = client.get(f"/console/jobs/{bad['id']}")
    assert "An operator marked its dead letter resolved" in page.text
    again = client.post(
        f"/console/dead-letters/{dl['id']}/resolve",
        data={"csrf_token": signed_in},
        follow_redirects=False,
    )
    assert again.headers["location"].endswith("done=not_resolved")
    groups = client.get("/console/dead-letters").text
    assert "nothing open" in groups


def test_cancel_a_running_job_asks_its_worker(client, signed_in, pool, settings, tenant) -> None:
    j = submit(pool, settings, tenant[0], tenant[1][:3])
    with pool.connection() as conn:
        job_store.job_claim(conn, job_id=j["id"], message_id=None, lease_seconds=30)
    confirm = client.get(f"/console/jobs/{j['id']}/cancel")
    assert "next chunk" in confirm.text
    client.post(f"/console/jobs/{j['id']}/cancel", data={"csrf_token": signed_in})
    row = job(pool, j["id"])
    assert row["status"] == "running" and row["cancel_requested"]
    page = client.get(f"/console/jobs/{j['id']}")
    assert "the worker stops at its next chunk boundary" in page.text


def test_schedules_pause_and_resume(client, signed_in, pool, settings, tenant) -> None:
    s = create_schedule(
        pool,
        tenant_id=tenant[0],
        fields={"name": "nightly", "cron": "0 2 * * *", "timezone": "Europe/Berlin", "all": True},
    )
    page = client.get("/console/schedules")
    assert "nightly" in page.text and "Run schedule nightly now" in page.text
    assert "Next slots" in page.text
    r = client.post(
        f"/console/schedules/{s['id']}/pause",
        data={"csrf_token": signed_in},
        follow_redirects=False,
    )
    assert r.status_code == 303
    with pool.connection() as conn:
        assert not conn.execute(
            "SELECT enabled FROM export_schedules WHERE id = %s", (s["id"],)
        ).fetchone()["enabled"]
    assert "paused" in client.get(r.headers["location"]).text
    client.post(f"/console/schedules/{s['id']}/resume", data={"csrf_token": signed_in})
    with pool.connection() as conn:
        assert conn.execute(
            "SELECT enabled FROM export_schedules WHERE id = %s", (s["id"],)
        ).fetchone()["enabled"]


def test_the_schedules_next_slots_are_when_they_fire_with_the_jitter(
    client, signed_in, pool, tenant
) -> None:
    _ = signed_in
    s = create_schedule(
        pool,
        tenant_id=tenant[0],
        fields={"name": "spread", "cron": "@daily", "timezone": "UTC", "all": True, "jitter": 900},
    )
    fires = s["next_due_at"] + timedelta(seconds=s["jitter_offset"])
    page = client.get("/console/schedules").text
    assert f'datetime="{fires.isoformat(timespec="seconds").replace("+00:00", "Z")}"' in page
    assert f"jitter 900 s: each slot fires {s['jitter_offset']} s after its instant" in page


def test_run_now_goes_through_the_schedules_slot_and_admission(
    client, signed_in, pool, settings, tenant
) -> None:
    s = create_schedule(pool, tenant_id=tenant[0], fields={"interval_seconds": 3600, "all": True})
    r = client.post(
        f"/console/schedules/{s['id']}/run", data={"csrf_token": signed_in}, follow_redirects=False
    )
    assert r.status_code == 303 and r.headers["location"].endswith("?done=run_now")
    with pool.connection() as conn:
        slot = conn.execute(
            "SELECT trigger, outcome, job_id FROM export_schedule_slots WHERE schedule_id = %s",
            (s["id"],),
        ).fetchone()
    assert slot["trigger"] == "manual" and slot["outcome"] == "created"
    assert r.headers["location"].startswith(f"/console/jobs/{slot['job_id']}")
    assert "Schedule run now" in client.get(r.headers["location"]).text
    # admission still decides: at a quota of 0 active jobs the run is refused, nothing written
    with pool.connection() as conn:
        tenant_store.tenant_set_quota(conn, tenant_id=tenant[0], quota=1)
    refused = client.post(f"/console/schedules/{s['id']}/run", data={"csrf_token": signed_in})
    assert refused.status_code == 429 and "refused by admission control" in refused.text
    assert (
        count(pool, "SELECT count(*) FROM export_schedule_slots WHERE schedule_id = %s", s["id"])
        == 1
    )
    # without the CSRF token nothing runs
    forged = client.post(f"/console/schedules/{s['id']}/run", data={})
    assert forged.status_code == 403
    # the manual run is still queued when the next slot comes due: skipped for overlap
    with pool.connection() as conn:
        conn.execute(
            "UPDATE export_schedules SET next_due_at = now() - interval '1 s' WHERE id = %s",
            (s["id"],),
        )
    assert ScheduleTicker(settings, pool).tick().overlap == 1
    page = client.get("/console/schedules").text
    assert "overlap skip" in page and ": skipped: overlap" in page


def test_tenants_page_shows_quota_active_jobs_and_refusals(
    client, signed_in, pool, settings, tenant
) -> None:
    key = make_key(pool, tenant[0], ["exports:write", "exports:read"])
    with pool.connection() as conn:
        tenant_store.tenant_set_quota(conn, tenant_id=tenant[0], quota=1)
    auth = {"Authorization": f"Bearer {key}"}
    first = client.post("/v1/exports", json={"note_ids": tenant[1][:1]}, headers=auth)
    assert first.status_code == 202
    for _ in range(2):
        assert (
            client.post("/v1/exports", json={"note_ids": tenant[1][:1]}, headers=auth).status_code
            == 429
        )
    page = client.get("/console/tenants", params={"prefix": tenant[0]})
    row = re.sub(r"\s+", " ", page.text.split(f">{tenant[0]}</a>", 1)[1].split("</tr>", 1)[0])
    assert ">1<" in row  # quota 1, one queued
    assert "at quota" in row
    assert '2 <span class="muted">(2 over quota)</span>' in row


def test_operators_download_any_tenants_file(client, signed_in, pool, settings, tenant) -> None:
    from exportcore.artifacts import open_store
    from exportcore.runner import JobRunner

    j = submit(pool, settings, tenant[0], tenant[1][:2])
    JobRunner(settings, pool, open_store(settings)).run(j["id"], None)
    assert job(pool, j["id"])["status"] == "succeeded"
    r = client.get(f"/console/jobs/{j['id']}/download")
    assert r.status_code == 200 and r.headers["etag"] == f'"{job(pool, j["id"])["result_sha256"]}"'
    queued = submit(pool, settings, tenant[0], tenant[1][:1])
    assert client.get(f"/console/jobs/{queued['id']}/download").status_code == 409
