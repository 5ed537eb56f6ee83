"""Claim refusal reasons and lease renewal timing (no database: the store is stubbed)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from uuid import uuid4

import pytest

from exportcore import execution
from exportcore.execution import LeaseKeeper, LeaseLost, classify_refusal


def facts(**overrides: Any) -> dict[str, Any]:
    """A ``job_claim_refusal`` row for a queued job that is claimable (a lost race)."""
    row: dict[str, Any] = {
        "status": "queued",
        "attempts": 0,
        "max_attempts": 3,
        "cancel_requested": False,
        "past_deadline": False,
        "not_due": False,
        "lease_valid": None,
    }
    row.update(overrides)
    return row


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        (None, "not_found"),
        (facts(status="succeeded"), "terminal"),
        (facts(status="failed"), "terminal"),
        (facts(status="cancelled"), "terminal"),
        (facts(status="running", lease_valid=True), "leased"),
        (facts(status="running", lease_valid=False), "lease_expired"),
        (facts(status="running", lease_valid=None), "lease_expired"),
        (facts(cancel_requested=True), "cancel_requested"),
        (facts(past_deadline=True), "past_deadline"),
        (facts(attempts=3), "attempts_exhausted"),
        (facts(attempts=4), "attempts_exhausted"),
        (facts(not_due=True), "not_due"),
        (facts(attempts=2), "race"),
        (facts(), "race"),
    ],
)
def test_classify_refusal(row: dict[str, Any] | None, reason: str) -> None:
    assert classify_refusal(row) == reason


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        # A terminal job is terminal whatever else is true of it.
        (facts(status="failed", cancel_requested=True, past_deadline=True), "terminal"),
        # A valid lease is reported even when a cancel is pending.
        (facts(status="running", lease_valid=True, cancel_requested=True), "leased"),
        (facts(cancel_requested=True, past_deadline=True, attempts=3), "cancel_requested"),
        (facts(past_deadline=True, attempts=3, not_due=True), "past_deadline"),
        (facts(attempts=3, not_due=True), "attempts_exhausted"),
    ],
)
def test_classify_refusal_precedence(row: dict[str, Any], reason: str) -> None:
    assert classify_refusal(row) == reason


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakePool:
    def __init__(self) -> None:
        self.borrowed = 0

    @contextmanager
    def connection(self) -> Iterator[str]:
        self.borrowed += 1
        yield "conn"


@pytest.fixture
def renewals(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Replaces ``job_renew_lease`` with a recorder of its arguments; a negative
    ``progress`` makes it refuse (return None, as when the token lost the lease)."""
    calls: list[dict[str, Any]] = []

    def fake_renew(conn: object, **kwargs: Any) -> dict[str, Any] | None:
        calls.append(kwargs)
        return None if kwargs["progress"] < 0 else {"id": kwargs["job_id"]}

    monkeypatch.setattr(execution.job_store, "job_renew_lease", fake_renew)
    return calls


def keeper(clock: FakeClock, pool: FakePool | None = None, lease: float = 30.0) -> LeaseKeeper:
    return LeaseKeeper(pool or FakePool(), uuid4(), uuid4(), lease, clock=clock)  # type: ignore[arg-type]


def test_due_after_a_third_of_the_lease() -> None:
    clock = FakeClock()
    k = keeper(clock, lease=30.0)
    assert not k.due()
    clock.now += 9.999
    assert not k.due()
    clock.now += 0.001
    assert k.due()
    clock.now += 1000
    assert k.due()


def test_due_with_a_clock_that_goes_nowhere() -> None:
    clock = FakeClock(0.0)
    k = keeper(clock, lease=0.3)
    assert not k.due()
    clock.now = 0.1
    assert k.due()


def test_check_renews_only_when_due(renewals: list[dict[str, Any]]) -> None:
    clock, pool = FakeClock(), FakePool()
    k = keeper(clock, pool, lease=30.0)
    k.check(progress=5)
    assert renewals == []
    assert pool.borrowed == 0

    clock.now += 12
    k.check(progress=7)
    assert renewals == [
        {"job_id": k.job_id, "lease_token": k.lease_token, "lease_seconds": 30.0, "progress": 7}
    ]
    assert pool.borrowed == 1
    assert k.renewed_at == clock.now
    assert not k.due()

    clock.now += 9
    k.check(progress=8)
    assert len(renewals) == 1


def test_renewal_time_is_taken_before_the_round_trip(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock(100.0)

    def slow_renew(conn: object, **kwargs: Any) -> dict[str, Any]:
        clock.now += 5  # the database took 5 s to answer
        return {}

    monkeypatch.setattr(execution.job_store, "job_renew_lease", slow_renew)
    k = keeper(clock, lease=30.0)
    clock.now = 110.0
    assert k.renew() is True
    assert k.renewed_at == 110.0  # conservative: the lease was extended at most then


def test_refused_renewal_raises_lease_lost(renewals: list[dict[str, Any]]) -> None:
    clock = FakeClock()
    k = keeper(clock, lease=3.0)
    before = k.renewed_at
    clock.now += 1
    with pytest.raises(LeaseLost, match=str(k.lease_token)):
        k.check(progress=-1)
    assert k.renewed_at == before
