"""Where batches form (exportcore.claims): a fast worker's claim of one delivered message
takes due small exports of the outbox beside its own job, in the outbox claim's fair order
and within each tenant's in-flight cap (docs/architecture.md INV-16), on real PostgreSQL.
Every job is claimed by the guarded statement (INV-3) and dispatched exactly once, however
the claims and the publishers' marks interleave."""

from __future__ import annotations

import threading
from pathlib import Path
from uuid import UUID, uuid4

import psycopg
import pytest

from devtools.waiting import wait_for
from exportcore.claims import Claimed, claim_delivery
from exportcore.domain import BULK_QUEUE, FAST_QUEUE
from exportcore.settings import Settings
from exportcore.store.outbox import Sent, outbox_mark_sent_and_claim_due, outbox_mark_sent_many
from exportcore.store.tenants import tenant_set_in_flight
from tests.support import count, events, job, kinds, submit, tenant_with_notes, waits_on_lock


@pytest.fixture
def tenant_b(pool, notes_dir: Path) -> tuple[str, list[int]]:
    return tenant_with_notes(pool, notes_dir)


def sent_message(pool, queue: str = FAST_QUEUE) -> tuple[UUID, UUID, UUID]:
    """A publisher's claim of the oldest due event of ``queue`` (one message): ``(job id,
    event id = task id, the publisher's claim token)``; the message is "in the broker"."""
    token = uuid4()
    other = BULK_QUEUE if queue == FAST_QUEUE else FAST_QUEUE
    with pool.connection() as conn:
        [event] = outbox_mark_sent_and_claim_due(
            conn,
            claim_token=token,
            limit=1,
            claim_seconds=30,
            bulk_cap=1,
            fast_cap=8,
            held_queues=[other],
        ).events
    return event["job_id"], event["id"], token


def claim_on(conn, settings: Settings, job_id: UUID, message_id: UUID, queue=FAST_QUEUE) -> Claimed:
    """A worker's claim of the one-job message ``message_id`` of ``queue`` on ``conn``."""
    return claim_delivery(
        conn, settings, job_ids=[job_id], message_ids=[message_id], queue=queue, carrier=message_id
    )


def deliver(pool, settings: Settings, job_id: UUID, message_id: UUID, queue=FAST_QUEUE) -> Claimed:
    with pool.connection() as conn:
        return claim_on(conn, settings, job_id, message_id, queue)


def fast_jobs(pool, settings: Settings, tenant, n: int) -> list[UUID]:
    tid, ids = tenant
    return [submit(pool, settings, tid, ids[i : i + 1])["id"] for i in range(n)]


def test_a_fast_claim_takes_due_exports_round_robin_up_to_worker_claim_jobs(
    pool, settings: Settings, tenant, tenant_b
) -> None:
    a = fast_jobs(pool, settings, tenant, 10)
    b = fast_jobs(pool, settings, tenant_b, 2)
    job_id, message_id, _ = sent_message(pool)
    assert job_id == a[0]
    claimed = deliver(
        pool, settings.model_copy(update={"worker_claim_jobs": 6}), job_id, message_id
    )
    # the message's job + 5 in fair order: every tenant's first, then every tenant's second…
    assert set(claimed.taken) == {a[1], b[0], a[2], b[1], a[3]}
    assert sorted(j.id for j in claimed.jobs) == sorted([a[0], *claimed.taken])
    assert set(claimed.chunks) == {j.id for j in claimed.jobs}  # first chunks read with it
    assert all(j.status == "running" and j.lease_token for j in claimed.jobs)
    assert count(pool, "SELECT count(*) FROM export_outbox WHERE sent_at IS NULL") == 6
    for j in claimed.jobs:
        row = job(pool, j.id)
        assert row["dispatch_count"] == 1 and row["attempts"] == 1
        assert kinds(pool, j.id) == ["submitted", "dispatched", "claimed"]
        dispatched, claim_event = events(pool, j.id)[1:]
        assert dispatched["at"] <= claim_event["at"] and dispatched["id"] < claim_event["id"]
        # the claimed event names the job's own outbox event (its message, or the one taken)
        expected = message_id if j.id == job_id else claimed.taken[j.id]["id"]
        assert claim_event["message_id"] == expected == dispatched["message_id"]


def test_a_claim_takes_no_more_than_a_tenants_cap(pool, settings: Settings, tenant) -> None:
    tid, _ = tenant
    with pool.connection() as conn:
        tenant_set_in_flight(conn, tenant_id=tid, bulk=None, fast=3)
    jobs = fast_jobs(pool, settings, tenant, 6)
    job_id, message_id, _ = sent_message(pool)
    claimed = deliver(pool, settings, job_id, message_id)
    assert set(claimed.taken) == set(jobs[1:3])  # 3 in flight: the message's + 2
    # a second message of the tenant: its job is claimed (it was dispatched within the cap
    # before), nothing more is taken while the cap is full
    with pool.connection() as conn:
        conn.execute("UPDATE tenants SET fast_in_flight = 4 WHERE id = %s", (tid,))
    job_id, message_id, _ = sent_message(pool)
    assert deliver(pool, settings, job_id, message_id).taken == {}


def test_bulk_claims_and_claims_of_an_unknown_queue_take_nothing(
    pool, settings: Settings, tenant
) -> None:
    tid, _ = tenant
    bulk = submit(pool, settings, tid, None)["id"]
    fast = fast_jobs(pool, settings, tenant, 3)
    job_id, message_id, _ = sent_message(pool, BULK_QUEUE)
    assert job_id == bulk
    claimed = deliver(pool, settings, job_id, message_id, queue=BULK_QUEUE)
    assert [j.id for j in claimed.jobs] == [bulk] and claimed.taken == {}
    job_id, message_id, _ = sent_message(pool)
    assert deliver(pool, settings, job_id, message_id, queue=None).taken == {}
    assert all(job(pool, j)["status"] == "queued" for j in fast[1:])


def test_a_refused_delivery_still_takes_the_backlog(pool, settings: Settings, tenant) -> None:
    """A duplicate message (its job already claimed) finds a free worker all the same."""
    jobs = fast_jobs(pool, settings, tenant, 3)
    job_id, message_id, _ = sent_message(pool)
    first = deliver(pool, settings.model_copy(update={"worker_claim_jobs": 1}), job_id, message_id)
    assert [j.id for j in first.jobs] == [job_id]
    again = deliver(pool, settings, job_id, message_id)  # redelivered
    assert set(again.taken) == set(jobs[1:]) and job_id not in {j.id for j in again.jobs}
    assert job(pool, job_id)["attempts"] == 1 and job(pool, job_id)["dispatch_count"] == 1


def test_concurrent_claims_take_each_event_once(pool, settings: Settings, tenant) -> None:
    tid, _ = tenant
    with pool.connection() as conn:
        tenant_set_in_flight(conn, tenant_id=tid, bulk=None, fast=1000)
    jobs = fast_jobs(pool, settings, tenant, 40)
    messages = [sent_message(pool) for _ in range(4)]
    barrier = threading.Barrier(len(messages))
    results: list[Claimed] = []

    def run(job_id: UUID, message_id: UUID) -> None:
        barrier.wait()
        results.append(deliver(pool, settings, job_id, message_id))

    threads = [threading.Thread(target=run, args=m[:2]) for m in messages]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    claimed = [j.id for r in results for j in r.jobs]
    assert len(claimed) == len(set(claimed)) == 4 * 8  # 4 full claims, no job twice
    assert count(pool, "SELECT count(*) FROM export_jobs WHERE dispatch_count > 1") == 0
    assert count(pool, "SELECT count(*) FROM export_jobs WHERE status = 'running'") == 32
    assert (
        count(
            pool,
            "SELECT count(*) FROM export_outbox WHERE sent_at IS NULL AND job_id = ANY(%s)",
            claimed,
        )
        == 0
    )
    assert len(jobs) - len(claimed) == count(
        pool, "SELECT count(*) FROM export_outbox WHERE sent_at IS NULL"
    )


def test_a_publishers_mark_and_a_claim_of_the_same_message_stamp_one_dispatch(
    pool, settings: Settings, tenant
) -> None:
    """The publisher marks a message no claim marked in time; the claim of that message
    then stamps nothing more. While the publisher's mark is uncommitted, the claim waits
    for it (it locks the event), and finds it sent."""
    [one, two] = fast_jobs(pool, settings, tenant, 2)
    job_id, message_id, token = sent_message(pool)
    marked_at = job(pool, job_id)["created_at"]
    dsn = str(settings.database_url)
    with psycopg.connect(dsn) as marker:  # the publisher's mark, not yet committed
        marker.execute(
            "UPDATE export_outbox SET sent_at = now(), claim_token = NULL WHERE id = %s",
            (message_id,),
        )
        marker.execute(
            "UPDATE export_jobs SET dispatch_count = dispatch_count + 1,"
            " last_dispatched_at = now() WHERE id = %s",
            (job_id,),
        )
        out: list[Claimed] = []
        with pool.connection() as conn:
            pid = conn.info.backend_pid
            t = threading.Thread(
                target=lambda: out.append(claim_on(conn, settings, job_id, message_id))
            )
            t.start()
            with psycopg.connect(dsn, autocommit=True) as watch:
                wait_for(lambda: waits_on_lock(watch, pid), 10, "the claim waits for the mark")
            marker.commit()
            t.join()
    [claimed] = out
    assert sorted(j.id for j in claimed.jobs) == sorted([one, two])
    assert job(pool, job_id)["dispatch_count"] == 1  # the publisher's stamp only
    assert "dispatched" not in kinds(pool, job_id)  # (the test's mark wrote no event)
    assert job(pool, job_id)["last_dispatched_at"] >= marked_at
    assert job(pool, two)["dispatch_count"] == 1
    # the other order: the claim marked it first, so the publisher's later mark finds
    # nothing to do
    [three] = fast_jobs(pool, settings, tenant, 1)
    job_id, message_id, token = sent_message(pool)
    assert job_id == three
    deliver(pool, settings, job_id, message_id)
    with pool.connection() as conn:
        late = outbox_mark_sent_many(conn, sent=[Sent(message_id, token, marked_at)])
    assert late.marked == 0 and job(pool, three)["dispatch_count"] == 1
