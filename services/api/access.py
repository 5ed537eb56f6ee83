"""One log line per request (INFO, logger ``services.api.access``) and its HTTP metrics
(``exports_http_requests_total``, ``exports_http_request_duration_seconds``, on the api's
metrics port): method, the route's path TEMPLATE (``/v1/exports/{job_id}``, never the path a
client typed, never the query string), status and duration. An answer given before routing
(a 413 of the body limit) or by a route the router does not tag (``/openapi.json``) is named
after the route its path matches. Probes and /metrics log at DEBUG. No header is logged: an
``Authorization`` header never reaches a log. The line carries the request's ``request_id``
(the log filter of :mod:`services.api.request_ids`, whose middleware wraps this one)."""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from starlette.routing import Match, Mount, compile_path
from starlette.types import Receive, Scope, Send

from exportcore import metrics
from services.api.asgi import HTTPMiddleware, WatchedSend

log = logging.getLogger(__name__)

QUIET = frozenset({"/healthz", "/readyz", "/metrics"})


def path_template(scope: Scope) -> str:
    """The matched route's template, the mount's for static files; for a request answered
    before (or without) routing, the template of the app's route its path matches; else
    ``<unmatched>`` (so a path a client invents never becomes a metric label)."""
    route: Any = scope.get("route")
    if route is not None and getattr(route, "path", None):
        return str(route.path)
    root = scope.get("root_path", "")
    if root:
        return f"{root}/{{path}}"
    app: Any = scope.get("app")
    path = str(scope.get("path", ""))
    for candidate in getattr(app, "routes", ()):
        template = getattr(candidate, "path", None)
        if template and candidate.matches({**scope, "type": "http"})[0] is not Match.NONE:
            return f"{template}/{{path}}" if isinstance(candidate, Mount) else str(template)
    for pattern, template in _documented(app):
        if pattern.match(path):
            return template
    return "<unmatched>"


def _documented(app: Any) -> list[tuple[re.Pattern[str], str]]:
    """The API's path templates (its OpenAPI document's paths) as regular expressions,
    built once per app: the routes that include routers nest, so their templates are read
    from the document rather than from the router."""
    cached = getattr(getattr(app, "state", None), "path_templates", None)
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    try:
        paths = list(app.openapi().get("paths", {}))
    except Exception:  # no app, or one without a document: nothing to match against
        return []
    built = [(compile_path(p)[0], p) for p in sorted(paths, key=len, reverse=True)]
    app.state.path_templates = built
    return built


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
            elapsed = time.perf_counter() - started
            metrics.HTTP_REQUESTS.labels(scope["method"], template, str(status)).inc()
            metrics.HTTP_DURATION.labels(scope["method"], template).observe(elapsed)
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
                    "duration_ms": round(elapsed * 1000, 1),
                },
            )
