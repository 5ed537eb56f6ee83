"""The outbox publisher against real PostgreSQL and a real Redis broker."""

from __future__ import annotations

import base64
import json
import threading
from dataclasses import replace
from typing import Any
from uuid import UUID, uuid4

import pytest
import redis

from devtools.stack import free_port
from exportcore import metrics
from exportcore.broker import EXPORT_BATCH_TASK, EXPORT_TASK, make_celery
from exportcore.claims import claim_delivery
from exportcore.domain import FAST_QUEUE
from exportcore.publisher import Publisher, PublisherConfig
from exportcore.settings import Settings
from exportcore.store.outbox import outbox_mark_sent_and_claim_due
from exportcore.store.tenants import tenant_set_in_flight
from tests.support import count, events, idle_wakes, job, kinds, submit


def make_publisher(s: Settings, pool, mark_delay: float = 0.0, **kwargs: Any) -> Publisher:
    """A publisher on ``s`` for the publishing mechanics: no worker claims (and marks) what
    is sent here, so the publisher marks its sends at its next pass (``mark_delay`` 0); the
    tests of the messages ahead of the workers set their own delays."""
    config = replace(PublisherConfig.from_settings(s), mark_delay=mark_delay)
    return Publisher(s, pool, make_celery(s), config=config, **kwargs)


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _messages(broker_url: str, queue: str) -> list[dict]:
    """The messages waiting in ``queue``, in the order the workers take them (kombu pushes
    on the left and pops on the right)."""
    r = redis.Redis.from_url(broker_url)
    return [json.loads(m) for m in reversed(r.lrange(queue, 0, -1))]


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
    publisher = make_publisher(settings, pool)
    counts = publisher.run_once()
    assert counts == {
        "claimed": 2,
        "published": 2,
        "failed": 0,
        "messages": 2,
        "marked": 0,
        "held": 0,
        "waiting": 0,
    }
    # no claim marked them: the next pass does (in its claim statement)
    assert publisher.run_once() == {
        "claimed": 0,
        "published": 0,
        "failed": 0,
        "messages": 0,
        "marked": 2,
        "held": 0,
        "waiting": 0,
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
    publisher = make_publisher(down, pool)
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
    up = make_publisher(settings, pool)
    assert up.run_once()["published"] == 1
    assert len(_messages(settings.broker_url, "exports.fast")) == 1


def test_concurrent_publishers_publish_each_event_exactly_once(
    pool, settings: Settings, tenant
) -> None:
    tid, ids = tenant
    with pool.connection() as conn:  # publication, not fair dispatch: no cap in the way
        tenant_set_in_flight(conn, tenant_id=tid, bulk=None, fast=1000)
    jobs = [submit(pool, settings, tid, ids[i : i + 1])["id"] for i in range(60)]
    # every message may be ahead: no worker claims anything here
    small_batches = settings.model_copy(
        update={"publisher_batch_size": 7, "publisher_messages_ahead": 1000}
    )
    publishers = [make_publisher(small_batches, pool) for _ in range(4)]
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
    assert {len(ids_) for ids_ in sent} == {1}  # one job per message
    for p in publishers:
        p.flush()
    assert count(pool, "SELECT count(*) FROM export_outbox WHERE sent_at IS NULL") == 0
    assert count(pool, "SELECT count(*) FROM export_jobs WHERE dispatch_count <> 1") == 0


def test_a_claim_that_expires_unmarked_is_published_again(pool, settings: Settings, tenant) -> None:
    """Publisher died after send_task, before marking: the event is sent again (a
    duplicate the job claim will refuse), never lost."""
    tid, ids = tenant
    row = submit(pool, settings, tid, ids[:1])
    crashed = make_publisher(settings, pool)
    with pool.connection() as conn:
        [ev] = outbox_mark_sent_and_claim_due(
            conn, claim_token=uuid4(), limit=10, claim_seconds=30, bulk_cap=1, fast_cap=8
        ).events
    crashed._publish(ev)  # published, then the process "died" before marking
    other = make_publisher(settings, pool)
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
    publisher = make_publisher(settings, pool)
    try:
        woke = idle_wakes(publisher, lambda: submit(pool, settings, tid, ids[:1]))
        assert woke, "idle() was not woken by the submit's NOTIFY"
    finally:
        publisher.close_listener()


def test_an_idle_publisher_waits_instead_of_spinning(pool, settings: Settings, tenant) -> None:
    """With nothing pending the next wait is the whole poll interval; with an event due in
    the future it is the time until then (both read by the pass's own statement); with sent
    events waiting to be marked it is at most the mark delay."""
    publisher = make_publisher(settings, pool)
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
    assert publisher.next_wait(sent, 60.0) == publisher.config.mark_delay


def _holds() -> float:
    return metrics.PUBLISHER_HOLDS.labels(FAST_QUEUE)._value.get()


def _ahead_settings(settings: Settings, **extra: object) -> Settings:
    return settings.model_copy(
        update={
            "publisher_messages_ahead": 2,
            "publisher_poll_seconds": 1.0,
            "tenant_fast_in_flight": 100,
            **extra,
        }
    )


def _deliver(pool, settings: Settings, msg: dict):
    """What a fast worker's claim does with a message it took from Redis."""
    [job_id] = _job_ids(msg)
    task_id = UUID(msg["headers"]["id"])
    with pool.connection() as conn:
        return claim_delivery(
            conn,
            settings,
            job_ids=[UUID(job_id)],
            message_ids=[task_id],
            queue=FAST_QUEUE,
            carrier=task_id,
        )


def test_small_exports_wait_in_the_outbox_only_while_messages_ahead_wait_for_a_worker(
    pool, settings: Settings, tenant
) -> None:
    """PUBLISHER_MESSAGES_AHEAD one-job messages go at once; the next small exports stay in
    the outbox (bulk ones still go), and the claim of a message that reaches a worker takes
    them beside its own job, marks every event it delivered and stamps each dispatch once."""
    tid, ids = tenant
    ahead = _ahead_settings(settings)
    clock = Clock()
    publisher = make_publisher(ahead, pool, mark_delay=1.0, clock=clock)
    fast = [submit(pool, settings, tid, ids[i : i + 1])["id"] for i in range(6)]
    bulk = submit(pool, settings, tid, None)["id"]
    holds = _holds()
    counts = publisher.run_once()
    assert (counts["published"], counts["messages"]) == (3, 3)
    assert counts["waiting"] >= 1  # (the claim looks one event past its limit, not further)
    assert _holds() == holds + 1
    sent = _messages(settings.broker_url, FAST_QUEUE)
    assert [_job_ids(m) for m in sent] == [[str(fast[0])], [str(fast[1])]]  # oldest first
    assert [_job_ids(m) for m in _messages(settings.broker_url, "exports.bulk")] == [[str(bulk)]]
    assert count(pool, "SELECT count(*) FROM export_outbox WHERE sent_at IS NULL") == 7
    # nothing more is sent while both messages wait: the wait ends at the earliest expiry
    assert publisher.run_once()["published"] == 0
    assert publisher.next_wait({"claimed": 0}, 30.0) == pytest.approx(1.0)

    claimed = _deliver(pool, ahead, sent[0])
    assert sorted(j.id for j in claimed.jobs) == sorted(fast[:1] + fast[2:])  # 1 + the 4 held
    assert set(claimed.taken) == set(fast[2:])
    # every delivered event is sent, every job dispatched once, the taken ones by the claim
    assert count(pool, "SELECT count(*) FROM export_outbox WHERE sent_at IS NULL") == 2
    for job_id in fast[:1] + fast[2:]:
        assert job(pool, job_id)["dispatch_count"] == 1
        assert kinds(pool, job_id) == ["submitted", "dispatched", "claimed"]
    by_claim = [events(pool, j)[1]["detail"].get("by") for j in fast[2:]]
    assert by_claim == ["claim"] * 4
    assert events(pool, fast[0])[1]["detail"].get("by") is None
    # the claim reported the message: it is no longer ahead, and the publisher has no mark
    # to make for it (bulk and the second fast message are marked by the publisher)
    assert publisher.claimed(sent[0]["headers"]["id"]) is True
    clock.now += 1.0
    counts = publisher.run_once()
    assert counts["marked"] == 2 and counts["published"] == 0 and counts["waiting"] == 0
    assert job(pool, fast[1])["dispatch_count"] == 1
    assert publisher.flush() == 0
    publisher.close_listener()


def test_a_claim_report_wakes_a_held_publisher_and_a_held_submit_does_not(
    pool, settings: Settings, tenant
) -> None:
    tid, ids = tenant
    ahead = _ahead_settings(settings, publisher_messages_ahead=1)
    publisher = make_publisher(ahead, pool, mark_delay=1.0)
    submit(pool, settings, tid, ids[:1])
    assert publisher.run_once()["published"] == 1  # one message ahead: full
    stop = threading.Event()

    def woken_by(action) -> bool:
        woke = threading.Event()

        def wait() -> None:
            publisher.idle(30.0, stop)
            woke.set()

        t = threading.Thread(target=wait)
        t.start()
        try:
            submit(pool, settings, tid, ids[1:2])  # a small export while full: no wake-up
            assert not woke.wait(0.3), "a small export woke the publisher while full"
            action()
            return woke.wait(10.0)
        finally:
            stop.set()
            t.join()
            stop.clear()

    assert woken_by(lambda: submit(pool, settings, tid, None))  # a bulk export wakes it
    [msg] = _messages(settings.broker_url, FAST_QUEUE)
    assert woken_by(lambda: _deliver(pool, ahead, msg))  # the claim's NOTIFY
    publisher.close_listener()


def test_a_message_no_claim_reports_stops_holding_after_the_poll_interval(
    pool, settings: Settings, tenant
) -> None:
    """A message lost with Redis (or a claim report lost with the LISTEN connection) holds
    small exports back for PUBLISHER_POLL_SECONDS at most."""
    tid, ids = tenant
    ahead = _ahead_settings(settings, publisher_messages_ahead=1)
    clock = Clock()
    publisher = make_publisher(ahead, pool, mark_delay=1.0, clock=clock)
    first, second = (submit(pool, settings, tid, ids[i : i + 1])["id"] for i in range(2))
    assert publisher.run_once()["waiting"] == 1
    redis.Redis.from_url(settings.broker_url).delete(FAST_QUEUE)  # the message is lost
    clock.now += 0.5
    assert publisher.run_once()["published"] == 0
    clock.now += 0.5
    counts = publisher.run_once()
    assert counts["published"] == 1 and counts["waiting"] == 0
    assert [_job_ids(m) for m in _messages(settings.broker_url, FAST_QUEUE)] == [[str(second)]]
    assert job(pool, first)["status"] == "queued"  # the lost-dispatch rule re-sends it
    publisher.close_listener()


def test_an_export_cancelled_before_its_event_is_sent_is_never_dispatched(
    api, pool, settings: Settings, tenant
) -> None:
    client, user, _ = api
    _, ids = tenant
    created = client.post("/v1/exports", json={"note_ids": ids[:1]}, headers=user).json()
    assert client.post(f"/v1/exports/{created['id']}/cancel", headers=user).status_code == 202
    counts = make_publisher(settings, pool).run_once()
    assert counts["claimed"] == 0 and counts["published"] == 0
    assert _messages(settings.broker_url, FAST_QUEUE) == []
    assert count(pool, "SELECT count(*) FROM export_outbox WHERE sent_at IS NULL") == 0
    assert kinds(pool, UUID(created["id"])) == ["submitted", "cancel_requested", "cancelled"]
