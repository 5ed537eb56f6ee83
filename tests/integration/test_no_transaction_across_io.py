"""docs/architecture.md INV-13 no-transaction-across-io, tested directly: no transaction is
open while the publisher sends to the broker, a worker writes an artifact (writes, commits,
the batch's overlapped commit, deletes) or a checkpoint (its durable flush, a takeover's copy
of the prefix), or webhook-delivery makes its HTTP request.

The real code paths run on real PostgreSQL, Redis, the file store, an S3-compatible server
and a loopback receiver; a :class:`~tests.integration.transaction_watch.TransactionWatch`
wraps each I/O call and asks PostgreSQL, at the call's start and end, whether a transaction
of the test's database was held across it (``pg_stat_activity``, not the code's own
bookkeeping). Each test also checks that the boundaries it watches were crossed, so a path
that silently stopped doing I/O cannot pass for one that keeps the invariant, and
:func:`test_the_watch_sees_a_transaction_held_across_a_call` shows the watch catches what it
is for.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any
from uuid import uuid4

import httpcore
import kombu.messaging
import pytest

from devtools.webhook_receiver import Receiver
from exportcore.artifacts import ArtifactStore, ArtifactWriter, open_store
from exportcore.broker import make_celery
from exportcore.db import transaction
from exportcore.publisher import Publisher, PublisherConfig
from exportcore.recovery import RecoveryScanner
from exportcore.render import NoteRecord
from exportcore.runner import JobRunner
from exportcore.settings import Settings
from exportcore.webhooks import endpoints
from exportcore.webhooks.delivery import WebhookDelivery
from tests.integration.transaction_watch import TransactionWatch
from tests.support import events, job, multiply_notes, shift_job, submit

WRITER_IO = ("write", "sync", "commit", "abort")
STORE_IO = ("commit_all", "drop_prefix", "delete")


@pytest.fixture
def watch(database_url: str) -> Iterator[TransactionWatch]:
    w = TransactionWatch(database_url)
    yield w
    w.close()


def watched_store(
    store: ArtifactStore, watch: TransactionWatch, monkeypatch: pytest.MonkeyPatch
) -> ArtifactStore:
    """``store`` (any backend) with its I/O watched: every writer it opens or resumes, and
    its batch commit, prefix drop and delete."""

    def watched_writer(writer: ArtifactWriter) -> ArtifactWriter:
        for name in WRITER_IO:
            watch.patch(monkeypatch, writer, name, f"artifact.{name}")
        return writer

    open_writer = store.open_writer
    monkeypatch.setattr(store, "open_writer", lambda key: watched_writer(open_writer(key)))
    resume_writer = store.resume_writer

    def resume(key: str, prefix: Any) -> Any:
        writer, durable = resume_writer(key, prefix)
        return watched_writer(writer), durable

    monkeypatch.setattr(store, "resume_writer", watch.wrap("checkpoint.resume_writer", resume))
    for name in STORE_IO:
        watch.patch(monkeypatch, store, name, f"artifact.{name}")
    return store


def assert_no_transaction_held(watch: TransactionWatch, *boundaries: str) -> None:
    """Every boundary named was crossed, and no transaction was held across any call."""
    missing = [b for b in boundaries if not watch.calls[b]]
    assert not missing, f"never crossed: {missing}; calls: {dict(watch.calls)}"
    assert not watch.held, "INV-13 broken:\n" + watch.report()


def test_the_watch_sees_a_transaction_held_across_a_call(pool, watch: TransactionWatch) -> None:
    """The watch is not vacuous: a call inside a transaction of the code's own pool is
    reported (with the backend and its last statement); a transaction committed before the
    call, or a statement on another connection, is not."""
    io = watch.wrap("io", lambda: None)
    with pool.connection() as conn:
        conn.execute("SELECT 1 AS before_the_call")
    io()
    assert not watch.held
    with transaction(pool) as conn:
        conn.execute("SELECT 2 AS inside_the_transaction")
        io()
    [held] = watch.held
    assert held.boundary == "io" and held.application_name == "tests"
    assert "inside_the_transaction" in held.query
    watch.held.clear()
    with transaction(pool) as conn:  # a transaction that writes has an xid
        conn.execute("CREATE TEMP TABLE t (x int)")
        io()
    [held] = watch.held
    assert held.backend_xid is not None


def test_the_publisher_sends_outside_any_transaction(
    pool, settings: Settings, tenant, watch: TransactionWatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    tid, ids = tenant
    jobs = [submit(pool, settings, tid, ids[:2]) for _ in range(3)]
    jobs.append(submit(pool, settings, tid, None))  # a bulk one, on the other queue
    # Every message the publisher sends goes through kombu's Producer.publish.
    watch.patch(monkeypatch, kombu.messaging.Producer, "publish", "broker.publish")
    config = replace(PublisherConfig.from_settings(settings), messages_ahead=len(jobs))
    publisher = Publisher(settings, pool, make_celery(settings), config=config)
    counts = publisher.run_once()
    assert counts["published"] == len(jobs), counts
    assert publisher.flush() >= 0
    assert watch.calls["broker.publish"] == len(jobs)
    assert_no_transaction_held(watch, "broker.publish")


@pytest.mark.parametrize("backend", ["file", "s3"])
def test_a_worker_writes_and_commits_artifacts_outside_any_transaction(
    pool,
    backend: str,
    request: pytest.FixtureRequest,
    tenant,
    watch: TransactionWatch,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch of small exports (the overlapped commit of several writers) and a refused
    finish's delete, on the folder store and on S3."""
    settings: Settings = request.getfixturevalue("settings" if backend == "file" else "s3_settings")
    tid, ids = tenant
    jobs = [submit(pool, settings, tid, ids[i : i + 4])["id"] for i in range(3)]
    store = watched_store(open_store(settings), watch, monkeypatch)
    runner = JobRunner(settings, pool, store)
    outcomes = runner.run_batch([(j, uuid4()) for j in jobs], queue="exports.fast")
    assert [o.result for o in outcomes] == ["succeeded"] * 3
    # A finish refused (its lease expired meanwhile): the rendered artifact is deleted.
    late = submit(pool, settings, tid, ids[:3])["id"]
    original_finish = runner._finish

    def expire_then_finish(stored: Any) -> None:
        shift_job(pool, late, lease_expires_at="-1 hour")
        original_finish(stored)

    monkeypatch.setattr(runner, "_finish", expire_then_finish)
    assert runner.run(late, uuid4()).result == "finish_refused"
    assert_no_transaction_held(
        watch, "artifact.write", "artifact.commit_all", "artifact.commit", "artifact.delete"
    )


def test_a_bulk_worker_checkpoints_and_takes_over_outside_any_transaction(
    pool, settings: Settings, tenant, watch: TransactionWatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bulk render checkpoints as it goes (a durable flush of the prefix, then the
    checkpoint's statement), stops with its lease lost, and the next claim takes the
    checkpoint over (copies the prefix under its own token, drops the old one) and
    finishes."""
    settings = settings.model_copy(update={"checkpoint_bytes": 32 * 1024})
    tid, _ = tenant
    with pool.connection() as conn:
        multiply_notes(conn, tid, 512 * 1024)
    row = submit(pool, settings, tid, None, fmt="ndjson")
    assert row["queue"] == "exports.bulk"
    store = watched_store(open_store(settings), watch, monkeypatch)

    # The lease is lost after half the notes, as when the worker stalls past its expiry.
    rendered = 0
    original = NoteRecord.from_row

    def from_row(r: dict[str, Any]) -> NoteRecord:
        nonlocal rendered
        rendered += 1
        if rendered == row["note_count"] // 2:
            shift_job(pool, row["id"], lease_expires_at="-1 hour")
        return original(r)

    monkeypatch.setattr("exportcore.runner.NoteRecord.from_row", staticmethod(from_row))
    first = JobRunner(settings, pool, store).run(row["id"], uuid4())
    assert first.result == "lease_lost"
    RecoveryScanner(settings, pool, store).recover_expired_leases()
    shift_job(pool, row["id"], next_attempt_at="-1 hour")
    second = JobRunner(settings, pool, store).run(row["id"], uuid4())
    assert second.result == "succeeded", second
    assert "resumed" in [e["kind"] for e in events(pool, row["id"])]
    assert job(pool, row["id"])["status"] == "succeeded"
    assert_no_transaction_held(
        watch,
        "artifact.write",
        "artifact.sync",
        "checkpoint.resume_writer",
        "artifact.drop_prefix",
        "artifact.commit",
    )


def test_webhook_delivery_sends_outside_any_transaction(
    pool, settings: Settings, tenant, watch: TransactionWatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each attempt's HTTP request (on the sender threads, while the delivery loop runs its
    passes) is made with no transaction open."""
    settings = settings.model_copy(
        update={
            "webhook_allow_http": True,
            "webhook_allow_private_networks": True,
            "webhook_poll_seconds": 0.05,
        }
    )
    tid, ids = tenant
    # Every request of the sender goes through httpcore's pool.
    watch.patch(monkeypatch, httpcore.ConnectionPool, "handle_request", "webhook.http")
    delivery = WebhookDelivery(settings, pool)
    try:
        with Receiver() as receiver:
            ep = endpoints.create_endpoint(pool, settings, tenant_id=tid, url=receiver.url + "/h")
            receiver.secrets = [ep["secret"]]
            for _ in range(3):
                j = submit(pool, settings, tid, ids[:2])
                runner = JobRunner(settings, pool, open_store(settings))
                assert runner.run(j["id"], uuid4()).result == "succeeded"
            stop = threading.Event()
            deadline = time.monotonic() + 30
            while len(receiver.received) < 3 or delivery.in_flight:
                assert time.monotonic() < deadline, f"received {len(receiver.received)} of 3"
                # the passes run while attempts are in flight, as in the service loop
                counts = delivery.run_once()
                delivery.idle(delivery.next_wait(counts, 0.05), stop)
            delivery.run_once()  # records the attempts
    finally:
        delivery.close(timeout=5)
    assert watch.calls["webhook.http"] >= 3
    assert_no_transaction_held(watch, "webhook.http")
