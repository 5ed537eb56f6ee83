"""The api process: a FastAPI app served by gunicorn with uvicorn workers.

Run: ``gunicorn -c services/api/gunicorn_conf.py services.api.app:app``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from fastapi_offline import FastAPIOffline
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from psycopg_pool import ConnectionPool

from exportcore import telemetry
from exportcore.artifacts import open_store
from exportcore.auth import ApiKeyCache
from exportcore.coalesce import SubmitCoalescer
from exportcore.db import DATABASE_UNAVAILABLE, Conn, make_pool
from exportcore.logs import setup_logging
from exportcore.ratelimit import RateLimiter, TenantLimits
from exportcore.settings import Settings, get_settings
from exportcore.store import tenants as tenant_store
from exportcore.webhooks import secret_keys
from exportcore.webhooks.encryption import SecretKeysMissing
from services.api import access, console, openapi, problems, request_ids
from services.api.body_limit import BodyLimit
from services.api.headers import SecurityHeaders
from services.api.methods import LiteralPathMethods
from services.api.rate_headers import RateLimitHeaders
from services.api.routers import (
    admin,
    audit,
    bulk_actions,
    exports,
    health,
    manifest_keys,
    pauses,
    schedules,
    webhooks,
    workers,
)
from services.api.unhandled_errors import UnhandledErrors

log = logging.getLogger(__name__)


def _check_webhook_secret_keys(pool: ConnectionPool[Conn], settings: Settings) -> None:
    """Refuse to start when stored webhook secrets use a key ``WEBHOOK_SECRET_KEYS`` lacks
    (raises SecretKeysMissing, logged first: the api encrypts with the first key, and the
    deployment's processes must share one key list). A database that does not answer at
    start skips the check (the api starts and answers 503 until it does, as before)."""
    try:
        secret_keys.check_keys(
            pool, settings.webhook_secret_box(), timeout=settings.db_connect_timeout
        )
    except SecretKeysMissing as exc:
        log.error("cannot start: %s", exc.detail, extra={"code": exc.code})
        raise
    except DATABASE_UNAVAILABLE as exc:
        log.warning(
            "database unavailable at start; webhook secret keys not checked",
            extra={"error": type(exc).__name__},
        )


def _tenant_limit(pool: ConnectionPool[Conn], tenant_id: str) -> dict[str, Any] | None:
    with pool.connection() as conn:
        return tenant_store.tenant_submit_limit(conn, tenant_id=tenant_id)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; the connection pool is opened per worker process at startup."""
    settings = settings or get_settings()
    setup_logging("api", settings.log_level, settings.log_format)
    tracing = telemetry.setup_tracing("api", instrument=("psycopg",))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # per worker process (after gunicorn forks): the pool and the rate limiter's Redis
        pool = app.state.pool = make_pool(settings, "exports-api")
        try:
            _check_webhook_secret_keys(pool, settings)
        except SecretKeysMissing:
            pool.close()
            raise
        app.state.submit_coalescer = (
            SubmitCoalescer(pool, settings) if settings.api_submit_batch > 1 else None
        )
        app.state.rate_limiter = RateLimiter(settings)
        app.state.tenant_limits = TenantLimits(settings, partial(_tenant_limit, pool))
        try:
            yield
        finally:
            app.state.rate_limiter.close()
            app.state.pool.close()

    # /docs (Swagger UI) and /redoc serve their scripts and styles from the fastapi-offline
    # package under /static-offline-docs: they work without the internet (air-gapped
    # clusters). No validator badge: Swagger UI would fetch it from validator.swagger.io.
    app = FastAPIOffline(
        title="notes-exports",
        version="0.1.0",
        description="Durable exports of notes: accept (202), poll, download.",
        lifespan=lifespan,
        swagger_ui_parameters={"validatorUrl": None},
    )

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        """The front page is the API's documentation."""
        return RedirectResponse("docs", status_code=307)

    app.state.settings = settings
    app.state.store = open_store(settings)
    app.state.key_cache = ApiKeyCache(settings.api_key_cache_seconds)
    problems.install(app)
    openapi.install(app)
    app.add_middleware(LiteralPathMethods)  # innermost: before routing, after the others
    app.add_middleware(BodyLimit, max_bytes=settings.max_request_bytes)
    app.add_middleware(UnhandledErrors)  # any failure left: a 500 problem
    app.add_middleware(RateLimitHeaders)  # RateLimit fields of a limited request, 500s too
    app.add_middleware(SecurityHeaders)  # also on BodyLimit's 413 and the 500 problems
    app.add_middleware(access.AccessLog)  # every answer, 413s and 500s included
    # outermost of these: X-Request-ID on every answer; the id is set before the access
    # log line and every other line of the request is written
    request_ids.install(app)
    app.include_router(health.router)
    app.include_router(exports.router)
    app.include_router(schedules.router)
    app.include_router(schedules.preview_router)
    app.include_router(webhooks.router)
    app.include_router(admin.router)
    app.include_router(manifest_keys.router)
    app.include_router(audit.router)
    app.include_router(bulk_actions.router)
    app.include_router(workers.router)
    app.include_router(pauses.router)
    if settings.console_enabled:
        console.install(app)
    if tracing is not None:
        FastAPIInstrumentor.instrument_app(app, excluded_urls="healthz,readyz,metrics")
    return app


app = create_app()
