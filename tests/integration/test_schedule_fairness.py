"""Schedules that cannot block the tick (docs/schedules.md), on real PostgreSQL with a
controllable clock: backoff of refused slots, the batch shared across tenants, the per-tenant
cap and the minimum interval, pausing a schedule whose notes were deleted, unknown note ids
at create and update; and "run now" through the same slot and admission path."""

from __future__ import annotations

import random
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from exportcore import metrics
from exportcore.admission import QuotaExceeded
from exportcore.domain import UnknownNotes
from exportcore.schedules.management import (
    ScheduleLimitReached,
    create_schedule,
    run_now,
    update_schedule,
)
from exportcore.schedules.rules import InvalidSchedule, Rule, preview
from exportcore.schedules.ticker import ScheduleTicker
from exportcore.settings import Settings
from exportcore.store import tenants as tenant_store
from tests.support import count, submit, tenant_with_notes

T0 = datetime(2030, 1, 7, 9, 0, tzinfo=UTC)
SEC = timedelta(seconds=1)


@pytest.fixture
def fair(settings: Settings) -> Settings:
    """The measured case's rules: 1-second intervals allowed, default batch and backoff."""
    return settings.model_copy(update={"schedule_min_interval_seconds": 1})


def schedule_at(pool, settings, tid, cursor: datetime, **fields) -> dict:
    """A schedule whose cursor is ``cursor``. Its exports never run here, so it allows
    overlap unless told otherwise (fairness, not the overlap policy, is under test)."""
    fields = {"overlap": "allow_all", **fields}
    row = create_schedule(pool, tenant_id=tid, fields=fields, settings=settings)
    with pool.connection() as conn:
        conn.execute(
            "UPDATE export_schedules SET next_due_at = %s WHERE id = %s", (cursor, row["id"])
        )
    return row


def row_of(pool, schedule_id) -> dict:
    with pool.connection() as conn:
        return conn.execute(
            "SELECT * FROM export_schedules WHERE id = %s", (schedule_id,)
        ).fetchone()


def created(pool, schedule_id) -> list[datetime]:
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT scheduled_at FROM export_schedule_slots WHERE schedule_id = %s"
            " AND outcome = 'created' AND trigger = 'schedule' ORDER BY scheduled_at",
            (schedule_id,),
        ).fetchall()
    return [r["scheduled_at"] for r in rows]


def fill_quota(pool, settings, tid, ids, quota: int) -> None:
    with pool.connection() as conn:
        tenant_store.tenant_set_quota(conn, tenant_id=tid, quota=quota)
    for _ in range(quota):
        submit(pool, settings, tid, ids[:1])


def test_an_attacker_at_its_quota_with_100_schedules_does_not_stop_a_victims_cadence(
    pool, fair: Settings, notes_dir: Path
) -> None:
    """The measured starvation case: before, a victim's 2-second schedule ran 0 times in
    40 s behind 100 refused 1-second schedules (catch_up all) of a tenant at its quota."""
    attacker, a_ids = tenant_with_notes(pool, notes_dir)
    victim, v_ids = tenant_with_notes(pool, notes_dir)
    fill_quota(pool, fair, attacker, a_ids, quota=3)
    for i in range(100):
        schedule_at(
            pool,
            fair,
            attacker,
            T0 - timedelta(minutes=5),
            name=f"flood-{i}",
            interval_seconds=1,
            all=True,
            catch_up="all",
            max_catch_up=1000,
        )
    mine = schedule_at(pool, fair, victim, T0 + 2 * SEC, interval_seconds=2, note_ids=v_ids[:3])
    ticker = ScheduleTicker(fair, pool, rng=random.Random(18))
    attempts_before = _submit_attempts()
    refused = 0
    for second in range(1, 41):  # a tick every second for 40 s of the controllable clock
        refused += ticker.tick(now=T0 + second * SEC).refused
    assert created(pool, mine["id"]) == [T0 + 2 * k * SEC for k in range(1, 21)]
    assert row_of(pool, mine["id"])["last_refusal"] is None
    # the attacker got nothing past its quota, and its refusals backed off: far fewer than
    # the 100 x 40 = 4000 refusals a tick without backoff makes in 40 ticks
    assert count(pool, "SELECT count(*) FROM export_jobs WHERE tenant_id = %s", attacker) == 3
    assert 100 <= refused < 1000, refused
    # a tenant at its quota is refused once per tick from a count: no snapshot is copied
    assert _submit_attempts() - attempts_before == 20  # the victim's 20 accepted slots
    flood = [row_of(pool, r) for r in _ids(pool, attacker)]
    assert all(r["refusals"] >= 1 and r["retry_at"] is not None for r in flood)
    refusal = flood[0]["last_refusal"]
    assert refusal["code"] == "quota_exceeded" and refusal["refusals"] == flood[0]["refusals"]
    assert datetime.fromisoformat(refusal["next_retry_at"]) == flood[0]["retry_at"]


def _submit_attempts() -> float:
    """Accepted + refused schedule submits counted so far (each one took a snapshot)."""
    return sum(
        metrics.SUBMITS.labels(outcome, "schedule")._value.get()
        for outcome in ("accepted", "quota_exceeded", "capacity_exceeded")
    )


def _ids(pool, tid) -> list:
    with pool.connection() as conn:
        return [
            r["id"]
            for r in conn.execute("SELECT id FROM export_schedules WHERE tenant_id = %s", (tid,))
        ]


def test_a_refused_slot_backs_off_with_full_jitter_up_to_the_cap_then_runs(
    pool, fair: Settings, notes_dir: Path
) -> None:
    tid, ids = tenant_with_notes(pool, notes_dir)
    fill_quota(pool, fair, tid, ids, quota=1)
    sched = schedule_at(pool, fair, tid, T0, interval_seconds=60, note_ids=ids[:2])
    ticker = ScheduleTicker(fair, pool, rng=random.Random(7))
    now, ceilings = T0, []
    for attempt in range(1, 10):
        assert ticker.tick(now=now).refused == 1
        row = row_of(pool, sched["id"])
        assert row["refusals"] == attempt and row["next_due_at"] == T0  # the slot waits
        wait = (row["retry_at"] - now).total_seconds()
        ceiling = min(
            fair.schedule_retry_cap_seconds, fair.schedule_retry_base_seconds * 2 ** (attempt - 1)
        )
        assert 0 <= wait <= ceiling
        ceilings.append(ceiling)
        # not due before its retry time, whatever the cursor says
        if wait > 0.001:
            assert ticker.tick(now=row["retry_at"] - timedelta(milliseconds=1)).schedules == 0
        now = row["retry_at"]
    assert ceilings[-1] == fair.schedule_retry_cap_seconds
    with pool.connection() as conn:  # the quota frees up: the slot runs and the backoff ends
        conn.execute("UPDATE export_jobs SET status = 'cancelled' WHERE tenant_id = %s", (tid,))
    assert ticker.tick(now=now).created == 1
    row = row_of(pool, sched["id"])
    assert (row["refusals"], row["retry_at"], row["last_refusal"]) == (0, None, None)
    latest = T0 + timedelta(minutes=int((now - T0).total_seconds() // 60))
    assert created(pool, sched["id"]) == [latest]  # catch-up "skip": the latest missed slot


def test_each_tick_shares_its_batch_round_robin_across_tenants(
    pool, fair: Settings, notes_dir: Path
) -> None:
    small = fair.model_copy(update={"schedule_batch_size": 6})
    tenants = [tenant_with_notes(pool, notes_dir) for _ in range(3)]
    big, big_ids = tenants[0]
    for i in range(10):  # the oldest cursors all belong to one tenant
        schedule_at(
            pool,
            small,
            big,
            T0 - timedelta(hours=1, seconds=i),
            interval_seconds=3600,
            note_ids=big_ids[:1],
        )
    others = [
        schedule_at(
            pool, small, tid, T0 - timedelta(minutes=1), interval_seconds=3600, note_ids=ids[:1]
        )
        for tid, ids in tenants[1:]
    ]
    counts = ScheduleTicker(small, pool).tick(now=T0)
    assert counts.schedules == 6 and counts.created == 6
    assert all(len(created(pool, o["id"])) == 1 for o in others)
    assert count(pool, "SELECT count(*) FROM export_jobs WHERE tenant_id = %s", big) == 4


def test_capacity_refusal_ends_the_tick_and_backs_off_only_the_schedule_tried(
    pool, fair: Settings, notes_dir: Path
) -> None:
    full = fair.model_copy(update={"admission_capacity": 0})
    rows = []
    for _ in range(3):
        tid, ids = tenant_with_notes(pool, notes_dir)
        rows.append(schedule_at(pool, full, tid, T0, interval_seconds=60, note_ids=ids[:1]))
    counts = ScheduleTicker(full, pool).tick(now=T0 + SEC)
    assert (counts.refused, counts.schedules) == (1, 1)
    backed_off = [r for r in (row_of(pool, x["id"]) for x in rows) if r["retry_at"]]
    assert len(backed_off) == 1 and backed_off[0]["last_refusal"]["code"] == "capacity_exceeded"


def test_deleted_notes_pause_the_schedule_with_the_reason(
    pool, fair: Settings, notes_dir: Path
) -> None:
    tid, ids = tenant_with_notes(pool, notes_dir)
    sched = schedule_at(pool, fair, tid, T0, interval_seconds=60, note_ids=ids[:3])
    with pool.connection() as conn:
        conn.execute("DELETE FROM notes WHERE id = ANY(%s)", (ids[1:3],))
    before = metrics.SCHEDULE_PAUSES.labels("unknown_notes")._value.get()
    counts = ScheduleTicker(fair, pool).tick(now=T0 + SEC)
    assert (counts.invalid, counts.paused, counts.created) == (1, 1, 0)
    row = row_of(pool, sched["id"])
    assert row["enabled"] is False and row["paused_reason"] == "unknown_notes"
    assert row["paused_at"] == T0 + SEC and str(ids[1]) in row["paused_detail"]
    assert row["next_due_at"] == T0 + timedelta(minutes=1)  # the invalid slot is behind it
    assert metrics.SCHEDULE_PAUSES.labels("unknown_notes")._value.get() == before + 1
    assert ScheduleTicker(fair, pool).tick(now=T0 + timedelta(minutes=5)).schedules == 0
    # resuming with the same selection is refused, listing the missing notes
    with pytest.raises(UnknownNotes) as missing:
        update_schedule(
            pool, tenant_id=tid, schedule_id=sched["id"], patch={"enabled": True}, settings=fair
        )
    assert missing.value.extra["unknown_note_ids"] == ids[1:3]
    fixed = update_schedule(
        pool,
        tenant_id=tid,
        schedule_id=sched["id"],
        patch={"note_ids": ids[:1], "enabled": True},
        settings=fair,
    )
    assert fixed["enabled"] and fixed["paused_reason"] is None and fixed["paused_at"] is None


def test_a_tenant_without_notes_pauses_an_all_schedule(pool, fair: Settings, notes_dir) -> None:
    tid, _ = tenant_with_notes(pool, notes_dir)
    sched = schedule_at(pool, fair, tid, T0, interval_seconds=60, all=True)
    with pool.connection() as conn:
        conn.execute("DELETE FROM notes WHERE tenant_id = %s", (tid,))
    ScheduleTicker(fair, pool).tick(now=T0 + SEC)
    assert row_of(pool, sched["id"])["paused_reason"] == "invalid_selection"


def test_unknown_note_ids_at_create_and_update_are_refused_listing_them(
    pool, settings: Settings, notes_dir: Path
) -> None:
    tid, ids = tenant_with_notes(pool, notes_dir)
    _, other_ids = tenant_with_notes(pool, notes_dir)
    with pytest.raises(UnknownNotes) as exc:
        create_schedule(
            pool,
            tenant_id=tid,
            settings=settings,
            fields={"interval_seconds": 3600, "note_ids": [ids[0], 10**9, other_ids[0]]},
        )
    assert exc.value.extra["unknown_note_ids"] == [other_ids[0], 10**9]
    assert count(pool, "SELECT count(*) FROM export_schedules") == 0
    sched = create_schedule(
        pool, tenant_id=tid, settings=settings, fields={"interval_seconds": 3600, "all": True}
    )
    with pytest.raises(UnknownNotes):
        update_schedule(
            pool,
            tenant_id=tid,
            schedule_id=sched["id"],
            patch={"note_ids": [10**9]},
            settings=settings,
        )


def test_the_cap_per_tenant_holds_under_concurrent_creates(
    pool, settings: Settings, notes_dir: Path
) -> None:
    capped = settings.model_copy(update={"schedules_per_tenant_max": 5})
    tid, _ = tenant_with_notes(pool, notes_dir)
    barrier, outcomes = threading.Barrier(12), []

    def create() -> None:
        barrier.wait()
        try:
            create_schedule(
                pool, tenant_id=tid, settings=capped, fields={"interval_seconds": 3600, "all": True}
            )
            outcomes.append("created")
        except ScheduleLimitReached:
            outcomes.append("refused")

    threads = [threading.Thread(target=create) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["created"] * 5 + ["refused"] * 7
    assert count(pool, "SELECT count(*) FROM export_schedules WHERE tenant_id = %s", tid) == 5


@pytest.mark.parametrize(
    ("rule", "minimum", "message"),
    [
        ({"interval_seconds": 59}, 60, "at least 60"),
        ({"cron": "* * * * * *", "timezone": "UTC"}, 60, "5 fields"),
        ({"cron": "@reboot", "timezone": "UTC"}, 60, "unknown cron nickname"),
        ({"cron": "0,30 2 * * *", "timezone": "UTC"}, 3600, "1800 s apart"),
        ({"cron": "@hourly", "timezone": "UTC"}, 7200, "3600 s apart"),
    ],
)
def test_rules_faster_than_the_minimum_are_refused(
    pool, settings: Settings, notes_dir: Path, rule: dict, minimum: int, message: str
) -> None:
    strict = settings.model_copy(update={"schedule_min_interval_seconds": minimum})
    tid, _ = tenant_with_notes(pool, notes_dir)
    with pytest.raises(InvalidSchedule, match=message):
        create_schedule(pool, tenant_id=tid, settings=strict, fields={**rule, "all": True})


def test_cron_nicknames_fire_like_their_expansion(pool, settings: Settings, notes_dir) -> None:
    tid, _ = tenant_with_notes(pool, notes_dir)
    sched = create_schedule(
        pool,
        tenant_id=tid,
        settings=settings,
        fields={"cron": "@daily", "timezone": "Europe/Berlin", "all": True},
        now=datetime(2031, 3, 29, 12, tzinfo=UTC),
    )
    assert sched["cron"] == "@daily"  # stored as written
    assert sched["next_due_at"] == datetime(2031, 3, 29, 23, 0, tzinfo=UTC)  # midnight CEST
    nights = Rule("@daily", "Europe/Berlin").upcoming(datetime(2031, 3, 29, 12, tzinfo=UTC), 2)
    assert nights == [datetime(2031, 3, 29, 23, tzinfo=UTC), datetime(2031, 3, 30, 22, tzinfo=UTC)]


def test_run_now_creates_a_manual_slot_beside_the_scheduled_one(
    pool, settings: Settings, notes_dir: Path
) -> None:
    tid, ids = tenant_with_notes(pool, notes_dir)
    sched = schedule_at(pool, settings, tid, T0, interval_seconds=60, note_ids=ids[:2])
    # a manual run at the very instant of the scheduled slot: both happen, each once
    manual = run_now(pool, settings, tenant_id=tid, schedule_id=sched["id"], now=T0)
    assert manual.scheduled_at == T0 and manual.job["status"] == "queued"
    assert ScheduleTicker(settings, pool).tick(now=T0 + SEC).created == 1
    with pool.connection() as conn:
        slots = conn.execute(
            "SELECT trigger, scheduled_at FROM export_schedule_slots WHERE schedule_id = %s"
            " ORDER BY trigger",
            (sched["id"],),
        ).fetchall()
        detail = conn.execute(
            "SELECT detail FROM export_job_events WHERE job_id = %s AND kind = 'submitted'",
            (manual.job["id"],),
        ).fetchone()["detail"]
    assert [(s["trigger"], s["scheduled_at"]) for s in slots] == [("manual", T0), ("schedule", T0)]
    assert detail["trigger"] == "manual" and detail["schedule_id"] == str(sched["id"])
    assert row_of(pool, sched["id"])["next_due_at"] == T0 + timedelta(minutes=1)


def test_run_now_passes_admission_and_writes_nothing_when_refused(
    pool, settings: Settings, notes_dir: Path
) -> None:
    tid, ids = tenant_with_notes(pool, notes_dir)
    sched = schedule_at(pool, settings, tid, T0, interval_seconds=60, note_ids=ids[:2])
    fill_quota(pool, settings, tid, ids, quota=1)
    with pytest.raises(QuotaExceeded):
        run_now(pool, settings, tenant_id=tid, schedule_id=sched["id"])
    assert count(pool, "SELECT count(*) FROM export_schedule_slots") == 0
    assert row_of(pool, sched["id"])["refusals"] == 0  # a manual refusal is the caller's
    with pool.connection() as conn:
        conn.execute("DELETE FROM notes WHERE tenant_id = %s", (tid,))
        tenant_store.tenant_set_quota(conn, tenant_id=tid, quota=None)
    with pytest.raises(UnknownNotes):
        run_now(pool, settings, tenant_id=tid, schedule_id=sched["id"])


def test_preview_lists_the_next_slots_in_the_zone_and_keeps_an_intervals_phase() -> None:
    berlin = preview(
        Rule("30 2 * * *", "Europe/Berlin"), 3, now=datetime(2031, 3, 28, 12, tzinfo=UTC)
    )
    assert [p.at for p in berlin] == [
        datetime(2031, 3, 29, 1, 30, tzinfo=UTC),
        datetime(2031, 3, 30, 1, 0, tzinfo=UTC),  # 02:30 does not exist that night: 03:00
        datetime(2031, 3, 31, 0, 30, tzinfo=UTC),
    ]
    assert [p.local.isoformat() for p in berlin][1] == "2031-03-30T03:00:00+02:00"
    cursor = datetime(2030, 1, 1, 0, 0, 10, tzinfo=UTC)
    phase = preview(
        Rule(interval_seconds=60), 2, now=cursor + timedelta(minutes=5, seconds=1), cursor=cursor
    )
    assert [p.at for p in phase] == [cursor + timedelta(minutes=6), cursor + timedelta(minutes=7)]


def test_a_schedule_that_fails_to_evaluate_does_not_stop_the_others(
    pool, settings: Settings, notes_dir: Path
) -> None:
    broken_tid, b_ids = tenant_with_notes(pool, notes_dir)
    tid, ids = tenant_with_notes(pool, notes_dir)
    broken = schedule_at(
        pool, settings, broken_tid, T0 - SEC, interval_seconds=60, note_ids=b_ids[:1]
    )
    with pool.connection() as conn:  # a stored rule cronsim cannot read any more
        conn.execute(
            "UPDATE export_schedules SET interval_seconds = NULL, cron = '@fortnightly',"
            " timezone = 'UTC' WHERE id = %s",
            (broken["id"],),
        )
    fine = schedule_at(pool, settings, tid, T0, interval_seconds=60, note_ids=ids[:1])
    counts = ScheduleTicker(settings, pool).tick(now=T0 + SEC)
    assert (counts.errors, counts.created) == (1, 1)
    assert created(pool, fine["id"]) == [T0]
    assert row_of(pool, broken["id"])["next_due_at"] == T0 - SEC  # left as it was
