"""Where the rate-limit buckets live relative to the broker (pure logic of
exportcore.broker_memory; the check against real servers: tests/integration/test_broker_memory.py)."""

from __future__ import annotations

import pytest

from exportcore.broker_memory import rate_limits_share_broker
from exportcore.settings import Settings

BROKER = "redis://exports:pw@redis.db.svc:6379/0"


@pytest.mark.parametrize(
    ("rate_limit_url", "shared"),
    [
        ("", True),  # unset: the broker's Redis
        ("redis://exports:pw@redis.db.svc:6379/3", True),  # another db, the same memory
        ("redis://other:pw2@redis.db.svc/1", True),  # port 6379 by default
        ("redis://ratelimit:pw@ratelimit.db.svc:6379/0", False),
        ("redis://exports:pw@redis.db.svc:6380/0", False),
    ],
)
def test_a_rate_limit_redis_is_shared_when_it_is_the_same_server(
    rate_limit_url: str, shared: bool
) -> None:
    settings = Settings(celery_broker_url=BROKER, rate_limit_redis_url=rate_limit_url)
    assert rate_limits_share_broker(settings) is shared


def test_sentinels_are_compared_as_the_set_they_name() -> None:
    broker = "sentinel://u:p@s0:26379/0;sentinel://s1:26379"
    same = Settings(
        celery_broker_url=broker,
        rate_limit_redis_url="sentinel://u:p@s0:26379/2;sentinel://s1:26379",
        broker_sentinel_master="m",
    )
    assert rate_limits_share_broker(same)
    other = same.model_copy(update={"rate_limit_redis_url": "redis://u:p@limits:6379/0"})
    assert not rate_limits_share_broker(other)
