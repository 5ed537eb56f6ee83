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
from starlette.types import Message, Receive, Scope, Send

from services.api.asgi import HTTPMiddleware, WatchedSend

NOSNIFF = ("X-Content-Type-Options", "nosniff")
NO_STORE = ("Cache-Control", "no-store")


class SecurityHeaders(HTTPMiddleware):
    """ASGI middleware adding the headers above to every HTTP response start."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the request with the headers added to its response start."""
        api = str(scope.get("path", "")).startswith("/v1/")

        def add_headers(start: Message) -> None:
            headers = MutableHeaders(scope=start)
            headers[NOSNIFF[0]] = NOSNIFF[1]
            if api and "cache-control" not in headers:
                headers[NO_STORE[0]] = NO_STORE[1]

        await self.app(scope, receive, WatchedSend(send, on_start=add_headers))
