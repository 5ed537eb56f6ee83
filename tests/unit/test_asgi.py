"""services.api.asgi: the pass-through of non-HTTP scopes and the watched response start
that the api's middlewares share (pure logic: plain ASGI callables, no server)."""

from __future__ import annotations

import asyncio

import pytest
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.api.asgi import HTTPMiddleware, WatchedSend


class Recorder(HTTPMiddleware):
    """Notes which scopes reached ``handle``."""

    def __init__(self, app: ASGIApp) -> None:
        super().__init__(app)
        self.handled: list[str] = []

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.handled.append(scope["type"])
        await self.app(scope, receive, send)


def _run(app: HTTPMiddleware, scope: Scope) -> None:
    async def receive() -> Message:
        return {"type": "http.request", "body": b""}

    async def send(message: Message) -> None:
        return None

    asyncio.run(app(scope, receive, send))


def test_only_http_scopes_reach_handle() -> None:
    reached: list[str] = []

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        reached.append(scope["type"])

    middleware = Recorder(inner)
    for kind in ("lifespan", "websocket", "http"):
        _run(middleware, {"type": kind, "path": "/"})
    assert reached == ["lifespan", "websocket", "http"]  # every scope reaches the app
    assert middleware.handled == ["http"]


def test_watched_send_records_the_start_and_passes_every_message() -> None:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    watched = WatchedSend(send)
    assert watched.status is None and not watched.started
    start = {"type": "http.response.start", "status": 404, "headers": []}
    body = {"type": "http.response.body", "body": b"x"}
    asyncio.run(watched(start))
    assert watched.status == 404 and watched.started
    asyncio.run(watched(body))
    assert sent == [start, body]
    assert watched.status == 404


def test_on_start_amends_the_start_message_only() -> None:
    sent: list[Message] = []
    calls: list[int] = []

    async def send(message: Message) -> None:
        sent.append(message)

    def add_header(start: Message) -> None:
        calls.append(start["status"])
        MutableHeaders(scope=start)["X-Test"] = "1"

    watched = WatchedSend(send, on_start=add_header)
    asyncio.run(watched({"type": "http.response.start", "status": 200, "headers": []}))
    asyncio.run(watched({"type": "http.response.body", "body": b""}))
    assert calls == [200]
    assert sent[0]["headers"] == [(b"x-test", b"1")]
    assert "headers" not in sent[1]


def test_a_failing_send_still_counts_as_started() -> None:
    """The headers were handed to the server: an error after that cannot become a new
    answer (UnhandledErrors only cuts such a response short)."""

    async def broken(message: Message) -> None:
        raise OSError("client went away")

    watched = WatchedSend(broken)
    with pytest.raises(OSError):
        asyncio.run(watched({"type": "http.response.start", "status": 200, "headers": []}))
    assert watched.started
