"""The failure policy: classification and retry decisions (pure logic)."""

from __future__ import annotations

import errno
import random

import kombu.exceptions
import psycopg
import pytest
import redis.exceptions
from hypothesis import given
from hypothesis import strategies as st

from exportcore.failures import PermanentError, TransientError, classify
from exportcore.retry import Failure, RetryPolicy

POLICY = RetryPolicy(base_seconds=2.0, cap_seconds=10.0, margin_seconds=1.0)
TRANSIENT = Failure("transient", "storage_io_error", "OSError EIO")


@pytest.mark.parametrize(
    ("exc", "kind", "code"),
    [
        (PermanentError("invalid_snapshot", "3 of 4"), "permanent", "invalid_snapshot"),
        (
            TransientError("notes_source_unavailable", "down"),
            "transient",
            "notes_source_unavailable",
        ),
        (psycopg.OperationalError("gone"), "transient", "database_unavailable"),
        (psycopg.errors.QueryCanceled("timeout"), "transient", "database_unavailable"),
        (kombu.exceptions.OperationalError("refused"), "transient", "broker_unavailable"),
        (redis.exceptions.ConnectionError("refused"), "transient", "broker_unavailable"),
        (OSError(errno.ENOSPC, "full"), "transient", "storage_io_error"),
        (RuntimeError("bug"), "transient", "internal_error"),
    ],
)
def test_classify(exc: BaseException, kind: str, code: str) -> None:
    failure = classify(exc)
    assert (failure.kind, failure.code) == (kind, code)


def test_classified_detail_never_carries_foreign_message_text() -> None:
    secret = "postgresql://u:hunter2@db/x and a note's private content"
    for exc in (psycopg.OperationalError(secret), OSError(errno.EIO, secret), RuntimeError(secret)):
        assert "hunter2" not in classify(exc).detail and "private" not in classify(exc).detail
    assert classify(OSError(errno.ENOSPC, secret)).detail == "OSError ENOSPC"


def test_permanent_fails_at_once_whatever_the_budget() -> None:
    d = POLICY.decide(
        Failure("permanent", "invalid_snapshot", "x"),
        attempts=1,
        max_attempts=9,
        seconds_to_deadline=1e6,
    )
    assert (d.action, d.code) == ("fail", "invalid_snapshot")


def test_no_attempts_or_no_time_left_fails() -> None:
    spent = POLICY.decide(TRANSIENT, attempts=3, max_attempts=3, seconds_to_deadline=1e6)
    late = POLICY.decide(TRANSIENT, attempts=1, max_attempts=3, seconds_to_deadline=0.5)
    assert (spent.action, spent.code) == ("fail", "attempts_exhausted")
    assert (late.action, late.code) == ("fail", "deadline_exceeded")
    assert "storage_io_error" in spent.detail


@given(
    attempts=st.integers(1, 50),
    extra=st.integers(1, 5),
    seconds=st.floats(0, 1e6, allow_nan=False),
    base=st.floats(0, 100, allow_nan=False),
    cap=st.floats(0, 1000, allow_nan=False),
    margin=st.floats(0, 10, allow_nan=False),
    seed=st.integers(0, 2**32),
)
def test_delays_stay_within_the_backoff_and_before_the_deadline(
    attempts, extra, seconds, base, cap, margin, seed
) -> None:
    policy = RetryPolicy(base, cap, margin)
    d = policy.decide(
        TRANSIENT,
        attempts=attempts,
        max_attempts=attempts + extra,
        seconds_to_deadline=seconds,
        rng=random.Random(seed),
    )
    if seconds - margin <= 0:
        assert d.action == "fail"
        return
    assert d.action == "retry"
    assert 0 <= d.delay <= min(cap, base * 2 ** (attempts - 1)) + 1e-9
    assert d.delay <= seconds - margin + 1e-9  # never past deadline - margin


@given(attempts=st.integers(1, 200))
def test_backoff_ceiling_is_monotone_and_capped(attempts: int) -> None:
    rng = random.Random(0)
    ceilings = [POLICY.delay(a, _MaxRandom()) for a in (attempts, attempts + 1)]
    assert ceilings[0] <= ceilings[1] <= POLICY.cap_seconds
    assert POLICY.delay(attempts, rng) <= POLICY.cap_seconds


class _MaxRandom(random.Random):
    """Always draws the top of the range: the delay equals the ceiling."""

    def uniform(self, a: float, b: float) -> float:
        return b


def test_expired_lease_decisions() -> None:
    base = {
        "cancel_requested": False,
        "attempts": 1,
        "max_attempts": 3,
        "seconds_to_deadline": 100.0,
    }
    assert POLICY.decide_expired({**base, "cancel_requested": True}).action == "cancel"
    requeue = POLICY.decide_expired(base, random.Random(1))
    assert (requeue.action, requeue.code) == ("retry", "lease_expired") and requeue.delay <= 2.0
    assert POLICY.decide_expired({**base, "attempts": 3}).code == "attempts_exhausted"
    assert POLICY.decide_expired({**base, "seconds_to_deadline": -5}).code == "deadline_exceeded"


# --- S3 storage errors (real botocore exception objects, as the client raises them) -------


def _client_error(code: str, status: int, message: str = "server text") -> BaseException:
    from botocore.exceptions import ClientError

    return ClientError(
        {
            "Error": {"Code": code, "Message": message},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        "PutObject",
    )


@pytest.mark.parametrize(
    ("code", "status", "kind", "failure_code"),
    [
        ("SlowDown", 503, "transient", "storage_unavailable"),
        ("ServiceUnavailable", 503, "transient", "storage_unavailable"),
        ("InternalError", 500, "transient", "storage_unavailable"),
        ("RequestTimeout", 400, "transient", "storage_unavailable"),
        ("Throttling", 400, "transient", "storage_unavailable"),
        ("TooManyRequestsException", 429, "transient", "storage_unavailable"),
        ("ExpiredToken", 400, "transient", "storage_unavailable"),
        ("NoSuchUpload", 404, "transient", "storage_unavailable"),
        ("SomethingNew", 502, "transient", "storage_unavailable"),
        ("NoSuchBucket", 404, "permanent", "storage_misconfigured"),
        ("AccessDenied", 403, "permanent", "storage_misconfigured"),
        ("InvalidAccessKeyId", 403, "permanent", "storage_misconfigured"),
        ("SignatureDoesNotMatch", 403, "permanent", "storage_misconfigured"),
        ("PermanentRedirect", 301, "permanent", "storage_misconfigured"),
        ("403", 403, "permanent", "storage_misconfigured"),
        ("EntityTooSmall", 400, "transient", "storage_error"),
    ],
)
def test_classify_s3_client_errors(code: str, status: int, kind: str, failure_code: str) -> None:
    failure = classify(_client_error(code, status))
    assert (failure.kind, failure.code) == (kind, failure_code)
    assert failure.detail == f"ClientError {code} HTTP {status}"


def test_classify_s3_connection_problems_are_transient() -> None:
    from botocore import exceptions as bce

    for exc in (
        bce.EndpointConnectionError(endpoint_url="http://s3.invalid:9000"),
        bce.ConnectTimeoutError(endpoint_url="http://s3.invalid:9000"),
        bce.ReadTimeoutError(endpoint_url="http://s3.invalid:9000"),
        bce.ConnectionClosedError(endpoint_url="http://s3.invalid:9000"),
        bce.ResponseStreamingError(error="reset"),
        bce.IncompleteReadError(actual_bytes=1, expected_bytes=2),
    ):
        failure = classify(exc)
        assert (failure.kind, failure.code) == ("transient", "storage_unavailable"), exc
        assert failure.detail == type(exc).__name__


def test_classify_missing_s3_credentials_is_permanent() -> None:
    from botocore import exceptions as bce

    for exc in (
        bce.NoCredentialsError(),
        bce.PartialCredentialsError(provider="env", cred_var="x"),
    ):
        assert (classify(exc).kind, classify(exc).code) == ("permanent", "storage_misconfigured")


def test_classify_other_botocore_errors_are_transient_storage_errors() -> None:
    from botocore import exceptions as bce

    failure = classify(bce.ParamValidationError(report="bad"))
    assert (failure.kind, failure.code) == ("transient", "storage_error")


def test_s3_detail_never_carries_server_text_or_odd_codes() -> None:
    failure = classify(_client_error("Slow Down <script>", 503, "secret-key AKIA... in text"))
    assert failure.detail == "ClientError unknown HTTP 503"
    assert failure.code == "storage_unavailable"


def test_transient_storage_errors_use_the_retry_policy() -> None:
    decision = POLICY.decide(
        classify(_client_error("SlowDown", 503)),
        attempts=1,
        max_attempts=3,
        seconds_to_deadline=600,
        rng=random.Random(1),
    )
    assert decision.action == "retry" and decision.code == "storage_unavailable"
    assert 0 <= decision.delay <= 2.0
    failed = POLICY.decide(
        classify(_client_error("NoSuchBucket", 404)),
        attempts=1,
        max_attempts=3,
        seconds_to_deadline=600,
    )
    assert (failed.action, failed.code) == ("fail", "storage_misconfigured")
