"""Which failure an S3 client (botocore) error is: the error codes that pass, the ones no
retry can fix, and :func:`classify_storage` over them. Shared by the worker's failure
classification (:func:`exportcore.failures.classify`) and the API's answer when storage is
down."""

from __future__ import annotations

import re

from exportcore.retry import Failure

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
