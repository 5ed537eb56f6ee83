"""The processes behind PgBouncer 1.18 in transaction mode (``DATABASE_POOLER=transaction``),
against a real PgBouncer in front of the test server: they refuse to start when the server
sessions lack the timeouts they cannot set there, they prepare no statement (a prepared
statement does not survive to the next transaction's server connection), and their LISTEN
goes around the pooler."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql
from pydantic import PostgresDsn

from devtools.ha.pgbouncer import PgBouncer
from exportcore.broker import make_celery
from exportcore.db import PoolerMisconfigured, connection_kwargs, make_pool, session_defaults
from exportcore.deadlines import Deadline, statement_timeout
from exportcore.publisher import Publisher
from exportcore.settings import Settings
from tests.support import idle_wakes, submit


def _pooled(settings: Settings, bouncer: PgBouncer) -> Settings:
    """This test's database through the PgBouncer, the direct URL beside it."""
    name = psycopg.conninfo.conninfo_to_dict(settings.database_dsn)["dbname"]
    return settings.model_copy(
        update={
            "database_url": PostgresDsn(f"postgresql://postgres@127.0.0.1:{bouncer.port}/{name}"),
            "database_pooler": "transaction",
            "database_direct_url": settings.database_url,
        }
    )


def _set_defaults(settings: Settings) -> None:
    with psycopg.connect(settings.session_dsn, autocommit=True) as conn:
        db = conn.info.dbname
        for key, value in session_defaults(settings).items():
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                    sql.Identifier(db), sql.Identifier(key), sql.Literal(value)
                )
            )


@pytest.fixture
def pooled(settings: Settings, pgbouncer: PgBouncer) -> Settings:
    """Settings behind the pooler, with the database's session defaults set for it."""
    s = _pooled(settings, pgbouncer)
    _set_defaults(s)
    return s


def test_a_process_refuses_to_start_when_the_pooled_sessions_lack_the_timeouts(
    settings: Settings, pgbouncer: PgBouncer
) -> None:
    with pytest.raises(PoolerMisconfigured) as err:
        make_pool(_pooled(settings, pgbouncer), "tests-pooler")
    message = str(err.value)
    assert "ALTER ROLE postgres SET statement_timeout = '15000'" in message
    assert "DATABASE_POOLER=none" in message


def test_statements_are_never_prepared_behind_a_transaction_pooler(pooled: Settings) -> None:
    def client(**kwargs: Any) -> psycopg.Connection[Any]:
        return psycopg.connect(pooled.database_dsn, autocommit=True, **kwargs)

    def run_while_another_client_holds_its_server(a: psycopg.Connection[Any]) -> None:
        a.execute("SELECT %s::int", (1,))  # prepared on the server it got, if it prepares
        with client() as b, b.transaction():
            b.execute("SELECT 1")  # b holds that server: a's next statement lands elsewhere
            a.execute("SELECT %s::int", (2,))

    # What psycopg's default (prepare after 5 runs; 0 here: at once) meets behind PgBouncer:
    with client(prepare_threshold=0) as a, pytest.raises(psycopg.errors.InvalidSqlStatementName):
        run_while_another_client_holds_its_server(a)
    kwargs = connection_kwargs(pooled, "tests-pooler")
    assert kwargs["prepare_threshold"] is None and "options" not in kwargs
    kwargs.pop("row_factory")
    with client(**{k: v for k, v in kwargs.items() if k != "connect_timeout"}) as a:
        run_while_another_client_holds_its_server(a)


def test_the_pool_and_the_listen_work_behind_the_pooler(
    pooled: Settings, pgbouncer: PgBouncer, tenant
) -> None:
    pool = make_pool(pooled, "tests-pooler", min_size=1, max_size=4, open_wait=True)
    try:
        with pool.connection() as conn:
            timeout = conn.execute("SHOW statement_timeout").fetchone()
        assert timeout == {"statement_timeout": "15s"}  # the database's default, checked
        tid, ids = tenant
        publisher = Publisher(pooled, pool, make_celery(pooled))
        try:

            def submits() -> None:
                for _ in range(8):  # the same statements many times: nothing prepared
                    submit(pool, pooled, tid, ids[:1])

            woke = idle_wakes(publisher, submits)
            assert woke, "the NOTIFY of a submit through the pooler did not wake it"
            # its LISTEN has a session of its own, around the pooler
            assert publisher._listen_conn().info.port != pgbouncer.port
        finally:
            publisher.close_listener()
        # a pass through the pooler publishes (small exports beyond the messages ahead
        # wait in the outbox for a claim to make room: no worker runs here)
        assert publisher.run_once()["published"] >= 1
    finally:
        pool.close()


def test_a_deadline_bounded_read_leaves_no_timeout_on_a_pooled_server(pooled: Settings) -> None:
    """The statement timeout of a read near its job's deadline lasts one transaction: an
    autocommit SET would stay on the server connection, which PgBouncer hands to the next
    client (last used first)."""

    def show(conn: psycopg.Connection[Any]) -> Any:
        return conn.execute("SHOW statement_timeout").fetchone()

    with psycopg.connect(pooled.database_dsn, autocommit=True, prepare_threshold=None) as a:
        with statement_timeout(a, Deadline.after(30), default_ms=60_000):
            assert show(a)[0] != "15s"  # bounded by the 30 s left
            with psycopg.connect(pooled.database_dsn, autocommit=True) as b:
                assert show(b) == ("15s",)
        with psycopg.connect(pooled.database_dsn, autocommit=True) as b:
            assert show(b) == ("15s",)
