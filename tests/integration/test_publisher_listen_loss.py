"""The publisher's LISTEN session lost and found again, on a real publisher process (the
Procfile's line), real PostgreSQL and real Redis: while nothing LISTENs, the poll every
``PUBLISHER_POLL_SECONDS`` still dispatches what is submitted (its NOTIFY is heard by
nobody); once LISTEN is back, a submit is dispatched by its NOTIFY again, well before the
next poll. (docs/operations.md, "High availability"; the failover drills only wait for the
LISTEN to come back.)

The LISTEN session is the one connection the publisher opens over ``DATABASE_DIRECT_URL``:
here that URL logs in as a role of this test, so ``ALTER ROLE … NOLOGIN`` keeps the
publisher from opening it again (what a primary that does not answer yet does) while its
pool, on ``DATABASE_URL``, works on; ``LOGIN`` lets it back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit
from uuid import UUID, uuid4

import psycopg
import pytest
import redis
from psycopg_pool import ConnectionPool

from devtools.probe import DatabaseProbe
from devtools.stack import ManagedProcess, Stack
from devtools.waiting import wait_for
from exportcore.db import Conn
from exportcore.domain import FAST_QUEUE
from exportcore.publisher import MARK_DELAY_SECONDS
from exportcore.settings import Settings
from tests.support import submit

POLL_SECONDS = 4.0
"""``PUBLISHER_POLL_SECONDS`` of the publisher under test: long enough that a dispatch
within :data:`NOTIFY_BUDGET` of a submit cannot be a poll, short enough for the test."""
JITTER = 0.2
"""``ServiceLoop``'s default jitter: an idle wait lasts 0.8 to 1.2 times the poll interval."""
POLL_BUDGET = POLL_SECONDS * (1 + JITTER) + MARK_DELAY_SECONDS + 3.0
"""Submit → dispatch recorded, without LISTEN: the longest idle wait, the publisher's own
mark of its send (no worker runs here to claim and mark it), and slack for a loaded
machine."""
NOTIFY_BUDGET = 2.0
"""Submit → message in Redis, with LISTEN. A reconnected LISTEN is followed by a pass (the
publisher looks for what was submitted meanwhile), which starts an idle wait of at least
0.8 x POLL_SECONDS = 3.2 s: a dispatch this soon after a submit made right after the
reconnect was woken by the submit's NOTIFY, not by the poll."""
LISTEN_SQL = (
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
    " AND application_name = 'exports-publisher-listen' AND query ILIKE 'LISTEN%%'"
    " AND state = 'idle'"
)
"""The backends of the publisher's LISTEN session (as the failover drills find it), once
their LISTEN has committed (idle after it: a NOTIFY committed from then on is heard)."""


@pytest.fixture
def listen_role(database_url: str) -> Iterator[tuple[str, str]]:
    """A login role of this test and the test database's URL that logs in as it (the
    publisher's ``DATABASE_DIRECT_URL``): ``(role, url)``. Dropped after the test."""
    role = f"listen_{uuid4().hex[:12]}"
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
    url = urlsplit(database_url)
    yield role, urlunsplit(url._replace(netloc=f"{role}@{url.hostname}:{url.port}"))
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(f"DROP ROLE IF EXISTS {role}")


@pytest.fixture
def publisher(
    database_url: str,
    broker_url: str,
    artifact_dir: Path,
    tmp_path: Path,
    listen_role: tuple[str, str],
) -> Iterator[ManagedProcess]:
    """The publisher process, started as the e2e stacks start it, LISTENing as
    ``listen_role``; stopped (TERM, exit 0) after the test."""
    _, direct_url = listen_role
    stack = Stack.build(
        database_url=database_url,
        broker_url=broker_url,
        artifact_dir=artifact_dir,
        log_dir=tmp_path / "logs",
        names=("publisher",),
        extra_env={
            "DATABASE_DIRECT_URL": direct_url,
            "PUBLISHER_POLL_SECONDS": str(POLL_SECONDS),
            # no worker claims the first message: room ahead for the second one, whose
            # NOTIFY would otherwise be left for a claim's report (exportcore.publisher)
            "PUBLISHER_MESSAGES_AHEAD": "2",
        },
    )
    stack.start(wait=False)
    proc = stack.procs["publisher"]
    try:
        yield proc
    finally:
        assert proc.stop(30) == 0, proc.log_text()[-3000:]


def _sent_message_ids(broker_url: str) -> set[str]:
    """The task ids (= outbox event ids) of the messages waiting in ``exports.fast``."""
    raw = redis.Redis.from_url(broker_url).lrange(FAST_QUEUE, 0, -1)
    return {json.loads(m)["headers"]["id"] for m in raw}


def test_lost_listen_falls_back_to_polling_and_comes_back(
    publisher: ManagedProcess,
    listen_role: tuple[str, str],
    pool: ConnectionPool[Conn],
    settings: Settings,
    tenant: tuple[str, list[int]],
) -> None:
    """An export submitted while the LISTEN session is gone is dispatched by the poll before
    LISTEN may come back; LISTEN then comes back in a new backend and the next submit is
    sent at once, by its NOTIFY."""
    role, _ = listen_role
    tid, ids = tenant
    db = DatabaseProbe(settings.database_dsn)

    def log_tail() -> str:
        return "publisher log:\n" + publisher.log_text()[-3000:]

    def running() -> None:
        if not publisher.alive:
            raise AssertionError("the publisher exited\n" + log_tail())

    def listening() -> list[int]:
        return [r["pid"] for r in db.sql(LISTEN_SQL)]

    def backend_gone(pid: int) -> bool:
        return not db.sql("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,))

    def event_id(job_id: UUID) -> str:
        [event] = db.outbox(job_id)
        return str(event["id"])

    def dispatched(job_id: UUID) -> bool:
        [event] = db.outbox(job_id)
        return event["sent_at"] is not None and db.job(job_id)["dispatch_count"] == 1

    try:
        [first] = wait_for(
            listening, 60, "the publisher's LISTEN session", check=running, detail=log_tail
        )

        # The LISTEN session ends and cannot be opened again; the pool is untouched.
        db.sql(f"ALTER ROLE {role} NOLOGIN")
        [ended] = db.sql("SELECT pg_terminate_backend(%s) AS ended", (first,))
        assert ended["ended"], "pg_terminate_backend did not end the LISTEN backend"
        wait_for(lambda: backend_gone(first), 10, "the LISTEN backend to end", check=running)
        assert not listening()

        # Submitted while nothing LISTENs: its NOTIFY reaches nobody, the poll sends it.
        lost = submit(pool, settings, tid, ids[:1])["id"]
        wait_for(
            lambda: dispatched(lost),
            POLL_BUDGET,
            "the export submitted without LISTEN to be dispatched by the poll",
            check=running,
            detail=log_tail,
        )
        assert event_id(lost) in _sent_message_ids(settings.broker_url)
        assert not listening(), "the dispatch came before the LISTEN was allowed back"
        # one warning per loss, however many reconnects failed meanwhile (one a second)
        assert publisher.log_text().count("LISTEN connection lost; polling") == 1

        # LISTEN comes back in a new session, and a submit is dispatched by its NOTIFY.
        db.sql(f"ALTER ROLE {role} LOGIN")
        [again] = wait_for(
            listening,
            POLL_BUDGET,
            "the publisher's LISTEN session to come back",
            check=running,
            detail=log_tail,
        )
        assert again != first
        wait_for(
            lambda: "LISTEN connection back" in publisher.log_text(),
            POLL_BUDGET,
            "the publisher to log that its LISTEN is back",
            check=running,
        )
        heard = submit(pool, settings, tid, ids[1:2])["id"]
        wait_for(
            lambda: event_id(heard) in _sent_message_ids(settings.broker_url),
            NOTIFY_BUDGET,
            "the export submitted after LISTEN came back to be sent at once (its NOTIFY)",
            check=running,
            detail=log_tail,
        )
        wait_for(
            lambda: dispatched(heard),
            MARK_DELAY_SECONDS + 3.0,
            "the NOTIFY-woken dispatch to be recorded",
            check=running,
            detail=log_tail,
        )
    finally:
        db.close()
