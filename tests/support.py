"""Helpers shared by integration and e2e tests (real database, no mocks)."""

from __future__ import annotations

import http.server
import re
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
            "exec celery -A services.worker.app worker -Q exports.fast -n fast@%h --concurrency 1"
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


def idle_wakes(publisher: Any, act: Callable[[], object], timeout: float = 10.0) -> bool:
    """Whether ``publisher.idle`` (its LISTEN, opened first as the loop does) returns
    within ``timeout`` seconds of ``act()`` (a submit, whose NOTIFY should wake it)."""
    publisher._listen_conn()
    stop, woke = threading.Event(), threading.Event()

    def wait() -> None:
        publisher.idle(60.0, stop)
        woke.set()

    t = threading.Thread(target=wait)
    t.start()
    try:
        act()
        return woke.wait(timeout)
    finally:
        stop.set()
        t.join()


class OtlpReceiver:
    """A real OTLP/HTTP trace receiver on loopback (``POST /v1/traces``, protobuf, as an
    OpenTelemetry Collector's ``otlphttp`` receiver), decoding with the OpenTelemetry proto
    library: a process exporting with ``OTEL_TRACES_EXPORTER=otlp`` to :attr:`endpoint`
    goes through the SDK's real batch processor and OTLP exporter.

    ``spans()`` returns every span received so far as ``{name, service, trace_id, span_id,
    parent_id, attributes: {key: str}, links: [{trace_id, span_id}]}`` (ids in hex).
    """

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        received: list[dict[str, Any]] = []
        lock = threading.Lock()

        def value(v: Any) -> str:
            kind = v.WhichOneof("value")
            return "" if kind is None else str(getattr(v, kind))

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                request = ExportTraceServiceRequest.FromString(body)
                spans = []
                for rs in request.resource_spans:
                    resource = {kv.key: value(kv.value) for kv in rs.resource.attributes}
                    for ss in rs.scope_spans:
                        for s in ss.spans:
                            spans.append(
                                {
                                    "name": s.name,
                                    "service": resource.get("service.name"),
                                    "trace_id": s.trace_id.hex(),
                                    "span_id": s.span_id.hex(),
                                    "parent_id": s.parent_span_id.hex() or None,
                                    "attributes": {kv.key: value(kv.value) for kv in s.attributes},
                                    "links": [
                                        {"trace_id": ln.trace_id.hex(), "span_id": ln.span_id.hex()}
                                        for ln in s.links
                                    ],
                                }
                            )
                with lock:
                    received.extend(spans)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self._received, self._lock = received, lock
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def spans(self) -> list[dict[str, Any]]:
        """Every span received so far."""
        with self._lock:
            return list(self._received)

    def close(self) -> None:
        """Stop the server."""
        self.server.shutdown()
        self.server.server_close()


# The spans every export leaves in its trace (besides the HTTP and Celery spans), by the
# process that records them: the api (submit), the publisher or the claim that took it
# (publish), the worker (claim, render, write, finish). docs/observability.md.
EXPORT_SPANS = (
    "exports.submit",
    "exports.publish",
    "exports.claim",
    "exports.render",
    "exports.write",
    "exports.finish",
)


def trace_gaps(spans: list[dict[str, Any]], job_ids: list[str]) -> list[str]:
    """What the received ``spans`` (:meth:`OtlpReceiver.spans`) still lack of the traces of
    ``job_ids``: a span of :data:`EXPORT_SPANS` carrying the job's id, or a span that one of
    the job's spans names as its parent or links to (the HTTP request span, the Celery task
    span: processes export in batches, at their own pace). Empty once everything arrived;
    for a wait, before the checks below."""
    received = {s["span_id"] for s in spans}
    gaps: list[str] = []
    for job_id in job_ids:
        mine = [s for s in spans if s["attributes"].get("job_id") == job_id]
        names = {s["name"] for s in mine}
        gaps += [f"{job_id}: no {name}" for name in EXPORT_SPANS if name not in names]
        for s in mine:
            if s["parent_id"] is not None and s["parent_id"] not in received:
                gaps.append(f"{job_id}: the parent of {s['name']}")
            if any(link["span_id"] not in received for link in s["links"]):
                gaps.append(f"{job_id}: the link of {s['name']}")
    return gaps


def one_trace(
    spans: list[dict[str, Any]], job_id: str
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The spans carrying ``job_id`` (asserted to lie in ONE trace: one export, one trace)
    and every span of that trace by span id."""
    mine = [s for s in spans if s["attributes"].get("job_id") == job_id]
    traces = {s["trace_id"] for s in mine}
    assert len(traces) == 1, f"spans of {job_id} spread over {len(traces)} traces"
    trace_id = traces.pop()
    return mine, {s["span_id"]: s for s in spans if s["trace_id"] == trace_id}


def assert_claim_tree(mine: list[dict[str, Any]], attempts: int) -> None:
    """A job's spans (``mine``, of :func:`one_trace`) hold ``attempts`` claim spans, each
    with the job's ``job_id``, ``message_id``, ``lease_token``, ``attempt``, ``queue`` and
    ``tenant_id``; every render, write and finish span is a child of one of them and carries
    its ``message_id`` and ``lease_token``; one write and one finish (the attempt that
    succeeded)."""
    claims = {s["span_id"]: s for s in mine if s["name"] == "exports.claim"}
    assert len(claims) == attempts
    for claim in claims.values():
        assert {"job_id", "message_id", "lease_token", "attempt", "queue", "tenant_id"} <= set(
            claim["attributes"]
        ), claim["attributes"]
    for name in ("exports.render", "exports.write", "exports.finish"):
        for span in (s for s in mine if s["name"] == name):
            claim = claims.get(span["parent_id"])
            assert claim is not None, f"{name} is not a child of a claim"
            for key in ("message_id", "lease_token"):
                assert span["attributes"].get(key) == claim["attributes"][key], (
                    f"{name} carries another {key} than its claim"
                )
    assert sum(s["name"] == "exports.finish" for s in mine) == 1
    assert sum(s["name"] == "exports.write" for s in mine) == 1
    for span in mine:
        if span["name"] == "exports.finish":
            assert {"job_id", "lease_token", "attempt", "queue", "tenant_id"} <= set(
                span["attributes"]
            )


def assert_batch_traces(spans: list[dict[str, Any]], job_ids: list[str]) -> list[list[str]]:
    """Check one trace per export for exports that each ran once, whatever batch they ran
    in, and return the batches the spans show: the job ids each claim took, the message's
    own job first, largest batch first. ``job_ids`` must hold every job of those claims
    (each claim's ``batch_jobs`` is compared with its batch).

    For every job: one trace holds its HTTP request span (``POST /v1/exports``), its
    ``exports.submit`` span (a child of it), one ``exports.publish`` span (a child of the
    submit span) and one claim (:func:`assert_claim_tree`) with the publish span's
    ``message_id``. A message's own job: the publisher's span, its claim a child of the
    Celery task span. A job the claim of another job's message took from the outbox
    (``dispatched_by: claim``): the publish span is the worker's, linked to that message's
    task span (the parent of the other job's claim, in the other job's trace), and its claim
    is a child of it (docs/observability.md)."""
    own: dict[str, dict[str, Any]] = {}  # message id -> its own job's claim span
    taken: list[tuple[dict[str, Any], dict[str, Any]]] = []  # (publish, claim) spans
    claims: dict[str, dict[str, Any]] = {}
    for job_id in job_ids:
        mine, whole = one_trace(spans, job_id)
        [submit] = [s for s in mine if s["name"] == "exports.submit"]
        [publish] = [s for s in mine if s["name"] == "exports.publish"]
        [claim] = [s for s in mine if s["name"] == "exports.claim"]
        request = whole.get(submit["parent_id"] or "")
        assert request is not None and request["name"].startswith("POST /v1/exports"), (
            f"the submit span of {job_id} is not a child of its HTTP request span"
        )
        assert publish["parent_id"] == submit["span_id"]
        assert publish["attributes"]["message_id"]
        assert claim["attributes"]["message_id"] == publish["attributes"]["message_id"]
        if publish["attributes"].get("dispatched_by") == "claim":
            assert claim["parent_id"] == publish["span_id"]
            taken.append((publish, claim))
        else:
            task = whole.get(claim["parent_id"] or "")
            assert task is not None and task["name"].startswith("run/"), (
                f"the claim of {job_id} is not a child of its message's task span"
            )
            own[publish["attributes"]["message_id"]] = claim
        assert_claim_tree(mine, 1)
        claims[job_id] = claim
    batches = {message: [claim["attributes"]["job_id"]] for message, claim in own.items()}
    for publish, claim in taken:
        carrier = own.get(publish["attributes"].get("carrier", ""))
        assert carrier is not None, f"{publish['attributes']} names no message of these jobs"
        [link] = publish["links"]
        assert link == {"trace_id": carrier["trace_id"], "span_id": carrier["parent_id"]}, (
            "a taken job's publish span does not link to its message's task span"
        )
        assert link["trace_id"] != publish["trace_id"]
        batches[publish["attributes"]["carrier"]].append(claim["attributes"]["job_id"])
    for batch in batches.values():
        for job_id in batch:
            assert claims[job_id]["attributes"]["batch_jobs"] == str(len(batch)), (
                f"the claim of {job_id} took {claims[job_id]['attributes']['batch_jobs']}"
                f" jobs; its batch in the spans has {len(batch)}"
            )
    return sorted(batches.values(), key=len, reverse=True)


class StepClock:
    """A monotonic clock a test moves by hand (``advance``), starting at the real one."""

    def __init__(self) -> None:
        import time

        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` forward."""
        self.now += seconds


def key_cache_clock(app: Any) -> StepClock:
    """Put a :class:`StepClock` under the api app's API-key cache (``API_KEY_CACHE_SECONDS``);
    returns it, for the test to make a cached key's time run out."""
    clock = StepClock()
    app.state.key_cache.clock = clock
    return clock


def run_queued(coalescer: Any, gate: threading.Event, threads: list[threading.Thread]) -> None:
    """Run concurrent submits through a submit coalescer (``exportcore.coalesce``) whose
    first lone write is held until ``gate`` is set: the first thread writes, the others
    queue behind it, then the gate opens and every thread is joined."""
    threads[0].start()
    wait_for(lambda: coalescer._writing, 10, "the first submit writing (held at the gate)")
    for t in threads[1:]:
        t.start()
    wait_for(lambda: len(coalescer._waiting) == len(threads) - 1, 10, "the others waiting")
    gate.set()
    for t in threads:
        t.join(30)


CONSOLE_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
CONSOLE_LOGIN_TOKEN = re.compile(r'name="login_token" value="([^"]+)"')


def console_sign_in(client: Any, key: str) -> str:
    """Sign in to the console of ``client`` (a ``TestClient`` of the api) with the operator
    ``key`` through its form; returns the session's CSRF token, as the overview's forms
    carry it."""
    token = CONSOLE_LOGIN_TOKEN.search(client.get("/console/login").text)
    assert token
    r = client.post(
        "/console/login",
        data={"key": key, "login_token": token.group(1), "next": "/console/"},
        follow_redirects=False,
    )
    assert r.status_code == 303, r.text
    m = CONSOLE_CSRF.search(client.get("/console/").text)
    assert m
    return m.group(1)
