"""Request ids: every answer of the api carries ``X-Request-ID``, and so does everything the
request leaves behind — its access log line and every other log line it causes, its
problem+json body (the ``request_id`` extension member, RFC 9457 section 3.2), its console
error page and its OpenTelemetry server span (the ``request_id`` attribute) — so a client
can quote one id in a support ticket and an operator finds all of it.

The id is the client's ``X-Request-ID`` when that one is valid (:func:`valid`: 1 to
:data:`MAX_LENGTH` characters of ASCII letters, digits, ``-``, ``_``, ``.`` and ``:``; what a
proxy or a client library generates — a UUID, nginx's ``$request_id``, a ULID — fits), else
a new one (:func:`new_id`, 32 hex digits of a random UUID). An invalid one is never echoed,
logged or stored: a header of another shape could carry spaces, quotes or line breaks into
a log line (log injection), be long enough to bloat every record, or be a secret.

The middleware is ``asgi-correlation-id``'s (the id lives in its context variable, which the
threads FastAPI runs sync routes on inherit); :class:`RequestIdLogFilter` puts it on every
log record of the process's handler, :class:`RequestIdSpan` on the current span.
"""

from __future__ import annotations

import logging
import re
from uuid import uuid4

from asgi_correlation_id import CorrelationIdMiddleware, correlation_id
from fastapi import FastAPI
from opentelemetry import trace
from starlette.types import Receive, Scope, Send

from exportcore.logs import process_handlers
from exportcore.redaction import redact
from services.api.asgi import HTTPMiddleware

HEADER = "X-Request-ID"
MAX_LENGTH = 128
"""The longest client id kept (characters); a longer one is replaced."""
ATTRIBUTE = "request_id"
"""The name of the id on a log record, in a problem body and on the span."""

_VALID = re.compile(rf"[A-Za-z0-9._:-]{{1,{MAX_LENGTH}}}")


def valid(value: str) -> bool:
    """Whether a client's ``X-Request-ID`` is kept: 1 to :data:`MAX_LENGTH` characters, each
    an ASCII letter, a digit, ``-``, ``_``, ``.`` or ``:`` (no space, quote, comma, control
    character or non-ASCII character: nothing that could split a log line or a header), and
    nothing the log redaction calls a secret (:func:`exportcore.redaction.redact`: an API
    key sent there by mistake must not reach a span, which no filter redacts)."""
    return _VALID.fullmatch(value) is not None and redact(value) == value


def new_id() -> str:
    """A new request id: the 32 lowercase hex digits of a random (version 4) UUID."""
    return uuid4().hex


def current() -> str | None:
    """The id of the request being served in this context (None outside a request)."""
    return correlation_id.get()


class RequestIdLogFilter(logging.Filter):
    """Adds ``request_id`` (the current request's id) to every record logged while a request
    is served, on whatever thread serves it; records outside a request are left as they
    are. A record that already names one in ``extra`` keeps its own."""

    def filter(self, record: logging.LogRecord) -> bool:
        rid = correlation_id.get()
        if rid is not None and not hasattr(record, ATTRIBUTE):
            setattr(record, ATTRIBUTE, rid)
        return True


class RequestIdSpan(HTTPMiddleware):
    """ASGI middleware setting the ``request_id`` attribute on the current span — the
    server span of OpenTelemetry's ASGI middleware, which wraps the whole app — once the id
    is known (it must run inside :class:`CorrelationIdMiddleware`). Nothing happens while
    tracing is off (the current span is then the invalid one, which records nothing)."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Tag the span, then serve the request."""
        rid = correlation_id.get()
        span = trace.get_current_span()
        if rid is not None and span.is_recording():
            span.set_attribute(ATTRIBUTE, rid)
        await self.app(scope, receive, send)


def install(app: FastAPI) -> None:
    """Add the request-id middleware to ``app`` as its outermost one so far (call it after
    the middleware whose answers and log lines must carry the id: the access log, the
    error handlers), and the log filter to this process's log handler (idempotent).

    The filter runs first on the handler, before the redacting filter, which then sees the
    id like any other field."""
    app.add_middleware(RequestIdSpan)
    app.add_middleware(
        CorrelationIdMiddleware,
        header_name=HEADER,
        update_request_header=True,
        generator=new_id,
        validator=valid,
        transformer=None,
    )
    for handler in process_handlers():
        if not any(isinstance(f, RequestIdLogFilter) for f in handler.filters):
            handler.filters.insert(0, RequestIdLogFilter())
