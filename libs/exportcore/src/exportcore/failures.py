"""Which failure an exception is: the errors job code raises on purpose (:class:`PermanentError`,
:class:`TransientError`) and :func:`classify`, which maps any exception raised while running a
job to a transient or permanent :class:`~exportcore.retry.Failure` with a stable code. Plain
code, no I/O; what happens next is the retry policy's (:mod:`exportcore.retry`).
"""

from __future__ import annotations

import errno

import psycopg
import psycopg_pool

from exportcore.retry import Failure
from exportcore.storage_errors import classify_storage


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


def _broker_errors() -> tuple[type[BaseException], ...]:
    import kombu.exceptions
    import redis.exceptions

    return (kombu.exceptions.OperationalError, redis.exceptions.ConnectionError)


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
