"""Security headers on every answer of the API (OWASP REST Security Cheat Sheet, "Security
headers"), including problems, 304s, redirects and answers made by other middleware.

- ``X-Content-Type-Options: nosniff`` everywhere: a browser must never guess a download's
  type (an export of notes is user content) or render a JSON body as HTML.
- ``Cache-Control: no-store`` on ``/v1/…``: tenant data behind a bearer key, files and
  presigned links included, must not be kept by browsers or shared caches (RFC 9111
  section 5.2.2.5). A route that sets its own ``Cache-Control`` keeps it.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

NOSNIFF = ("X-Content-Type-Options", "nosniff")
NO_STORE = ("Cache-Control", "no-store")


class SecurityHeaders:
    """ASGI middleware adding the headers above to every HTTP response start."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        api = str(scope.get("path", "")).startswith("/v1/")

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers[NOSNIFF[0]] = NOSNIFF[1]
                if api and "cache-control" not in headers:
                    headers[NO_STORE[0]] = NO_STORE[1]
            await send(message)

        await self.app(scope, receive, with_headers)
