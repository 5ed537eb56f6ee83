"""HTTP errors as ``application/problem+json`` (RFC 9457, "Problem Details for HTTP APIs").

``type`` is a ``tag:`` URI per problem code (RFC 9457 section 3.1.1 allows non-dereferenceable
URIs); ``title`` is constant per type, ``detail`` explains this occurrence.
"""

from __future__ import annotations

import logging
import traceback
from pathlib import Path
from typing import Any
from uuid import uuid4

import psycopg
import psycopg_pool
from botocore.exceptions import BotoCoreError, ClientError
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from exportcore import admission, domain, metrics
from exportcore.storage_errors import classify_storage

log = logging.getLogger(__name__)

PROBLEM_MEDIA_TYPE = "application/problem+json"
TYPE_ROOT = "tag:notes-exports,2026:problem/"


class Problem(BaseModel):
    """An RFC 9457 problem object; extension members may follow the standard ones."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(examples=[TYPE_ROOT + "unknown_notes"])
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None


class ProblemError(Exception):
    """Raise from a route to answer with a problem: ``status``, stable ``code``, ``title``."""

    def __init__(
        self,
        status: int,
        code: str,
        title: str,
        detail: str | None = None,
        headers: dict[str, str] | None = None,
        **extensions: Any,
    ) -> None:
        super().__init__(detail or title)
        self.status = status
        self.code = code
        self.title = title
        self.detail = detail
        self.headers = headers or {}
        self.extensions = extensions


def problem_response(
    request: Request,
    status: int,
    code: str,
    title: str,
    detail: str | None = None,
    headers: dict[str, str] | None = None,
    **extensions: Any,
) -> JSONResponse:
    """Build the problem+json response for ``request``."""
    body: dict[str, Any] = {
        "type": TYPE_ROOT + code,
        "title": title,
        "status": status,
        "instance": request.url.path,
    }
    if detail:
        body["detail"] = detail
    body.update(extensions)
    return JSONResponse(body, status_code=status, media_type=PROBLEM_MEDIA_TYPE, headers=headers)


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries documenting problem+json bodies for ``statuses``."""
    return {
        s: {
            "model": Problem,
            "content": {PROBLEM_MEDIA_TYPE: {}},
            "description": _TITLES.get(s, "Problem"),
        }
        for s in statuses
    }


_TITLES = {
    400: "Malformed request",
    401: "Missing or invalid API key",
    403: "Insufficient scope",
    404: "Not found",
    409: "Conflict with the job's state",
    410: "Gone",
    413: "Request too large",
    415: "Unsupported media type",
    422: "Invalid request",
    429: "Tenant quota or submit rate exceeded",
    500: "Internal server error",
    503: "Service unavailable",
}

STATUS_BY_KIND = {
    "bad_request": 400,
    "invalid": 422,
    "not_found": 404,
    "conflict": 409,
    "gone": 410,
}


def _openapi_with_problems(app: FastAPI) -> Any:
    """FastAPI documents request validation errors (422) as its own JSON shape; this API
    answers them as problem+json, so the document says so for every operation."""
    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = original()
        problem_ref = {"$ref": "#/components/schemas/Problem"}
        for path in schema.get("paths", {}).values():
            for operation in path.values():
                response = operation.get("responses", {}).get("422")
                if response is not None:
                    response["description"] = _TITLES[422]
                    response["content"] = {PROBLEM_MEDIA_TYPE: {"schema": problem_ref}}
        schemas = schema.setdefault("components", {}).setdefault("schemas", {})
        schemas.setdefault(
            "Problem", Problem.model_json_schema(ref_template="#/components/schemas/{model}")
        )
        for unused in ("HTTPValidationError", "ValidationError"):
            schemas.pop(unused, None)
        app.openapi_schema = schema
        return schema

    return openapi


class BodyLimit:
    """ASGI middleware bounding request bodies to ``max_bytes``: 413 problem+json (RFC 9110
    section 15.5.14, RFC 9457). A declared ``Content-Length`` over the limit is refused
    before any of the body is read; a body sent without a length is cut off as soon as it
    passes the limit (the route fails while reading it, and nothing is written)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = Headers(scope=scope).get("content-length", "")
        if length.isdigit() and int(length) > self.max_bytes:
            response = problem_response(
                Request(scope),
                413,
                "request_too_large",
                _TITLES[413],
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


class UnhandledErrors:
    """ASGI middleware: an exception that no handler answered becomes a 500 problem+json
    (RFC 9457) instead of the server's ``text/plain`` page, with no detail of the error in it
    (an exception's text can hold a failing row, a path or a key) and an ``error_id`` that the
    log line carries too, so an operator can find it. The log names the exception's type and
    where it was raised, never its message. When the response had already started (a
    download stream broke) it is only cut short."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking)
        except Exception as exc:
            error_id = uuid4().hex
            log.error(
                "unhandled error",
                extra={
                    "error": type(exc).__name__,
                    "error_id": error_id,
                    "where": _frames(exc),
                    "method": scope.get("method"),
                    "path": scope.get("path"),
                },
            )
            if started:
                return
            response = problem_response(
                Request(scope),
                500,
                "internal_error",
                "Internal server error",
                "an unexpected error occurred; retry later (a submit with the same "
                "Idempotency-Key never runs twice) and give error_id to the operator if it "
                "persists",
                error_id=error_id,
            )
            await response(scope, receive, send)


def _frames(exc: BaseException, depth: int = 6) -> list[str]:
    """Where ``exc`` was raised: the innermost ``file:line function`` frames, no values."""
    frames = traceback.extract_tb(exc.__traceback__)[-depth:]
    return [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames]


def install(app: FastAPI) -> None:
    """Register handlers so that every error the API produces is problem+json."""
    app.openapi = _openapi_with_problems(app)  # type: ignore[method-assign]

    @app.exception_handler(ProblemError)
    async def _problem(request: Request, exc: ProblemError) -> JSONResponse:
        return problem_response(
            request, exc.status, exc.code, exc.title, exc.detail, exc.headers, **exc.extensions
        )

    @app.exception_handler(admission.AdmissionRefused)
    async def _refused(request: Request, exc: admission.AdmissionRefused) -> JSONResponse:
        # RFC 9110 section 15.5.20 / 15.6.4 and RFC 6585 section 4: Retry-After with 429/503.
        quota = isinstance(exc, admission.QuotaExceeded)
        return problem_response(
            request,
            429 if quota else 503,
            exc.code,
            "Tenant quota exceeded" if quota else "Export capacity exceeded",
            exc.detail + "; nothing was accepted, retry later",
            headers={"Retry-After": str(exc.retry_after)},
        )

    @app.exception_handler(domain.ExportError)
    async def _domain(request: Request, exc: domain.ExportError) -> JSONResponse:
        status = STATUS_BY_KIND.get(exc.kind, 400)
        return problem_response(request, status, exc.code, exc.title, exc.detail, **exc.extra)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
            for e in exc.errors()
        ]
        content_type = request.headers.get("content-type", "")
        body_errors = [e for e in errors if e["loc"][:1] == ["body"]]
        if body_errors and "json" not in content_type:
            return problem_response(
                request,
                415,
                "unsupported_media_type",
                "Unsupported media type",
                "send the body as JSON with 'Content-Type: application/json'",
            )
        if request.method == "POST" and request.url.path == "/v1/exports":
            metrics.SUBMITS.labels("invalid", "api").inc()
        if any(e["type"] == "json_invalid" for e in errors):
            return problem_response(
                request,
                400,
                "malformed_json",
                "Malformed request",
                "the request body is not valid JSON",
                errors=errors,
            )
        return problem_response(
            request,
            422,
            "invalid_request",
            "Invalid request",
            "the request does not match the schema",
            errors=errors,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(
            exc.status_code, "http_error"
        )
        return problem_response(
            request,
            exc.status_code,
            code,
            _TITLES.get(exc.status_code, "HTTP error"),
            str(exc.detail) if exc.detail else None,
            dict(exc.headers or {}),
        )

    @app.exception_handler(BotoCoreError)
    @app.exception_handler(ClientError)
    async def _storage_down(request: Request, exc: Exception) -> JSONResponse:
        failure = classify_storage(exc)
        level = logging.ERROR if failure and failure.kind == "permanent" else logging.WARNING
        log.log(
            level,
            "artifact storage unavailable",
            extra={"error": failure.detail if failure else type(exc).__name__},
        )
        return problem_response(
            request,
            503,
            "storage_unavailable",
            "Service unavailable",
            "the artifact storage is unreachable or refused the request; retry later",
            headers={"Retry-After": "5"},
        )

    @app.exception_handler(psycopg.DataError)
    async def _bad_value(request: Request, exc: psycopg.DataError) -> JSONResponse:
        # A value the database cannot store (a NUL byte, a number out of range): the
        # request is at fault, not the server. Nothing was written.
        log.info("value refused by the database", extra={"error": type(exc).__name__})
        return problem_response(
            request,
            422,
            "invalid_value",
            "Invalid request",
            "a value in the request cannot be stored (control characters, out-of-range numbers)",
        )

    @app.exception_handler(psycopg.IntegrityError)
    async def _integrity(request: Request, exc: psycopg.IntegrityError) -> JSONResponse:
        # A constraint refused the write: the request is at fault (a value out of bounds or
        # missing: 422; a row that already exists, or that another references: 409). The
        # database's message can contain the failing row, so none of it is returned or
        # logged; nothing was written (the transaction rolled back).
        constraint = exc.diag.constraint_name if exc.diag else None
        log.info(
            "write refused by a constraint",
            extra={"error": type(exc).__name__, "constraint": constraint},
        )
        if isinstance(exc, psycopg.errors.NotNullViolation | psycopg.errors.CheckViolation):
            return problem_response(
                request,
                422,
                "invalid_value",
                "Invalid request",
                "a value in the request is missing or outside what can be stored",
            )
        return problem_response(
            request,
            409,
            "conflict",
            "Conflict",
            "the request conflicts with data that already exists; nothing was written",
        )

    @app.exception_handler(psycopg.OperationalError)
    @app.exception_handler(psycopg_pool.PoolTimeout)
    async def _db_down(request: Request, exc: Exception) -> JSONResponse:
        log.warning("database unavailable", extra={"error": type(exc).__name__})
        return problem_response(
            request,
            503,
            "database_unavailable",
            "Service unavailable",
            "the job database is unreachable; nothing was accepted, retry later",
            headers={"Retry-After": "5"},
        )
