"""Backoff with jitter: plain functions, unit-tested, shared by every retry in the system."""

from __future__ import annotations

import random


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
