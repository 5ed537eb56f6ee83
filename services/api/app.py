"""The api process: a FastAPI app served by gunicorn with uvicorn workers.

Run: ``gunicorn -c services/api/gunicorn_conf.py services.api.app:app``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

from exportcore import telemetry
from exportcore.artifacts import open_store
from exportcore.db import make_pool
from exportcore.logs import setup_logging
from exportcore.settings import Settings, get_settings
from services.api import problems
from services.api.headers import SecurityHeaders
from services.api.routers import admin, exports, health, schedules


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; the connection pool is opened per worker process at startup."""
    settings = settings or get_settings()
    setup_logging("api", settings.log_level)
    tracing = telemetry.setup_tracing("api", instrument=("psycopg",))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.pool = make_pool(settings, "exports-api")
        try:
            yield
        finally:
            app.state.pool.close()

    app = FastAPI(
        title="notes-exports",
        version="0.1.0",
        description="Durable exports of notes: accept (202), poll, download.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.store = open_store(settings)
    problems.install(app)
    app.add_middleware(problems.BodyLimit, max_bytes=settings.max_request_bytes)
    app.add_middleware(SecurityHeaders)  # outermost: also on BodyLimit's 413
    app.include_router(health.router)
    app.include_router(exports.router)
    app.include_router(schedules.router)
    app.include_router(admin.router)
    if tracing is not None:
        FastAPIInstrumentor.instrument_app(app, excluded_urls="healthz,readyz,metrics")
    return app


app = create_app()
