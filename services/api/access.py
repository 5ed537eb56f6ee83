"""One log line per request (INFO, logger ``services.api.access``): method, the route's path
TEMPLATE (``/v1/exports/{job_id}``, never the path a client typed, never the query string),
status and duration. Probes and /metrics log at DEBUG. No header is logged: an
``Authorization`` header never reaches a log."""

from __future__ import annotations

import logging
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

QUIET = frozenset({"/healthz", "/readyz", "/metrics"})


def path_template(scope: Scope) -> str:
    """The matched route's template, the mount's for static files, else ``<unmatched>``."""
    route: Any = scope.get("route")
    if route is not None and getattr(route, "path", None):
        return str(route.path)
    root = scope.get("root_path", "")
    return f"{root}/{{path}}" if root else "<unmatched>"


class AccessLog:
    """ASGI middleware writing the request line once the answer started (or failed)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # an exception before any answer is a 500 to the client

        async def record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, record)
        finally:
            template = path_template(scope)
            log.log(
                logging.DEBUG if template in QUIET else logging.INFO,
                "%s %s %s",
                scope["method"],
                template,
                status,
                extra={
                    "method": scope["method"],
                    "path": template,
                    "status": status,
                    "duration_ms": round((time.perf_counter() - started) * 1000, 1),
                },
            )
