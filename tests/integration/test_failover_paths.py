"""What a failover does to the processes, one path at a time, against real PostgreSQL: a
finish the database does not answer is an unknown completion that the lease recovers; a
pool drops connections that reach a read-only server; an error that broke its connection
is a database that did not answer, never a bug. (The drills in devtools/drills/failover.py
run the real thing under Patroni.)"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any
from uuid import uuid4

import psycopg
import pytest

from devtools.ha.postgres import TIMING
from exportcore.artifacts import FileArtifactStore
from exportcore.db import connect, make_pool
from exportcore.recovery import RecoveryScanner
from exportcore.runner import JobRunner
from exportcore.settings import Settings
from exportcore.store import jobs as job_store
from tests.support import job, kinds, shift_job, submit

TCP_USER_TIMEOUT = getattr(socket, "TCP_USER_TIMEOUT", 18)  # linux/tcp.h


def _terminate(settings: Settings, conn: psycopg.Connection[Any]) -> None:
    """End ``conn``'s server session from another one (what a primary going away does)."""
    with psycopg.connect(settings.database_dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))


def test_a_finish_the_database_does_not_answer_is_an_unknown_completion(
    pool, settings: Settings, tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    tid, ids = tenant
    job_id = submit(pool, settings, tid, ids[:3])["id"]
    store = FileArtifactStore(settings.artifact_dir)
    finish = job_store.job_finish_if_leased_many

    def server_gone(conn, finishes):  # type: ignore[no-untyped-def]
        _terminate(settings, conn)
        return finish(conn, finishes)

    monkeypatch.setattr(job_store, "job_finish_if_leased_many", server_gone)
    outcome = JobRunner(settings, pool, store).run(job_id, uuid4())
    monkeypatch.undo()
    assert (outcome.result, outcome.reason) == ("unknown", "finish")
    row = job(pool, job_id)
    assert row["status"] == "running" and row["result_ref"] is None  # the finish never landed
    files = [p for p in Path(settings.artifact_dir).rglob("*") if p.is_file()]
    assert len(files) == 1, "the artifact is kept (it would be the result had the finish landed)"

    # The lease path recovers it: expired, requeued by the scanner, run again, one success.
    shift_job(pool, job_id, lease_expires_at="-1 hour")
    assert RecoveryScanner(settings, pool, store).run_once()["expired_requeued"] == 1
    shift_job(pool, job_id, next_attempt_at="-1 hour")
    assert JobRunner(settings, pool, store).run(job_id, uuid4()).result == "succeeded"
    assert kinds(pool, job_id).count("succeeded") == 1
    assert job(pool, job_id)["attempts"] == 2


def test_a_pool_drops_every_connection_once_one_reaches_a_read_only_server(
    settings: Settings,
) -> None:
    # Sessions that start read-only stand for a demoted primary behind a pooler; the server
    # becoming writable again stands for the pooler being pointed at the new primary.
    with psycopg.connect(settings.database_dsn, autocommit=True) as admin:
        db = admin.info.dbname
        admin.execute(f'ALTER DATABASE "{db}" SET default_transaction_read_only = on')
        p = make_pool(settings, "tests-read-only", min_size=3, max_size=3, open_wait=True)
        admin.execute(f'ALTER DATABASE "{db}" RESET default_transaction_read_only')
    try:
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction), p.connection() as conn:
            conn.execute("CREATE TEMP TABLE t (x int)")
        # Without the drain the next borrower would get one of the two idle read-only ones.
        for _ in range(3):
            with p.connection() as conn:
                assert conn.execute("SHOW transaction_read_only").fetchone() == {
                    "transaction_read_only": "off"
                }
    finally:
        p.close()


def test_an_error_that_broke_its_connection_is_a_database_that_did_not_answer(
    pool, settings: Settings
) -> None:
    with (
        pytest.raises(psycopg.OperationalError, match="connection was lost") as err,
        pool.connection() as conn,
    ):
        _terminate(settings, conn)
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
        # what psycopg makes of PgBouncer's two errors for one COMMIT whose server died
        raise psycopg.InternalError("received 2 results from command 'COMMIT'")
    assert isinstance(err.value.__cause__, psycopg.InternalError)
    with pool.connection() as conn:  # and the pool has replaced it
        assert conn.execute("SELECT 1 AS one").fetchone() == {"one": 1}


def _tcp_bounds(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    """(seconds of unanswered keepalives before an idle connection ends, milliseconds a sent
    statement may stay unacknowledged) as the kernel holds them for ``conn``'s socket."""
    sock = socket.socket(fileno=os.dup(conn.fileno()))
    try:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        idle = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE)
        interval = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL)
        count = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT)
        return idle + interval * count, sock.getsockopt(socket.IPPROTO_TCP, TCP_USER_TIMEOUT)
    finally:
        os.close(sock.detach())  # the duplicate; the connection keeps its own descriptor


def test_a_connection_to_a_vanished_primary_ends_before_patroni_promotes(
    settings: Settings,
) -> None:
    # A primary whose machine died sends no RST: without these bounds an idle pooled
    # connection lingers ~20 s and a statement in flight ~15 minutes (TCP retransmissions),
    # past the failover (Patroni's ttl, at least 20 s: docs/operations.md).
    pool = make_pool(settings, "tests-tcp-bounds", min_size=1, max_size=1, open_wait=True)
    try:
        with pool.connection() as conn:
            idle_bound, in_flight_ms = _tcp_bounds(conn)
    finally:
        pool.close()
    with connect(settings, "tests-tcp-bounds", direct=True) as conn:
        assert _tcp_bounds(conn) == (idle_bound, in_flight_ms)
    assert idle_bound <= 10
    assert 0 < in_flight_ms <= 10_000
    assert max(idle_bound, in_flight_ms / 1000) < TIMING.ttl
