"""One log line per request (INFO, logger ``services.api.access``): method, the route's path
TEMPLATE (``/v1/exports/{job_id}``, never the path a client typed, never the query string),
status and duration. Probes and /metrics log at DEBUG. No header is logged: an
``Authorization`` header never reaches a log."""

from __future__ import annotations

import logging
import time
from typing import Any

from starlette.types import Receive, Scope, Send

from services.api.asgi import HTTPMiddleware, WatchedSend

log = logging.getLogger(__name__)

QUIET = frozenset({"/healthz", "/readyz", "/metrics"})


def path_template(scope: Scope) -> str:
    """The matched route's template, the mount's for static files, else ``<unmatched>``."""
    route: Any = scope.get("route")
    if route is not None and getattr(route, "path", None):
        return str(route.path)
    root = scope.get("root_path", "")
    return f"{root}/{{path}}" if root else "<unmatched>"


class AccessLog(HTTPMiddleware):
    """ASGI middleware writing the request line once the answer started (or failed)."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the request, then log its line (status 500 when nothing was answered)."""
        started = time.perf_counter()
        watched = WatchedSend(send)
        try:
            await self.app(scope, receive, watched)
        finally:
            # an exception before any answer is a 500 to the client
            status = 500 if watched.status is None else watched.status
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
