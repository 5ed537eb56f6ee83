"""PostgreSQL connections: one psycopg 3 pool per process, with timeouts on every session.

Pooled connections are in autocommit mode: a job transition is ONE statement (a CTE that
changes the job and writes its history), atomic on its own, so it costs one round trip and
no separate COMMIT. Work that spans several statements — a submit, the scanner's locked
batch, a schedule tick — runs inside :func:`transaction` (``BEGIN`` … ``COMMIT``). No
transaction is held across broker I/O, file I/O or rendering (docs/architecture.md
INV-13 no-transaction-across-io).
"""

from __future__ import annotations

import logging
import os
import random
import select
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from exportcore.settings import Settings

Row = dict[str, Any]
Conn = psycopg.Connection[Row]
T = TypeVar("T")
log = logging.getLogger(__name__)
_jitter = random.Random()
# deadlock_detected, serialization_failure (PostgreSQL Appendix A, class 40)
RETRY_SQLSTATES = frozenset({"40P01", "40001"})
# read_only_sql_transaction: the server behind this connection is no longer the primary (a
# pooler whose member was demoted by a switchover keeps the client's connection open).
NOT_PRIMARY_SQLSTATES = frozenset({"25006"})
DATABASE_UNAVAILABLE: tuple[type[Exception], ...] = (
    psycopg.OperationalError,  # connection lost or refused, server shutting down; PoolTimeout
    psycopg.errors.ReadOnlySqlTransaction,  # reached a standby: the primary moved
)
"""What a statement raises while the primary is unreachable or moving (a restart, a
failover): the statement's outcome is unknown when it was a write. The api answers 503 with
Retry-After; the worker treats its finish as an unknown completion (docs/operations.md,
"What a failover does")."""
# A connection whose server vanished without closing it (its machine died: no RST, no FIN)
# fails within about 10 s instead of hanging (docs/operations.md, "What bounds the
# unavailability"): an idle one after idle + interval * count seconds of unanswered TCP
# keepalives, one whose statement was sent and never acknowledged after tcp_user_timeout
# (keepalives are not sent while data is in flight, and the kernel would retransmit for
# ~15 minutes). Both end before Patroni can promote the standby (its ttl, at least 20 s), so
# the pools hold no connection to the old primary by then. A slow statement is not cut:
# the server's kernel acknowledges the query at once.
KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 4,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,  # milliseconds
}


class PoolerMisconfigured(psycopg.ProgrammingError):
    """The session defaults of the server connections behind a transaction pooler differ
    from the settings (the processes cannot set them per session there)."""


def session_options(settings: Settings) -> str:
    """The libpq ``options`` string setting statement, lock and idle-in-transaction timeouts."""
    return " ".join(
        [
            f"-c statement_timeout={settings.db_statement_timeout_ms}",
            f"-c lock_timeout={settings.db_lock_timeout_ms}",
            f"-c idle_in_transaction_session_timeout={settings.db_idle_in_transaction_timeout_ms}",
            "-c timezone=UTC",
        ]
    )


def session_defaults(settings: Settings) -> dict[str, str]:
    """The session settings every connection must run with (what :func:`session_options`
    sets), as ``pg_settings`` reports them (milliseconds; the time zone's name)."""
    return {
        "statement_timeout": str(settings.db_statement_timeout_ms),
        "lock_timeout": str(settings.db_lock_timeout_ms),
        "idle_in_transaction_session_timeout": str(settings.db_idle_in_transaction_timeout_ms),
        "TimeZone": "UTC",
    }


def pooled(settings: Settings, direct: bool = False) -> bool:
    """True when a connection of these settings goes through a transaction pooler."""
    return settings.database_pooler == "transaction" and not direct


def connection_kwargs(
    settings: Settings, application_name: str, *, direct: bool = False
) -> dict[str, Any]:
    """Keyword arguments for ``psycopg.connect`` shared by pools and dedicated connections.

    Through a transaction pooler (``DATABASE_POOLER=transaction``, not ``direct``) two
    things of a session do not exist: a server connection serves another client after each
    transaction, so no prepared statements (``prepare_threshold=None``: psycopg would
    prepare a statement it ran five times, and the next transaction may land where it was
    never prepared), and PgBouncer refuses the ``options`` startup parameter (its server
    connections start with the database's defaults: :func:`check_session_defaults`)."""
    kwargs: dict[str, Any] = {
        "connect_timeout": settings.db_connect_timeout,
        "application_name": application_name[:63],
        "row_factory": dict_row,
        **KEEPALIVES,
    }
    if pooled(settings, direct):
        kwargs["prepare_threshold"] = None
    else:
        kwargs["options"] = session_options(settings)
    return kwargs


def connect(
    settings: Settings, application_name: str, autocommit: bool = False, *, direct: bool = False
) -> Conn:
    """Open one dedicated connection (for the CLI; with ``direct``, a session of its own for
    LISTEN or migrations: ``DATABASE_DIRECT_URL`` when set).

    Raises ``psycopg.OperationalError`` when the server is unreachable within
    ``db_connect_timeout`` seconds.
    """
    conn = psycopg.connect(
        settings.session_dsn if direct else settings.database_dsn,
        autocommit=autocommit,
        **connection_kwargs(settings, application_name, direct=direct),
    )
    if pooled(settings, direct):
        try:
            check_session_defaults(conn, settings)
        except BaseException:
            conn.close()
            raise
    return conn


def verify_pooler(settings: Settings, application_name: str) -> None:
    """At a process's start behind a transaction pooler: one connection through it, and
    :func:`check_session_defaults` (raises :class:`PoolerMisconfigured`). A database that
    does not answer yet is no reason to refuse: the pool checks every connection it opens."""
    try:
        connect(settings, application_name, autocommit=True).close()
    except PoolerMisconfigured:
        raise
    except psycopg.OperationalError as exc:
        log.warning(
            "could not check the pooler's session defaults at start; checked per connection",
            extra={"error": type(exc).__name__},
        )


def check_session_defaults(conn: Conn, settings: Settings) -> None:
    """Behind a transaction pooler: raise :class:`PoolerMisconfigured` unless the server
    connections start with :func:`session_defaults` (one read of ``pg_settings``). The
    message names the statements that fix it (``ALTER ROLE … SET``, which every new server
    session of that role then starts with)."""
    want = session_defaults(settings)
    rows = conn.execute(
        "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)", (list(want),)
    ).fetchall()
    have = {r["name"]: r["setting"] for r in rows}
    if not conn.autocommit:
        conn.rollback()
    wrong = {
        name: value
        for name, value in want.items()
        if have.get(name) != value and not (name == "TimeZone" and have.get(name) == "Etc/UTC")
    }
    if wrong:
        role = conn.info.user
        fix = "; ".join(f"ALTER ROLE {role} SET {k} = '{v}'" for k, v in wrong.items())
        raise PoolerMisconfigured(
            "DATABASE_POOLER=transaction: the server sessions behind the pooler start with "
            f"{ {k: have.get(k) for k in wrong} }, not the settings' {wrong}; the processes "
            f"cannot set them per session there. Run: {fix} (then RECONNECT the pooler's "
            "server connections), or set DATABASE_POOLER=none if DATABASE_URL is no pooler"
        )


def check_idle_connection(conn: Conn) -> None:
    """The pool's ``check`` callback: raise if ``conn`` is no longer usable.

    An idle connection must have nothing to read. When the server ended the session while
    it sat in the pool (a restart or failover, ``pg_terminate_backend``, an idle-session
    timeout), it sent a FATAL error and closed the socket, so the socket is readable: only
    then is the connection tested with psycopg_pool's ``check_connection`` (an empty query,
    one round trip), which raises ``psycopg.OperationalError`` on a dead one and the pool
    discards it and hands out another. A healthy idle connection costs one ``poll(2)``, no
    query. (A peer that vanished without closing the socket is not seen here; the
    statement's timeouts and the caller's retry cover it.)
    """
    if conn.closed or conn.broken:
        raise psycopg.OperationalError("the pooled connection is closed")
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
    if poller.poll(0):
        ConnectionPool.check_connection(conn)


def _check_or_sweep(pool: ConnectionPool[Conn], conn: Conn) -> None:
    try:
        check_idle_connection(conn)
    except psycopg.Error:
        pool.check()  # the server ended one idle session: it likely ended them all
        raise


def make_pool(
    settings: Settings,
    application_name: str,
    *,
    min_size: int | None = None,
    max_size: int | None = None,
    open_wait: bool = False,
) -> ConnectionPool[Conn]:
    """Create and open a connection pool of autocommit connections for this process.

    Connections are not pinged on every borrow (that doubled the round trips of a job):
    :func:`check_idle_connection` pings only one whose socket became readable while idle.
    When it finds one dead, every idle connection is checked at once (``pool.check()``), so
    that after a PostgreSQL restart the borrower skips the dead ones without the pool's
    per-retry backoff (1, 2, 4 s…, which would outlast ``db_connect_timeout``). A connection
    that breaks mid-statement raises ``psycopg.OperationalError`` and is discarded.
    ``open_wait`` blocks until ``min_size`` connections exist (raises
    ``psycopg_pool.PoolTimeout`` after ``db_connect_timeout`` seconds).

    Failovers: ``DATABASE_URL`` may name several hosts with
    ``target_session_attrs=read-write``; every new connection goes to whichever is the
    primary, and :class:`FailoverPool` drops connections that reach a standby. Behind a
    transaction pooler (``DATABASE_POOLER=transaction``) the session defaults are checked
    first (:func:`verify_pooler`: a mismatch raises :class:`PoolerMisconfigured`, so the
    process refuses to start) and then on every new connection.
    """
    if pooled(settings):
        verify_pooler(settings, application_name)
    kwargs = {**connection_kwargs(settings, application_name), "autocommit": True}
    pool: ConnectionPool[Conn] = FailoverPool(
        settings.database_dsn,
        min_size=settings.db_pool_min_size if min_size is None else min_size,
        max_size=settings.db_pool_max_size if max_size is None else max_size,
        kwargs=kwargs,
        open=False,
        name=application_name,
        timeout=float(settings.db_connect_timeout),
        # After a failed connect the pool retries with a doubling delay (1, 2, 4, 8 s…) until
        # reconnect_timeout, and only then lets a borrower start a new attempt at once: a
        # long timeout kept processes waiting up to 16 s after a new primary was up (the
        # primary-kill drill). Short, so the pool tries again soon after a failover.
        reconnect_timeout=max(5.0, 2.0 * settings.db_connect_timeout),
        check=lambda conn: _check_or_sweep(pool, conn),
        configure=(lambda conn: check_session_defaults(conn, settings))
        if pooled(settings)
        else None,
    )
    pool.open(wait=open_wait, timeout=float(settings.db_connect_timeout))
    return pool


class FailoverPool(ConnectionPool[Conn]):
    """psycopg_pool's pool, and one rule of failovers: a connection whose statement was
    refused because its server is no longer the primary (SQLSTATE 25006, read-only) is
    closed, and every idle connection with it (``drain``): the replacements connect
    through the multi-host URL again, and ``target_session_attrs=read-write`` takes them
    to the new primary. (A connection the server closed is discarded by the pool itself.)"""

    @contextmanager
    def connection(self, timeout: float | None = None) -> Iterator[Conn]:
        """:meth:`ConnectionPool.connection`, dropping connections that reach a standby.

        An error that left the connection broken is raised as ``psycopg.OperationalError``
        (the connection was lost, whatever psycopg made of the last bytes: PgBouncer
        answering a COMMIT whose server died with two errors is an ``InternalError``
        "received 2 results" otherwise), so every caller treats it as a database that did
        not answer (:data:`DATABASE_UNAVAILABLE`), never as a bug."""
        with super().connection(timeout=timeout) as conn:
            try:
                yield conn
            except psycopg.Error as exc:
                if exc.sqlstate in NOT_PRIMARY_SQLSTATES and not conn.closed:
                    log.warning(
                        "the database connection reached a server that is not the primary; "
                        "reconnecting the pool",
                        extra={"pool": self.name, "sqlstate": exc.sqlstate},
                    )
                    conn.close()
                    self.drain()
                if conn.broken and not isinstance(exc, psycopg.OperationalError):
                    raise psycopg.OperationalError(
                        f"the database connection was lost ({type(exc).__name__})"
                    ) from exc
                raise


class ProcessPool:
    """A lazily created pool that is re-created after ``fork`` (Celery prefork, gunicorn).

    A pool created in a parent must never be used by a child: the sockets would be shared.
    ``get()`` returns the pool for the current PID, creating it on first use.
    """

    def __init__(self, settings: Settings, application_name: str, **pool_kwargs: Any) -> None:
        self._settings = settings
        self._name = application_name
        self._kwargs = pool_kwargs
        self._pid: int | None = None
        self._pool: ConnectionPool[Conn] | None = None
        self._lock = threading.Lock()

    def get(self) -> ConnectionPool[Conn]:
        """The pool of this process; created on first call in each process."""
        pid = os.getpid()
        if self._pool is None or self._pid != pid:
            with self._lock:
                if self._pool is None or self._pid != pid:
                    self._pool = make_pool(self._settings, self._name, **self._kwargs)
                    self._pid = pid
        return self._pool

    def close(self) -> None:
        """Close this process's pool, if it was created here."""
        if self._pool is not None and self._pid == os.getpid():
            self._pool.close()
        self._pool = None
        self._pid = None


@contextmanager
def transaction(pool: ConnectionPool[Conn], timeout: float | None = None) -> Iterator[Conn]:
    """Borrow a connection and run one multi-statement transaction: ``BEGIN``, then
    ``COMMIT`` on success or ``ROLLBACK`` on error. ``timeout`` bounds the wait for a
    connection (seconds; ``psycopg_pool.PoolTimeout``)."""
    with pool.connection(timeout=timeout) as conn, conn.transaction():
        yield conn


def retry_rolled_back(
    conn: Conn,
    statement: Callable[[], T],
    *,
    what: str,
    attempts: int = 3,
    base_delay: float = 0.02,
    rng: random.Random | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``statement`` (one SQL statement on ``conn``, which is its own transaction) and
    run it again when PostgreSQL rolled it back as a deadlock victim (SQLSTATE 40P01,
    ``psycopg.errors.DeadlockDetected``) or for a serialization failure (40001), the two
    errors PostgreSQL's documentation ("Serialization Failure Handling") answers with "retry
    the transaction". Nothing of a rolled-back statement was written, so running it again is
    safe; guarded transitions then match or refuse as they would have the first time. (Not
    the rest of class 40: 40003 says the statement's completion is unknown.)

    ``attempts`` runs in all; before attempt n+1 it waits a full-jitter backoff, uniform in
    [0, ``base_delay`` * 2**(n-1)] seconds. Inside a transaction block (``conn`` not in
    autocommit, or a block open) the error aborted the whole block, so it is raised at once.
    Raises the last rollback error when every attempt was rolled back, and any other error
    at once. ``what`` names the statement in the warning logged per retry."""
    own = conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    for attempt in range(1, attempts + 1):
        try:
            return statement()
        except psycopg.Error as exc:
            if exc.sqlstate not in RETRY_SQLSTATES or not own or attempt == attempts:
                raise
            log.warning(
                "statement rolled back by the database; running it again",
                extra={"statement": what, "sqlstate": exc.sqlstate, "attempt": attempt},
            )
            sleep((rng or _jitter).uniform(0, base_delay * 2 ** (attempt - 1)))
    raise AssertionError("unreachable")
