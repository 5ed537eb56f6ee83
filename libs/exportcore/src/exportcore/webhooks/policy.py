"""Delivery policy as plain functions: what an answer means, when a message is tried again,
and an endpoint's circuit breaker. No I/O; the delivery process applies the decisions.

Sources: Standard Webhooks 1.0, "Delivery success and failure" (2xx is success; 3xx is a
failure, redirects are not followed; 410 Gone means the receiver wants no more messages and
the endpoint is disabled; 429/502/503/504 ask to slow down, and ``Retry-After`` is honoured)
and "Deliverability and reliability" (retries with exponential backoff and jitter over
hours; an endpoint failing for a long time is disabled). The retries follow a schedule with
±10 % jitter (Svix's published schedule by default: about 27.6 hours).
"""

from __future__ import annotations

import email.utils
import random
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

DELIVERED = "delivered"
HTTP_ERROR = "http_error"
REDIRECT = "redirect"
GONE = "gone"
TIMEOUT = "timeout"
CONNECTION_ERROR = "connection_error"
REFUSED = "refused"
OUTCOMES = (DELIVERED, HTTP_ERROR, REDIRECT, GONE, TIMEOUT, CONNECTION_ERROR, REFUSED)
#: answers that ask the sender to slow down (their Retry-After is honoured)
THROTTLING = frozenset({429, 502, 503, 504})


def outcome_of_status(status: int) -> str:
    """The outcome of an HTTP answer: ``delivered`` for 2xx, ``redirect`` for 3xx (never
    followed), ``gone`` for 410, ``http_error`` for anything else."""
    if 200 <= status <= 299:
        return DELIVERED
    if 300 <= status <= 399:
        return REDIRECT
    if status == 410:
        return GONE
    return HTTP_ERROR


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds asked for by a ``Retry-After`` header (RFC 9110 section 10.2.3: a number of
    seconds or an HTTP-date), or None when absent or malformed."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        at = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return max(0.0, (at - now).total_seconds())


@dataclass(frozen=True)
class RetrySchedule:
    """Message retries on a schedule (``WEBHOOK_RETRY_SCHEDULE``; Svix's by default: 5 s,
    5 min, 30 min, 2 h, 5 h, 10 h, 10 h): after the n-th failed attempt the message waits
    ``waits[n-1]`` seconds, each wait spread by ±``jitter`` (10 %) so that the messages of
    one outage do not come back at one instant; after the last wait's attempt it is failed.
    A schedule, rather than an exponential backoff with full jitter, gives every message
    the same known horizon (docs/webhooks.md, "Retries")."""

    waits: tuple[float, ...]
    jitter: float = 0.1

    @property
    def max_attempts(self) -> int:
        """Attempts per (re)queue: the first, then one after each wait."""
        return len(self.waits) + 1

    def next_delay(
        self, attempt: int, retry_after: float | None = None, rng: random.Random | None = None
    ) -> float | None:
        """Seconds before attempt ``attempt + 1``, or None when ``attempt`` was the last.

        A ``retry_after`` asked for by the receiver is honoured as a lower bound (never
        beyond the schedule's longest wait)."""
        if attempt >= self.max_attempts:
            return None
        base = self.waits[max(attempt, 1) - 1]
        delay = base * (rng or random).uniform(1 - self.jitter, 1 + self.jitter)
        if retry_after is not None:
            delay = max(delay, min(retry_after, max(self.waits)))
        return delay

    def horizon(self) -> tuple[float, float]:
        """The shortest and the longest time, in seconds, from a message's first attempt to
        its last (every jitter at its floor, at its ceiling): how long a receiver can be
        down without losing a message to the schedule."""
        total = sum(self.waits)
        return total * (1 - self.jitter), total * (1 + self.jitter)

    def longest_schedule(self) -> float:
        """The longest total wait of one message's retries, in seconds."""
        return self.horizon()[1]


@dataclass(frozen=True)
class Health:
    """An endpoint's delivery health, as stored in its row.

    ``consecutive_failures`` counts failed attempts since the last success;
    ``failing_since`` is when the first of them started; ``circuit_open_until`` is when the
    next probe may go (None: closed)."""

    enabled: bool
    consecutive_failures: int = 0
    failing_since: datetime | None = None
    circuit_open_until: datetime | None = None
    disabled_reason: str | None = None
    last_error: str | None = None
    last_success_at: datetime | None = None
    last_failure_at: datetime | None = None


@dataclass(frozen=True)
class BreakerPolicy:
    """The per-endpoint circuit breaker and the disable rule.

    ``threshold`` consecutive failures open the circuit for ``min(cap, base * 2**k)``
    seconds (k = failed probes so far, ±20 % jitter); while it is open nothing is sent to
    the endpoint; then one probe (half-open: one attempt in flight) either closes it (a
    success) or opens it again for longer. An endpoint whose failures have lasted
    ``disable_after`` without a success is disabled, with the reason kept; a 410 Gone
    disables it at once."""

    threshold: int
    base_seconds: float
    cap_seconds: float
    disable_after: timedelta

    def is_half_open(self, health: Health) -> bool:
        """True when the endpoint failed ``threshold`` times in a row: only a single probe
        may then be in flight."""
        return health.consecutive_failures >= self.threshold

    def after_attempt(
        self,
        health: Health,
        *,
        outcome: str,
        started_at: datetime,
        now: datetime,
        error: str | None,
        rng: random.Random | None = None,
    ) -> Health:
        """The endpoint's health after one attempt that ended with ``outcome`` (one of
        :data:`OUTCOMES`), ``now`` being the database clock."""
        if outcome == DELIVERED:
            return replace(
                health,
                consecutive_failures=0,
                failing_since=None,
                circuit_open_until=None,
                last_success_at=now,
            )
        failures = health.consecutive_failures + 1
        since = health.failing_since or started_at
        failed = replace(
            health,
            consecutive_failures=failures,
            failing_since=since,
            last_failure_at=now,
            last_error=error,
        )
        if not health.enabled:
            return failed
        if outcome == GONE:
            return replace(
                failed,
                enabled=False,
                circuit_open_until=None,
                disabled_reason="the receiver answered 410 Gone: it accepts no more messages",
            )
        if now - since >= self.disable_after:
            hours = self.disable_after.total_seconds() / 3600
            return replace(
                failed,
                enabled=False,
                circuit_open_until=None,
                disabled_reason=(
                    f"failing without a success for more than {hours:g} h (since "
                    f"{since.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}, {failures} failed attempts); "
                    f"last error: {error or outcome}"
                ),
            )
        if failures >= self.threshold:
            trips = failures - self.threshold
            pause = min(self.cap_seconds, self.base_seconds * 2.0 ** min(trips, 60))
            pause *= (rng or random).uniform(0.8, 1.2)
            return replace(failed, circuit_open_until=now + timedelta(seconds=pause))
        return failed
