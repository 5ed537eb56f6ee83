"""Failure policy: classify errors, and decide retry / fail / cancel. Plain code, no I/O.

A retry has a cause (a transient error class), a wait (exponential backoff with full jitter,
stored durably as ``next_attempt_at``), a budget (``max_attempts``) and a limit (the job's
deadline) — docs/architecture.md INV-8 retries-are-bounded. Permanent errors go straight
to failed + dead letter. Unknown errors count as transient and consume attempts like any
other, so nothing loops forever.
"""

from __future__ import annotations

import errno
import random
import re
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
import psycopg_pool

from exportcore.retry import full_jitter


class PermanentError(Exception):
    """An error that no retry can fix (invalid snapshot, a note that can never render).

    ``code`` is the stable reason recorded on the job and its dead letter; the message must
    not contain note content or secrets (it is stored as the sanitized detail).
    """

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


class TransientError(Exception):
    """An error that may pass (a source temporarily unavailable); same contract as above."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


@dataclass(frozen=True)
class Failure:
    """A classified error: ``kind`` transient or permanent, a stable ``code`` and a
    sanitized ``detail`` (exception class and errno name, never message text from outside)."""

    kind: Literal["transient", "permanent"]
    code: str
    detail: str


def _broker_errors() -> tuple[type[BaseException], ...]:
    import kombu.exceptions
    import redis.exceptions

    return (kombu.exceptions.OperationalError, redis.exceptions.ConnectionError)


# S3 error codes (botocore ``ClientError``) that pass: throttling, timeouts, server trouble,
# credentials being refreshed, an upload aborted under the writer. A new attempt helps.
STORAGE_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
        "ExpiredToken",
        "RequestTimeTooSkewed",
        "NoSuchUpload",
        "OperationAborted",
        "XMinioServerNotInitialized",
    }
)
# S3 error codes that no retry within a job's budget can fix: the bucket, its region or the
# credentials are wrong. The job fails at once (dead letter ``storage_misconfigured``); an
# operator fixes the configuration and replays it.
STORAGE_PERMANENT_CODES = frozenset(
    {
        "NoSuchBucket",
        "AccessDenied",
        "AllAccessDisabled",
        "AccountProblem",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidBucketName",
        "AuthorizationHeaderMalformed",
        "PermanentRedirect",
        "InvalidToken",
        "InvalidObjectState",
    }
)
_SAFE_CODE = re.compile(r"[A-Za-z0-9.]{1,64}")


def classify_storage(exc: BaseException) -> Failure | None:
    """The failure class of an S3 client (botocore) error, or None for anything else.

    Unreachable, throttling or failing store → transient ``storage_unavailable``; wrong
    bucket, region or credentials → permanent ``storage_misconfigured``; any other S3
    error → transient ``storage_error``. The detail names the exception class, the S3
    error code and the HTTP status, never a message from the server.
    """
    try:
        from botocore import exceptions as bce
    except ImportError:  # pragma: no cover - boto3 is a dependency of exportcore
        return None
    name = type(exc).__name__
    if isinstance(exc, bce.ClientError):
        error = exc.response.get("Error", {}) or {}
        raw = str(error.get("Code", ""))
        code = raw if _SAFE_CODE.fullmatch(raw) else "unknown"
        status = int((exc.response.get("ResponseMetadata", {}) or {}).get("HTTPStatusCode", 0))
        detail = f"ClientError {code} HTTP {status}"
        if code in STORAGE_PERMANENT_CODES or (
            status == 403 and code not in STORAGE_TRANSIENT_CODES
        ):
            return Failure("permanent", "storage_misconfigured", detail)
        if code in STORAGE_TRANSIENT_CODES or status == 429 or status >= 500:
            return Failure("transient", "storage_unavailable", detail)
        return Failure("transient", "storage_error", detail)
    if isinstance(exc, bce.NoCredentialsError | bce.PartialCredentialsError | bce.NoRegionError):
        return Failure("permanent", "storage_misconfigured", name)
    if isinstance(exc, bce.ConnectionError | bce.HTTPClientError | bce.IncompleteReadError):
        # connection refused or reset, DNS, TLS, connect/read timeouts, broken streams
        return Failure("transient", "storage_unavailable", name)
    if isinstance(exc, bce.BotoCoreError):
        return Failure("transient", "storage_error", name)
    return None


def classify(exc: BaseException) -> Failure:
    """Map an exception raised while running a job to a :class:`Failure`."""
    name = type(exc).__name__
    if isinstance(exc, PermanentError):
        return Failure("permanent", exc.code, exc.detail[:500])
    if isinstance(exc, TransientError):
        return Failure("transient", exc.code, exc.detail[:500])
    if isinstance(exc, psycopg.OperationalError | psycopg_pool.PoolTimeout):
        return Failure("transient", "database_unavailable", name)
    if isinstance(exc, _broker_errors()):
        return Failure("transient", "broker_unavailable", name)
    storage = classify_storage(exc)
    if storage is not None:
        return storage
    if isinstance(exc, OSError):
        code = errno.errorcode.get(exc.errno or 0, "unknown")
        return Failure("transient", "storage_io_error", f"{name} {code}")
    return Failure("transient", "internal_error", name)


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
