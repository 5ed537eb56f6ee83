"""The token bucket's arithmetic on a fake clock (pure logic; the shared Redis bucket is tested
against a real Redis in tests/integration/test_rate_limits.py)."""

from __future__ import annotations

import pytest

from exportcore.ratelimit import Decision, Limit, LocalBuckets, TokenBucket


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_full_bucket_allows_its_burst_then_refills_at_the_rate() -> None:
    limit = Limit(rate=10.0, burst=5)
    bucket = TokenBucket(limit, now=0.0)
    assert [bucket.take(limit, 0.0)[0] for _ in range(6)] == [True] * 5 + [False]
    allowed, left, wait = bucket.take(limit, 0.0)
    assert not allowed and left == pytest.approx(0.0) and wait == pytest.approx(0.1)
    assert bucket.take(limit, 0.1)[0]  # one token after 1/rate seconds
    assert not bucket.take(limit, 0.1)[0]
    assert bucket.take(limit, 100.0)[1] == pytest.approx(4.0)  # refill stops at the burst


def test_a_clock_going_back_never_adds_tokens() -> None:
    limit = Limit(rate=1.0, burst=1)
    bucket = TokenBucket(limit, now=10.0)
    assert bucket.take(limit, 10.0)[0]
    assert not bucket.take(limit, 5.0)[0]
    assert not bucket.take(limit, 10.5)[0]
    assert bucket.take(limit, 11.0)[0]


def test_local_buckets_are_per_tenant_and_bounded_in_number() -> None:
    clock = Clock()
    buckets = LocalBuckets(clock, max_tenants=2)
    limit = Limit(rate=1.0, burst=1)
    assert buckets.take("a", limit).allowed and not buckets.take("a", limit).allowed
    assert buckets.take("b", limit).allowed  # another tenant has its own bucket
    assert buckets.take("c", limit).allowed  # "a", the least recently used, is dropped
    assert buckets.take("a", limit).backend == "local"
    assert len(buckets._buckets) == 2


def test_a_share_of_a_limit_keeps_at_least_one_token() -> None:
    assert Limit(10.0, 50).share(0.25) == Limit(2.5, 12)
    assert Limit(0.5, 1).share(0.1).burst == 1  # never refuse-all


@pytest.mark.parametrize(("wait", "header"), [(0.01, "1"), (1.0, "1"), (1.2, "2"), (30.0, "30")])
def test_retry_after_is_whole_seconds_rounded_up(wait: float, header: str) -> None:
    assert Decision(False, wait, 0.0, "redis", Limit(1.0, 1)).retry_after_header == header
