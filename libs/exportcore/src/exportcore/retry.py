"""Retrying: backoff with jitter, and the retry policy that decides retry / fail / cancel for
a classified failure. Plain functions, unit-tested, shared by every retry in the system.

A retry has a cause (a transient error class), a wait (exponential backoff with full jitter,
stored durably as ``next_attempt_at``), a budget (``max_attempts``) and a limit (the job's
deadline) — docs/architecture.md INV-8 retries-are-bounded. Permanent errors go straight
to failed + dead letter. Unknown errors count as transient and consume attempts like any
other, so nothing loops forever. Which failure an exception is: :mod:`exportcore.failures`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Literal


def backoff_ceiling(attempt: int, *, base: float, cap: float) -> float:
    """The exponential ceiling ``min(cap, base * 2**(attempt-1))`` in seconds.

    ``attempt`` counts from 1; raises ValueError for ``attempt < 1`` or negative bounds.
    """
    if attempt < 1:
        raise ValueError("attempt counts from 1")
    if base < 0 or cap < 0:
        raise ValueError("base and cap must be >= 0 seconds")
    # 2.0**1000 is finite and past any cap; avoids float overflow for absurd attempts.
    return min(cap, base * 2.0 ** min(attempt - 1, 1000))


def full_jitter(
    attempt: int, *, base: float, cap: float, rng: random.Random | None = None
) -> float:
    """A delay drawn uniformly from ``[0, backoff_ceiling(attempt)]`` seconds.

    "Full jitter" as described in the AWS Architecture Blog, "Exponential Backoff And
    Jitter" (Marc Brooker, 2015): it spreads retries of many clients evenly.
    """
    ceiling = backoff_ceiling(attempt, base=base, cap=cap)
    return (rng or random).uniform(0.0, ceiling)


@dataclass(frozen=True)
class Failure:
    """A classified error: ``kind`` transient or permanent, a stable ``code`` and a
    sanitized ``detail`` (exception class and errno name, never message text from outside)."""

    kind: Literal["transient", "permanent"]
    code: str
    detail: str


@dataclass(frozen=True)
class Decision:
    """What to do with a job: ``retry`` after ``delay`` seconds, ``fail`` (dead letter) or
    ``cancel``; ``code``/``detail`` are recorded on the job."""

    action: Literal["retry", "fail", "cancel"]
    code: str
    detail: str
    delay: float = 0.0


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff bounds in seconds.

    ``base_seconds`` and ``cap_seconds`` bound full-jitter backoff; ``margin_seconds`` is the
    least time before the deadline that is worth another attempt: a retry is never scheduled
    later than ``deadline - margin``.
    """

    base_seconds: float
    cap_seconds: float
    margin_seconds: float

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Full-jitter delay before attempt ``attempt + 1`` (``attempt`` counts from 1)."""
        return full_jitter(attempt, base=self.base_seconds, cap=self.cap_seconds, rng=rng)

    def decide(
        self,
        failure: Failure,
        *,
        attempts: int,
        max_attempts: int,
        seconds_to_deadline: float,
        rng: random.Random | None = None,
    ) -> Decision:
        """Retry a transient failure while attempts and time are left; fail otherwise.

        The returned delay is in ``[0, min(backoff ceiling, seconds_to_deadline - margin)]``.
        """
        if failure.kind == "permanent":
            return Decision("fail", failure.code, failure.detail)
        last = f"last error {failure.code}: {failure.detail}"[:500]
        if attempts >= max_attempts:
            return Decision("fail", "attempts_exhausted", last)
        room = seconds_to_deadline - self.margin_seconds
        if room <= 0:
            return Decision("fail", "deadline_exceeded", last)
        delay = min(self.delay(attempts, rng), room)
        return Decision("retry", failure.code, failure.detail, delay)

    def decide_expired(self, job: dict[str, Any], rng: random.Random | None = None) -> Decision:
        """For a running job whose lease expired (the worker died or stalled): cancel it if
        a cancel was requested, fail it when no attempt or time is left, else requeue.

        ``job`` needs ``cancel_requested``, ``attempts``, ``max_attempts`` and
        ``seconds_to_deadline``.
        """
        if job["cancel_requested"]:
            return Decision("cancel", "cancelled", "cancel requested; the lease expired")
        return self.decide(
            Failure("transient", "lease_expired", "the worker stopped renewing its lease"),
            attempts=job["attempts"],
            max_attempts=job["max_attempts"],
            seconds_to_deadline=float(job["seconds_to_deadline"]),
            rng=rng,
        )
