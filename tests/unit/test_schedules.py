"""Schedule rules, catch-up and overlap planning (pure): DST, policies, bounds."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exportcore.schedules.rules import (
    MAX_BACKFILL_SLOTS,
    InvalidSchedule,
    Rule,
    backfill_slots,
    check_jitter,
    check_policies,
    plan_overlap,
    plan_slots,
    preview,
)

BERLIN = ZoneInfo("Europe/Berlin")
T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        (Rule(), "either cron"),
        (Rule("0 2 * * *", "Europe/Berlin", 60), "either cron"),
        (Rule("0 2 * * *"), "IANA timezone"),
        (Rule("0 2 * * *", "Mars/Olympus"), "unknown time zone"),
        (Rule("61 2 * * *", "UTC"), "invalid cron expression"),
        (Rule("every day", "UTC"), "invalid cron expression"),
        # a bad cron is reported as such even without a zone (it used to be "needs a zone")
        (Rule("61 2 * * *"), r"^invalid cron expression '61 2 \* \* \*': the minute field"),
        (Rule("0 25 * * *", "UTC"), r"the hour field is not valid \(it takes 0-23\)"),
        (Rule("0 0 * * 9"), r"the day of week field is not valid \(it takes 0-7 or sun-sat\)"),
        (Rule(None, "UTC", 60), "timezone applies to cron"),
        (Rule(None, None, 0), "at least 1"),
    ],
)
def test_invalid_rules_say_what_to_fix(rule: Rule, message: str) -> None:
    with pytest.raises(InvalidSchedule, match=message):
        rule.validate()


def daily_slots(rule: Rule, start: datetime, days: int) -> list[datetime]:
    slots, t = [], start
    end = start + timedelta(days=days)
    while (t := rule.next_after(t)) < end:
        slots.append(t)
    return slots


@pytest.mark.parametrize("zone", ["Europe/Berlin", "America/New_York", "Australia/Sydney", "UTC"])
@pytest.mark.parametrize("cron", ["30 2 * * *", "0 0 * * *", "15 1 * * *"])
def test_a_daily_schedule_runs_exactly_once_every_local_day_of_a_year(zone: str, cron: str) -> None:
    rule = Rule(cron, zone).validate()
    start = datetime(2026, 1, 1, tzinfo=UTC)
    slots = daily_slots(rule, start, 366)
    local_days = [s.astimezone(ZoneInfo(zone)).date() for s in slots]
    assert len(local_days) == len(set(local_days))  # never twice on one day (fall back)
    first, last = local_days[0], local_days[-1]
    assert len(local_days) == (last - first).days + 1  # never a day skipped (spring forward)
    assert all(b > a for a, b in itertools.pairwise(slots))


def test_berlin_transitions_map_to_the_documented_utc_instants() -> None:
    rule = Rule("30 2 * * *", "Europe/Berlin")
    # spring forward 2026-03-29: 02:30 does not exist -> 03:00 CEST = 01:00 UTC
    assert rule.next_after(datetime(2026, 3, 28, 12, tzinfo=UTC)) == datetime(
        2026, 3, 29, 1, 0, tzinfo=UTC
    )
    # fall back 2026-10-25: 02:30 happens twice -> the first (CEST) = 00:30 UTC, once
    first = rule.next_after(datetime(2026, 10, 24, 12, tzinfo=UTC))
    assert first == datetime(2026, 10, 25, 0, 30, tzinfo=UTC)
    assert rule.next_after(first) == datetime(2026, 10, 26, 1, 30, tzinfo=UTC)
    # an hourly rule runs in both real hours of the repeated hour
    hourly = Rule("30 * * * *", "Europe/Berlin")
    t = datetime(2026, 10, 24, 23, 0, tzinfo=UTC)
    got = [t := hourly.next_after(t) for _ in range(4)]
    assert got == [
        datetime(2026, 10, 24, 23, 30, tzinfo=UTC) + timedelta(hours=h) for h in range(4)
    ]


def test_plan_on_time_runs_the_one_due_slot() -> None:
    rule = Rule(None, None, 60)
    plan = plan_slots(
        rule, T0, T0 + timedelta(seconds=5), catch_up="skip", max_catch_up=10, batch=20
    )
    assert plan.run == [T0] and plan.skipped == [] and plan.cursor == T0 + timedelta(seconds=60)


def test_plan_nothing_due_keeps_the_cursor() -> None:
    plan = plan_slots(
        Rule(None, None, 60),
        T0,
        T0 - timedelta(seconds=1),
        catch_up="all",
        max_catch_up=3,
        batch=20,
    )
    assert plan.run == [] and plan.cursor == T0


def test_plan_skip_runs_only_the_latest_missed_slot() -> None:
    rule = Rule(None, None, 60)
    plan = plan_slots(
        rule, T0, T0 + timedelta(minutes=5, seconds=1), catch_up="skip", max_catch_up=10, batch=20
    )
    assert plan.run == [T0 + timedelta(minutes=5)]
    assert plan.skipped == [T0 + timedelta(minutes=m) for m in range(5)] and plan.skipped_total == 5
    assert plan.cursor == T0 + timedelta(minutes=6)


def test_plan_all_runs_every_missed_slot_up_to_the_maximum() -> None:
    rule = Rule(None, None, 60)
    now = T0 + timedelta(minutes=5, seconds=1)
    plan = plan_slots(rule, T0, now, catch_up="all", max_catch_up=3, batch=20)
    assert plan.run == [T0 + timedelta(minutes=m) for m in (3, 4, 5)]
    assert plan.skipped_total == 3
    within = plan_slots(rule, T0, now, catch_up="all", max_catch_up=10, batch=20)
    assert within.run == [T0 + timedelta(minutes=m) for m in range(6)] and within.skipped == []


def test_plan_batch_leaves_the_rest_for_the_next_tick() -> None:
    rule = Rule(None, None, 60)
    now = T0 + timedelta(minutes=5, seconds=1)
    first = plan_slots(rule, T0, now, catch_up="all", max_catch_up=10, batch=4)
    assert first.run == [T0 + timedelta(minutes=m) for m in range(4)]
    assert first.cursor == T0 + timedelta(minutes=4)
    second = plan_slots(rule, first.cursor, now, catch_up="all", max_catch_up=10, batch=4)
    assert second.run == [T0 + timedelta(minutes=4), T0 + timedelta(minutes=5)]


@given(
    interval=st.integers(1, 10_000),
    gap=st.integers(0, 500_000),
    keep=st.integers(1, 50),
    batch=st.integers(1, 50),
    policy=st.sampled_from(["skip", "all"]),
)
def test_plans_only_run_due_slots_in_order_and_move_forward(
    interval, gap, keep, batch, policy
) -> None:
    rule = Rule(None, None, interval)
    now = T0 + timedelta(seconds=gap)
    plan = plan_slots(rule, T0, now, catch_up=policy, max_catch_up=keep, batch=batch)
    assert all(T0 <= s <= now for s in plan.run)
    assert plan.run == sorted(set(plan.run)) and len(plan.run) <= min(
        batch, 1 if policy == "skip" else keep
    )
    assert plan.cursor is not None and plan.cursor >= T0
    assert all(s < plan.cursor for s in plan.run + plan.skipped)
    due = gap // interval + 1
    assert len(plan.run) + plan.skipped_total <= due


# --- overlap: an earlier export still queued or running ----------------------------------

MINUTE = Rule(None, None, 60)


def test_overlap_skip_skips_every_due_slot_and_moves_past_the_latest() -> None:
    plan = plan_overlap(MINUTE, T0, T0 + timedelta(minutes=2, seconds=5), "skip")
    assert plan.skipped == [T0, T0 + timedelta(minutes=1), T0 + timedelta(minutes=2)]
    assert plan.skipped_total == 3 and plan.held is None
    assert plan.cursor == T0 + timedelta(minutes=3)


def test_overlap_buffer_one_holds_the_latest_due_slot_and_skips_the_older() -> None:
    on_time = plan_overlap(MINUTE, T0, T0 + timedelta(seconds=5), "buffer_one")
    assert (on_time.skipped, on_time.held, on_time.cursor) == ([], T0, T0)  # just waits
    later = plan_overlap(MINUTE, T0, T0 + timedelta(minutes=2, seconds=5), "buffer_one")
    assert later.skipped == [T0, T0 + timedelta(minutes=1)] and later.skipped_total == 2
    assert later.held == later.cursor == T0 + timedelta(minutes=2)


@pytest.mark.parametrize("policy", ["skip", "buffer_one"])
def test_overlap_with_nothing_due_changes_nothing(policy: str) -> None:
    plan = plan_overlap(MINUTE, T0, T0 - timedelta(seconds=1), policy)
    assert (plan.skipped, plan.skipped_total, plan.cursor, plan.held) == ([], 0, T0, None)


def test_a_long_overlap_records_a_bounded_number_of_skipped_slots() -> None:
    plan = plan_overlap(MINUTE, T0, T0 + timedelta(days=7), "skip")
    assert plan.skipped_total == 7 * 24 * 60 + 1 and len(plan.skipped) <= 101
    assert plan.skipped[-1] == T0 + timedelta(days=7)


@pytest.mark.parametrize(
    ("catch_up", "overlap", "ok"),
    [
        ("skip", "skip", True),
        ("skip", "buffer_one", True),
        ("skip", "allow_all", True),
        ("all", "allow_all", True),
        ("all", "skip", False),
        ("all", "buffer_one", False),
        ("skip", "buffer_all", False),
    ],
)
def test_catch_up_all_needs_overlap_allow_all(catch_up: str, overlap: str, ok: bool) -> None:
    if ok:
        check_policies(catch_up, overlap)
    else:
        with pytest.raises(InvalidSchedule, match="overlap"):
            check_policies(catch_up, overlap)


# --- jitter and backfill ranges -----------------------------------------------------------------


def test_the_preview_of_a_jittered_rule_shows_the_instant_and_when_it_fires() -> None:
    rule = Rule("30 2 * * *", "Europe/Berlin")
    now = datetime(2026, 3, 28, 1, 31, tzinfo=UTC)  # 02:31 Berlin: today's 02:30 has passed
    plain = preview(rule, 2, now=now)
    assert [p.local.isoformat() for p in plain] == [
        "2026-03-29T03:00:00+02:00",  # spring forward: 02:30 does not exist
        "2026-03-30T02:30:00+02:00",
    ]
    assert all(p.fires_at == p.at for p in plain)
    late = preview(rule, 2, now=now, jitter_offset=120)
    # today's slot (01:30 UTC) fires at 01:32 UTC, after now: still to come
    assert [p.at for p in late] == [datetime(2026, 3, 28, 1, 30, tzinfo=UTC), plain[0].at]
    assert [p.fires_at - p.at for p in late] == [timedelta(seconds=120)] * 2
    assert late[0].fires_local.isoformat() == "2026-03-28T02:32:00+01:00"
    cursor = T0 + timedelta(seconds=10)
    interval = preview(Rule(interval_seconds=60), 2, now=T0, cursor=cursor, jitter_offset=5)
    assert [p.fires_at for p in interval] == [
        cursor + timedelta(seconds=5),
        cursor + timedelta(seconds=65),
    ]


@pytest.mark.parametrize("bad", [-1, 3601, 1.5, "60", None, True])
def test_jitter_is_whole_seconds_up_to_an_hour(bad: object) -> None:
    with pytest.raises(InvalidSchedule, match="jitter"):
        check_jitter(bad)
    assert check_jitter(0) == 0 and check_jitter(3600) == 3600


def test_backfill_slots_of_a_cron_rule_and_of_an_interval_rule_in_its_phase() -> None:
    daily = Rule("@daily", "Europe/Berlin")
    start, end = datetime(2026, 3, 27, tzinfo=UTC), datetime(2026, 3, 30, tzinfo=UTC)
    assert [s.isoformat() for s in backfill_slots(daily, start, end, anchor=end)] == [
        "2026-03-27T23:00:00+00:00",
        "2026-03-28T23:00:00+00:00",
        "2026-03-29T22:00:00+00:00",  # summer time from the 29th
    ]
    edge = datetime(2026, 3, 28, 23, tzinfo=UTC)
    assert backfill_slots(daily, edge, edge, anchor=end) == [edge]  # both ends included
    every = Rule(interval_seconds=600)
    anchor = T0 + timedelta(seconds=17)
    slots = backfill_slots(every, T0 - timedelta(hours=1), T0, anchor=anchor)
    assert slots[0] == anchor - timedelta(minutes=60) and slots[-1] == anchor - timedelta(
        minutes=10
    )
    assert all((anchor - s) % timedelta(minutes=10) == timedelta(0) for s in slots)
    with pytest.raises(InvalidSchedule, match="ends before it starts"):
        backfill_slots(every, T0, T0 - timedelta(seconds=1), anchor=anchor)


def test_a_backfill_range_is_bounded_and_says_where_to_split() -> None:
    minutely = Rule(interval_seconds=60)
    n = MAX_BACKFILL_SLOTS
    assert len(backfill_slots(minutely, T0, T0 + timedelta(minutes=n - 1), anchor=T0)) == n
    with pytest.raises(InvalidSchedule) as exc:
        backfill_slots(minutely, T0, T0 + timedelta(minutes=n), anchor=T0)
    last, first = T0 + timedelta(minutes=n - 1), T0 + timedelta(minutes=n)
    assert f"at most {n}" in exc.value.detail
    assert last.isoformat() in exc.value.detail and first.isoformat() in exc.value.detail
