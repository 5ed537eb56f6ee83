"""Operators at scale, against real PostgreSQL: roles (viewer / admin) enforced in one place
for the admin API and the console, the audit trail (every change leaves its row, written in
the change's own transaction, or the change did not happen), and bulk actions by filter
(count first, idempotent, racing single actions and each other: each job acted on once)."""

from __future__ import annotations

import re
import threading
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest
from fastapi.testclient import TestClient

from exportcore import bulk
from exportcore.audit import Actor
from exportcore.auth import create_operator_key
from exportcore.bulk_runner import BulkRunner
from exportcore.cancel import request_cancel
from exportcore.domain import new_id
from exportcore.replays import replay_export
from exportcore.schedules.management import create_schedule, update_schedule
from exportcore.store import jobs as job_store
from exportcore.store import tenants as tenant_store
from exportcore.store import webhook_messages as message_store
from exportcore.webhooks.endpoints import create_endpoint
from services.api.app import create_app
from tests.support import console_sign_in as sign_in
from tests.support import count, dead_letter, failed, job, key_cache_clock, kinds, submit

Row = dict[str, Any]
ADMIN = Actor(kind="operator", name="nex_op_test (tests)")
CHANGES_AUDITED = "SELECT count(*) FROM operator_actions WHERE action <> 'notes_import'"
"""The audit rows of what a test did (the ``tenant`` fixture's import of notes has its own)."""


def audit_rows(pool, action: str, **where: Any) -> list[Row]:
    clauses = " ".join(f"AND {k} = %s" for k in where)
    with pool.connection() as conn:
        return conn.execute(
            f"SELECT * FROM operator_actions WHERE action = %s {clauses} ORDER BY id",
            (action, *where.values()),
        ).fetchall()


def webhook_message(conn: Any, endpoint_id: UUID | str, tenant_id: str) -> Row:
    """A message of ``export.succeeded`` for the endpoint, due now, as an export's end
    writes one."""
    return message_store.message_insert(
        conn,
        message_id=new_id(),
        endpoint_id=UUID(str(endpoint_id)),
        tenant_id=tenant_id,
        event_type="export.succeeded",
        subject_id=uuid4(),
        data={"export": {}},
    )


@pytest.fixture
def viewer(pool) -> tuple[str, Row]:
    with pool.connection() as conn:
        return create_operator_key(conn, label="vera", role="viewer")


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# --- roles ----------------------------------------------------------------------------


def test_a_viewer_reads_everything_and_every_change_is_refused_with_403(
    api, viewer, pool, settings, tenant
) -> None:
    client, user, _ = api
    key, _ = viewer
    bad = failed(pool, settings, tenant[0], tenant[1])
    queued = submit(pool, settings, tenant[0], tenant[1][:1])
    for path in (
        "/v1/admin/dead-letters",
        f"/v1/admin/exports/{bad['id']}",
        f"/v1/admin/exports/{bad['id']}/events",
        "/v1/admin/audit",
    ):
        assert client.get(path, headers=bearer(key)).status_code == 200, path
    preview = client.post(
        "/v1/admin/bulk-actions/preview",
        json={"action": "replay", "filter": {"reason": "boom"}},
        headers=bearer(key),
    )
    assert preview.status_code == 200 and preview.json()["count"] == 1
    with pool.connection() as conn:
        dl = conn.execute(
            "SELECT id FROM export_dead_letters WHERE job_id = %s", (bad["id"],)
        ).fetchone()
    refused = {
        f"/v1/admin/exports/{bad['id']}/replay": None,
        f"/v1/admin/exports/{queued['id']}/cancel": None,
        f"/v1/admin/dead-letters/{dl['id']}/resolve": {},
        "/v1/admin/replays": {"reason": "boom"},
        "/v1/admin/bulk-actions/1/resume": None,  # refused before the run is looked up
        "/v1/admin/bulk-actions": {
            **preview.json(),
            "confirmed_count": 1,
            "request_id": str(uuid4()),
        },
    }
    for path, body in refused.items():
        if path == "/v1/admin/bulk-actions":
            body = {k: body[k] for k in ("action", "as_of", "confirmed_count", "request_id")}
        r = client.post(path, json=body, headers=bearer(key))
        assert r.status_code == 403, (path, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
        problem = r.json()
        assert problem["type"].endswith("/role_insufficient")
        assert problem["required_role"] == "admin" and problem["title"] == "Insufficient role"
        assert "viewer" in problem["detail"]
    # nothing happened, and nothing was audited
    assert job(pool, bad["id"])["status"] == "failed"
    assert count(pool, "SELECT count(*) FROM export_jobs WHERE replay_of = %s", bad["id"]) == 0
    assert job(pool, queued["id"])["status"] == "queued"
    assert count(pool, CHANGES_AUDITED) == 0
    assert count(pool, "SELECT count(*) FROM bulk_actions") == 0
    # a tenant key is no operator at all; an admin key passes the same check
    assert client.get("/v1/admin/audit", headers=user).status_code == 403


def test_existing_operator_keys_became_admins_and_a_role_change_applies_within_a_second(
    api, viewer, pool, settings, tenant
) -> None:
    client, _, _ = api
    # the column's default is what the migration gave every key that existed before it
    with pool.connection() as conn:
        default = conn.execute(
            "SELECT column_default FROM information_schema.columns "
            "WHERE table_name = 'operator_keys' AND column_name = 'role'"
        ).fetchone()
        conn.execute(
            "INSERT INTO operator_keys (id, key_hash, prefix, label) "
            "VALUES (%s, %s, 'nex_op_old00000', 'old')",
            (uuid4(), b"old"),
        )
        old = conn.execute("SELECT role FROM operator_keys WHERE label = 'old'").fetchone()
    assert "admin" in default["column_default"] and old["role"] == "admin"
    key, row = viewer
    clock = key_cache_clock(client.app)
    bad = failed(pool, settings, tenant[0], tenant[1])
    assert (
        client.post(f"/v1/admin/exports/{bad['id']}/replay", headers=bearer(key)).status_code == 403
    )
    with pool.connection() as conn:
        conn.execute("UPDATE operator_keys SET role = 'admin' WHERE id = %s", (row["id"],))
    # the api trusts a key it looked up for API_KEY_CACHE_SECONDS (at most 1 s, SECURITY.md):
    # a role change, like a revocation, applies on every api process within that bound
    clock.advance(1.0)
    assert (
        client.post(f"/v1/admin/exports/{bad['id']}/replay", headers=bearer(key)).status_code == 202
    )


def test_the_console_hides_changes_from_a_viewer_and_refuses_its_forged_posts(
    viewer, pool, settings, tenant
) -> None:
    key, _ = viewer
    bad = failed(pool, settings, tenant[0], tenant[1])
    running = submit(pool, settings, tenant[0], tenant[1][:1])
    with pool.connection() as conn:
        assert job_store.job_claim(conn, job_id=running["id"], message_id=None, lease_seconds=60)
        dl = conn.execute(
            "SELECT id FROM export_dead_letters WHERE job_id = %s", (bad["id"],)
        ).fetchone()
    schedule = create_schedule(
        pool,
        settings=settings,
        tenant_id=tenant[0],
        fields={"cron": "0 2 * * *", "timezone": "UTC", "all": True, "name": "n"},
    )
    hook = create_endpoint(pool, settings, tenant_id=tenant[0], url="https://hooks.example.com/x")
    audited = count(pool, "SELECT count(*) FROM operator_actions")  # the endpoint's creation
    with TestClient(create_app(settings), base_url="http://testserver") as client:
        csrf = sign_in(client, key)
        for path in (
            f"/console/jobs/{bad['id']}",
            f"/console/jobs/{running['id']}",
            "/console/schedules",
            "/console/dead-letters",
            "/console/jobs?status=failed",
            f"/console/webhooks/{hook['id']}",
        ):
            html = client.get(path).text
            assert "viewer" in html, path
            for button in (
                "Replay…",
                "Cancel…",
                "Mark resolved",
                ">Pause<",
                "Run now",
                "Replay every matching",
                "Cancel every matching",
                "Send them again",
            ):
                assert button not in html, (path, button)
        forged = {
            f"/console/jobs/{bad['id']}/replay": {},
            f"/console/jobs/{running['id']}/cancel": {},
            f"/console/dead-letters/{dl['id']}/resolve": {},
            f"/console/schedules/{schedule['id']}/pause": {},
            f"/console/schedules/{schedule['id']}/resume": {},
            f"/console/schedules/{schedule['id']}/run": {},
            f"/console/webhooks/{hook['id']}/recover": {"since": "2026-12-01T00:00:00Z"},
            f"/console/webhooks/{hook['id']}/attempts/1/redeliver": {},
            "/console/bulk/runs/1/resume": {},
            "/console/bulk/replay": {
                "error_code": "boom",
                "as_of": datetime.now(UTC).isoformat(),
                "confirmed": "1",
                "request_id": str(uuid4()),
            },
            "/console/bulk/cancel": {
                "as_of": datetime.now(UTC).isoformat(),
                "confirmed": "1",
                "request_id": str(uuid4()),
            },
        }
        for path, form in forged.items():
            r = client.post(path, data={"csrf_token": csrf, **form}, follow_redirects=False)
            assert r.status_code == 403 and "viewer" in r.text, (path, r.text[:300])
    assert job(pool, running["id"])["cancel_requested"] is False
    assert count(pool, "SELECT count(*) FROM export_jobs WHERE replay_of = %s", bad["id"]) == 0
    assert count(pool, "SELECT count(*) FROM operator_actions") == audited
    with pool.connection() as conn:
        assert conn.execute(
            "SELECT enabled FROM export_schedules WHERE id = %s", (schedule["id"],)
        ).fetchone()["enabled"]


# --- the audit trail --------------------------------------------------------------------


def test_every_single_action_leaves_its_audit_row_in_its_transaction(
    api, pool, settings, tenant
) -> None:
    client, user, operator = api
    who = f"{operator['X-Prefix']} (alice)"
    bad = failed(pool, settings, tenant[0], tenant[1])
    r = client.post(f"/v1/admin/exports/{bad['id']}/replay", headers=operator)
    assert r.status_code == 202
    again = client.post(f"/v1/admin/exports/{bad['id']}/replay", headers=operator)
    assert again.status_code == 200
    [done, existing] = audit_rows(pool, "replay", job_id=bad["id"])
    assert (done["outcome"], existing["outcome"]) == ("done", "existing")
    assert done["actor"] == who and done["actor_kind"] == "operator"
    assert done["detail"]["replay_id"] == r.json()["id"] and done["tenant_id"] == tenant[0]
    with pool.connection() as conn:
        dl = conn.execute(
            "SELECT id FROM export_dead_letters WHERE job_id = %s", (bad["id"],)
        ).fetchone()
    assert (
        client.post(
            f"/v1/admin/dead-letters/{dl['id']}/resolve", json={"note": "ok"}, headers=operator
        ).status_code
        == 200
    )
    [resolved] = audit_rows(pool, "resolve", target_id=str(dl["id"]))
    assert resolved["detail"] == {"note": "ok"} and resolved["job_id"] == bad["id"]
    # a tenant's own cancel, then an operator's: both on the job's history and in the trail
    mine = submit(pool, settings, tenant[0], tenant[1][:1])
    assert client.post(f"/v1/exports/{mine['id']}/cancel", headers=user).status_code == 202
    theirs = submit(pool, settings, tenant[0], tenant[1][:1])
    assert (
        client.post(f"/v1/admin/exports/{theirs['id']}/cancel", headers=operator).status_code == 202
    )
    [tenant_cancel] = audit_rows(pool, "cancel", job_id=mine["id"])
    [operator_cancel] = audit_rows(pool, "cancel", job_id=theirs["id"])
    assert tenant_cancel["actor_kind"] == "tenant" and operator_cancel["actor"] == who
    assert tenant_cancel["outcome"] == "cancelled"
    history = client.get(f"/v1/exports/{mine['id']}/events", headers=user).json()
    requested = next(e for e in history if e["kind"] == "cancel_requested")
    assert requested["detail"]["requested_by"] == "tenant"
    history = client.get(f"/v1/exports/{theirs['id']}/events", headers=user).json()
    assert next(e for e in history if e["kind"] == "cancel_requested")["detail"] == {
        "requested_by": "operator"
    }
    # webhook changes of the tenant
    hook = client.post(
        "/v1/webhooks", json={"url": "https://hooks.example.com/x"}, headers=user
    ).json()
    client.patch(f"/v1/webhooks/{hook['id']}", json={"description": "d"}, headers=user)
    client.post(f"/v1/webhooks/{hook['id']}/rotate-secret", json={}, headers=user)
    client.delete(f"/v1/webhooks/{hook['id']}", headers=user)
    for action in ("webhook_create", "webhook_update", "webhook_rotate_secret", "webhook_delete"):
        [row] = audit_rows(pool, action, target_id=hook["id"])
        assert row["actor_kind"] == "tenant" and row["tenant_id"] == tenant[0], action
    # the API lists them newest first, filtered and paged
    page = client.get("/v1/admin/audit?action=cancel&limit=1", headers=operator).json()
    assert [i["job_id"] for i in page["items"]] == [str(theirs["id"])] and page["next_cursor"]
    rest = client.get(
        f"/v1/admin/audit?action=cancel&cursor={page['next_cursor']}", headers=operator
    ).json()
    assert [i["job_id"] for i in rest["items"]] == [str(mine["id"])] and rest["next_cursor"] is None
    assert client.get(
        f"/v1/admin/audit?tenant={tenant[0]}&actor_kind=tenant", headers=operator
    ).json()["items"]


def refuse_audit_rows(pool, when: str = "true") -> None:
    """From now on the database refuses every ``operator_actions`` row written (inserted or
    updated) for which ``when`` holds (a trigger's WHEN: ``NEW.count > 2``), with the CHECK
    violation a constraint of the table would raise. The trigger lives in this test's own
    database (a fresh one per test); :func:`accept_audit_rows` removes it."""
    with pool.connection() as conn:
        conn.execute(
            "CREATE FUNCTION refuse_audit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            " RAISE EXCEPTION 'operator_actions refuses this % (the test''s trigger)', TG_OP"
            " USING ERRCODE = 'check_violation'; END $$"
        )
        conn.execute(
            "CREATE TRIGGER refuse_audit BEFORE INSERT OR UPDATE ON operator_actions"
            f" FOR EACH ROW WHEN ({when}) EXECUTE FUNCTION refuse_audit()"
        )


def accept_audit_rows(pool) -> None:
    """Remove the trigger of :func:`refuse_audit_rows`."""
    with pool.connection() as conn:
        conn.execute("DROP TRIGGER refuse_audit ON operator_actions")
        conn.execute("DROP FUNCTION refuse_audit()")


def test_a_single_action_whose_audit_row_fails_did_not_happen(pool, settings, tenant) -> None:
    bad = failed(pool, settings, tenant[0], tenant[1])
    queued = submit(pool, settings, tenant[0], tenant[1][:1])
    schedule = create_schedule(
        pool,
        settings=settings,
        tenant_id=tenant[0],
        fields={"cron": "0 2 * * *", "timezone": "UTC", "all": True, "name": "n"},
    )
    written = "SELECT (SELECT count(*) FROM export_jobs) + (SELECT count(*) FROM export_outbox)"
    before = count(pool, written)
    audited = count(pool, "SELECT count(*) FROM operator_actions")  # the schedule's creation
    history = {j: kinds(pool, j) for j in (bad["id"], queued["id"])}
    actions: dict[str, Any] = {
        "replay": lambda: replay_export(pool, settings, original_id=bad["id"], actor=ADMIN),
        "cancel": lambda: request_cancel(
            pool=pool, tenant_id=None, job_id=queued["id"], actor=ADMIN
        ),
        "pause": lambda: update_schedule(
            pool,
            tenant_id=tenant[0],
            schedule_id=schedule["id"],
            patch={"enabled": False},
            settings=settings,
            actor=ADMIN,
        ),
    }
    refuse_audit_rows(pool)
    # each action writes its change first and its audit row last, so a change committed on
    # its own would survive the refused row
    for act in actions.values():
        with pytest.raises(psycopg.errors.CheckViolation, match="refuses this INSERT"):
            act()
    # none of them happened: no replay (no job, no outbox event), the dead letter still
    # open, the queued job neither cancelled nor asked to be, the schedule still enabled
    assert count(pool, written) == before
    assert count(pool, "SELECT count(*) FROM export_jobs WHERE replay_of = %s", bad["id"]) == 0
    letter = dead_letter(pool, bad["id"])
    assert (letter["state"], letter["replayed_by"]) == ("open", None)
    after = job(pool, queued["id"])
    assert (after["status"], after["cancel_requested"]) == ("queued", False)
    assert {j: kinds(pool, j) for j in history} == history
    enabled = "SELECT count(*) FROM export_schedules WHERE id = %s AND enabled"
    assert count(pool, enabled, schedule["id"]) == 1
    assert count(pool, "SELECT count(*) FROM operator_actions") == audited
    # the audit row accepted again, the same actions go through, each with its row
    accept_audit_rows(pool)
    for act in actions.values():
        act()
    assert dead_letter(pool, bad["id"])["state"] == "replayed"
    assert job(pool, queued["id"])["status"] == "cancelled"
    assert count(pool, enabled, schedule["id"]) == 0
    assert [len(audit_rows(pool, a)) for a in actions] == [1, 1, 1]


@pytest.mark.parametrize("kind", ["cancel", "replay"])
def test_a_bulk_batch_whose_audit_update_fails_rolls_back_with_it(
    kind: str, pool, settings, tenant
) -> None:
    if kind == "cancel":
        targets = sorted(submit(pool, settings, tenant[0], tenant[1][:1])["id"] for _ in range(4))
        filt = bulk.BulkFilter(tenant_id=tenant[0])
    else:
        targets = [
            failed(pool, settings, tenant[0], tenant[1], code="audited")["id"] for _ in range(4)
        ]
        filt = bulk.BulkFilter(reason="audited")
    seen = bulk.preview(pool, kind, filt)
    assert seen.count == 4
    run, _ = bulk.start(pool, ADMIN, kind, filt, as_of=seen.as_of, confirmed=4, request_id=uuid4())
    # the first batch (2 targets) may advance the run's audit row; the second may not
    refuse_audit_rows(pool, "NEW.count > 2")
    with pytest.raises(psycopg.errors.CheckViolation, match="refuses this UPDATE"):
        bulk.run(pool, settings, run["id"], batch_size=2)

    def acted_on() -> list[UUID]:
        if kind == "cancel":
            return [j for j in targets if job(pool, j)["status"] == "cancelled"]
        return [j for j in targets if dead_letter(pool, j)["state"] == "replayed"]

    # the first batch committed with its audit count; the second rolled back whole: its
    # jobs untouched, the run's progress and its audit row where the first batch left them
    assert acted_on() == targets[:2]
    for j in targets[2:]:
        if kind == "cancel":
            assert job(pool, j)["cancel_requested"] is False
            assert "cancel_requested" not in kinds(pool, j)
        else:
            assert count(pool, "SELECT count(*) FROM export_jobs WHERE replay_of = %s", j) == 0
    progress = bulk.get(pool, run["id"])
    assert (progress["state"], progress["seen"], progress["acted"]) == ("running", 2, 2)
    [entry] = audit_rows(pool, f"bulk_{kind}")
    assert (entry["count"], entry["outcome"]) == (2, "running")
    # the audit row accepted again, the run resumes from its last committed batch
    accept_audit_rows(pool)
    with pool.connection() as conn:
        conn.execute(
            "UPDATE bulk_actions SET lease_expires_at = now() - interval '1 s' WHERE id = %s",
            (run["id"],),
        )
    done = bulk.resume(pool, settings, run["id"])
    assert (done["state"], done["acted"]) == ("done", 4) and acted_on() == targets
    [entry] = audit_rows(pool, f"bulk_{kind}")
    assert (entry["count"], entry["outcome"]) == (4, "done")


def test_a_refused_action_leaves_no_audit_row(api, pool, settings, tenant) -> None:
    client, _, operator = api
    bad = failed(pool, settings, tenant[0], tenant[1])
    with pool.connection() as conn:
        tenant_store.tenant_set_quota(conn, tenant_id=tenant[0], quota=0)
    r = client.post(f"/v1/admin/exports/{bad['id']}/replay", headers=operator)
    assert r.status_code == 429
    assert audit_rows(pool, "replay") == []
    assert count(pool, "SELECT count(*) FROM export_jobs WHERE replay_of = %s", bad["id"]) == 0


def test_schedule_pause_resume_and_run_now_are_audited(api, pool, settings, tenant) -> None:
    client, user, _ = api
    s = client.post(
        "/v1/schedules",
        json={"cron": "0 2 * * *", "timezone": "UTC", "all": True},
        headers=user,
    ).json()
    client.patch(f"/v1/schedules/{s['id']}", json={"enabled": False}, headers=user)
    client.patch(f"/v1/schedules/{s['id']}", json={"enabled": False}, headers=user)  # no change
    client.patch(f"/v1/schedules/{s['id']}", json={"enabled": True}, headers=user)
    run = client.post(f"/v1/schedules/{s['id']}/runs", headers=user).json()
    assert len(audit_rows(pool, "pause", target_id=s["id"])) == 1
    assert len(audit_rows(pool, "resume", target_id=s["id"])) == 1
    [ran] = audit_rows(pool, "run_now", target_id=s["id"])
    assert str(ran["job_id"]) == run["export"]["id"]


def test_console_pause_resume_run_now_and_redeliver_leave_their_audit_rows(
    pool, settings, tenant
) -> None:
    with pool.connection() as conn:
        key, operator = create_operator_key(conn, label="olga")
    schedule = create_schedule(
        pool,
        settings=settings,
        tenant_id=tenant[0],
        fields={"cron": "0 2 * * *", "timezone": "UTC", "all": True, "name": "n"},
    )
    sid = str(schedule["id"])
    hook = create_endpoint(pool, settings, tenant_id=tenant[0], url="https://hooks.example.com/x")
    with pool.connection() as conn:  # a message that failed for good, as the sender leaves it
        message = webhook_message(conn, hook["id"], tenant[0])
        conn.execute(
            "UPDATE webhook_messages SET status = 'failed', budget_used = 8 WHERE id = %s",
            (message["id"],),
        )
        attempt = conn.execute(
            "INSERT INTO webhook_attempts (message_id, endpoint_id, attempt, redelivery,"
            " started_at, outcome, signatures) VALUES (%s, %s, 8, false, now(),"
            " 'connection_error', 1) RETURNING id",
            (message["id"], hook["id"]),
        ).fetchone()["id"]
    with TestClient(create_app(settings), base_url="http://testserver") as console:
        csrf = sign_in(console, key)

        def post(path: str) -> str:
            r = console.post(path, data={"csrf_token": csrf}, follow_redirects=False)
            assert r.status_code == 303, (path, r.text[:300])
            return str(r.headers["location"])

        assert "done=paused" in post(f"/console/schedules/{sid}/pause")
        assert "done=resumed" in post(f"/console/schedules/{sid}/resume")
        ran = re.fullmatch(
            r"/console/jobs/([0-9a-f-]{36})\?done=run_now", post(f"/console/schedules/{sid}/run")
        )
        assert ran, "run now leads to the new export's page"
        assert "done=redelivered" in post(
            f"/console/webhooks/{hook['id']}/attempts/{attempt}/redeliver"
        )
    [paused] = audit_rows(pool, "pause", target_id=sid)
    [resumed] = audit_rows(pool, "resume", target_id=sid)
    [run_now] = audit_rows(pool, "run_now", target_id=sid)
    [redelivered] = audit_rows(pool, "webhook_redeliver", target_id=str(hook["id"]))
    for entry in (paused, resumed, run_now, redelivered):
        assert entry["actor_kind"] == "operator", entry["action"]
        assert entry["actor"] == f"{operator['prefix']} (olga)", entry["action"]
        assert entry["key_id"] == operator["id"], entry["action"]
        assert entry["tenant_id"] == tenant[0] and entry["outcome"] == "done", entry["action"]
    assert (paused["target_kind"], run_now["target_kind"]) == ("schedule", "schedule")
    assert str(run_now["job_id"]) == ran.group(1)
    assert job(pool, UUID(ran.group(1)))["status"] == "queued"
    assert redelivered["target_kind"] == "webhook"
    assert redelivered["detail"]["attempt_id"] == attempt
    with pool.connection() as conn:
        again = conn.execute(
            "SELECT status, budget_used, redelivery FROM webhook_messages WHERE id = %s",
            (message["id"],),
        ).fetchone()
        enabled = conn.execute(
            "SELECT enabled FROM export_schedules WHERE id = %s", (schedule["id"],)
        ).fetchone()["enabled"]
    assert (again["status"], again["budget_used"], again["redelivery"]) == ("pending", 0, True)
    assert enabled  # paused, then resumed


def test_the_job_timeline_shows_who_acted(api, pool, settings, tenant) -> None:
    client, _, operator = api
    key = operator["Authorization"].removeprefix("Bearer ")
    bad = failed(pool, settings, tenant[0], tenant[1])
    client.post(f"/v1/admin/exports/{bad['id']}/replay", headers=operator)
    with TestClient(create_app(settings), base_url="http://testserver") as console:
        sign_in(console, key)
        html = console.get(f"/console/jobs/{bad['id']}").text
    assert f"Replay asked by {operator['X-Prefix']} (alice)" in html


# --- bulk actions -------------------------------------------------------------------------


def test_a_bulk_cancel_counts_first_acts_once_and_is_audited_once(
    api, pool, settings, tenant
) -> None:
    client, _, operator = api
    jobs = [submit(pool, settings, tenant[0], tenant[1][:1]) for _ in range(5)]
    running = jobs[0]
    with pool.connection() as conn:
        assert job_store.job_claim(conn, job_id=running["id"], message_id=None, lease_seconds=60)
    preview = client.post(
        "/v1/admin/bulk-actions/preview",
        json={"action": "cancel", "filter": {"tenant": tenant[0]}},
        headers=operator,
    ).json()
    assert preview["count"] == 5
    late = submit(pool, settings, tenant[0], tenant[1][:1])  # matches only after the count
    body = {
        "action": "cancel",
        "filter": {"tenant": tenant[0]},
        "as_of": preview["as_of"],
        "confirmed_count": 5,
        "request_id": str(uuid4()),
    }
    r = client.post("/v1/admin/bulk-actions", json=body, headers=operator)
    assert r.status_code == 202 and r.headers["location"].endswith(f"/{r.json()['id']}")
    again = client.post("/v1/admin/bulk-actions", json=body, headers=operator)
    assert again.status_code == 200 and again.json()["id"] == r.json()["id"]  # idempotent
    # the api only wrote it: nothing was acted on until a bulk runner (the recovery-
    # scanner's) takes it
    assert r.json()["state"] == "running" and job(pool, jobs[1]["id"])["status"] == "queued"
    assert BulkRunner(settings, pool).run_once() == {"bulk_runs": 1, "bulk_targets": 5}
    run = client.get(f"/v1/admin/bulk-actions/{r.json()['id']}", headers=operator).json()
    assert (run["state"], run["seen"], run["acted"], run["skipped"]) == ("done", 5, 5, 0)
    for j in jobs[1:]:
        assert job(pool, j["id"])["status"] == "cancelled"
    assert (
        job(pool, running["id"])["cancel_requested"] and job(pool, late["id"])["status"] == "queued"
    )
    [entry] = audit_rows(pool, "bulk_cancel")
    assert (entry["count"], entry["outcome"], entry["filter"]) == (
        5,
        "done",
        {"tenant_id": tenant[0]},
    )
    assert entry["detail"]["bulk_id"] == run["id"] and entry["detail"]["seen"] == 5
    assert count(pool, "SELECT count(*) FROM bulk_actions") == 1
    events = count(
        pool,
        "SELECT count(*) FROM export_job_events WHERE kind = 'cancel_requested' "
        "AND detail ->> 'bulk_id' = %s",
        str(run["id"]),
    )
    assert events == 5


def test_bulk_and_single_actions_racing_act_on_each_job_once(pool, settings, tenant) -> None:
    jobs = [submit(pool, settings, tenant[0], tenant[1][:1]) for _ in range(40)]
    bad = [failed(pool, settings, tenant[0], tenant[1], code="race") for _ in range(20)]
    # the counts' instant: the replays written during the race are newer, so the bulk
    # cancel of the tenant never reaches them
    now = bulk.preview(pool, "cancel", bulk.BulkFilter()).as_of
    filt_cancel = bulk.BulkFilter(tenant_id=tenant[0])
    filt_replay = bulk.BulkFilter(reason="race")
    runs = [
        bulk.start(pool, ADMIN, "cancel", filt_cancel, as_of=now, confirmed=40, request_id=uuid4())[
            0
        ],
        bulk.start(pool, ADMIN, "cancel", filt_cancel, as_of=now, confirmed=40, request_id=uuid4())[
            0
        ],
        bulk.start(pool, ADMIN, "replay", filt_replay, as_of=now, confirmed=20, request_id=uuid4())[
            0
        ],
        bulk.start(pool, ADMIN, "replay", filt_replay, as_of=now, confirmed=20, request_id=uuid4())[
            0
        ],
    ]
    errors: list[BaseException] = []

    def guarded(fn: Any, *args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except Exception as exc:  # the single actions may find the job already acted on
            if type(exc).__name__ not in ("JobStateConflict",):
                errors.append(exc)

    threads = [
        threading.Thread(
            target=guarded, args=(bulk.run, pool, settings, r["id"]), kwargs={"batch_size": 7}
        )
        for r in runs
    ]
    threads += [
        threading.Thread(
            target=guarded,
            args=(request_cancel,),
            kwargs={"pool": pool, "tenant_id": None, "job_id": j["id"], "actor": ADMIN},
        )
        for j in jobs[::3]
    ]
    threads += [
        threading.Thread(
            target=guarded,
            args=(replay_export, pool, settings),
            kwargs={"original_id": b["id"], "actor": ADMIN},
        )
        for b in bad[::3]
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for j in jobs:
        assert job(pool, j["id"])["status"] == "cancelled"
        assert (
            count(
                pool,
                "SELECT count(*) FROM export_job_events WHERE job_id = %s "
                "AND kind = 'cancel_requested'",
                j["id"],
            )
            == 1
        )
    for b in bad:
        assert count(pool, "SELECT count(*) FROM export_jobs WHERE replay_of = %s", b["id"]) == 1
    with pool.connection() as conn:
        ended = conn.execute("SELECT kind, state, acted FROM bulk_actions ORDER BY id").fetchall()
    assert all(r["state"] == "done" for r in ended)
    cancels = sum(r["acted"] for r in ended if r["kind"] == "cancel")
    replays = sum(r["acted"] for r in ended if r["kind"] == "replay")
    assert cancels + len(audit_rows(pool, "cancel")) == 40
    assert replays + len([a for a in audit_rows(pool, "replay") if a["outcome"] == "done"]) == 20


def test_a_bulk_replay_stops_at_admission_and_a_dead_runner_is_resumed(
    pool, settings, tenant
) -> None:
    for _ in range(5):
        failed(pool, settings, tenant[0], tenant[1], code="halt")
    with pool.connection() as conn:
        tenant_store.tenant_set_quota(conn, tenant_id=tenant[0], quota=2)
    seen = bulk.preview(pool, "replay", bulk.BulkFilter(reason="halt"))
    run, _ = bulk.start(
        pool, ADMIN, "replay", seen.filter, as_of=seen.as_of, confirmed=5, request_id=uuid4()
    )
    ended = bulk.run(pool, settings, run["id"], batch_size=10)
    assert (ended["state"], ended["acted"]) == ("stopped", 2)
    assert "admission refused (quota_exceeded)" in ended["stop_reason"]
    [entry] = audit_rows(pool, "bulk_replay")
    assert (entry["count"], entry["outcome"]) == (2, "stopped")
    # a run whose runner died: its lease expires, and a resume continues where it was
    with pool.connection() as conn:
        tenant_store.tenant_set_quota(conn, tenant_id=tenant[0], quota=None)
    again, _ = bulk.start(
        pool, ADMIN, "replay", seen.filter, as_of=datetime.now(UTC), confirmed=3, request_id=uuid4()
    )
    with pool.connection() as conn:
        conn.execute(
            "UPDATE bulk_actions SET lease_token = %s, lease_expires_at = now() "
            "+ interval '1 hour' WHERE id = %s",
            (uuid4(), again["id"]),
        )
    assert bulk.run(pool, settings, again["id"])["state"] == "running"  # held: left alone
    with pool.connection() as conn:
        conn.execute(
            "UPDATE bulk_actions SET lease_expires_at = now() - interval '1 s' WHERE id = %s",
            (again["id"],),
        )
    assert bulk.get(pool, again["id"])["interrupted"]
    done = bulk.resume(pool, settings, again["id"])
    assert (done["state"], done["acted"]) == ("done", 3)
    assert (
        count(
            pool,
            "SELECT count(*) FROM export_dead_letters WHERE reason = 'halt' AND state = 'open'",
        )
        == 0
    )


def test_a_bulk_replay_from_the_console_shows_its_count_asks_runs_and_lands_on_the_audit_page(
    pool, settings, tenant
) -> None:
    for _ in range(3):
        failed(pool, settings, tenant[0], tenant[1], code="console_case")
    with pool.connection() as conn:
        key, _ = create_operator_key(conn, label="ada")
    with TestClient(create_app(settings), base_url="http://testserver") as client:
        csrf = sign_in(client, key)
        jobs = client.get("/console/jobs?status=failed&error_code=console_case").text
        assert "Replay every matching failed job" in jobs
        confirm = client.get("/console/bulk/replay?status=failed&error_code=console_case")
        assert (
            "<strong>3</strong> job(s) match" in confirm.text and "Replay 3 job(s)" in confirm.text
        )
        form = dict(re.findall(r'name="([a-z_]+)" value="([^"]*)"', confirm.text))
        r = client.post("/console/bulk/replay", data=form, follow_redirects=False)
        assert r.status_code == 303 and form["csrf_token"] == csrf
        assert re.match(r"/console/audit/\d+\?done=bulk_started", r.headers["location"])
        again = client.post("/console/bulk/replay", data=form, follow_redirects=False)
        assert again.headers["location"] == r.headers["location"]  # the same confirmation
        assert "Bulk replay: running" in client.get(r.headers["location"]).text
        assert BulkRunner(settings, pool).run_once()["bulk_runs"] == 1  # the scanner's runner
        entry = client.get(r.headers["location"]).text
        assert "Bulk replay: done" in entry and "3 of 3 reached: 3 replayed" in entry
        assert "bulk_replay" in client.get("/console/audit").text
    assert count(pool, "SELECT count(*) FROM bulk_actions") == 1


def test_a_console_confirmation_whose_as_of_was_moved_to_the_future_starts_nothing(
    pool, settings, tenant
) -> None:
    for _ in range(2):
        failed(pool, settings, tenant[0], tenant[1], code="moved_as_of")
    with pool.connection() as conn:
        key, _ = create_operator_key(conn, label="ada")
    with TestClient(create_app(settings), base_url="http://testserver") as client:
        sign_in(client, key)
        confirm = client.get("/console/bulk/replay?status=failed&error_code=moved_as_of")
        form = dict(re.findall(r'name="([a-z_]+)" value="([^"]*)"', confirm.text))
        later = datetime.fromisoformat(form["as_of"]) + timedelta(days=1)
        r = client.post("/console/bulk/replay", data=form | {"as_of": later.isoformat()})
        assert r.status_code == 422 and "The bulk action was not started" in r.text
        assert "the as_of of a preview" in r.text
    assert count(pool, "SELECT count(*) FROM bulk_actions") == 0
    assert audit_rows(pool, "bulk_replay") == []


def test_search_by_id_prefix_and_short_form_from_any_page(api, pool, settings, tenant) -> None:
    _, _, operator = api
    key = operator["Authorization"].removeprefix("Bearer ")
    a = submit(pool, settings, tenant[0], tenant[1][:1])
    b = submit(pool, settings, tenant[0], tenant[1][:1])
    with TestClient(create_app(settings), base_url="http://testserver") as client:
        sign_in(client, key)
        assert 'action="/console/search"' in client.get("/console/tenants").text
        aid = str(a["id"])
        for term in (aid, aid[:20], f"{aid[:8]}…{aid[-4:]}", f"{aid[:8]}...{aid[-4:]}"):
            r = client.get(f"/console/search?q={term}", follow_redirects=False)
            if term == aid[:20] and aid[:20] == str(b["id"])[:20]:
                continue
            assert r.status_code == 303 and r.headers["location"] == f"/console/jobs/{aid}", term
        both = client.get(f"/console/search?q={aid[:6]}")
        assert both.status_code == 200 and aid in both.text
        assert client.get("/console/search?q=zz").status_code == 400
        assert "No job has an id" in client.get(f"/console/search?q={UUID(int=1)}").text


# --- webhook health ---------------------------------------------------------------------


def test_webhook_attempts_recover_since_and_event_types(api, pool, settings, tenant) -> None:
    client, user, operator = api
    hook = client.post(
        "/v1/webhooks", json={"url": "https://hooks.example.com/x"}, headers=user
    ).json()
    with pool.connection() as conn:
        ids = []
        for _ in range(3):
            ids.append(webhook_message(conn, hook["id"], tenant[0])["id"])
        conn.execute(
            "UPDATE webhook_messages SET status = 'failed', budget_used = 8 WHERE id = ANY(%s)",
            (ids[:2],),
        )
        conn.execute(
            "UPDATE webhook_messages SET created_at = now() - interval '2 days' WHERE id = %s",
            (ids[0],),
        )
    since = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    r = client.post(f"/v1/webhooks/{hook['id']}/recover", json={"since": since}, headers=user)
    assert r.status_code == 202 and r.json()["recovered"] == 1, r.text
    with pool.connection() as conn:
        found = conn.execute(
            "SELECT id, status FROM webhook_messages WHERE id = ANY(%s)", (ids,)
        ).fetchall()
    states = {x["id"]: x["status"] for x in found}
    assert states == {ids[0]: "failed", ids[1]: "pending", ids[2]: "pending"}
    [entry] = audit_rows(pool, "webhook_recover", target_id=hook["id"])
    assert entry["count"] == 1 and entry["actor_kind"] == "tenant"
    page = client.get(f"/v1/webhooks/{hook['id']}/attempts?outcome=timeout", headers=user)
    assert page.status_code == 200 and page.json() == {"items": [], "next_cursor": None}
    kinds = client.get("/v1/webhooks/event-types", headers=user).json()
    assert {k["name"] for k in kinds} >= {"export.succeeded", "webhook.test"}
    assert all(k["schema"]["$schema"].endswith("2020-12/schema") for k in kinds)
    # disabled: the tenant sees why, and recover refuses until it is enabled again
    with pool.connection() as conn:
        conn.execute(
            "UPDATE webhook_endpoints SET enabled = false, disabled_reason = "
            "'the receiver answered 410 Gone' WHERE id = %s",
            (hook["id"],),
        )
    assert (
        "410 Gone"
        in client.get(f"/v1/webhooks/{hook['id']}", headers=user).json()["disabled_reason"]
    )
    refused = client.post(f"/v1/webhooks/{hook['id']}/recover", json={"since": since}, headers=user)
    assert refused.status_code == 409
    # operators: the console's health page, an admin may recover, a viewer may not
    key = operator["Authorization"].removeprefix("Bearer ")
    with TestClient(create_app(settings), base_url="http://testserver") as console:
        sign_in(console, key)
        listing = console.get(f"/console/webhooks?tenant={tenant[0]}").text
        assert "disabled" in listing and "410 Gone" in listing
        detail = console.get(f"/console/webhooks/{hook['id']}").text
        assert "Send them again" in detail and "410 Gone" in detail


def test_webhook_attempts_are_paged_by_their_cursor_newest_first(api, pool, tenant) -> None:
    client, user, _ = api
    hook = client.post(
        "/v1/webhooks", json={"url": "https://hooks.example.com/x"}, headers=user
    ).json()
    outcomes = ["http_error", "timeout", "connection_error", "timeout", "delivered"]
    with pool.connection() as conn:  # five attempts of one message, as the sender records them
        message = webhook_message(conn, hook["id"], tenant[0])
        ids = [
            conn.execute(
                "INSERT INTO webhook_attempts (message_id, endpoint_id, attempt, started_at,"
                " outcome, status_code) VALUES (%s, %s, %s, now(), %s, %s) RETURNING id",
                (message["id"], hook["id"], n, outcome, 204 if outcome == "delivered" else 503),
            ).fetchone()["id"]
            for n, outcome in enumerate(outcomes, start=1)
        ]
    newest_first = ids[::-1]

    def pages(query: str) -> list[list[int]]:
        """Every page of ``/attempts?<query>``, following next_cursor to the end."""
        got: list[list[int]] = []
        cursor = None
        while True:
            path = f"/v1/webhooks/{hook['id']}/attempts?{query}"
            r = client.get(path + (f"&cursor={cursor}" if cursor else ""), headers=user)
            assert r.status_code == 200, r.text
            page = r.json()
            got.append([a["id"] for a in page["items"]])
            cursor = page["next_cursor"]
            if cursor is None:
                return got
            assert cursor == got[-1][-1]  # the last attempt shown: the next page is older
            assert len(got) <= len(ids), "the cursor does not advance"

    assert pages("limit=2") == [newest_first[:2], newest_first[2:4], newest_first[4:]]
    assert pages("limit=4") == [newest_first[:4], newest_first[4:]]
    assert pages("limit=5") == [newest_first]  # exactly one full page: no empty next one
    timeouts = [i for i, o in zip(ids, outcomes, strict=True) if o == "timeout"][::-1]
    assert pages("limit=1&outcome=timeout") == [[timeouts[0]], [timeouts[1]]]
    # the former name answers the same pages
    first = client.get(f"/v1/webhooks/{hook['id']}/attempts?limit=2", headers=user).json()
    former = client.get(f"/v1/webhooks/{hook['id']}/deliveries?limit=2", headers=user).json()
    assert former == first and first["items"][0]["outcome"] == "delivered"


# --- the access log, the HTTP metrics, the console's headers ---------------------------


def test_requests_are_named_by_route_template_even_before_routing(
    api, settings, caplog: pytest.LogCaptureFixture
) -> None:
    from exportcore import metrics

    client, user, _ = api
    caplog.set_level("INFO", logger="services.api.access")
    too_big = "x" * (settings.max_request_bytes + 10)
    before = metrics.HTTP_REQUESTS.labels("POST", "/v1/exports", "413")._value.get()
    r = client.post(
        "/v1/exports", content=too_big, headers={**user, "content-type": "application/json"}
    )
    assert r.status_code == 413
    assert metrics.HTTP_REQUESTS.labels("POST", "/v1/exports", "413")._value.get() == before + 1
    client.get("/openapi.json")
    paths = [getattr(rec, "path", None) for rec in caplog.records]
    assert "/v1/exports" in paths and "/openapi.json" in paths and "<unmatched>" not in paths
    client.get("/no/such/thing")
    assert getattr(caplog.records[-1], "path", None) == "<unmatched>"
    console = client.get("/console/login")
    assert console.headers.get_list("x-content-type-options") == ["nosniff"]
