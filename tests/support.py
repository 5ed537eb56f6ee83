"""Helpers shared by integration and e2e tests (real database, no mocks)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import psycopg
from psycopg_pool import ConnectionPool

from devtools.stack import ManagedProcess, Stack
from devtools.waiting import wait_for as wait_for  # the one poll loop, for the tests
from exportcore.db import Conn, Row
from exportcore.domain import ExportFormat, ExportRequest
from exportcore.settings import Settings
from exportcore.store.jobs import JobRow, job_claim, job_claim_many, job_fail_if_leased
from exportcore.store.tenants import tenant_upsert
from exportcore.submit import submit_export
from exportctl.importer import import_notes


def create_tenant(pool: ConnectionPool[Conn], tenant_id: str | None = None) -> str:
    """A new tenant with a unique id; returns the id."""
    tid = tenant_id or f"t-{uuid4().hex[:10]}"
    with pool.connection() as conn:
        tenant_upsert(conn, tenant_id=tid, name=tid)
    return tid


def tenant_with_notes(pool: ConnectionPool[Conn], notes_dir: Path) -> tuple[str, list[int]]:
    """A new tenant holding the real notes of ``notes_dir``; returns (tenant id, note ids)."""
    tid = create_tenant(pool)
    import_notes(pool, tid, notes_dir)
    with pool.connection() as conn:
        ids = [
            r["id"]
            for r in conn.execute("SELECT id FROM notes WHERE tenant_id = %s ORDER BY id", (tid,))
        ]
    return tid, ids


def submit(
    pool: ConnectionPool[Conn],
    settings: Settings,
    tenant_id: str,
    note_ids: list[int] | None,
    fmt: str = "json",
) -> Row:
    """Submit through the library path the API uses; returns the committed job row."""
    request = ExportRequest.build(ExportFormat(fmt), note_ids, note_ids is None)
    return submit_export(pool, settings, tenant_id=tenant_id, request=request, source="test").job


def failed(
    pool: ConnectionPool[Conn],
    settings: Settings,
    tenant_id: str,
    ids: list[int],
    code: str = "boom",
) -> Row:
    """A job failed through the real transitions (submit, claim, a permanent failure), with
    its open dead letter of reason ``code``; returns the failed job."""
    j = submit(pool, settings, tenant_id, ids[:2])
    with pool.connection() as conn:
        claimed = job_claim(conn, job_id=j["id"], message_id=None, lease_seconds=30)
        assert claimed is not None
        done = job_fail_if_leased(
            conn, job_id=j["id"], lease_token=claimed.token, error_code=code, error_detail="x"
        )
        assert done is not None
    return asdict(done)


def fast_worker(
    database_url: str,
    broker_url: str,
    artifact_dir: Path,
    log_dir: Path,
    extra_env: dict[str, str] | None = None,
) -> tuple[ManagedProcess, dict[str, str]]:
    """A real fast-worker process (``fast@<host>``, one prefork child) on these servers,
    started; returns it and its environment. The caller stops it."""
    stack = Stack.build(
        database_url=database_url,
        broker_url=broker_url,
        artifact_dir=artifact_dir,
        log_dir=log_dir,
        names=(),
        extra_env=extra_env,
    )
    proc = ManagedProcess(
        name="fast-worker",
        command=(
            "exec celery -A services.worker.app worker -Q exports.fast -n fast@%h "
            "--concurrency 1 --loglevel INFO"
        ),
        env=stack.env,
        log_path=log_dir / "fast-worker.log",
    )
    proc.start()
    return proc, stack.env


def running_jobs(
    pool: ConnectionPool[Conn], settings: Settings, tenant: tuple[str, list[int]], n: int
) -> list[JobRow]:
    """Submit ``n`` one-note exports of ``tenant`` (tenant id, note ids) and claim them all
    with a 30 s lease; the running rows (with their lease tokens), in id order."""
    tid, ids = tenant
    job_ids = [submit(pool, settings, tid, ids[i : i + 1])["id"] for i in range(n)]
    with pool.connection() as conn:
        rows = job_claim_many(
            conn, job_ids=job_ids, message_ids=[uuid4() for _ in job_ids], lease_seconds=30
        )
    return sorted(rows, key=lambda r: r.id)


def waits_on_lock(watch: psycopg.Connection[Any], pid: int) -> bool:
    """True while the backend ``pid`` waits for a lock (pg_stat_activity; ``watch`` is an
    autocommit connection)."""
    row = watch.execute(
        "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'", (pid,)
    ).fetchone()
    return row is not None


def job(pool: ConnectionPool[Conn], job_id: UUID) -> Row:
    """The current job row (raises if missing)."""
    with pool.connection() as conn:
        row = conn.execute("SELECT * FROM export_jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None, f"job {job_id} does not exist"
    return row


def shift_job(pool: ConnectionPool[Conn], job_id: UUID, **intervals: str) -> None:
    """Move one job's timestamps, e.g. ``shift_job(p, id, lease_expires_at='-1 hour')``.

    This is how tests make time pass for one job without sleeping.
    """
    allowed = {
        "lease_expires_at",
        "next_attempt_at",
        "deadline_at",
        "last_dispatched_at",
        "created_at",
    }
    assert set(intervals) <= allowed, set(intervals) - allowed
    sets = ", ".join(f"{col} = {col} + %s::interval" for col in intervals)
    with pool.connection() as conn:
        conn.execute(f"UPDATE export_jobs SET {sets} WHERE id = %s", (*intervals.values(), job_id))  # type: ignore[arg-type]


def events(pool: ConnectionPool[Conn], job_id: UUID) -> list[Row]:
    """The job's history rows, oldest first."""
    with pool.connection() as conn:
        return conn.execute(
            "SELECT * FROM export_job_events WHERE job_id = %s ORDER BY id", (job_id,)
        ).fetchall()


def kinds(pool: ConnectionPool[Conn], job_id: UUID) -> list[str]:
    """The kinds of the job's history rows, oldest first (``["submitted", "claimed", ...]``)."""
    return [e["kind"] for e in events(pool, job_id)]


def dead_letter(pool: ConnectionPool[Conn], job_id: UUID) -> Row:
    """The job's row in ``export_dead_letters`` (fails the test when it has none)."""
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT * FROM export_dead_letters WHERE job_id = %s", (job_id,)
        ).fetchone()
    assert row is not None, f"job {job_id} has no dead letter"
    return row


def assert_attempts_exhausted(pool: ConnectionPool[Conn], job_id: UUID, attempts: int) -> Row:
    """The job ended ``failed`` with ``attempts_exhausted`` after ``attempts`` attempts;
    returns its dead letter for the caller's own checks of reason and detail."""
    row = job(pool, job_id)
    assert (row["status"], row["attempts"], row["error_code"]) == (
        "failed",
        attempts,
        "attempts_exhausted",
    )
    return dead_letter(pool, job_id)


def count(pool: ConnectionPool[Conn], sql: str, *params: Any) -> int:
    """The single integer a counting query returns."""
    with pool.connection() as conn:
        row = conn.execute(sql, params).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return int(next(iter(row.values())))


class _FixedAnswer(http.server.BaseHTTPRequestHandler):
    """Answers every request the way a failing S3 endpoint does: ``status`` and an S3 XML
    error body with ``code`` (e.g. 503 SlowDown when throttling, 403 AccessDenied)."""

    status = 503
    code = "SlowDown"

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>'
            f"<Error><Code>{self.code}</Code><Message>refused by the test</Message></Error>"
        ).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        pass


class FailingS3:
    """Real HTTP servers on loopback that fail every S3 request with a fixed error.

    ``with FailingS3() as start: endpoint = start(503, "SlowDown")`` returns the endpoint
    URL of a new server; every server is stopped when the block ends.
    """

    def __init__(self) -> None:
        self.servers: list[http.server.ThreadingHTTPServer] = []

    def __enter__(self) -> Callable[[int, str], str]:
        return self.start

    def start(self, status: int, code: str) -> str:
        handler = type("Handler", (_FixedAnswer,), {"status": status, "code": code})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    def __exit__(self, *exc: object) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()


def multiply_notes(conn: Any, tenant_id: str, target_bytes: int) -> tuple[int, int]:
    """Grow a tenant's notes to about ``target_bytes`` of content by copying its real notes
    (imported from real documents) as many times as needed, inside PostgreSQL. Returns
    (notes, content bytes) of the tenant afterwards. ``conn`` is a psycopg connection.

    The copies follow each other as whole collections (copy 1 of every note, then copy 2...)
    in a fixed order: without ORDER BY the planner may emit the 15 copies of one large
    document next to each other, and an export's chunks would differ from run to run."""
    row = conn.execute(
        "SELECT count(*), coalesce(sum(octet_length(content)), 0) FROM notes WHERE tenant_id = %s",
        (tenant_id,),
    ).fetchone()
    count_, size = (row["count"], row["coalesce"]) if isinstance(row, dict) else row
    assert size > 0, f"tenant {tenant_id} has no notes to copy"
    copies = max(0, -(-target_bytes // size) - 1)
    conn.execute(
        "INSERT INTO notes (tenant_id, source_path, title, content, pinned, updated_at)"
        " SELECT n.tenant_id, n.source_path || '#copy-' || g, n.title || ' (copy ' || g || ')',"
        "        n.content, n.pinned, n.updated_at"
        " FROM notes n CROSS JOIN generate_series(1, %s) AS g"
        " WHERE n.tenant_id = %s"
        " ORDER BY g, n.id",
        (copies, tenant_id),
    )
    return count_ * (copies + 1), size * (copies + 1)
