"""A request that meets a PostgreSQL restart or failover is a 503 problem with Retry-After
(RFC 9457, RFC 9110 section 10.2.3), never a 500: a lost connection, a pool timeout, and a
standby reached through a pooler (SQLSTATE 25006)."""

from __future__ import annotations

import psycopg
import psycopg_pool
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from services.api.problems import install


@pytest.mark.parametrize(
    "error",
    [
        psycopg.OperationalError("server closed the connection unexpectedly"),
        psycopg_pool.PoolTimeout("couldn't get a connection after 2.00 sec"),
        psycopg.errors.ReadOnlySqlTransaction("cannot execute INSERT in a read-only transaction"),
    ],
)
def test_the_database_moving_is_a_503_with_retry_after(error: Exception) -> None:
    app = FastAPI()
    install(app)

    @app.post("/v1/exports")
    def submit() -> None:
        raise error

    r = TestClient(app).post("/v1/exports")
    assert r.status_code == 503
    assert r.headers["content-type"] == "application/problem+json"
    assert r.headers["retry-after"] == "5"
    body = r.json()
    assert body["type"].endswith("/database_unavailable")
    assert "nothing was accepted" in body["detail"] and "read-only" not in body["detail"]
