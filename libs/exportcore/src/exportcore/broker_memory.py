"""The broker's Redis memory: ``maxmemory-policy noeviction``, checked when the publisher
starts, and where the rate-limit buckets take their memory from.

Why noeviction (lesson 08): under any evicting policy a full Redis silently deletes keys to
make room, and the keys of the broker are the queued messages themselves (kombu's lists,
its unacked hash): exports would wait for the recovery scanner instead of running. Under
``noeviction`` a full Redis refuses writes with an ``OOM`` error instead: the publisher's
sends fail loudly, the outbox keeps the messages, and they go out once memory is back.

The check reads ``INFO memory`` (allowed to the ACL user of the deployments, ``+@all
-@admin``; ``CONFIG GET`` is an administrative command and is not). A Redis that refuses
``INFO`` (some managed services) cannot be checked: that is logged, never fatal.

The rate-limit buckets (:mod:`exportcore.ratelimit`) live in ``RATE_LIMIT_REDIS_URL``, or,
when it is empty, in the broker's Redis: they then share its ``maxmemory`` budget. Each
bucket is one small hash that expires once it would be full again (at most
``burst / rate`` seconds plus one after its last use), so their memory is bounded by the
subjects active within that window; :func:`check_broker_redis` says at start which Redis
holds them (docs/operations.md "The broker's Redis").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from urllib.parse import urlsplit

import redis

from exportcore.redis_urls import parse_redis_url, redis_client
from exportcore.settings import Settings

log = logging.getLogger(__name__)

REQUIRED_POLICY = "noeviction"
CHECK_TIMEOUT_SECONDS = 3.0
"""Socket timeout of the start-up check; an unreachable broker is left to the process's
own retries."""


class EvictingBroker(RuntimeError):
    """The broker's Redis may evict keys (its ``maxmemory-policy`` is not ``noeviction``)."""


@dataclass(frozen=True)
class BrokerMemory:
    """What the check saw: ``policy`` (None when Redis could not be asked), ``maxmemory``
    in bytes (0 = no limit; None when unknown), and whether the rate-limit buckets share
    the broker's Redis (``rate_limits_shared``)."""

    policy: str | None
    maxmemory: int | None
    rate_limits_shared: bool


def eviction_policy(client: redis.Redis) -> tuple[str | None, int | None]:
    """``(maxmemory_policy, maxmemory)`` from ``INFO memory``; ``(None, None)`` when this
    user may not run INFO. Connection errors propagate."""
    try:
        info = client.info("memory")
    except (redis.exceptions.NoPermissionError, redis.exceptions.ResponseError):
        return None, None
    policy = info.get("maxmemory_policy")
    maxmemory = info.get("maxmemory")
    return (str(policy) if policy is not None else None), (
        int(maxmemory) if maxmemory is not None else None
    )


def rate_limits_share_broker(settings: Settings) -> bool:
    """True when the rate-limit buckets live in the broker's Redis: no
    ``RATE_LIMIT_REDIS_URL``, or one naming the same server(s) as the broker URL."""
    if not settings.rate_limit_redis_url:
        return True
    return _servers(settings.broker_url) == _servers(settings.rate_limit_redis_url)


def _servers(url: str) -> tuple[tuple[str, int], ...]:
    """The (host, port) a Redis URL reaches: its Sentinels, or the one server."""
    target = parse_redis_url(url)
    if target.sentinels:
        return target.sentinels
    parts = urlsplit(url)
    return ((parts.hostname or "", parts.port or 6379),)


def check_broker_redis(settings: Settings, client: redis.Redis | None = None) -> BrokerMemory:
    """Check the broker's ``maxmemory-policy`` and log where the rate-limit buckets live.

    Raises :class:`EvictingBroker` when the policy is readable and is not ``noeviction``
    and ``BROKER_EVICTION_CHECK`` is ``refuse`` (else logs an error). An unreachable Redis
    is logged and not raised (the caller's own retries deal with it)."""
    shared = rate_limits_share_broker(settings)
    own = client is None
    client = client or redis_client(settings, settings.broker_url, timeout=CHECK_TIMEOUT_SECONDS)
    try:
        policy, maxmemory = eviction_policy(client)
    except redis.RedisError as exc:
        log.warning(
            "broker maxmemory-policy not checked: Redis unreachable",
            extra={"error": type(exc).__name__},
        )
        return BrokerMemory(None, None, shared)
    finally:
        if own:
            client.close()
    seen = BrokerMemory(policy, maxmemory, shared)
    if policy is None:
        log.warning(
            "broker maxmemory-policy not checked: this Redis user may not run INFO; make sure "
            "it is noeviction (docs/operations.md, The broker's Redis)"
        )
    elif policy != REQUIRED_POLICY:
        message = (
            f"the broker's Redis has maxmemory-policy {policy}: when full it evicts keys, "
            "and queued export messages are keys. Set maxmemory-policy noeviction "
            "(docs/operations.md, The broker's Redis)"
        )
        if settings.broker_eviction_check == "refuse":
            raise EvictingBroker(message + ", or BROKER_EVICTION_CHECK=warn to start anyway")
        log.error(message, extra={"maxmemory_policy": policy})
    log.info(
        "broker memory",
        extra={
            "maxmemory_policy": policy,
            "maxmemory_bytes": maxmemory,
            "rate_limit_buckets": "in the broker's Redis (its maxmemory budget)"
            if shared
            else "in RATE_LIMIT_REDIS_URL",
        },
    )
    return seen
