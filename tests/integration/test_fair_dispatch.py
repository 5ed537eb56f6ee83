"""Fair dispatch (docs/architecture.md INV-16): the outbox claim's per-tenant in-flight caps
per queue and its round robin across tenants, on real PostgreSQL (and Redis for the
publisher). Time passes by moving timestamps in the database, never by sleeping."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from uuid import UUID, uuid4

import pytest

from exportcore.broker import make_celery
from exportcore.domain import BULK_QUEUE, FAST_QUEUE
from exportcore.publisher import Publisher, PublisherConfig
from exportcore.settings import Settings
from exportcore.store import jobs as job_store
from exportcore.store.outbox import (
    Pass,
    Sent,
    claim_params,
    outbox_mark_sent_and_claim_due,
    outbox_mark_sent_many,
)
from exportcore.store.tenants import tenant_set_in_flight
from tests.support import count, job, submit, tenant_with_notes


@pytest.fixture
def tenant_a(pool, notes_dir: Path) -> tuple[str, list[int]]:
    return tenant_with_notes(pool, notes_dir)


@pytest.fixture
def tenant_b(pool, notes_dir: Path) -> tuple[str, list[int]]:
    return tenant_with_notes(pool, notes_dir)


def claim(pool, *, bulk_cap: int = 1, fast_cap: int = 8, limit: int = 100) -> Pass:
    """One claim of a publisher that then "sends" (holds the claim for 30 s)."""
    with pool.connection() as conn:
        return outbox_mark_sent_and_claim_due(
            conn,
            claim_token=uuid4(),
            limit=limit,
            claim_seconds=30,
            bulk_cap=bulk_cap,
            fast_cap=fast_cap,
        )


def mark_sent(pool, p: Pass) -> None:
    """What the next pass does with a sent batch: mark it sent (the jobs are now in the
    broker, still in flight)."""
    token = claim_token(pool, p.events[0]["id"])
    with pool.connection() as conn:
        outbox_mark_sent_many(conn, sent=[Sent(e["id"], token, e["claimed_at"]) for e in p.events])


def claim_token(pool, event_id: UUID) -> UUID:
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT claim_token FROM export_outbox WHERE id = %s", (event_id,)
        ).fetchone()
    assert row is not None and row["claim_token"] is not None
    return row["claim_token"]


def start(pool, p: Pass) -> list[job_store.JobRow]:
    """Workers claim the delivered jobs (queued → running)."""
    with pool.connection() as conn:
        return job_store.job_claim_many(
            conn,
            job_ids=[e["job_id"] for e in p.events],
            message_ids=[e["id"] for e in p.events],
            lease_seconds=60,
        )


def finish(pool, rows: list[job_store.JobRow]) -> None:
    with pool.connection() as conn:
        done = job_store.job_finish_if_leased_many(
            conn,
            [job_store.Finish(r.id, r.lease_token, f"x/{r.id}", "0" * 64, 1, 1) for r in rows],
        )
    assert len(done) == len(rows)


def dispatch(pool, p: Pass) -> list[job_store.JobRow]:
    """Sent, marked and started: the pass's jobs are running."""
    mark_sent(pool, p)
    return start(pool, p)


def job_ids(p: Pass) -> list[UUID]:
    return [e["job_id"] for e in p.events]


def test_a_tenant_gets_at_most_its_cap_per_queue_and_held_events_are_not_attempts(
    pool, settings: Settings, tenant_a
) -> None:
    tid, ids = tenant_a
    bulk = [submit(pool, settings, tid, None)["id"] for _ in range(5)]
    fast = [submit(pool, settings, tid, ids[i : i + 1])["id"] for i in range(12)]

    first = claim(pool, bulk_cap=2, fast_cap=3)
    assert sorted(e["queue"] for e in first.events) == [BULK_QUEUE] * 2 + [FAST_QUEUE] * 3
    assert set(job_ids(first)) == {*bulk[:2], *fast[:3]}  # the oldest events of each queue
    assert first.held == 2  # (tenant, bulk) and (tenant, fast) held events back
    # Held events were not claimed: no publish attempt is counted against them.
    assert count(pool, "SELECT count(*) FROM export_outbox WHERE publish_attempts > 0") == 5
    assert count(pool, "SELECT count(*) FROM export_outbox WHERE claim_token IS NULL") == 12

    # Claimed (being sent), then sent (in the broker), then running: in flight every time.
    assert claim(pool, bulk_cap=2, fast_cap=3).events == []
    mark_sent(pool, first)
    again = claim(pool, bulk_cap=2, fast_cap=3)
    assert again.events == [] and again.held == 2
    start(pool, first)
    assert claim(pool, bulk_cap=2, fast_cap=3).events == []


def test_a_tenant_override_replaces_the_default_cap_and_resets_to_it(
    pool, settings: Settings, tenant_a, tenant_b
) -> None:
    a, _ = tenant_a
    b, _ = tenant_b
    for tid in (a, b):
        for _ in range(4):
            submit(pool, settings, tid, None)
    with pool.connection() as conn:
        assert tenant_set_in_flight(conn, tenant_id=b, bulk=3, fast=None) is not None
        assert tenant_set_in_flight(conn, tenant_id="nobody", bulk=3, fast=None) is None
    p = claim(pool, bulk_cap=1)
    per_tenant = {t: sum(1 for e in p.events if e["tenant_id"] == t) for t in (a, b)}
    assert per_tenant == {a: 1, b: 3}

    with pool.connection() as conn:  # back to the default: b is over it, nothing more
        tenant_set_in_flight(conn, tenant_id=b, bulk=None, fast=None)
    assert claim(pool, bulk_cap=1).events == []


def test_the_batch_is_shared_round_robin_across_tenants(
    pool, settings: Settings, tenant_a, tenant_b
) -> None:
    """A's 10 exports came first, B's 2 after: a batch of 4 is A, B, A, B — not A's four."""
    a, a_ids = tenant_a
    b, b_ids = tenant_b
    first_a = [submit(pool, settings, a, a_ids[i : i + 1])["id"] for i in range(10)]
    first_b = [submit(pool, settings, b, b_ids[i : i + 1])["id"] for i in range(2)]
    p = claim(pool, fast_cap=100, limit=4)
    assert [e["tenant_id"] for e in p.events] == [a, b, a, b]
    assert job_ids(p) == [first_a[0], first_b[0], first_a[1], first_b[1]]
    assert p.held == 0
    rest = claim(pool, fast_cap=100, limit=100)
    assert job_ids(rest) == first_a[2:]


def test_a_held_event_is_claimed_once_its_tenants_job_finishes(
    pool, settings: Settings, tenant_a
) -> None:
    tid, _ = tenant_a
    one, two = (submit(pool, settings, tid, None)["id"] for _ in range(2))
    p = claim(pool)
    assert job_ids(p) == [one] and p.held == 1
    running = dispatch(pool, p)
    assert claim(pool).held == 1  # one running: still held
    finish(pool, running)  # terminal jobs free their slot
    nxt = claim(pool)
    assert job_ids(nxt) == [two] and nxt.held == 0


def test_the_publisher_rechecks_soon_while_events_are_held(
    pool, settings: Settings, tenant_a
) -> None:
    tid, _ = tenant_a
    for _ in range(2):
        submit(pool, settings, tid, None)
    fair = settings.model_copy(update={"tenant_bulk_in_flight": 1})
    config = replace(
        PublisherConfig.from_settings(fair),
        held_recheck=0.2,
        # no worker claims (and marks) the message here: the publisher marks it at once
        mark_delay=0,
    )
    publisher = Publisher(fair, pool, make_celery(fair), config=config)
    counts = publisher.run_once()
    assert counts["claimed"] == 1 and counts["held"] == 1
    assert publisher.next_wait(counts, 30.0) == 0.0  # the sent event is marked at once
    counts = publisher.run_once()  # marks the first, the second still held
    assert counts["claimed"] == 0 and counts["held"] == 1 and counts["marked"] == 1
    assert publisher.next_wait(counts, 30.0) == pytest.approx(0.2)
    with pool.connection() as conn:  # the first one ends (cancelled by its tenant)
        conn.execute(
            "UPDATE export_jobs SET status = 'cancelled', finished_at = now() "
            "WHERE dispatch_count = 1"
        )
    counts = publisher.run_once()
    assert counts["claimed"] == 1 and counts["held"] == 0
    publisher.flush()


def test_a_retry_in_backoff_frees_the_slot_and_is_capped_when_due(
    pool, settings: Settings, tenant_a
) -> None:
    tid, _ = tenant_a
    one, two = (submit(pool, settings, tid, None)["id"] for _ in range(2))
    [running] = dispatch(pool, claim(pool))
    with pool.connection() as conn:
        [requeued] = job_store.job_requeue_if_leased_many(
            conn,
            [job_store.Requeue(one, running.lease_token, uuid4(), 60, "transient", "t")],
            margin_seconds=1,
        )
    assert requeued.status == "queued"
    # Waiting for its backoff, the retried job is not in flight: the other one goes.
    p = claim(pool)
    assert job_ids(p) == [two]
    dispatch(pool, p)
    # Its backoff over, the retry is due again but held: the tenant's slot is taken.
    with pool.connection() as conn:
        conn.execute(
            "UPDATE export_outbox SET available_at = now() WHERE job_id = %s AND sent_at IS NULL",
            (one,),
        )
        conn.execute("UPDATE export_jobs SET next_attempt_at = now() WHERE id = %s", (one,))
    held = claim(pool)
    assert held.events == [] and held.held == 1


def test_a_redispatch_goes_through_the_cap(pool, settings: Settings, tenant_a) -> None:
    """A lost message's job, redispatched by recovery, waits for a slot like any event: it
    stops counting as in flight when its new event is written, and the tenant still has
    at most its cap in flight."""
    tid, _ = tenant_a
    one, two = (submit(pool, settings, tid, None)["id"] for _ in range(2))
    p = claim(pool)
    mark_sent(pool, p)  # in the broker; the message is then lost
    assert claim(pool).held == 1
    with pool.connection() as conn:
        conn.execute(
            "UPDATE export_jobs SET last_dispatched_at = now() - interval '1 hour' WHERE id = %s",
            (one,),
        )
        [lost] = job_store.job_redispatch_if_lost_many(
            conn, threshold_seconds=60, max_factor=16, limit=10
        )
    assert lost["job_id"] == one
    nxt = claim(pool)
    assert len(nxt.events) == 1 and nxt.held == 1  # one of the two, never both
    assert job_ids(nxt) == [two]  # the older event first
    finish(pool, start(pool, nxt))
    again = claim(pool)
    assert job_ids(again) == [one] and again.events[0]["reason"] == "redispatch"


def test_a_replay_goes_through_the_cap(pool, settings: Settings, tenant_a) -> None:
    from exportcore.replays import replay_export

    tid, _ = tenant_a
    one, two = (submit(pool, settings, tid, None)["id"] for _ in range(2))
    [running] = dispatch(pool, claim(pool))
    with pool.connection() as conn:
        job_store.job_fail_if_leased_many(
            conn, [job_store.Fail(one, running.lease_token, "render_error", "boom")]
        )
    p = claim(pool)
    assert job_ids(p) == [two]
    dispatch(pool, p)
    replay = replay_export(pool, settings, original_id=one, actor="test")
    held = claim(pool)
    assert held.events == [] and held.held == 1
    assert job(pool, replay.job["id"])["status"] == "queued"


def test_a_cancelled_queued_job_frees_its_slot(pool, settings: Settings, tenant_a) -> None:
    tid, _ = tenant_a
    one, two = (submit(pool, settings, tid, None)["id"] for _ in range(2))
    mark_sent(pool, claim(pool))  # in the broker, not yet running
    assert claim(pool).held == 1
    with pool.connection() as conn:
        cancelled = job_store.job_request_cancel(conn, job_id=one, tenant_id=tid)
    assert cancelled is not None and cancelled["status"] == "cancelled"
    assert job_ids(claim(pool)) == [two]


def test_concurrent_publishers_never_exceed_a_cap(pool, settings: Settings, tenant_a) -> None:
    tid, ids = tenant_a
    for i in range(20):
        submit(pool, settings, tid, ids[i : i + 1])
    barrier = threading.Barrier(4)
    claimed: list[int] = []

    def one() -> None:
        barrier.wait()
        claimed.append(len(claim(pool, fast_cap=3).events))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(claimed) == 3


def test_the_claim_reads_no_finished_job(pool, settings: Settings, tenant_a, tenant_b) -> None:
    """With 50,000 finished jobs and a backlog of 300, the claim's plan walks indexes: no
    sequential scan of export_jobs, and a tenant's in-flight count reads its in-flight
    jobs only (export_jobs_in_flight_idx), never its backlog."""
    from exportcore.sql import q

    a, a_ids = tenant_a
    b, _ = tenant_b
    with pool.connection() as conn:
        conn.execute(
            """
            INSERT INTO export_jobs (id, tenant_id, status, queue, format, payload, note_count,
                                     request_hash, max_attempts, deadline_at, finished_at)
            SELECT gen_random_uuid(), CASE WHEN g %% 2 = 0 THEN %s ELSE %s END, 'cancelled',
                   CASE WHEN g %% 3 = 0 THEN 'exports.bulk' ELSE 'exports.fast' END, 'json',
                   '{}', 1, md5(g::text), 3, now() + interval '1 day', now()
            FROM generate_series(1, 50000) AS g
            """,
            (a, b),
        )
    with pool.connection() as conn:  # tenant a lifted its quota and has 300 queued exports
        conn.execute("UPDATE tenants SET max_active_jobs = 10000 WHERE id = %s", (a,))
    for i in range(300):
        submit(pool, settings, a, a_ids[i % 20 : i % 20 + 1])
    submit(pool, settings, b, None)
    with pool.connection() as conn:
        conn.execute("ANALYZE export_jobs")
        conn.execute("ANALYZE export_outbox")
        plan = "\n".join(
            r["QUERY PLAN"]
            for r in conn.execute(
                "EXPLAIN " + q("outbox", "outbox_mark_sent_and_claim_due"),
                claim_params(
                    claim_token=uuid4(), limit=100, claim_seconds=30, bulk_cap=1, fast_cap=8
                ),
            )
        )
    assert "Seq Scan on export_jobs" not in plan, plan
    assert "export_jobs_in_flight_idx" in plan, plan


def test_held_back_events_are_counted_per_queue_and_tenant_in_metrics(
    pool, settings: Settings, tenant_a, tenant_b
) -> None:
    from exportcore.store.metrics import metrics_snapshot

    a, a_ids = tenant_a
    b, _ = tenant_b
    for _ in range(4):
        submit(pool, settings, a, None)
    for i in range(3):
        submit(pool, settings, a, a_ids[i : i + 1])
    submit(pool, settings, b, None)
    fair = settings.model_copy(
        update={"tenant_bulk_in_flight": 1, "tenant_fast_in_flight": 2, "metrics_tenant_top_n": 0}
    )
    with pool.connection() as conn:
        before = metrics_snapshot(conn, fair)
    # Nothing claimed yet: what the next claim would hold back.
    assert before["held_back"] == {BULK_QUEUE: 3, FAST_QUEUE: 1}
    claim(pool, bulk_cap=1, fast_cap=2)
    with pool.connection() as conn:
        after = metrics_snapshot(conn, fair)
    assert after["held_back"] == {BULK_QUEUE: 3, FAST_QUEUE: 1}
    # Bounded labels: with no tenant named and top N 0, both are summed into "other".
    assert after["tenant_backlog"][("other", BULK_QUEUE)]["held_back"] == 3
    with pool.connection() as conn:
        named = metrics_snapshot(conn, fair.model_copy(update={"metrics_tenants": a}))
    assert named["tenant_backlog"][(a, BULK_QUEUE)]["held_back"] == 3
    assert named["tenant_backlog"][("other", BULK_QUEUE)]["held_back"] == 0
