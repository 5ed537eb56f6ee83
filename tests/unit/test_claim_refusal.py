"""Claim refusal reasons: why a delivered job was not claimed, from the facts row (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from exportcore.runner import classify_refusal


def facts(**overrides: Any) -> dict[str, Any]:
    """A ``job_claim_refusal`` row for a queued job that is claimable (a lost race)."""
    row: dict[str, Any] = {
        "status": "queued",
        "attempts": 0,
        "max_attempts": 3,
        "cancel_requested": False,
        "past_deadline": False,
        "not_due": False,
        "lease_valid": None,
    }
    row.update(overrides)
    return row


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        (None, "not_found"),
        (facts(status="succeeded"), "terminal"),
        (facts(status="failed"), "terminal"),
        (facts(status="cancelled"), "terminal"),
        (facts(status="running", lease_valid=True), "leased"),
        (facts(status="running", lease_valid=False), "lease_expired"),
        (facts(status="running", lease_valid=None), "lease_expired"),
        (facts(cancel_requested=True), "cancel_requested"),
        (facts(past_deadline=True), "past_deadline"),
        (facts(attempts=3), "attempts_exhausted"),
        (facts(attempts=4), "attempts_exhausted"),
        (facts(not_due=True), "not_due"),
        (facts(attempts=2), "race"),
        (facts(), "race"),
    ],
)
def test_classify_refusal(row: dict[str, Any] | None, reason: str) -> None:
    assert classify_refusal(row) == reason


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        # A terminal job is terminal whatever else is true of it.
        (facts(status="failed", cancel_requested=True, past_deadline=True), "terminal"),
        # A valid lease is reported even when a cancel is pending.
        (facts(status="running", lease_valid=True, cancel_requested=True), "leased"),
        (facts(cancel_requested=True, past_deadline=True, attempts=3), "cancel_requested"),
        (facts(past_deadline=True, attempts=3, not_due=True), "past_deadline"),
        (facts(attempts=3, not_due=True), "attempts_exhausted"),
    ],
)
def test_classify_refusal_precedence(row: dict[str, Any], reason: str) -> None:
    assert classify_refusal(row) == reason
