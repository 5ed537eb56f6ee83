"""Downstream rate limits: the workers' calls to the object store and to the notes source,
limited per deployment by token buckets that every worker replica shares.

A backlog burst (a flood of exports, a recovery re-dispatch, a bulk replay) makes every
worker process write artifacts and read snapshots at once. Without a bound the workers take
the whole of the store's request rate and throttle it for everyone else who uses it (S3
answers ``SlowDown``; a shared MinIO or PostgreSQL slows down for every client). So each
call takes a token first:

- ``storage`` (:data:`STORAGE`): every call of the S3 backend made by a worker — a
  ``PutObject``, each part of a multipart upload, its completion or abort, a delete
  (``DOWNSTREAM_STORAGE_RATE`` per second over the deployment, bursts of
  ``DOWNSTREAM_STORAGE_BURST``). The file backend is a local folder or the worker's own
  volume, with no shared service behind it: not limited;
- ``notes-source`` (:data:`NOTES_SOURCE`): every read of a snapshot chunk after the first
  (the first comes with the claim), i.e. the reads of the notes a bulk export renders
  (``DOWNSTREAM_NOTES_RATE`` / ``DOWNSTREAM_NOTES_BURST``).

The buckets are those of :mod:`exportcore.ratelimit`: one Lua script in Redis
(``RATE_LIMIT_REDIS_URL``, default the broker's), judged by Redis's own clock, so N worker
replicas share one rate. Without a token the call **waits** (it is never refused: the work
was accepted) for the time the bucket says, with jitter, at most
``DOWNSTREAM_MAX_WAIT_SECONDS`` and never past the job's deadline; beyond either it raises
:class:`DownstreamThrottled`, a transient error (the job is retried after its backoff,
its lease kept meanwhile by the renewal thread).

**When that Redis is down** (an error or no answer within
:data:`exportcore.ratelimit.REDIS_TIMEOUT_SECONDS`), each worker process decides alone with
a local bucket of ``RATE_LIMIT_LOCAL_SHARE`` of the rate, as the api's limits do, for
:data:`~exportcore.ratelimit.REDIS_RETRY_SECONDS` before it tries Redis again: W
processes then allow at most W x share x the rate. Work goes on at a bounded rate — neither
unlimited (the burst the limit exists for) nor stopped (an outage of the limiter's store
must not stop exports). Decisions are counted in
``exports_rate_limit_decisions_total{limit="storage"|"notes-source", backend}``, waits in
``exports_downstream_wait_seconds{target}``, give-ups in
``exports_downstream_throttled_total{target}``.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from exportcore import metrics
from exportcore.deadlines import Deadline
from exportcore.failures import TransientError
from exportcore.ratelimit import Limit, RateLimiter
from exportcore.settings import Settings

log = logging.getLogger(__name__)

STORAGE = "storage"
NOTES_SOURCE = "notes-source"
TARGETS = (STORAGE, NOTES_SOURCE)
SUBJECT = "deployment"
"""The one bucket per target: the whole deployment (every replica of every worker) shares
it; another release has its own broker Redis, hence its own buckets."""


class DownstreamThrottled(TransientError):
    """No token came within ``DOWNSTREAM_MAX_WAIT_SECONDS`` or before the job's deadline;
    code ``downstream_throttled`` (transient: the job is retried after its backoff)."""

    def __init__(self, detail: str) -> None:
        super().__init__("downstream_throttled", detail)


class DownstreamLimiter:
    """The downstream limits of one worker process (thread-safe).

    ``limiter`` holds the shared buckets (default: a :class:`~exportcore.ratelimit.RateLimiter`
    on ``RATE_LIMIT_REDIS_URL``); ``clock`` is monotonic seconds and ``sleep`` waits (tests
    pass both); ``rng`` draws the jitter of waits.
    """

    def __init__(
        self,
        settings: Settings,
        limiter: RateLimiter | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.limiter = limiter or RateLimiter(settings)
        self.clock = clock
        self.sleep = sleep
        self.rng = rng or random.Random()
        self.max_wait = settings.downstream_max_wait_seconds
        self.limits: dict[str, Limit | None] = {
            STORAGE: _limit(settings.downstream_storage_rate, settings.downstream_storage_burst),
            NOTES_SOURCE: _limit(settings.downstream_notes_rate, settings.downstream_notes_burst),
        }

    def acquire(self, target: str, deadline: Deadline | None = None, cost: float = 1.0) -> float:
        """Take ``cost`` tokens of ``target``'s deployment-wide bucket, waiting for them if
        need be; returns the seconds waited. Raises :class:`DownstreamThrottled` when they
        do not come within ``DOWNSTREAM_MAX_WAIT_SECONDS`` or before ``deadline``."""
        limit = self.limits[target]
        if limit is None:
            return 0.0
        started = self.clock()
        while True:
            decision = self.limiter.check(SUBJECT, limit, name=target, cost=cost)
            waited = self.clock() - started
            if decision.allowed:
                if waited > 0:
                    metrics.DOWNSTREAM_WAIT.labels(target).observe(waited)
                return waited
            pause = decision.retry_after * self.rng.uniform(1.0, 1.25)
            room = self.max_wait - waited
            if deadline is not None:
                room = min(room, deadline.remaining())
            if pause > room:
                metrics.DOWNSTREAM_THROTTLED.labels(target).inc()
                log.warning(
                    "downstream rate limit: no token in time",
                    extra={
                        "target": target,
                        "waited": round(waited, 3),
                        "retry_after": round(decision.retry_after, 3),
                    },
                )
                raise DownstreamThrottled(
                    f"the {target} rate limit ({limit.rate:g}/s over the deployment) had no "
                    f"token within {waited + max(room, 0):.1f} s"
                )
            self.sleep(pause)

    def close(self) -> None:
        """Close the Redis connections."""
        self.limiter.close()


def _limit(rate: float, burst: int) -> Limit | None:
    return Limit(rate, burst) if rate > 0 else None
