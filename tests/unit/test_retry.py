"""Exponential backoff ceiling and full jitter."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exportcore.retry import backoff_ceiling, full_jitter

attempts = st.integers(min_value=1, max_value=10**40)
seconds = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)


def exact_ceiling(attempt: int, base: float, cap: float) -> Fraction:
    """``min(cap, base * 2**(attempt-1))`` in exact arithmetic (no float overflow)."""
    if base == 0 or attempt - 1 > 4096:
        return Fraction(cap) if base else Fraction(0)
    return min(Fraction(cap), Fraction(base) * 2 ** (attempt - 1))


def test_ceiling_doubles_until_the_cap() -> None:
    got = [backoff_ceiling(a, base=1.5, cap=20.0) for a in range(1, 7)]
    assert got == [1.5, 3.0, 6.0, 12.0, 20.0, 20.0]


@given(attempt=st.integers(min_value=1, max_value=61), base=seconds, cap=seconds)
def test_ceiling_is_min_of_cap_and_exponential(attempt: int, base: float, cap: float) -> None:
    expected = exact_ceiling(attempt, base, cap)
    assert backoff_ceiling(attempt, base=base, cap=cap) == expected


@given(a=attempts, b=attempts, base=seconds, cap=seconds)
def test_ceiling_is_monotone_and_capped(a: int, b: int, base: float, cap: float) -> None:
    lo, hi = sorted((a, b))
    c_lo = backoff_ceiling(lo, base=base, cap=cap)
    c_hi = backoff_ceiling(hi, base=base, cap=cap)
    assert 0 <= c_lo <= c_hi <= cap


@given(attempt=attempts, base=seconds, cap=seconds, seed=st.integers())
def test_full_jitter_stays_within_the_ceiling(
    attempt: int, base: float, cap: float, seed: int
) -> None:
    delay = full_jitter(attempt, base=base, cap=cap, rng=random.Random(seed))
    assert 0 <= delay <= exact_ceiling(attempt, base, cap)


@given(attempt=st.integers(min_value=62, max_value=10**100))
def test_huge_attempt_numbers_do_not_overflow(attempt: int) -> None:
    assert backoff_ceiling(attempt, base=2.0, cap=300.0) == 300.0
    assert backoff_ceiling(attempt, base=1e300, cap=1e308) == 1e308
    assert math.isfinite(full_jitter(attempt, base=10.0, cap=3600.0))


def test_full_jitter_draws_from_zero_to_the_ceiling() -> None:
    class Bounds:
        def uniform(self, a: float, b: float) -> tuple[float, float]:
            return (a, b)

    assert full_jitter(4, base=2.0, cap=100.0, rng=Bounds()) == (0.0, 16.0)  # type: ignore[arg-type]


def test_full_jitter_is_reproducible_with_a_seeded_rng_and_spreads() -> None:
    draws = [full_jitter(5, base=1.0, cap=60.0, rng=random.Random(7)) for _ in range(3)]
    assert draws[0] == draws[1] == draws[2]
    spread = {round(full_jitter(5, base=1.0, cap=60.0, rng=random.Random(i)), 6) for i in range(50)}
    assert len(spread) > 40
    assert max(spread) <= 16.0


def test_zero_cap_means_no_wait() -> None:
    assert backoff_ceiling(10, base=5.0, cap=0.0) == 0.0
    assert full_jitter(10, base=5.0, cap=0.0) == 0.0


@pytest.mark.parametrize("attempt", [0, -1, -(10**9)])
def test_attempt_counts_from_one(attempt: int) -> None:
    with pytest.raises(ValueError, match="from 1"):
        backoff_ceiling(attempt, base=1.0, cap=10.0)
    with pytest.raises(ValueError):
        full_jitter(attempt, base=1.0, cap=10.0)


@pytest.mark.parametrize(("base", "cap"), [(-1.0, 10.0), (1.0, -0.5)])
def test_negative_bounds_are_rejected(base: float, cap: float) -> None:
    with pytest.raises(ValueError, match=">= 0"):
        backoff_ceiling(1, base=base, cap=cap)
