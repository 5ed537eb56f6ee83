"""The values of the api's RateLimit fields and the rule of a kept X-Request-ID (pure logic;
the fields on real answers: tests/integration/test_api_headers.py)."""

from __future__ import annotations

import http_sf
import pytest

from exportcore.ratelimit import Decision, Limit
from services.api.rate_headers import policy_value, service_value, window
from services.api.request_ids import MAX_LENGTH, new_id, valid


@pytest.mark.parametrize(
    ("limit", "seconds"),
    [
        (Limit(10.0, 50), 5),  # the submit defaults
        (Limit(0.2, 10), 50),  # the console sign-in defaults
        (Limit(3.0, 10), 4),  # 3.33 s rounded up: never states a higher rate than the real one
        (Limit(100.0, 5), 1),  # under a second: the draft's window is a positive integer
    ],
)
def test_the_window_is_the_refill_time_in_whole_seconds(limit: Limit, seconds: int) -> None:
    assert window(limit) == seconds
    assert policy_value("submit", limit) == f'"submit";q={limit.burst};w={seconds}'


@pytest.mark.parametrize(
    ("allowed", "remaining", "retry_after", "expected"),
    [
        (True, 49.0, 0.0, {"r": 49, "t": 1}),  # one token short of full: back in 0.1 s
        (True, 3.25, 0.0, {"r": 3, "t": 1}),
        (True, 50.0, 0.0, {"r": 50}),  # full: no more quota is coming, so no t
        (False, 0.4, 0.06, {"r": 0, "t": 1}),  # the refusal: t is Retry-After's value
        (False, 0.0, 2.5, {"r": 0, "t": 3}),
        (True, -0.000001, 0.0, {"r": 0, "t": 1}),  # a float's rounding never shows r=-1
    ],
)
def test_the_service_limit_follows_the_decision(
    allowed: bool, remaining: float, retry_after: float, expected: dict[str, int]
) -> None:
    decision = Decision(allowed, retry_after, remaining, "redis", Limit(10.0, 50))
    value = service_value("submit", decision)
    assert http_sf.parse(value.encode(), tltype="list") == [("submit", expected)]
    if not allowed:
        assert expected["t"] == int(decision.retry_after_header)


def test_a_slow_bucket_says_when_the_next_token_comes() -> None:
    decision = Decision(True, 0.0, 1.5, "redis", Limit(0.1, 10))
    assert service_value("webhook-action", decision) == '"webhook-action";r=1;t=5'


# the first is the shape new_id() generates (32 hex digits); written out, so that every
# xdist worker collects the same test ids
@pytest.mark.parametrize(
    "value",
    [
        "68b44be9244545058957bc1c6dcd5079",
        "3f2b0c8e-9d7a-4b1c-8e5f-6a7b8c9d0e1f",
        "req_01HZX3K5G7",
        "a.b:c-d_e",
        "x" * 128,
    ],
)
def test_ids_kept(value: str) -> None:
    assert valid(value)


@pytest.mark.parametrize(
    "value",
    [
        "",
        "x" * (MAX_LENGTH + 1),
        "with space",
        "line\nbreak",
        "tab\t",
        "a,b",
        'q"uote',
        "caf\u00e9",
        "nex_abcdefgh12345678",  # an API key's shape
        "AKIAABCDEFGHIJKLMNOP",  # an AWS access key id
    ],
)
def test_ids_replaced(value: str) -> None:
    assert not valid(value)


def test_a_new_id_is_32_hex_digits_and_new_each_time() -> None:
    first, second = new_id(), new_id()
    assert len(first) == 32 and int(first, 16) >= 0 and first != second
