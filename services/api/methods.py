"""405 for a method a literal path does not declare, before any route template can take it.

Starlette routes in order and a templated route takes any segment: ``PATCH
/v1/webhooks/event-types`` would reach ``PATCH /v1/webhooks/{endpoint_id}`` and answer 415
or 422 ("not a UUID") for a method the path ``/v1/webhooks/event-types`` never had. OpenAPI
3.1 (4.8.8, Paths Object): "concrete (non-templated) paths would be matched before their
templated counterparts", so such a request is for the literal path, and RFC 9110 section
15.5.6 makes it a 405 with ``Allow`` listing the methods the path has. This answers it before
routing, for every literal path of the documented API, ahead of any body or media-type
check.
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi.routing import iter_route_contexts
from starlette.requests import Request
from starlette.routing import BaseRoute
from starlette.types import Receive, Scope, Send

from services.api.asgi import HTTPMiddleware
from services.api.problems import TITLES, problem_response


def literal_path_methods(routes: Sequence[BaseRoute]) -> dict[str, frozenset[str]]:
    """``{path: its methods}`` of every documented route (``include_in_schema``: the API
    the OpenAPI document describes, whose matching rule this is) without path parameters
    in ``routes`` (an app's ``routes``, included routers walked as FastAPI's own OpenAPI
    document walks them, ``fastapi.routing.iter_route_contexts``). Undocumented routes are
    left to Starlette's order: the console's ``GET /console/bulk/{action}`` serves the page
    of ``/console/bulk/replay`` on purpose, whose literal route is its form's POST. Mounts
    and other routes without methods are skipped. Methods are upper case, as the routes
    hold them."""
    found: dict[str, set[str]] = {}
    for route in iter_route_contexts(routes):
        path, methods = route.path, route.methods
        documented = getattr(route, "include_in_schema", False)
        if path and methods and documented and "{" not in path:
            found.setdefault(path, set()).update(methods)
    return {path: frozenset(methods) for path, methods in found.items()}


class LiteralPathMethods(HTTPMiddleware):
    """ASGI middleware: a request whose path is one of the app's literal paths, with a
    method that path does not declare, answers a 405 problem+json (``method_not_allowed``)
    with ``Allow`` (RFC 9110 section 10.2.1, sorted); anything else goes to the app. The
    path table is read from ``scope["app"].routes`` at the first request (every router is
    included by then)."""

    _table: dict[str, frozenset[str]] | None = None

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer the 405 or serve the request."""
        if self._table is None:
            self._table = literal_path_methods(getattr(scope.get("app"), "routes", []))
        path = str(scope["path"])
        root = str(scope.get("root_path", ""))
        if root and path.startswith(root):
            path = path[len(root) :]
        allowed = self._table.get(path)
        if allowed is None or scope["method"] in allowed:
            await self.app(scope, receive, send)
            return
        response = problem_response(
            Request(scope),
            405,
            "method_not_allowed",
            TITLES[405],
            f"{scope['method']} is not a method of {path}",
            {"Allow": ", ".join(sorted(allowed))},
        )
        await response(scope, receive, send)
