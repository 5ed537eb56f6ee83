"""Rate limits: token buckets shared by every process, one per (limit, subject).

The submit limit: each tenant has a bucket of ``burst`` tokens that refills at ``rate``
tokens per second (``TENANT_SUBMIT_RATE`` / ``TENANT_SUBMIT_BURST``, or the tenant's own
override set with ``exportctl tenant set-rate``). A submit takes one token; without one it
is refused with 429 and ``Retry-After`` = the time until the bucket holds a token again
(RFC 6585 section 4, RFC 9110 section 10.2.3), before anything is read or written in
PostgreSQL. The same buckets, under other names (:data:`READ`, :data:`WEBHOOK_ACTION`,
:data:`CONSOLE_SIGN_IN`, the workers' downstream limits of :mod:`exportcore.downstream`),
bound a tenant's reads, its webhook test and redeliver requests, sign-in attempts per
client address, and the workers' calls to the object store and the notes source
(docs/limits.md).

Where the buckets live: in **Redis**, updated by one Lua script (atomic: Redis runs a script
alone, so concurrent api replicas never both take the last token) that reads the clock with
``TIME`` inside the script, so every replica judges by one clock. Not in PostgreSQL: the
limiter's job is to keep floods away from the database that holds job state, and a bucket
there would turn every refused request into a row lock, a WAL record and a commit on it.
The state is disposable (a lost bucket is a full bucket: at most one extra burst), which is
what Redis without persistence gives.

When Redis cannot be reached (an error, or no answer within ``REDIS_TIMEOUT_SECONDS``), each
process decides alone for ``REDIS_RETRY_SECONDS`` with a **local bucket** per tenant
holding ``RATE_LIMIT_LOCAL_SHARE`` of the tenant's rate and burst: neither unlimited work
(N processes allow at most N x share x the limit) nor refusing everyone. Its decisions are
counted in ``exports_rate_limit_decisions_total{backend="local"}``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from exportcore import metrics
from exportcore.redis_urls import redis_client
from exportcore.settings import Settings

log = logging.getLogger(__name__)

KEY_PREFIX = "exports:submit-rate:"
"""Redis key prefix of the submit buckets (``<prefix><tenant>``)."""

SUBMIT = "submit"
READ = "read"
WEBHOOK_ACTION = "webhook-action"
CONSOLE_SIGN_IN = "console-sign-in"
LIMITS = (SUBMIT, READ, WEBHOOK_ACTION, CONSOLE_SIGN_IN)
"""The names of the api's limits (the ``limit`` label of ``exports_rate_limit_decisions_total``;
the workers' downstream limits add theirs)."""


def bucket_key(limit: str, subject: str) -> str:
    """The Redis key of ``subject``'s bucket of ``limit``: ``exports:submit-rate:<tenant>``
    for submits (unchanged), ``exports:<limit>-rate:<subject>`` for the others."""
    return KEY_PREFIX + subject if limit == SUBMIT else f"exports:{limit}-rate:{subject}"


# KEYS[1] the tenant's bucket (a hash: tokens, ts); ARGV rate (tokens/s), burst, cost.
# Returns {allowed (0/1), tokens left, seconds until `cost` tokens are there} as strings
# (Redis would truncate Lua numbers to integers). The key expires once the bucket would be
# full again anyway, so idle tenants cost no memory.
TOKEN_BUCKET_LUA = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1])
local ts = tonumber(state[2])
if tokens == nil or ts == nil then
  tokens = burst
  ts = now
end
if now > ts then
  tokens = math.min(burst, tokens + (now - ts) * rate)
end
local allowed = 0
local wait = 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
else
  wait = (cost - tokens) / rate
end
local left = string.format('%.6f', tokens)
redis.call('HSET', KEYS[1], 'tokens', left, 'ts', string.format('%.6f', now))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1000)
return {allowed, left, string.format('%.6f', wait)}
"""


@dataclass(frozen=True)
class Limit:
    """A token bucket's shape: ``rate`` tokens per second, at most ``burst`` at once."""

    rate: float
    burst: int

    def share(self, fraction: float) -> Limit:
        """The same bucket scaled by ``fraction`` (at least one token, so never refuse-all)."""
        return Limit(max(self.rate * fraction, 1e-6), max(1, math.floor(self.burst * fraction)))


@dataclass(frozen=True)
class Decision:
    """Whether a request may go on; ``retry_after`` seconds until it could (0 when
    allowed); ``remaining`` tokens left in the bucket after this take (a float, as the
    bucket refills continuously); ``backend`` that decided: ``redis`` or ``local``;
    ``limit`` the bucket's shape it decided by (the local share of the limit while the
    local buckets decide). The api's ``RateLimit`` headers are written from these, with no
    second call to Redis."""

    allowed: bool
    retry_after: float
    remaining: float
    backend: str
    limit: Limit

    @property
    def retry_after_header(self) -> str:
        """``Retry-After`` as delay-seconds (RFC 9110 section 10.2.3: a whole number, here
        rounded up and at least 1)."""
        return str(max(1, math.ceil(self.retry_after)))


class TokenBucket:
    """An in-process token bucket (the fallback), on a monotonic clock in seconds."""

    def __init__(self, limit: Limit, now: float) -> None:
        self.tokens = float(limit.burst)
        self.updated = now

    def take(self, limit: Limit, now: float, cost: float = 1.0) -> tuple[bool, float, float]:
        """Refill for the time since the last call, then take ``cost`` tokens if there are
        that many: ``(allowed, tokens left, seconds until cost tokens are there)``."""
        if now > self.updated:
            self.tokens = min(float(limit.burst), self.tokens + (now - self.updated) * limit.rate)
        self.updated = max(self.updated, now)
        if self.tokens >= cost:
            self.tokens -= cost
            return True, self.tokens, 0.0
        return False, self.tokens, (cost - self.tokens) / limit.rate


class LocalBuckets:
    """Token buckets per tenant in this process, at most ``max_tenants`` (least recently used
    dropped first: a dropped bucket comes back full, the same as a new tenant's)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, max_tenants: int = 10_000):
        self.clock = clock
        self.max_tenants = max_tenants
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, key: str, limit: Limit, cost: float = 1.0) -> Decision:
        """Take ``cost`` tokens from the local bucket named ``key``."""
        with self._lock:
            now = self.clock()
            bucket = self._buckets.get(key)
            if bucket is None:
                bucket = self._buckets[key] = TokenBucket(limit, now)
                while len(self._buckets) > self.max_tenants:
                    self._buckets.popitem(last=False)
            else:
                self._buckets.move_to_end(key)
            allowed, left, wait = bucket.take(limit, now, cost)
        return Decision(allowed, wait, left, "local", limit)


REDIS_TIMEOUT_SECONDS = 0.2
"""Socket timeout of one rate-limit call to Redis; past it the local buckets decide."""
REDIS_RETRY_SECONDS = 5.0
"""After a failed Redis call, how long the local buckets decide alone."""


class RateLimiter:
    """The rate limiter of one process: every limit's buckets, in one Redis (thread-safe:
    FastAPI runs sync dependencies on a thread pool, a worker renders on several threads).

    ``client`` is a ``redis.Redis`` (default: from ``settings.rate_limit_url``, through its
    Sentinels when it is a ``sentinel://`` URL, with ``redis_timeout`` seconds of socket
    timeout); ``clock`` is monotonic seconds; after a failed Redis call the local buckets
    decide alone for ``redis_retry_seconds`` before Redis is tried again.
    """

    def __init__(
        self,
        settings: Settings,
        client: redis.Redis | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        redis_timeout: float = REDIS_TIMEOUT_SECONDS,
        redis_retry_seconds: float = REDIS_RETRY_SECONDS,
    ) -> None:
        self.settings = settings
        self.redis_retry_seconds = redis_retry_seconds
        self.client = client or redis_client(
            settings, settings.rate_limit_url, timeout=redis_timeout
        )
        self.script: Any = self.client.register_script(TOKEN_BUCKET_LUA)
        self.clock = clock
        self.local = LocalBuckets(clock)
        self._redis_down_until = 0.0
        self._lock = threading.Lock()

    def check(
        self, subject: str, limit: Limit, *, name: str = SUBMIT, cost: float = 1.0
    ) -> Decision:
        """Take ``cost`` tokens of ``subject``'s bucket of the limit ``name`` (a tenant id,
        a client address, a downstream's name). Never raises for Redis trouble: the local
        bucket decides then, with ``RATE_LIMIT_LOCAL_SHARE`` of the limit."""
        key = bucket_key(name, subject)
        decision = self._shared(key, limit, cost)
        if decision is None:
            share = limit.share(self.settings.rate_limit_local_share)
            decision = self.local.take(key, share, min(cost, share.burst))
        metrics.RATE_LIMIT_DECISIONS.labels(
            decision.backend, "allowed" if decision.allowed else "limited", name
        ).inc()
        return decision

    def _shared(self, key: str, limit: Limit, cost: float) -> Decision | None:
        if self.clock() < self._redis_down_until:
            return None
        try:
            allowed, left, wait = self.script(
                keys=[key], args=[repr(limit.rate), limit.burst, repr(float(cost))]
            )
        except redis.RedisError as exc:
            with self._lock:
                first = self.clock() >= self._redis_down_until
                self._redis_down_until = self.clock() + self.redis_retry_seconds
            if first:
                log.warning(
                    "rate-limit store unreachable; local fallback buckets decide",
                    extra={
                        "error": type(exc).__name__,
                        "retry_in_seconds": self.redis_retry_seconds,
                        "local_share": self.settings.rate_limit_local_share,
                    },
                )
            return None
        return Decision(bool(int(allowed)), float(wait), float(left), "redis", limit)

    def close(self) -> None:
        """Close the Redis connections."""
        self.client.close()


class TenantLimits:
    """Each tenant's bucket shape, read from ``tenants.submit_rate`` / ``submit_burst``
    (NULL: the settings' defaults) and kept for ``TENANT_LIMITS_CACHE_SECONDS`` per process.

    ``lookup(tenant_id)`` returns the row of overrides (or None for an unknown tenant).
    """

    def __init__(
        self,
        settings: Settings,
        lookup: Callable[[str], dict[str, Any] | None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.lookup = lookup
        self.clock = clock
        self._cache: dict[str, tuple[float, Limit]] = {}
        self._lock = threading.Lock()

    def default(self) -> Limit:
        """The limit of a tenant without overrides."""
        return Limit(self.settings.tenant_submit_rate, self.settings.tenant_submit_burst)

    def of(self, tenant_id: str) -> Limit:
        """The tenant's limit (cached)."""
        ttl = self.settings.tenant_limits_cache_seconds
        now = self.clock()
        with self._lock:
            cached = self._cache.get(tenant_id)
        if cached is not None and now - cached[0] < ttl:
            return cached[1]
        row = self.lookup(tenant_id) or {}
        limit = Limit(
            float(row.get("submit_rate") or self.settings.tenant_submit_rate),
            int(row.get("submit_burst") or self.settings.tenant_submit_burst),
        )
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[tenant_id] = (now, limit)
        return limit
