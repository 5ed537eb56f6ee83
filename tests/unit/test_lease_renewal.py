"""Lease renewal timing (no database: the store is stubbed)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from uuid import uuid4

import pytest

from exportcore import lease_renewal
from exportcore.lease_renewal import LeaseKeeper, LeaseLost


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

    monkeypatch.setattr(lease_renewal.job_store, "job_renew_lease", fake_renew)
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

    monkeypatch.setattr(lease_renewal.job_store, "job_renew_lease", slow_renew)
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
