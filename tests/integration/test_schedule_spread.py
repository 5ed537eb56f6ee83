"""Schedules that spread out (jitter), supersede their running export (overlap
``cancel_other``) and backfill a past range: real PostgreSQL, the real tick
(:class:`ScheduleTicker`) moved by an explicit clock, the job protocol of a worker in this
process for the cancel."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import pytest

from exportcore import faults, metrics
from exportcore.artifacts import FileArtifactStore
from exportcore.auth import create_operator_key
from exportcore.runner import JobRunner
from exportcore.schedules.management import backfill, create_schedule, run_now, update_schedule
from exportcore.schedules.rules import InvalidSchedule
from exportcore.schedules.ticker import ScheduleTicker
from exportcore.settings import Settings
from tests.support import count, events, job, wait_for

T0 = datetime(2030, 1, 7, 9, 0, tzinfo=UTC)
MIN = timedelta(minutes=1)
SEC = timedelta(seconds=1)


def schedule(pool, tid, ids, *, at: datetime = T0, **extra) -> dict:
    """A schedule every minute whose cursor is ``at``; its exports allow overlap unless told
    otherwise."""
    fields = {"interval_seconds": 60, "note_ids": ids[:2], "overlap": "allow_all", **extra}
    row = create_schedule(pool, tenant_id=tid, fields=fields)
    with pool.connection() as conn:
        return conn.execute(
            "UPDATE export_schedules SET next_due_at = %s WHERE id = %s RETURNING *",
            (at, row["id"]),
        ).fetchone()


def slot_rows(pool, schedule_id) -> list[tuple[datetime, str, bool]]:
    """``(scheduled_at, outcome, backfilled)`` of the schedule's slots, oldest first."""
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT scheduled_at, outcome, backfilled_at IS NOT NULL AS backfilled"
            " FROM export_schedule_slots WHERE schedule_id = %s ORDER BY scheduled_at",
            (schedule_id,),
        ).fetchall()
    return [(r["scheduled_at"], r["outcome"], r["backfilled"]) for r in rows]


def jobs_per_slot(pool, schedule_id) -> dict[datetime, int]:
    """How many exports each slot instant of the schedule has (its event details say)."""
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT e.detail->>'scheduled_at' AS slot, count(*) AS n FROM export_job_events e"
            " WHERE e.kind = 'submitted' AND e.detail->>'schedule_id' = %s GROUP BY 1",
            (str(schedule_id),),
        ).fetchall()
    return {datetime.fromisoformat(r["slot"]): r["n"] for r in rows}


# --- jitter -----------------------------------------------------------------------------------


def test_jitter_offsets_are_bounded_spread_and_derived_from_the_id_alone(pool, tenant) -> None:
    tid, _ = tenant
    rows = [
        create_schedule(
            pool,
            tenant_id=tid,
            fields={"cron": "@daily", "timezone": "UTC", "all": True, "jitter": 300},
        )
        for _ in range(60)
    ]
    offsets = [r["jitter_offset"] for r in rows]
    assert all(0 <= o <= 300 for o in offsets)
    assert len(set(offsets)) > 40  # 60 draws from 301 values: ~54 distinct expected
    # the offset is a function of the id and the bound: the same in any session, after a
    # restart, for a schedule written again with the same id; a pinned id pins its value
    pinned = UUID("00000000-0000-4000-8000-000000000001")
    with pool.connection() as conn:
        again = conn.execute(
            "INSERT INTO export_schedules (id, tenant_id, interval_seconds, payload, format,"
            " next_due_at, catch_up, jitter) SELECT %s, tenant_id, 60, payload, format,"
            " next_due_at, 'skip', 300 FROM export_schedules WHERE id = %s"
            " RETURNING jitter_offset",
            (pinned, rows[0]["id"]),
        ).fetchone()["jitter_offset"]
        conn.execute("DELETE FROM export_schedules WHERE id = %s", (pinned,))
        rewritten = conn.execute(
            "INSERT INTO export_schedules (id, tenant_id, interval_seconds, payload, format,"
            " next_due_at, catch_up, jitter) SELECT %s, tenant_id, 60, payload, format,"
            " next_due_at, 'skip', 300 FROM export_schedules WHERE id = %s"
            " RETURNING jitter_offset",
            (pinned, rows[0]["id"]),
        ).fetchone()["jitter_offset"]
    assert again == rewritten == PINNED_OFFSET
    first = rows[0]
    off = update_schedule(pool, tenant_id=tid, schedule_id=first["id"], patch={"jitter": 0})
    assert off is not None and off["jitter_offset"] == 0
    on = update_schedule(pool, tenant_id=tid, schedule_id=first["id"], patch={"jitter": 300})
    assert on is not None and on["jitter_offset"] == first["jitter_offset"]
    for bad in (-1, 3601, "60", None, True):
        with pytest.raises(InvalidSchedule):
            create_schedule(
                pool, tenant_id=tid, fields={"interval_seconds": 60, "all": True, "jitter": bad}
            )


PINNED_OFFSET = 24  # uuid_hash_extended('00000000-0000-4000-8000-000000000001', 0) mod 301


def jittered(pool, tid, ids, jitter: int = 50, **extra) -> dict:
    """A schedule (cursor T0) whose offset is at least 2 s, so that "one second early" is
    after the instant: a new schedule (a new id) until one is, the others deleted."""
    for _ in range(50):
        row = schedule(pool, tid, ids, jitter=jitter, **extra)
        if row["jitter_offset"] >= 2:
            return row
        with pool.connection() as conn:  # it would come due with the one kept: gone
            conn.execute("DELETE FROM export_schedules WHERE id = %s", (row["id"],))
    raise AssertionError("50 schedules in a row with an offset under 2 s")


def test_a_jittered_slot_fires_its_offset_late_and_keeps_its_instant(
    pool, settings: Settings, tenant
) -> None:
    tid, ids = tenant
    sched = jittered(pool, tid, ids)
    delay = timedelta(seconds=sched["jitter_offset"])
    ticker = ScheduleTicker(settings, pool)
    assert ticker.tick(now=T0 + delay - SEC).created == 0  # the instant passed, not its fire
    assert slot_rows(pool, sched["id"]) == []
    assert ticker.tick(now=T0 + delay).created == 1
    assert slot_rows(pool, sched["id"]) == [(T0, "created", False)]  # the unjittered instant
    assert ticker.tick(now=T0 + MIN + delay - SEC).created == 0
    assert ticker.tick(now=T0 + MIN + delay).created == 1
    assert [s for s, _, _ in slot_rows(pool, sched["id"])] == [T0, T0 + MIN]
    # ten ticks at once on the fire instant of the next slot: one export
    barrier = threading.Barrier(10)

    def tick() -> None:
        barrier.wait()
        ScheduleTicker(settings, pool).tick(now=T0 + 2 * MIN + delay)

    threads = [threading.Thread(target=tick) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert jobs_per_slot(pool, sched["id"]) == {T0: 1, T0 + MIN: 1, T0 + 2 * MIN: 1}


def test_the_preview_shows_when_each_slot_fires(api) -> None:
    client, auth, _ = api
    created = client.post(
        "/v1/schedules",
        json={"cron": "0 2 * * *", "timezone": "Europe/Berlin", "all": True, "jitter": 900},
        headers=auth,
    )
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["jitter"] == 900 and 0 <= body["jitter_offset"] <= 900
    preview = client.get(f"/v1/schedules/{body['id']}/preview?count=3", headers=auth).json()
    assert (preview["jitter"], preview["jitter_offset"]) == (900, body["jitter_offset"])
    for slot in preview["slots"]:
        at, fires = datetime.fromisoformat(slot["at"]), datetime.fromisoformat(slot["fires_at"])
        assert fires - at == timedelta(seconds=body["jitter_offset"])
        assert datetime.fromisoformat(slot["local"]).hour == 2  # the instant, in its zone
        assert datetime.fromisoformat(slot["fires_local"]) == fires
    unsaved = client.post(
        "/v1/schedule-preview", json={"interval_seconds": 3600, "count": 2}, headers=auth
    ).json()
    assert unsaved["jitter_offset"] == 0
    assert all(s["fires_at"] == s["at"] for s in unsaved["slots"])
    too_wide = client.patch(f"/v1/schedules/{body['id']}", json={"jitter": 3601}, headers=auth)
    assert too_wide.status_code == 422 and "jitter" in too_wide.text
    nulled = client.patch(f"/v1/schedules/{body['id']}", json={"jitter": None}, headers=auth)
    assert nulled.status_code == 422 and "jitter" in nulled.text


# --- overlap cancel_other ---------------------------------------------------------------------


def test_cancel_other_cancels_the_running_export_through_the_cancel_path(
    pool, settings: Settings, tenant, failpoints
) -> None:
    tid, ids = tenant
    # five notes in chunks of one: the export has chunk boundaries to stop at
    sched = schedule(pool, tid, ids, note_ids=ids[:5], overlap="cancel_other")
    sched_id = sched["id"]
    ticker = ScheduleTicker(settings, pool)
    assert ticker.tick(now=T0 + SEC).created == 1
    first = only_job(pool, sched_id, T0)
    short = settings.model_copy(update={"lease_seconds": 1.5, "render_chunk_size": 1})
    # two slow chunks: the next slot comes due while it runs, with time to spare on a busy host
    faults.arm(failpoints, "render.chunk", "sleep:1.5", times=2)
    result: list[str] = []
    worker = threading.Thread(
        target=lambda: result.append(
            JobRunner(short, pool, FileArtifactStore(settings.artifact_dir))
            .run(first, uuid4())
            .result
        )
    )
    worker.start()
    wait_for(lambda: job(pool, first)["status"] == "running", 10, "the worker claiming it")
    superseded = metrics.SCHEDULE_SUPERSEDED._value.get()
    counts = ticker.tick(now=T0 + MIN + SEC)  # the next slot supersedes the running export
    assert metrics.SCHEDULE_SUPERSEDED._value.get() == superseded + 1
    assert (counts.cancelled, counts.created, counts.overlap) == (1, 1, 0)
    assert job(pool, first)["cancel_requested"] and job(pool, first)["status"] == "running"
    worker.join(timeout=30)
    assert result == ["cancelled"]  # the worker stopped at its next chunk boundary
    row = job(pool, first)
    assert row["status"] == "cancelled" and row["result_ref"] is None
    requested = [e for e in events(pool, first) if e["kind"] == "cancel_requested"]
    assert len(requested) == 1
    assert requested[0]["detail"]["requested_by"] == "schedule"
    assert requested[0]["detail"]["superseded_by_slot"] == (T0 + MIN).isoformat()
    with pool.connection() as conn:
        audit_row = conn.execute(
            "SELECT actor_kind, actor, outcome FROM operator_actions"
            " WHERE action = 'cancel' AND job_id = %s",
            (first,),
        ).fetchone()
    assert audit_row["actor_kind"] == "system" and audit_row["actor"] == f"schedule {sched_id}"
    assert audit_row["outcome"] == "requested"
    second = only_job(pool, sched_id, T0 + MIN)
    assert job(pool, second)["status"] == "queued"
    # a queued export is cancelled at once by the slot after it
    assert ticker.tick(now=T0 + 2 * MIN + SEC).cancelled == 1
    assert job(pool, second)["status"] == "cancelled"
    assert job(pool, only_job(pool, sched_id, T0 + 2 * MIN))["status"] == "queued"


def only_job(pool, schedule_id, slot: datetime) -> UUID:
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT job_id FROM export_schedule_slots WHERE schedule_id = %s"
            " AND trigger = 'schedule' AND scheduled_at = %s AND job_id IS NOT NULL",
            (schedule_id, slot),
        ).fetchone()
    assert row is not None, f"no export for the slot {slot}"
    return row["job_id"]


def test_cancel_other_never_cancels_a_manual_run_and_runs_beside_it(
    pool, settings: Settings, tenant
) -> None:
    tid, ids = tenant
    sched = schedule(pool, tid, ids, overlap="cancel_other")
    manual = run_now(pool, settings, tenant_id=tid, schedule_id=sched["id"]).job["id"]
    counts = ScheduleTicker(settings, pool).tick(now=T0 + SEC)
    assert (counts.cancelled, counts.created) == (0, 1)
    assert job(pool, manual)["status"] == "queued" and not job(pool, manual)["cancel_requested"]


def test_cancel_other_with_catch_up_all_is_refused(pool, tenant) -> None:
    tid, _ = tenant
    with pytest.raises(InvalidSchedule, match="allow_all"):
        create_schedule(
            pool,
            tenant_id=tid,
            fields={
                "interval_seconds": 60,
                "all": True,
                "overlap": "cancel_other",
                "catch_up": "all",
            },
        )


# --- backfill ---------------------------------------------------------------------------------


def test_backfill_creates_one_export_per_missed_slot_and_a_repeat_creates_none(
    pool, settings: Settings, tenant
) -> None:
    tid, ids = tenant
    sched = schedule(pool, tid, ids, catch_up="skip")
    ScheduleTicker(settings, pool).tick(now=T0 + 5 * MIN + SEC)  # downtime: 5 slots skipped
    assert [o for _, o, _ in slot_rows(pool, sched["id"])] == ["skipped"] * 5 + ["created"]
    now = T0 + 6 * MIN + 30 * SEC
    report = backfill(
        pool,
        settings,
        tenant_id=tid,
        schedule_id=sched["id"],
        start=T0,
        end=T0 + 5 * MIN,
        now=now,
    )
    assert [(s.scheduled_at, s.outcome) for s in report] == [
        *[(T0 + i * MIN, "created") for i in range(5)],
        (T0 + 5 * MIN, "exists"),
    ]
    assert report[-1].job_id == only_job(pool, sched["id"], T0 + 5 * MIN)
    assert slot_rows(pool, sched["id"]) == [
        *[(T0 + i * MIN, "created", True) for i in range(5)],
        (T0 + 5 * MIN, "created", False),
    ]
    again = backfill(
        pool,
        settings,
        tenant_id=tid,
        schedule_id=sched["id"],
        start=T0,
        end=T0 + 5 * MIN,
        now=now,
    )
    assert [s.outcome for s in again] == ["exists"] * 6
    assert [s.job_id for s in again] == [s.job_id for s in report[:5]] + [report[-1].job_id]
    assert jobs_per_slot(pool, sched["id"]) == {T0 + i * MIN: 1 for i in range(6)}
    assert (
        count(pool, "SELECT count(*) FROM operator_actions WHERE action = 'schedule_backfill'") == 5
    )
    with pool.connection() as conn:
        detail = conn.execute(
            "SELECT detail FROM export_schedule_slots WHERE schedule_id = %s AND scheduled_at = %s",
            (sched["id"], T0),
        ).fetchone()["detail"]
    assert detail == "backfilled by operator (was skipped: catch_up)"


def test_concurrent_backfills_and_the_tick_create_one_export_per_slot(
    pool, settings: Settings, tenant
) -> None:
    tid, ids = tenant
    sched = schedule(pool, tid, ids, catch_up="skip")  # cursor T0, not ticked yet
    now = T0 + 4 * MIN + 30 * SEC
    barrier = threading.Barrier(6)
    reports: list[list] = []

    def run_backfill() -> None:
        barrier.wait()
        reports.append(
            backfill(
                pool,
                settings,
                tenant_id=tid,
                schedule_id=sched["id"],
                start=T0,
                end=T0 + 4 * MIN,
                now=now,
            )
        )

    def run_tick() -> None:
        barrier.wait()
        ScheduleTicker(settings, pool).tick(now=now)

    threads = [threading.Thread(target=run_backfill) for _ in range(5)]
    threads.append(threading.Thread(target=run_tick))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(reports) == 5
    assert jobs_per_slot(pool, sched["id"]) == {T0 + i * MIN: 1 for i in range(5)}
    for i in range(5):  # each slot: one report says created (or the tick made it), all agree
        outcomes = [r[i].outcome for r in reports]
        assert outcomes.count("created") <= 1 and set(outcomes) <= {"created", "exists"}
        assert len({r[i].job_id for r in reports}) == 1
    assert [o for _, o, _ in slot_rows(pool, sched["id"])] == ["created"] * 5


def test_backfill_reports_refusals_per_slot_and_a_later_one_fills_them(
    pool, settings: Settings, tenant
) -> None:
    tid, ids = tenant
    sched = schedule(pool, tid, ids)
    now = T0 + 10 * MIN
    with pool.connection() as conn:
        conn.execute("UPDATE tenants SET max_active_jobs = 2 WHERE id = %s", (tid,))
    report = backfill(
        pool,
        settings,
        tenant_id=tid,
        schedule_id=sched["id"],
        start=T0,
        end=T0 + 4 * MIN,
        now=now,
    )
    assert [(s.outcome, s.code) for s in report] == [("created", None)] * 2 + [
        ("refused", "quota_exceeded")
    ] * 3
    assert "quota" in report[2].detail and report[3].detail.startswith("not tried")
    assert [o for _, o, _ in slot_rows(pool, sched["id"])] == ["created"] * 2  # nothing else
    full = settings.model_copy(update={"admission_capacity": 0})
    with pool.connection() as conn:
        conn.execute("UPDATE tenants SET max_active_jobs = NULL WHERE id = %s", (tid,))
    refused = backfill(
        pool, full, tenant_id=tid, schedule_id=sched["id"], start=T0, end=T0 + 4 * MIN, now=now
    )
    assert [(s.outcome, s.code) for s in refused] == [("exists", None)] * 2 + [
        ("refused", "capacity_exceeded")
    ] * 3
    filled = backfill(
        pool,
        settings,
        tenant_id=tid,
        schedule_id=sched["id"],
        start=T0,
        end=T0 + 4 * MIN,
        now=now,
    )
    assert [s.outcome for s in filled] == ["exists"] * 2 + ["created"] * 3
    assert jobs_per_slot(pool, sched["id"]) == {T0 + i * MIN: 1 for i in range(5)}


def test_backfill_is_bounded_past_only_and_the_tenants_own(
    pool, settings: Settings, tenant, notes_dir
) -> None:
    tid, ids = tenant
    sched = schedule(pool, tid, ids)
    now = T0 + 200 * MIN
    with pytest.raises(InvalidSchedule, match="at most 100"):
        backfill(
            pool,
            settings,
            tenant_id=tid,
            schedule_id=sched["id"],
            start=T0,
            end=T0 + 100 * MIN,
            now=now,
        )
    with pytest.raises(InvalidSchedule, match="after now"):
        backfill(
            pool, settings, tenant_id=tid, schedule_id=sched["id"], start=T0, end=now + SEC, now=now
        )
    with pytest.raises(InvalidSchedule, match="ends before it starts"):
        backfill(
            pool, settings, tenant_id=tid, schedule_id=sched["id"], start=T0 + MIN, end=T0, now=now
        )
    assert count(pool, "SELECT count(*) FROM export_jobs") == 0
    exactly = backfill(
        pool, settings, tenant_id=tid, schedule_id=sched["id"], start=T0, end=T0 + 99 * MIN, now=now
    )
    assert len(exactly) == 100 and {s.outcome for s in exactly} == {"created"}


def test_backfill_through_the_tenant_and_admin_api(api, pool, settings, tenant) -> None:
    client, auth, operator = api
    tid, ids = tenant
    start = (datetime.now(UTC) - timedelta(hours=1)).replace(second=0, microsecond=0)
    sched = schedule(pool, tid, ids, at=start)
    window = {"from": start.isoformat(), "to": (start + 2 * MIN).isoformat()}
    r = client.post(f"/v1/schedules/{sched['id']}/backfill", json=window, headers=auth)
    assert r.status_code == 200, r.text
    body = r.json()
    assert datetime.fromisoformat(body["from"]) == start
    assert (body["created"], body["existing"], body["refused"], body["invalid"]) == (3, 0, 0, 0)
    assert [s["outcome"] for s in body["slots"]] == ["created"] * 3
    wider = {"from": start.isoformat(), "to": (start + 4 * MIN).isoformat()}
    r = client.post(f"/v1/admin/schedules/{sched['id']}/backfill", json=wider, headers=operator)
    assert r.status_code == 200, r.text
    assert [s["outcome"] for s in r.json()["slots"]] == ["exists"] * 3 + ["created"] * 2
    with pool.connection() as conn:
        actors = conn.execute(
            "SELECT actor_kind, count(*) AS n FROM operator_actions"
            " WHERE action = 'schedule_backfill' GROUP BY 1 ORDER BY 1"
        ).fetchall()
    assert [(a["actor_kind"], a["n"]) for a in actors] == [("operator", 2), ("tenant", 3)]
    runs = client.get(f"/v1/schedules/{sched['id']}/runs", headers=auth).json()
    assert len(runs) == 5 and all(run["backfilled_at"] for run in runs)
    for bad, code in (
        ({"from": start.isoformat(), "to": (start + 200 * MIN).isoformat()}, "invalid_schedule"),
        ({"from": "yesterday", "to": start.isoformat()}, "invalid_request"),
        ({"from": start.isoformat()}, "invalid_request"),
    ):
        refused = client.post(f"/v1/schedules/{sched['id']}/backfill", json=bad, headers=auth)
        assert refused.status_code == 422, (bad, refused.text)
        assert refused.json()["type"].endswith("/" + code), refused.text
    assert (
        "100"
        in client.post(
            f"/v1/schedules/{sched['id']}/backfill",
            json={"from": (start - 200 * MIN).isoformat(), "to": start.isoformat()},
            headers=auth,
        ).json()["detail"]
    )
    assert (
        client.post(f"/v1/schedules/{uuid4()}/backfill", json=window, headers=auth).status_code
        == 404
    )
    assert (
        client.post(
            f"/v1/admin/schedules/{sched['id']}/backfill", json=window, headers=auth
        ).status_code
        == 403
    )
    with pool.connection() as conn:
        viewer, _ = create_operator_key(conn, label="bob", role="viewer")
    as_viewer = client.post(
        f"/v1/admin/schedules/{sched['id']}/backfill",
        json=window,
        headers={"Authorization": f"Bearer {viewer}"},
    )
    assert as_viewer.status_code == 403 and as_viewer.json()["type"].endswith("/role_insufficient")
