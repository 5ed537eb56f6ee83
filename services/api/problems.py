"""HTTP errors as ``application/problem+json`` (RFC 9457, "Problem Details for HTTP APIs").

``type`` is a ``tag:`` URI per problem code (RFC 9457 section 3.1.1 allows non-dereferenceable
URIs); ``title`` is constant per type, ``detail`` explains this occurrence. :func:`install`
maps every error the routes raise (the library's, the database's, the storage's, the
framework's) to a problem. A request the schema refuses is a 422 whose ``detail`` and
``errors[].msg`` say in words what to fix (:mod:`services.api.validation_words`, never
pydantic's wording). The 413 of a body over the limit is :mod:`services.api.body_limit`,
the 500 of an error nothing answered :mod:`services.api.unhandled_errors`, and the OpenAPI
document's problem bodies :mod:`services.api.openapi`.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import psycopg_pool
from botocore.exceptions import BotoCoreError, ClientError
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from exportcore import admission, domain, metrics
from exportcore.storage_errors import classify_storage
from services.api import request_ids
from services.api.validation_words import say, summary

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
    request_id: str | None = Field(
        None,
        description="The request's id, as in its X-Request-ID response header: quote it "
        "to the operator, who finds the request's log lines by it.",
        examples=["3f2b0c8e9d7a4b1c8e5f6a7b8c9d0e1f"],
    )


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
    """Build the problem+json response for ``request``, with the request's id as the
    extension member ``request_id`` (RFC 9457 section 3.2; :mod:`services.api.request_ids`)
    when one is set."""
    body: dict[str, Any] = {
        "type": TYPE_ROOT + code,
        "title": title,
        "status": status,
        "instance": request.url.path,
    }
    if detail:
        body["detail"] = detail
    body.update(extensions)
    rid = request_ids.current()
    if rid is not None:
        body.setdefault("request_id", rid)
    return JSONResponse(body, status_code=status, media_type=PROBLEM_MEDIA_TYPE, headers=headers)


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries documenting problem+json bodies for ``statuses``."""
    return {
        s: {
            "model": Problem,
            "content": {PROBLEM_MEDIA_TYPE: {}},
            "description": TITLES.get(s, "Problem"),
        }
        for s in statuses
    }


TITLES = {
    400: "Malformed request",
    401: "Missing or invalid API key",
    403: "Insufficient scope",
    404: "Not found",
    405: "Method not allowed",
    409: "Conflict with the job's state",
    410: "Gone",
    413: "Request too large",
    415: "Unsupported media type",
    422: "Invalid request",
    429: "Tenant quota or submit rate exceeded",
    500: "Internal server error",
    503: "Service unavailable",
}
"""The ``title`` of a problem by HTTP status, where the status alone names the problem type
(RFC 9457 section 3.1.3: the same title for every occurrence of a type)."""

STATUS_BY_KIND = {
    "bad_request": 400,
    "forbidden": 403,
    "invalid": 422,
    "not_found": 404,
    "conflict": 409,
    "gone": 410,
    "unavailable": 503,
}


def install(app: FastAPI) -> None:
    """Register handlers so that every error the API produces is problem+json."""

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
            {"loc": list(e.get("loc", ())), "msg": say(e), "type": e.get("type", "")}
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
            summary([e["msg"] for e in errors]),
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
            TITLES.get(exc.status_code, "HTTP error"),
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

    # The primary is unreachable or moving (a restart, a failover: exportcore.db
    # DATABASE_UNAVAILABLE, a standby reached through a pooler included): 503, never 500. A
    # submit's transaction did not answer COMMIT, so no 202 was given; retrying with the
    # same Idempotency-Key returns the export if the commit did land.
    @app.exception_handler(psycopg.OperationalError)
    @app.exception_handler(psycopg_pool.PoolTimeout)
    @app.exception_handler(psycopg.errors.ReadOnlySqlTransaction)
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
