"""Durable schedules against real PostgreSQL, with a controllable clock for the tick."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from uuid import uuid4
from zoneinfo import ZoneInfo

import pytest
from fastapi.testclient import TestClient

from exportcore.artifacts import FileArtifactStore
from exportcore.auth import create_api_key
from exportcore.db import transaction
from exportcore.runner import JobRunner
from exportcore.schedules.management import create_schedule, run_now, update_schedule
from exportcore.schedules.rules import Rule
from exportcore.schedules.ticker import ScheduleTicker
from exportcore.settings import Settings
from exportcore.store import jobs as job_store
from exportcore.store import schedules as schedule_store
from services.api.app import create_app
from tests.support import count, tenant_with_notes, wait_for

T0 = datetime(2030, 1, 7, 9, 0, tzinfo=UTC)
MIN = timedelta(minutes=1)


def every_minute(pool, tid, ids, **extra) -> dict:
    """A schedule every minute from T0. Its exports never run in these tests, so it allows
    overlap unless told otherwise: each slot's outcome then does not depend on the previous
    export (the overlap policies have tests of their own)."""
    fields = {"interval_seconds": 60, "note_ids": ids[:2], "overlap": "allow_all", **extra}
    row = create_schedule(pool, tenant_id=tid, fields=fields)
    with pool.connection() as conn:
        conn.execute("UPDATE export_schedules SET next_due_at = %s WHERE id = %s", (T0, row["id"]))
    return row


def slots(pool, schedule_id) -> list[tuple[datetime, str, bool]]:
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT scheduled_at, outcome, job_id IS NOT NULL AS has_job FROM export_schedule_slots"
            " WHERE schedule_id = %s ORDER BY scheduled_at",
            (schedule_id,),
        ).fetchall()
    return [(r["scheduled_at"], r["outcome"], r["has_job"]) for r in rows]


def cursor(pool, schedule_id) -> datetime:
    with pool.connection() as conn:
        return conn.execute(
            "SELECT next_due_at FROM export_schedules WHERE id = %s", (schedule_id,)
        ).fetchone()["next_due_at"]


def jobs_of(pool, schedule_id) -> int:
    return count(
        pool,
        "SELECT count(*) FROM export_jobs j JOIN export_schedule_slots s ON s.job_id = j.id WHERE s.schedule_id = %s",
        schedule_id,
    )


def test_ten_concurrent_ticks_create_one_job_for_one_slot(pool, settings: Settings, tenant) -> None:
    tid, ids = tenant
    sched = every_minute(pool, tid, ids)
    barrier = threading.Barrier(10)

    def tick() -> None:
        barrier.wait()
        ScheduleTicker(settings, pool).tick(now=T0 + timedelta(seconds=3))

    threads = [threading.Thread(target=tick) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert slots(pool, sched["id"]) == [(T0, "created", True)]
    assert count(pool, "SELECT count(*) FROM export_jobs") == 1
    # a tick redelivered after the slot's minute has passed: still one job for that slot
    ScheduleTicker(settings, pool).tick(now=T0 + timedelta(seconds=50))
    assert count(pool, "SELECT count(*) FROM export_jobs") == 1
    assert cursor(pool, sched["id"]) == T0 + MIN
    with pool.connection() as conn:
        detail = conn.execute(
            "SELECT detail FROM export_job_events WHERE kind = 'submitted'"
        ).fetchone()["detail"]
    assert detail["source"] == "schedule" and detail["schedule_id"] == str(sched["id"])


def test_downtime_with_skip_runs_only_the_latest_slot(pool, settings: Settings, tenant) -> None:
    tid, ids = tenant
    sched = every_minute(pool, tid, ids, catch_up="skip")
    ScheduleTicker(settings, pool).tick(now=T0 + 5 * MIN + timedelta(seconds=2))
    got = slots(pool, sched["id"])
    assert [(s, o) for s, o, _ in got] == [(T0 + m * MIN, "skipped") for m in range(5)] + [
        (T0 + 5 * MIN, "created")
    ]
    assert jobs_of(pool, sched["id"]) == 1
    assert cursor(pool, sched["id"]) == T0 + 6 * MIN
    ScheduleTicker(settings, pool).tick(now=T0 + 6 * MIN + timedelta(seconds=1))  # then on time
    assert jobs_of(pool, sched["id"]) == 2


def test_downtime_with_all_runs_each_missed_slot_up_to_the_maximum(
    pool, settings: Settings, tenant
) -> None:
    tid, ids = tenant
    sched = every_minute(pool, tid, ids, catch_up="all", max_catch_up=3)
    ticker = ScheduleTicker(settings, pool)
    ticker.tick(now=T0 + 5 * MIN + timedelta(seconds=2))
    got = slots(pool, sched["id"])
    assert [o for _, o, _ in got] == ["skipped"] * 3 + ["created"] * 3
    assert [s for s, o, _ in got if o == "created"] == [T0 + m * MIN for m in (3, 4, 5)]
    ticker.tick(now=T0 + 6 * MIN + timedelta(seconds=2))
    assert jobs_of(pool, sched["id"]) == 4 and cursor(pool, sched["id"]) == T0 + 7 * MIN


def test_each_created_slot_commits_before_the_next_slot_is_admitted(
    pool, settings: Settings, tenant
) -> None:
    """A catch-up of several slots must not hold the global admission lock (taken by each
    job's admission) across slots: every slot is committed on its own."""
    tid, ids = tenant
    sched = every_minute(pool, tid, ids, catch_up="all", max_catch_up=3)
    ticker = ScheduleTicker(settings, pool)
    run_slot, seen = ticker._run_slot, []

    def observed(conn, schedule, slot, *more):
        # seen from another session as each slot starts: committed jobs, and the advisory
        # locks the ticking session holds
        held = count(
            pool,
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s",
            conn.info.backend_pid,
        )
        seen.append((jobs_of(pool, sched["id"]), held))
        return run_slot(conn, schedule, slot, *more)

    ticker._run_slot = observed  # type: ignore[method-assign]
    counts = ticker.tick(now=T0 + 5 * MIN + timedelta(seconds=2))
    assert seen == [(0, 0), (1, 0), (2, 0)]
    assert (counts.created, counts.skipped, counts.schedules) == (3, 3, 1)
    assert jobs_of(pool, sched["id"]) == 3 and cursor(pool, sched["id"]) == T0 + 6 * MIN


def test_an_edit_waits_for_a_tick_holding_the_schedule_and_keeps_its_cursor(
    pool, settings: Settings, tenant
) -> None:
    tid, ids = tenant
    sched = every_minute(pool, tid, ids)
    edited: dict = {}
    with transaction(pool) as tick:  # a tick in progress holds the row and moved the cursor
        assert schedule_store.schedule_lock_due(tick, schedule_id=sched["id"], now=T0)
        schedule_store.schedule_advance(tick, schedule_id=sched["id"], next_due_at=T0 + MIN)
        edit = threading.Thread(
            target=lambda: edited.update(
                row=update_schedule(
                    pool, tenant_id=tid, schedule_id=sched["id"], patch={"name": "renamed"}
                )
            )
        )
        edit.start()
        wait_for(
            lambda: count(
                pool,
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database() AND pid <> %s",
                tick.info.backend_pid,
            ),
            10,
            "the edit to wait for the tick's row lock",
        )
    edit.join(10)
    assert not edit.is_alive()
    assert edited["row"]["name"] == "renamed"
    assert edited["row"]["next_due_at"] == T0 + MIN == cursor(pool, sched["id"])


def test_capacity_full_keeps_the_cursor_and_the_slot_runs_later(
    pool, settings: Settings, tenant
) -> None:
    tid, ids = tenant
    sched = every_minute(pool, tid, ids, catch_up="all")
    full = settings.model_copy(update={"admission_capacity": 0})
    ScheduleTicker(full, pool).tick(now=T0 + timedelta(seconds=5))
    assert slots(pool, sched["id"]) == [] and count(pool, "SELECT count(*) FROM export_jobs") == 0
    assert cursor(pool, sched["id"]) == T0
    with pool.connection() as conn:
        refusal = conn.execute(
            "SELECT last_refusal FROM export_schedules WHERE id = %s", (sched["id"],)
        ).fetchone()["last_refusal"]
    assert refusal["code"] == "capacity_exceeded" and refusal["slot"] == T0.isoformat()
    ScheduleTicker(settings, pool).tick(now=T0 + timedelta(seconds=20))
    assert slots(pool, sched["id"]) == [(T0, "created", True)]
    with pool.connection() as conn:
        assert (
            conn.execute(
                "SELECT last_refusal FROM export_schedules WHERE id = %s", (sched["id"],)
            ).fetchone()["last_refusal"]
            is None
        )


def test_paused_creates_nothing_and_resume_follows_the_policy(
    pool, settings: Settings, tenant
) -> None:
    tid, ids = tenant
    sched = every_minute(pool, tid, ids, catch_up="skip")
    update_schedule(pool, tenant_id=tid, schedule_id=sched["id"], patch={"enabled": False})
    ticker = ScheduleTicker(settings, pool)
    ticker.tick(now=T0 + 3 * MIN + timedelta(seconds=1))
    assert slots(pool, sched["id"]) == [] and cursor(pool, sched["id"]) == T0
    update_schedule(pool, tenant_id=tid, schedule_id=sched["id"], patch={"enabled": True})
    ticker.tick(now=T0 + 3 * MIN + timedelta(seconds=2))
    assert [o for _, o, _ in slots(pool, sched["id"])] == ["skipped"] * 3 + ["created"]
    assert jobs_of(pool, sched["id"]) == 1


def test_daylight_saving_transitions_through_the_tick(pool, settings: Settings, tenant) -> None:
    """Hour by hour across both 2031 transitions in Berlin (30 March, 26 October)."""
    tid, _ = tenant
    sched = create_schedule(
        pool,
        tenant_id=tid,
        # its exports never run here: each night's slot must not wait for the previous one's
        fields={
            "cron": "30 2 * * *",
            "timezone": "Europe/Berlin",
            "all": True,
            "overlap": "allow_all",
        },
    )
    rule = Rule("30 2 * * *", "Europe/Berlin")
    ticker = ScheduleTicker(settings, pool)
    for base in (datetime(2031, 3, 28, 12, tzinfo=UTC), datetime(2031, 10, 24, 12, tzinfo=UTC)):
        with pool.connection() as conn:
            conn.execute(
                "UPDATE export_schedules SET next_due_at = %s WHERE id = %s",
                (rule.next_after(base), sched["id"]),
            )
        for h in range(72):
            ticker.tick(now=base + timedelta(hours=h))
    created = [s for s, o, _ in slots(pool, sched["id"]) if o == "created"]
    assert created == [
        datetime(2031, 3, 29, 1, 30, tzinfo=UTC),  # 02:30 CET
        datetime(2031, 3, 30, 1, 0, tzinfo=UTC),  # 02:30 does not exist: 03:00 CEST
        datetime(2031, 3, 31, 0, 30, tzinfo=UTC),  # 02:30 CEST
        datetime(2031, 10, 25, 0, 30, tzinfo=UTC),  # 02:30 CEST
        datetime(2031, 10, 26, 0, 30, tzinfo=UTC),  # 02:30 happens twice: the first, once
        datetime(2031, 10, 27, 1, 30, tzinfo=UTC),  # 02:30 CET
    ]
    berlin_days = [c.astimezone(ZoneInfo("Europe/Berlin")).date() for c in created]
    assert len(berlin_days) == len(set(berlin_days))


def test_scheduled_jobs_run_like_any_other(pool, settings: Settings, tenant) -> None:
    tid, ids = tenant
    every_minute(pool, tid, ids)
    ScheduleTicker(settings, pool).tick(now=T0 + timedelta(seconds=1))
    with pool.connection() as conn:
        job_id = conn.execute("SELECT id FROM export_jobs").fetchone()["id"]
    assert (
        JobRunner(settings, pool, FileArtifactStore(settings.artifact_dir))
        .run(job_id, uuid4())
        .result
        == "succeeded"
    )


# --- overlap: an earlier export still queued or running -----------------------------------


def slot_rows(pool, schedule_id) -> list[tuple[datetime, str, str | None]]:
    """``(scheduled_at, outcome, reason)`` of the schedule's slots, oldest first."""
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT scheduled_at, outcome, reason FROM export_schedule_slots"
            " WHERE schedule_id = %s ORDER BY scheduled_at",
            (schedule_id,),
        ).fetchall()
    return [(r["scheduled_at"], r["outcome"], r["reason"]) for r in rows]


def latest_job(pool, schedule_id):
    with pool.connection() as conn:
        return conn.execute(
            "SELECT job_id FROM export_schedule_slots WHERE schedule_id = %s AND job_id IS NOT"
            " NULL ORDER BY created_at DESC LIMIT 1",
            (schedule_id,),
        ).fetchone()["job_id"]


def run_to_the_end(settings: Settings, pool, job_id) -> None:
    """The export runs on a worker's job protocol and succeeds: it is no longer active."""
    runner = JobRunner(settings, pool, FileArtifactStore(settings.artifact_dir))
    assert runner.run(job_id, uuid4()).result == "succeeded"


def test_overlap_skip_skips_a_slot_while_the_previous_export_is_active(
    pool, settings: Settings, tenant
) -> None:
    tid, ids = tenant
    sched = every_minute(pool, tid, ids, overlap="skip")
    assert sched["overlap"] == "skip"
    ticker = ScheduleTicker(settings, pool)
    ticker.tick(now=T0 + timedelta(seconds=1))
    first = latest_job(pool, sched["id"])
    counts = ticker.tick(now=T0 + MIN + timedelta(seconds=1))  # the first is still queued
    assert (counts.created, counts.overlap) == (0, 1)
    assert slot_rows(pool, sched["id"]) == [
        (T0, "created", None),
        (T0 + MIN, "skipped", "overlap"),
    ]
    assert cursor(pool, sched["id"]) == T0 + 2 * MIN and jobs_of(pool, sched["id"]) == 1
    run_to_the_end(settings, pool, first)
    ticker.tick(now=T0 + 2 * MIN + timedelta(seconds=1))
    assert slot_rows(pool, sched["id"])[-1] == (T0 + 2 * MIN, "created", None)
    second = latest_job(pool, sched["id"])
    with transaction(pool) as conn:  # now running, under a lease, as on a worker
        assert job_store.job_claim(conn, job_id=second, message_id=None, lease_seconds=30)
    ticker.tick(now=T0 + 3 * MIN + timedelta(seconds=1))
    assert slot_rows(pool, sched["id"])[-1] == (T0 + 3 * MIN, "skipped", "overlap")
    assert jobs_of(pool, sched["id"]) == 2


def test_overlap_buffer_one_runs_the_latest_waiting_slot_once_the_previous_ended(
    pool, settings: Settings, tenant
) -> None:
    tid, ids = tenant
    sched = every_minute(pool, tid, ids, overlap="buffer_one")
    ticker = ScheduleTicker(settings, pool)
    ticker.tick(now=T0 + timedelta(seconds=1))
    first = latest_job(pool, sched["id"])
    held = ticker.tick(now=T0 + MIN + timedelta(seconds=1))
    assert (held.created, held.overlap, held.held, held.schedules) == (0, 0, 1, 0)
    assert cursor(pool, sched["id"]) == T0 + MIN  # waits on its slot; nothing recorded yet
    ticker.tick(now=T0 + 2 * MIN + timedelta(seconds=1))  # a newer slot: the older one goes
    assert slot_rows(pool, sched["id"]) == [(T0, "created", None), (T0 + MIN, "skipped", "overlap")]
    assert cursor(pool, sched["id"]) == T0 + 2 * MIN
    run_to_the_end(settings, pool, first)
    ticker.tick(now=T0 + 2 * MIN + timedelta(seconds=20))  # runs late, as soon as it may
    assert slot_rows(pool, sched["id"])[-1] == (T0 + 2 * MIN, "created", None)
    assert cursor(pool, sched["id"]) == T0 + 3 * MIN and jobs_of(pool, sched["id"]) == 2


def test_overlap_allow_all_runs_every_slot_whatever_runs(pool, settings: Settings, tenant) -> None:
    tid, ids = tenant
    sched = every_minute(pool, tid, ids, overlap="allow_all")
    ticker = ScheduleTicker(settings, pool)
    ticker.tick(now=T0 + timedelta(seconds=1))
    ticker.tick(now=T0 + MIN + timedelta(seconds=1))
    assert [o for _, o, _ in slot_rows(pool, sched["id"])] == ["created", "created"]


def test_a_manual_run_is_never_skipped_and_counts_as_an_earlier_export(
    pool, settings: Settings, tenant
) -> None:
    tid, ids = tenant
    sched = every_minute(pool, tid, ids, overlap="skip")
    first = run_now(pool, settings, tenant_id=tid, schedule_id=sched["id"])
    run_now(pool, settings, tenant_id=tid, schedule_id=sched["id"])  # never skipped
    ScheduleTicker(settings, pool).tick(now=T0 + timedelta(seconds=1))
    rows = slot_rows(pool, sched["id"])  # the two manual slots (now), then T0 (2030)
    assert [r[1:] for r in rows] == [("created", None)] * 2 + [("skipped", "overlap")]
    with pool.connection() as conn:
        detail = conn.execute(
            "SELECT detail FROM export_schedule_slots WHERE scheduled_at = %s", (T0,)
        ).fetchone()["detail"]
    assert str(first.job["id"]) in detail and "still queued" in detail
    assert count(pool, "SELECT count(*) FROM export_jobs") == 2


@pytest.fixture
def api(settings: Settings, pool, tenant) -> Iterator[tuple[TestClient, dict]]:
    tid, _ = tenant
    with pool.connection() as conn:
        key, _ = create_api_key(conn, tenant_id=tid, scopes=["exports:read", "exports:write"])
    with TestClient(create_app(settings)) as client:
        yield client, {"Authorization": f"Bearer {key}"}


def test_schedule_api(api, pool, settings, tenant, notes_dir) -> None:
    client, auth = api
    _ = tenant
    r = client.post(
        "/v1/schedules",
        json={"cron": "0 2 * * *", "timezone": "Europe/Berlin", "all": True, "name": "nightly"},
        headers=auth,
    )
    assert r.status_code == 201, r.text
    sched = r.json()
    assert r.headers["location"] == f"/v1/schedules/{sched['id']}"
    assert (
        sched["next_due_at"].endswith(("T01:00:00Z", "T00:00:00Z")) and sched["catch_up"] == "skip"
    )
    assert sched["overlap"] == "skip"  # the default
    for body, code in (
        ({"cron": "0 25 * * *", "timezone": "UTC", "all": True}, "invalid_schedule"),
        ({"interval_seconds": 3600, "all": True, "overlap": "buffer_all"}, "invalid_request"),
        ({"interval_seconds": 3600, "all": True, "catch_up": "all"}, "invalid_schedule"),
        ({"cron": "0 2 * * *", "timezone": "Atlantis/Capital", "all": True}, "invalid_schedule"),
        ({"cron": "0 2 * * *", "all": True}, "invalid_schedule"),
        ({"interval_seconds": 60}, "invalid_selection"),
        ({"interval_seconds": "60", "all": True}, "invalid_request"),
    ):
        bad = client.post("/v1/schedules", json=body, headers=auth)
        assert bad.status_code == 422 and bad.json()["type"].endswith("/" + code), (body, bad.text)
        assert bad.headers["content-type"].startswith("application/problem+json")
    paused = client.patch(
        f"/v1/schedules/{sched['id']}", json={"enabled": False}, headers=auth
    ).json()
    assert paused["enabled"] is False and paused["next_due_at"] == sched["next_due_at"]
    buffered = client.patch(
        f"/v1/schedules/{sched['id']}", json={"overlap": "buffer_one"}, headers=auth
    )
    assert buffered.status_code == 200 and buffered.json()["overlap"] == "buffer_one"
    contradiction = client.patch(
        f"/v1/schedules/{sched['id']}", json={"catch_up": "all"}, headers=auth
    )
    assert contradiction.status_code == 422 and "overlap allow_all" in contradiction.text
    both = client.patch(
        f"/v1/schedules/{sched['id']}",
        json={"catch_up": "all", "overlap": "allow_all"},
        headers=auth,
    ).json()
    assert (both["catch_up"], both["overlap"]) == ("all", "allow_all")
    nulled = client.patch(f"/v1/schedules/{sched['id']}", json={"overlap": None}, headers=auth)
    assert nulled.status_code == 422 and "overlap" in nulled.text
    moved = client.patch(
        f"/v1/schedules/{sched['id']}", json={"interval_seconds": 300}, headers=auth
    ).json()
    assert moved["cron"] is None and moved["interval_seconds"] == 300
    assert [s["id"] for s in client.get("/v1/schedules", headers=auth).json()] == [sched["id"]]
    assert client.get(f"/v1/schedules/{sched['id']}/runs", headers=auth).json() == []
    other, _ = tenant_with_notes(pool, notes_dir)
    with pool.connection() as conn:
        okey, _ = create_api_key(conn, tenant_id=other, scopes=["exports:read", "exports:write"])
    intruder = {"Authorization": f"Bearer {okey}"}
    for method, path in (("GET", ""), ("GET", "/runs"), ("PATCH", ""), ("DELETE", "")):
        kwargs = {"json": {"enabled": True}} if method == "PATCH" else {}
        assert (
            client.request(
                method, f"/v1/schedules/{sched['id']}{path}", headers=intruder, **kwargs
            ).status_code
            == 404
        )
    assert client.delete(f"/v1/schedules/{sched['id']}", headers=auth).status_code == 204
    assert client.get(f"/v1/schedules/{sched['id']}", headers=auth).status_code == 404


def test_the_runs_say_why_a_slot_was_skipped(api, pool, settings, tenant) -> None:
    client, auth = api
    _, ids = tenant
    created = client.post(
        "/v1/schedules",
        json={"interval_seconds": 60, "note_ids": ids[:2], "overlap": "skip"},
        headers=auth,
    ).json()
    with pool.connection() as conn:
        conn.execute(
            "UPDATE export_schedules SET next_due_at = %s WHERE id = %s", (T0, created["id"])
        )
    ticker = ScheduleTicker(settings, pool)
    ticker.tick(now=T0 + 2 * MIN + timedelta(seconds=1))  # two missed (catch-up), one created
    ticker.tick(now=T0 + 3 * MIN + timedelta(seconds=1))  # the created one is still queued
    runs = client.get(f"/v1/schedules/{created['id']}/runs", headers=auth).json()
    assert [(r["outcome"], r["reason"]) for r in runs] == [
        ("skipped", "overlap"),
        ("created", None),
        ("skipped", "catch_up"),
        ("skipped", "catch_up"),
    ]
    assert runs[0]["job_id"] is None and runs[1]["job_id"] in runs[0]["detail"]
