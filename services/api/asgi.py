"""What the api's ASGI middleware share: they are pure ASGI (not Starlette's
``BaseHTTPMiddleware``, whose limits the Starlette documentation lists), act on HTTP
requests only, and watch the start of the response.

- :class:`HTTPMiddleware`: pass lifespan and websocket scopes through untouched, hand an
  HTTP request to :meth:`HTTPMiddleware.handle`.
- :class:`WatchedSend`: a ``send`` that records the response's status once it started and
  lets the middleware amend that first message (its headers) on the way out.

ASGI 3.0 specification, "HTTP & WebSocket ASGI Message Format": the ``http.response.start``
message carries ``status`` and ``headers`` and is sent once, before any body.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class HTTPMiddleware(ABC):
    """Base of a pure ASGI middleware that acts on HTTP requests only: a scope of another
    type (``lifespan``, ``websocket``) goes to the wrapped ``app`` as it came; an ``http``
    one goes to :meth:`handle`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.handle(scope, receive, send)

    @abstractmethod
    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one HTTP request (``scope["type"] == "http"``), calling ``self.app``."""


class WatchedSend:
    """A ``send`` for the wrapped app that notes the start of the response.

    ``status`` is None until the ``http.response.start`` message went out, then its status
    code (an int): None after the app returned or raised means nothing was answered yet.
    ``on_start``, when given, is called with that message before it is sent and may change
    it in place (add headers, e.g. with ``MutableHeaders(scope=message)``). Every message is
    passed on to ``send`` unchanged otherwise."""

    def __init__(self, send: Send, on_start: Callable[[Message], None] | None = None) -> None:
        self._send = send
        self._on_start = on_start
        self.status: int | None = None

    @property
    def started(self) -> bool:
        """Whether the response started (its status and headers went out)."""
        return self.status is not None

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            if self._on_start is not None:
                self._on_start(message)
            self.status = int(message["status"])
        await self._send(message)
