"""Pausing dispatch of a queue, or of one tenant on a queue, on real PostgreSQL and Redis
with the real publisher (exportcore.pauses): paused work waits in the outbox, unclaimed;
other tenants and queues flow; a resume wakes the publishers and sends it; the pause is a
row, so a restarted publisher process still honours it; a worker's take of due jobs beside
its message skips a paused pair too; every change is audited with its reason."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any
from uuid import uuid4

import psycopg
import pytest
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from devtools.stack import ROOT, Stack
from devtools.waiting import wait_for
from exportcore import pauses
from exportcore.artifacts import FileArtifactStore
from exportcore.audit import Actor
from exportcore.broker import make_celery
from exportcore.claims import claim_delivery
from exportcore.domain import BULK_QUEUE, FAST_QUEUE
from exportcore.pauses import AlreadyPaused, InvalidPause, NotPaused, Scope
from exportcore.publisher import Publisher, PublisherConfig
from exportcore.recovery import RecoveryScanner
from exportcore.settings import Settings
from exportcore.sql import q
from exportcore.store.metrics import metrics_snapshot
from exportcore.store.outbox import claim_params
from tests.support import count, fast_worker, idle_wakes, job, submit, tenant_with_notes

ALICE = Actor(kind="operator", name="nex_op_1a2b3c4d (alice)")


@pytest.fixture
def tenant_b(pool, notes_dir: Path) -> tuple[str, list[int]]:
    return tenant_with_notes(pool, notes_dir)


def make_publisher(s: Settings, pool) -> Publisher:
    """A publisher whose sends no worker claims here: it marks them at its next pass, and
    keeps sending small exports (no claim reports them: no limit of messages ahead)."""
    config = replace(PublisherConfig.from_settings(s), mark_delay=0, messages_ahead=100)
    return Publisher(s, pool, make_celery(s), config=config)


def outbox_of(pool, job_id: Any) -> dict[str, Any]:
    """The job's outbox event: whether it was sent, claimed, and how often published."""
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT sent_at IS NOT NULL AS sent, claim_token IS NOT NULL AS claimed, "
            "publish_attempts FROM export_outbox WHERE job_id = %s",
            (job_id,),
        ).fetchone()
    assert row is not None
    return dict(row)


def test_a_paused_queue_keeps_its_events_unsent_and_a_resume_sends_them(
    pool, settings: Settings, tenant
) -> None:
    tid, ids = tenant
    pause = pauses.pause(pool, Scope(BULK_QUEUE), reason="storage incident", actor=ALICE)
    assert pause["paused_by"] == ALICE.name and pause["tenant_id"] is None
    bulk = submit(pool, settings, tid, None)["id"]
    fast = submit(pool, settings, tid, ids[:1])["id"]
    publisher = make_publisher(settings, pool)

    counts = publisher.run_once()
    assert counts["claimed"] == 1 and counts["held"] == 0  # a pause is not a cap
    assert outbox_of(pool, fast)["claimed"]
    publisher.run_once()  # marks the fast one; the bulk one is still left alone
    assert outbox_of(pool, bulk) == {"sent": False, "claimed": False, "publish_attempts": 0}
    assert job(pool, bulk)["status"] == "queued" and job(pool, bulk)["dispatch_count"] == 0
    assert pauses.pauses(pool)[0]["waiting"] == 1

    # The resume's NOTIFY wakes an idle publisher, whose next pass sends the event.
    assert idle_wakes(
        publisher,
        lambda: pauses.resume(pool, Scope(BULK_QUEUE), reason="storage is back", actor=ALICE),
    )
    assert publisher.run_once()["claimed"] == 1
    publisher.run_once()
    assert outbox_of(pool, bulk)["sent"] and job(pool, bulk)["dispatch_count"] == 1
    assert pauses.pauses(pool) == []
    publisher.close_listener()

    with pool.connection() as conn:
        audit = conn.execute(
            "SELECT action, actor, target_kind, target_id, tenant_id, detail "
            "FROM operator_actions WHERE target_kind = 'queue' ORDER BY id"
        ).fetchall()
    assert [(a["action"], a["target_id"], a["detail"]["reason"]) for a in audit] == [
        ("queue_pause", BULK_QUEUE, "storage incident"),
        ("queue_resume", BULK_QUEUE, "storage is back"),
    ]
    assert {a["actor"] for a in audit} == {ALICE.name}
    assert audit[1]["detail"]["paused_seconds"] >= 0


def test_a_tenants_pause_leaves_other_tenants_flowing(
    pool, settings: Settings, tenant, tenant_b
) -> None:
    a, a_ids = tenant
    b, b_ids = tenant_b
    pauses.pause(pool, Scope(FAST_QUEUE, a), reason="tenant's bad data", actor=ALICE)
    paused = [submit(pool, settings, a, a_ids[i : i + 1])["id"] for i in range(3)]
    flowing = [submit(pool, settings, b, b_ids[i : i + 1])["id"] for i in range(3)]
    a_bulk = submit(pool, settings, a, None)["id"]  # the tenant's other queue is not paused
    publisher = make_publisher(settings, pool)
    for _ in range(6):
        publisher.run_once()
    assert all(outbox_of(pool, j)["sent"] for j in [*flowing, a_bulk])
    assert not any(outbox_of(pool, j)["sent"] or outbox_of(pool, j)["claimed"] for j in paused)

    # The gauges tell a pause from a fault: the paused jobs are no backlog age and no cap
    # hold, and the pause has gauges of its own.
    with pool.connection() as conn:
        conn.execute(
            "UPDATE export_jobs SET next_attempt_at = now() - interval '1 hour', "
            "created_at = now() - interval '1 hour' WHERE tenant_id = %s",
            (a,),
        )
        conn.execute(
            "UPDATE export_outbox SET available_at = now() - interval '1 hour' "
            "WHERE tenant_id = %s",
            (a,),
        )
        snap = metrics_snapshot(conn, settings.model_copy(update={"metrics_tenants": a}))
    assert snap["oldest_queued"][FAST_QUEUE] < 60
    assert snap["outbox_oldest_age"] < 60 and snap["outbox_unpublished"] == 3
    assert snap["tenant_backlog"][(a, FAST_QUEUE)]["oldest_age"] == 0
    assert snap["tenant_backlog"][(a, FAST_QUEUE)]["held_back"] == 0
    [p] = snap["dispatch_pauses"]
    assert (p["queue"], p["tenant_id"], p["waiting"]) == (FAST_QUEUE, a, 3)

    # A queue-wide pause and the tenant's are separate scopes: resuming one keeps the other.
    pauses.pause(pool, Scope(FAST_QUEUE), reason="bad release", actor=ALICE)
    pauses.resume(pool, Scope(FAST_QUEUE, a), reason="data fixed", actor=ALICE)
    for _ in range(2):
        publisher.run_once()
    assert not any(outbox_of(pool, j)["sent"] for j in paused)
    pauses.resume(pool, Scope(FAST_QUEUE), reason="rolled back", actor=ALICE)
    for _ in range(3):
        publisher.run_once()
    assert all(outbox_of(pool, j)["sent"] for j in paused)


def test_a_workers_take_beside_its_message_skips_a_paused_tenant(
    pool, settings: Settings, tenant, tenant_b
) -> None:
    a, a_ids = tenant
    b, b_ids = tenant_b
    pauses.pause(pool, Scope(FAST_QUEUE, a), reason="hold a", actor=ALICE)
    waiting = [submit(pool, settings, a, a_ids[i : i + 1])["id"] for i in range(3)]
    mine = submit(pool, settings, b, b_ids[:1])
    others = [submit(pool, settings, b, b_ids[i : i + 1])["id"] for i in range(1, 3)]
    with pool.connection() as conn:
        [message] = conn.execute(
            "SELECT id FROM export_outbox WHERE job_id = %s", (mine["id"],)
        ).fetchall()
        claimed = claim_delivery(
            conn,
            settings.model_copy(update={"worker_claim_jobs": 8}),
            job_ids=[mine["id"]],
            message_ids=[message["id"]],
            queue=FAST_QUEUE,
        )
    assert {j.id for j in claimed.jobs} == {mine["id"], *others}
    assert all(job(pool, j)["status"] == "queued" for j in waiting)
    assert not any(outbox_of(pool, j)["sent"] or outbox_of(pool, j)["claimed"] for j in waiting)


def test_pause_and_resume_refuse_what_they_cannot_do(pool) -> None:
    with pytest.raises(InvalidPause):
        pauses.pause(pool, Scope("exports.slow"), reason="x", actor=ALICE)
    with pytest.raises(InvalidPause):
        pauses.pause(pool, Scope(BULK_QUEUE), reason="   ", actor=ALICE)
    with pytest.raises(NotPaused):
        pauses.resume(pool, Scope(BULK_QUEUE), reason="nothing to resume", actor=ALICE)
    pauses.pause(pool, Scope(BULK_QUEUE), reason="first", actor=ALICE)
    with pytest.raises(AlreadyPaused) as refused:
        pauses.pause(pool, Scope(BULK_QUEUE), reason="second", actor=ALICE)
    assert refused.value.extra["paused_by"] == ALICE.name
    assert refused.value.extra["reason"] == "first"
    # refused changes write no audit row
    assert count(pool, "SELECT count(*) FROM operator_actions WHERE target_kind = 'queue'") == 1


def test_the_pause_survives_a_publisher_restart(
    pool,
    settings: Settings,
    database_url: str,
    broker_url: str,
    artifact_dir: Path,
    tmp_path: Path,
    tenant,
    tenant_b,
) -> None:
    """Real processes: a publisher and a fast-worker. Tenant a is paused on exports.fast;
    tenant b's exports succeed; the publisher is killed and started again, and b's next
    export succeeds through it while a's still wait; the resume sends a's, which succeed."""
    a, a_ids = tenant
    b, b_ids = tenant_b
    pauses.pause(pool, Scope(FAST_QUEUE, a), reason="hold a", actor=ALICE)
    stack = Stack.build(
        database_url=database_url,
        broker_url=broker_url,
        artifact_dir=artifact_dir,
        log_dir=tmp_path / "logs",
        names=("publisher",),
    ).start(wait=False)
    worker, _ = fast_worker(database_url, broker_url, artifact_dir, tmp_path / "logs")

    def succeeded(job_id: Any) -> bool:
        return job(pool, job_id)["status"] == "succeeded"

    try:
        held = [submit(pool, settings, a, a_ids[i : i + 1])["id"] for i in range(2)]
        first = submit(pool, settings, b, b_ids[:1])["id"]
        wait_for(lambda: succeeded(first), 60, "tenant b's first export to succeed")

        stack.procs["publisher"].signal(9)
        assert stack.procs["publisher"].wait(10) is not None
        stack.restart("publisher")
        second = submit(pool, settings, b, b_ids[1:2])["id"]
        wait_for(lambda: succeeded(second), 60, "tenant b's export after the restart")
        assert [job(pool, j)["status"] for j in held] == ["queued", "queued"]
        assert not any(outbox_of(pool, j)["sent"] for j in held)

        pauses.resume(pool, Scope(FAST_QUEUE, a), reason="done", actor=ALICE)
        wait_for(lambda: all(succeeded(j) for j in held), 60, "tenant a's exports after resume")
    finally:
        worker.stop()
        stack.stop()


def test_the_claim_reads_the_pauses_once_per_statement(
    pool, settings: Settings, tenant, tenant_b
) -> None:
    """The common case is no pause at all: the claim reads dispatch_pauses once per
    statement (one scan of an empty table), not once per (tenant, queue) pair."""

    for tid, ids in (tenant, tenant_b):
        for i in range(3):
            submit(pool, settings, tid, ids[i : i + 1])
        submit(pool, settings, tid, None)
    params = claim_params(claim_token=uuid4(), limit=100, claim_seconds=30, bulk_cap=1, fast_cap=8)
    with pool.connection() as conn, conn.transaction(force_rollback=True):
        plan = "\n".join(
            r["QUERY PLAN"]
            for r in conn.execute(
                "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) "
                + q("outbox", "outbox_mark_sent_and_claim_due"),
                params,
            )
        )
    scans = [line for line in plan.splitlines() if "dispatch_pauses" in line]
    assert scans, plan
    assert all("loops=1)" in line for line in scans), plan


def test_the_scanner_leaves_paused_work_alone_however_old(pool, settings: Settings, tenant) -> None:
    """A paused export's event is pending, so the lost-dispatch rule (a queued job with no
    pending event, not dispatched for the threshold) never takes it for a lost one: no
    redispatch, no second event, however long it waits."""

    tid, ids = tenant
    pauses.pause(pool, Scope(FAST_QUEUE, tid), reason="hold", actor=ALICE)
    waiting = submit(pool, settings, tid, ids[:1])["id"]
    with pool.connection() as conn:
        conn.execute(
            "UPDATE export_jobs SET created_at = now() - interval '20 minutes', "
            "next_attempt_at = now() - interval '20 minutes' WHERE id = %s",
            (waiting,),
        )
        conn.execute(
            "UPDATE export_outbox SET available_at = now() - interval '20 minutes', "
            "created_at = now() - interval '20 minutes' WHERE job_id = %s",
            (waiting,),
        )
    counts = RecoveryScanner(settings, pool, FileArtifactStore(settings.artifact_dir)).run_once()
    assert counts["redispatched"] == 0 and counts["queued_failed"] == 0, counts
    assert job(pool, waiting)["status"] == "queued"
    assert count(pool, "SELECT count(*) FROM export_outbox WHERE job_id = %s", waiting) == 1
    assert outbox_of(pool, waiting) == {"sent": False, "claimed": False, "publish_attempts": 0}


def test_the_migration_downgrades_and_upgrades_again(servers) -> None:

    url = servers.create_database("t_dispatch_pauses_migration")
    try:
        cfg = Config(str(ROOT / "alembic.ini"))
        cfg.attributes["database_url"] = url
        cfg.attributes["configure_logger"] = False
        command.upgrade(cfg, "head")
        before = ScriptDirectory.from_config(cfg).get_revision("0024").down_revision
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO dispatch_pauses (queue, tenant_id, reason, paused_by) "
                "VALUES ('exports.bulk', NULL, 'r', 'a')"
            )
            with pytest.raises(psycopg.errors.UniqueViolation):  # one pause per scope
                conn.execute(
                    "INSERT INTO dispatch_pauses (queue, tenant_id, reason, paused_by) "
                    "VALUES ('exports.bulk', NULL, 'again', 'b')"
                )
            with pytest.raises(psycopg.errors.CheckViolation):
                conn.execute(
                    "INSERT INTO dispatch_pauses (queue, reason, paused_by) "
                    "VALUES ('exports.slow', 'r', 'a')"
                )
        command.downgrade(cfg, str(before))
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT to_regclass('dispatch_pauses')").fetchone() == (None,)
        command.upgrade(cfg, "head")
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM dispatch_pauses").fetchone() == (0,)
    finally:
        servers.drop_database("t_dispatch_pauses_migration")
