"""A bound on request bodies: the API refuses a body over ``MAX_REQUEST_BYTES`` with a 413
problem (RFC 9110 section 15.5.14, RFC 9457) and reads no more of it."""

from __future__ import annotations

from fastapi import Request
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.api.asgi import HTTPMiddleware
from services.api.problems import TITLES, problem_response


class BodyLimit(HTTPMiddleware):
    """ASGI middleware bounding request bodies to ``max_bytes``: 413 problem+json (RFC 9110
    section 15.5.14, RFC 9457). A declared ``Content-Length`` over the limit is refused
    before any of the body is read; a body sent without a length is cut off as soon as it
    passes the limit (the route fails while reading it, and nothing is written)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        super().__init__(app)
        self.max_bytes = max_bytes

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse a declared length over the limit, else serve with the body counted."""
        length = Headers(scope=scope).get("content-length", "")
        if length.isdigit() and int(length) > self.max_bytes:
            response = problem_response(
                Request(scope),
                413,
                "request_too_large",
                TITLES[413],
                f"the request body has {length} bytes; at most {self.max_bytes} are accepted",
                {"Connection": "close"},
            )
            await response(scope, receive, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    # an HTTPException: the framework lets it through its body parsing
                    raise StarletteHTTPException(
                        413,
                        f"the request body exceeds {self.max_bytes} bytes",
                        {"Connection": "close"},
                    )
            return message

        await self.app(scope, limited, send)
