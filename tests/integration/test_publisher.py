"""The outbox publisher against real PostgreSQL and a real Redis broker."""

from __future__ import annotations

import base64
import json
import threading
from uuid import uuid4

import pytest
import redis

from devtools.stack import free_port
from exportcore import metrics
from exportcore.broker import EXPORT_BATCH_TASK, EXPORT_TASK, make_celery
from exportcore.publisher import Publisher
from exportcore.settings import Settings
from exportcore.store.outbox import outbox_mark_sent_and_claim_due
from exportcore.store.tenants import tenant_set_in_flight
from tests.support import count, events, idle_wakes, job, submit


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The publishing mechanics without the broker window (no worker drains the broker
    here); the window's own tests below turn it on."""
    return settings.model_copy(update={"publisher_broker_window": 0})


def _messages(broker_url: str, queue: str) -> list[dict]:
    r = redis.Redis.from_url(broker_url)
    return [json.loads(m) for m in r.lrange(queue, 0, -1)]


def _job_ids(msg: dict) -> list[str]:
    """The job ids a message carries (one-job or batch message)."""
    args, _, _ = json.loads(base64.b64decode(msg["body"]))
    if msg["headers"]["task"] == EXPORT_TASK:
        return [args[0]]
    assert msg["headers"]["task"] == EXPORT_BATCH_TASK
    job_ids, message_ids = args
    assert len(job_ids) == len(message_ids) and msg["headers"]["id"] == message_ids[0]
    return list(job_ids)


def test_publishes_job_id_only_with_event_id_as_task_id(pool, settings: Settings, tenant) -> None:
    tid, ids = tenant
    small = submit(pool, settings, tid, ids[:2])
    big = submit(pool, settings, tid, None)
    publisher = Publisher(settings, pool, make_celery(settings))
    counts = publisher.run_once()
    assert counts == {
        "claimed": 2,
        "published": 2,
        "failed": 0,
        "messages": 2,
        "marked": 0,
        "held": 0,
    }
    # the next pass marks them sent (in its claim statement), whether or not it claims more
    assert publisher.run_once() == {
        "claimed": 0,
        "published": 0,
        "failed": 0,
        "messages": 0,
        "marked": 2,
        "held": 0,
    }

    with pool.connection() as conn:
        outbox = {r["job_id"]: r for r in conn.execute("SELECT * FROM export_outbox").fetchall()}
    for row, queue in ((small, "exports.fast"), (big, "exports.bulk")):
        [msg] = _messages(settings.broker_url, queue)
        assert msg["headers"]["task"] == EXPORT_TASK
        assert msg["headers"]["id"] == str(outbox[row["id"]]["id"])
        args, kwargs, _ = json.loads(base64.b64decode(msg["body"]))
        assert args == [str(row["id"])] and kwargs == {}
        assert outbox[row["id"]]["sent_at"] is not None
        assert job(pool, row["id"])["last_dispatched_at"] is not None
        assert job(pool, row["id"])["dispatch_count"] == 1
        assert [e["kind"] for e in events(pool, row["id"])] == ["submitted", "dispatched"]
    assert publisher.run_once()["claimed"] == 0 and publisher.flush() == 0


def test_broker_down_keeps_events_pending_and_retries_later(
    pool, settings: Settings, tenant
) -> None:
    tid, ids = tenant
    row = submit(pool, settings, tid, ids[:1])
    down = settings.model_copy(
        update={
            "celery_broker_url": f"redis://127.0.0.1:{free_port()}/0",
            "broker_publish_timeout": 1.0,
        }
    )
    publisher = Publisher(down, pool, make_celery(down))
    counts = publisher.run_once()
    assert counts["failed"] == 1 and counts["published"] == 0
    with pool.connection() as conn:
        ev = conn.execute("SELECT * FROM export_outbox WHERE job_id = %s", (row["id"],)).fetchone()
    assert ev["sent_at"] is None and ev["claim_token"] is None
    assert ev["last_error"] and ev["available_at"] > ev["created_at"]
    assert job(pool, row["id"])["dispatch_count"] == 0
    assert "dispatched" not in [e["kind"] for e in events(pool, row["id"])]

    # The broker is back and the backoff has passed: the same event is published once.
    with pool.connection() as conn:
        conn.execute(
            "UPDATE export_outbox SET available_at = now() WHERE job_id = %s", (row["id"],)
        )
    up = Publisher(settings, pool, make_celery(settings))
    assert up.run_once()["published"] == 1
    assert len(_messages(settings.broker_url, "exports.fast")) == 1


def test_concurrent_publishers_publish_each_event_exactly_once(
    pool, settings: Settings, tenant
) -> None:
    tid, ids = tenant
    with pool.connection() as conn:  # publication, not fair dispatch: no cap in the way
        tenant_set_in_flight(conn, tenant_id=tid, bulk=None, fast=1000)
    jobs = [submit(pool, settings, tid, ids[i : i + 1])["id"] for i in range(60)]
    small_batches = settings.model_copy(update={"publisher_batch_size": 7})
    publishers = [Publisher(small_batches, pool, make_celery(small_batches)) for _ in range(4)]
    barrier = threading.Barrier(len(publishers))

    def drain(p: Publisher) -> None:
        barrier.wait()
        while p.run_once()["claimed"]:
            pass

    threads = [threading.Thread(target=drain, args=(p,)) for p in publishers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sent = [_job_ids(m) for m in _messages(settings.broker_url, "exports.fast")]
    job_ids = [job_id for ids_ in sent for job_id in ids_]
    assert sorted(job_ids) == sorted(str(j) for j in jobs)  # each job exactly once
    assert max(len(ids_) for ids_ in sent) > 1  # a backlog travels in batch messages
    assert count(pool, "SELECT count(*) FROM export_outbox WHERE sent_at IS NULL") == 0
    assert count(pool, "SELECT count(*) FROM export_jobs WHERE dispatch_count <> 1") == 0


def test_a_claim_that_expires_unmarked_is_published_again(pool, settings: Settings, tenant) -> None:
    """Publisher died after send_task, before marking: the event is sent again (a
    duplicate the job claim will refuse), never lost."""
    tid, ids = tenant
    row = submit(pool, settings, tid, ids[:1])
    crashed = Publisher(settings, pool, make_celery(settings))
    with pool.connection() as conn:
        [ev] = outbox_mark_sent_and_claim_due(
            conn, claim_token=uuid4(), limit=10, claim_seconds=30, bulk_cap=1, fast_cap=8
        ).events
    crashed._publish([ev])  # published, then the process "died" before marking
    other = Publisher(settings, pool, make_celery(settings))
    assert other.run_once()["claimed"] == 0  # still owned by the dead claim
    with pool.connection() as conn:
        conn.execute("UPDATE export_outbox SET claimed_until = now() - interval '1 second'")
    assert other.run_once()["published"] == 1
    assert other.flush() == 1
    ids_sent = [m["headers"]["id"] for m in _messages(settings.broker_url, "exports.fast")]
    assert ids_sent == [str(ev["id"]), str(ev["id"])]
    assert job(pool, row["id"])["dispatch_count"] == 1


def test_idle_wakes_on_submit_notify(pool, settings: Settings, tenant) -> None:
    tid, ids = tenant
    publisher = Publisher(settings, pool, make_celery(settings))
    try:
        woke = idle_wakes(publisher, lambda: submit(pool, settings, tid, ids[:1]))
        assert woke, "idle() was not woken by the submit's NOTIFY"
    finally:
        publisher.close_listener()


def test_an_idle_publisher_waits_instead_of_spinning(pool, settings: Settings, tenant) -> None:
    """With nothing pending the next wait is the whole poll interval; with an event due in
    the future it is the time until then (both read by the pass's own statement); with sent
    events waiting to be marked it is at most the mark delay."""
    publisher = Publisher(settings, pool, make_celery(settings))
    idle = publisher.run_once()
    assert idle["claimed"] == 0 and publisher.next_wait(idle, 1.0) == 1.0
    tid, ids = tenant
    row = submit(pool, settings, tid, ids[:1])
    with pool.connection() as conn:
        conn.execute(
            "UPDATE export_outbox SET available_at = now() + interval '30 seconds' WHERE job_id = %s",
            (row["id"],),
        )
    later = publisher.run_once()
    assert later["claimed"] == 0
    assert publisher.next_wait(later, 1.0) == 1.0
    assert 29 < publisher.next_wait(later, 60.0) <= 30
    with pool.connection() as conn:
        conn.execute(
            "UPDATE export_outbox SET available_at = now() WHERE job_id = %s", (row["id"],)
        )
    sent = publisher.run_once()
    assert sent["published"] == 1
    assert publisher.next_wait(sent, 60.0) == settings.publisher_mark_delay_seconds


def _window_holds() -> float:
    return metrics.PUBLISHER_WINDOW_HOLDS.labels("exports.fast")._value.get()


def test_the_broker_window_keeps_a_backlog_in_the_outbox_where_it_forms_batches(
    pool, settings: Settings, tenant
) -> None:
    """While exports.fast has PUBLISHER_BROKER_WINDOW messages waiting in Redis, new small
    events stay pending (bulk ones still go); when the workers have taken them, the next
    pass sends the backlog as batch messages."""
    tid, ids = tenant
    windowed = settings.model_copy(
        update={"publisher_broker_window": 2, "tenant_fast_in_flight": 100}
    )
    publisher = Publisher(windowed, pool, make_celery(windowed))
    first = [submit(pool, settings, tid, ids[i : i + 1])["id"] for i in range(2)]
    assert publisher.run_once()["published"] == 2  # an empty broker: sent at once
    assert len(_messages(settings.broker_url, "exports.fast")) == 2
    backlog = [submit(pool, settings, tid, ids[i : i + 1])["id"] for i in range(2, 14)]
    bulk = submit(pool, settings, tid, None)
    holds = _window_holds()
    held = publisher.run_once()
    assert (held["claimed"], held["published"], held["marked"]) == (1, 1, 2)  # the bulk one
    assert _window_holds() == holds + 1
    assert [_job_ids(m) for m in _messages(settings.broker_url, "exports.bulk")] == [
        [str(bulk["id"])]
    ]
    assert publisher.flush() == 1  # the bulk one marked sent
    # the held events were never claimed, and are not "due" for the wait: it is the poll
    # interval, not a spin
    assert count(pool, "SELECT count(*) FROM export_outbox WHERE claim_token IS NOT NULL") == 0
    assert publisher.next_wait({"claimed": 0}, 1.0) == 1.0
    # a worker takes the two waiting messages
    redis.Redis.from_url(settings.broker_url).delete("exports.fast")
    drained = publisher.run_once()
    assert drained["published"] == len(backlog) and drained["messages"] < len(backlog)
    sent = [_job_ids(m) for m in _messages(settings.broker_url, "exports.fast")]
    assert sorted(j for ids_ in sent for j in ids_) == sorted(str(j) for j in backlog)
    assert max(len(ids_) for ids_ in sent) > 1
    assert {str(j) for j in first}.isdisjoint(j for ids_ in sent for j in ids_)
    publisher.close_listener()


def test_a_held_publisher_waits_on_the_broker_and_wakes_when_it_drains(
    pool, settings: Settings, tenant
) -> None:
    """idle() while held: submits of the held queue do not wake it, a bulk submit does, and
    the queue's length dropping below the window does."""
    tid, ids = tenant
    windowed = settings.model_copy(update={"publisher_broker_window": 1})
    publisher = Publisher(windowed, pool, make_celery(windowed))
    submit(pool, settings, tid, ids[:1])
    assert publisher.run_once()["published"] == 1
    submit(pool, settings, tid, ids[1:2])
    assert publisher.run_once()["claimed"] == 0  # held: one message is waiting
    publisher._listen_conn()
    stop = threading.Event()

    def woken_by(action) -> bool:
        woke = threading.Event()

        def wait() -> None:
            publisher.idle(30.0, stop)
            woke.set()

        t = threading.Thread(target=wait)
        t.start()
        try:
            submit(pool, settings, tid, ids[2:3])  # the held queue: no wake-up
            assert not woke.wait(0.3), "a submit of the held queue woke the publisher"
            action()
            return woke.wait(10.0)
        finally:
            stop.set()
            t.join()
            stop.clear()

    assert woken_by(lambda: submit(pool, settings, tid, None))  # a bulk export
    assert woken_by(lambda: redis.Redis.from_url(settings.broker_url).delete("exports.fast"))
    publisher.close_listener()


def test_a_broker_that_cannot_be_read_holds_nothing(pool, settings: Settings, tenant) -> None:
    tid, ids = tenant
    down = settings.model_copy(
        update={
            "publisher_broker_window": 1,
            "celery_broker_url": f"redis://127.0.0.1:{free_port()}/0",
            "broker_publish_timeout": 0.2,
        }
    )
    publisher = Publisher(down, pool, make_celery(down))
    assert publisher._full_queues() == ()
    submit(pool, settings, tid, ids[:1])
    counts = publisher.run_once()
    assert counts["claimed"] == 1 and counts["failed"] == 1  # released with a backoff
