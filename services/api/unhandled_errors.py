"""The last answer: an exception no handler answered becomes a 500 problem (RFC 9457) with
an ``error_id`` the log line carries too, and nothing of the error's text."""

from __future__ import annotations

import logging
import traceback
from pathlib import Path
from uuid import uuid4

from fastapi import Request
from starlette.types import Receive, Scope, Send

from services.api.asgi import HTTPMiddleware, WatchedSend
from services.api.problems import problem_response

log = logging.getLogger(__name__)


class UnhandledErrors(HTTPMiddleware):
    """ASGI middleware: an exception that no handler answered becomes a 500 problem+json
    (RFC 9457) instead of the server's ``text/plain`` page, with no detail of the error in it
    (an exception's text can hold a failing row, a path or a key) and an ``error_id`` that the
    log line carries too, so an operator can find it. The log names the exception's type and
    where it was raised, never its message. When the response had already started (a
    download stream broke) it is only cut short."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the request; an exception out of it is logged and answered as above."""
        watched = WatchedSend(send)
        try:
            await self.app(scope, receive, watched)
        except Exception as exc:
            error_id = uuid4().hex
            log.error(
                "unhandled error",
                extra={
                    "error": type(exc).__name__,
                    "error_id": error_id,
                    "where": _frames(exc),
                    "method": scope.get("method"),
                    "path": scope.get("path"),
                },
            )
            if watched.started:  # headers went out: the answer can only be cut short
                return
            response = problem_response(
                Request(scope),
                500,
                "internal_error",
                "Internal server error",
                "an unexpected error occurred; retry later (a submit with the same "
                "Idempotency-Key never runs twice) and give error_id to the operator if it "
                "persists",
                error_id=error_id,
            )
            await response(scope, receive, send)


def _frames(exc: BaseException, depth: int = 6) -> list[str]:
    """Where ``exc`` was raised: the innermost ``file:line function`` frames, no values."""
    frames = traceback.extract_tb(exc.__traceback__)[-depth:]
    return [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames]
