"""The connection pool after the server dropped its idle connections (a PostgreSQL restart
or failover, ``pg_terminate_backend``, an idle-session timeout): the next borrower gets a
working connection, never the dead one (which would turn a request into a 503)."""

from __future__ import annotations

from collections.abc import Iterator
from uuid import uuid4

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from exportcore.db import Conn, make_pool, transaction
from exportcore.settings import Settings
from tests.support import wait_for


@pytest.fixture
def small_pool(settings: Settings) -> Iterator[tuple[ConnectionPool[Conn], str]]:
    name = f"pool-check-{uuid4().hex[:8]}"
    p = make_pool(settings, name, min_size=8, max_size=8, open_wait=True)
    yield p, name
    p.close()


def _sessions(admin: psycopg.Connection[tuple[object, ...]], application_name: str) -> int:
    row = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [application_name]
    ).fetchone()
    return int(row[0]) if row else 0


def _terminate(settings: Settings, application_name: str) -> int:
    """End every session of the pool server-side and wait until they are gone (a backend
    exits, sending its FATAL message, a moment after pg_terminate_backend returns)."""
    with psycopg.connect(settings.database_dsn, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            [application_name],
        ).fetchall()
        wait_for(lambda: _sessions(admin, application_name) == 0, 10, "the sessions to end")
    return len(rows)


def test_every_idle_connection_killed_by_the_server_is_replaced(
    settings: Settings, small_pool: tuple[ConnectionPool[Conn], str]
) -> None:
    pool, name = small_pool
    wait_for(lambda: pool.get_stats()["pool_available"] == 8, 10, "eight idle connections")
    assert _terminate(settings, name) == 8
    # Every borrower, one after another, gets a live connection: none sees the dead ones, and
    # none waits out the pool's backoff between failed checks (1 + 2 + 4 s for eight dead
    # connections: past the 5 s db_connect_timeout, a PoolTimeout, i.e. a 503).
    for _ in range(10):
        with transaction(pool) as conn:
            assert conn.execute("SELECT 1 AS one").fetchone() == {"one": 1}
    with pool.connection() as a, pool.connection() as b, pool.connection() as c:
        pids = {x.execute("SELECT pg_backend_pid() AS p").fetchone()["p"] for x in (a, b, c)}
    assert len(pids) == 3
    assert pool.get_stats()["connections_lost"] == 8
