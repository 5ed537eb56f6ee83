"""Seeing the broker (`exportctl broker inspect`, the exports_broker_* gauges) on real Redis
with real Celery messages (published by the project's publisher, or Celery's ``send_task``
for a message of no job, and taken by kombu's own consumer path so that they sit in its
``unacked`` hash): counts and ages per queue, the reconciliation against PostgreSQL, and a
purge that removes only the messages of terminal jobs. A real worker holding a message is in
tests/e2e/test_operations.py."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest

from exportcore.broker import EXPORT_BATCH_TASK, EXPORT_TASK, TICK_TASK, make_celery
from exportcore.broker_inspect import BrokerInspector, BrokerKeys
from exportcore.cancel import request_cancel
from exportcore.metrics import BrokerGauges
from exportcore.publisher import Publisher
from exportcore.settings import Settings
from exportcore.store.outbox import Sent, outbox_mark_sent_and_claim_due, outbox_mark_sent_many
from exportctl.exits import EXIT_UNAVAILABLE
from tests.support import submit, wait_for

EXPORTCTL = str(Path(sys.executable).parent / "exportctl")


@pytest.fixture
def r(settings: Settings) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.broker_url)
    yield client
    client.close()


def published(
    pool, settings: Settings, tid: str, ids: list[int], n: int, message_jobs: int = 1
) -> list:
    """``n`` small jobs submitted and published to exports.fast: by the real publisher, one
    message each, or (``message_jobs`` > 1) in batch messages of that many jobs, as a
    publisher of an earlier version sent them (workers still take them)."""
    jobs = [submit(pool, settings, tid, ids[i : i + 1])["id"] for i in range(n)]
    s = settings.model_copy(update={"publisher_messages_ahead": n})
    if message_jobs == 1:
        publisher = Publisher(s, pool, make_celery(s))
        assert publisher.run_once()["published"] == n
        publisher.flush()  # mark them sent now (no worker claims them here)
        return jobs
    token = uuid4()
    with pool.connection() as conn:
        events = outbox_mark_sent_and_claim_due(
            conn, claim_token=token, limit=n, claim_seconds=30, bulk_cap=1, fast_cap=n
        ).events
    app = make_celery(s)
    for i in range(0, n, message_jobs):
        batch = events[i : i + message_jobs]
        app.send_task(
            EXPORT_BATCH_TASK,
            args=[[str(e["job_id"]) for e in batch], [str(e["id"]) for e in batch]],
            task_id=str(batch[0]["id"]),
            queue="exports.fast",
        )
    with pool.connection() as conn:
        outbox_mark_sent_many(conn, sent=[Sent(e["id"], token, e["claimed_at"]) for e in events])
    return jobs


def _body(raw: bytes) -> bytes:
    """The Celery body ``[args, kwargs, embed]`` (JSON) of a raw kombu envelope."""
    return base64.b64decode(json.loads(raw)["body"])


def age_dispatches(pool, *job_ids) -> None:
    """Move the jobs' last dispatch a minute back (past the inspector's grace)."""
    with pool.connection() as conn:
        conn.execute(
            "UPDATE export_jobs SET last_dispatched_at = last_dispatched_at - interval '1 minute',"
            " created_at = created_at - interval '1 minute' WHERE id = ANY(%s)",
            (list(job_ids),),
        )
        conn.execute(
            "UPDATE export_outbox SET sent_at = sent_at - interval '90 seconds'"
            " WHERE job_id = ANY(%s)",
            (list(job_ids),),
        )


def test_counts_ages_and_reconciliation(pool, settings: Settings, tenant, r) -> None:
    tid, ids = tenant
    live, stale, lost = published(pool, settings, tid, ids, 3)
    request_cancel(pool, tenant_id=tid, job_id=stale)  # terminal while its message waits
    age_dispatches(pool, live, stale, lost)
    celery = make_celery(settings)
    ghost = uuid4()
    celery.send_task(EXPORT_TASK, args=[str(ghost)], task_id=str(uuid4()), queue="exports.fast")
    celery.send_task(TICK_TASK, queue="exports.fast")
    r.lpush("exports.bulk", b"not json at all")
    # the message of `lost` vanishes from Redis (a flush, a failover)
    [lost_raw] = [m for m in r.lrange("exports.fast", 0, -1) if str(lost).encode() in _body(m)]
    assert r.lrem("exports.fast", 1, lost_raw) == 1

    report = BrokerInspector.from_settings(settings, pool).inspect()
    fast, bulk = report.queues["exports.fast"], report.queues["exports.bulk"]
    assert (fast.ready, fast.unacked, bulk.ready, bulk.unacked) == (4, 0, 1, 0)
    assert [m.job_id for m in report.stale] == [stale]
    assert report.stale[0].job_status == "cancelled"
    assert [m.job_id for m in report.unknown] == [ghost]
    assert [m.queue for m in report.unreadable] == ["exports.bulk"]
    assert [row["id"] for row in report.lost] == [lost]
    assert (fast.stale, fast.unknown, fast.lost, bulk.unreadable) == (1, 1, 1, 1)
    # ages of ready messages come from their outbox events (moved 90 s back)
    assert fast.oldest_ready_age is not None and 85 < fast.oldest_ready_age < 600
    assert fast.oldest_unacked_age is None and report.oldest_unacked_age is None
    assert r.llen("exports.fast") == 4 and r.llen("exports.bulk") == 1  # read-only
    assert report.purged is None and not report.truncated


def test_unacked_messages_and_a_purge_that_removes_only_terminal_jobs(
    pool, settings: Settings, tenant, r
) -> None:
    tid, ids = tenant
    held_live, held_stale, ready_live, ready_stale = published(pool, settings, tid, ids, 4)
    celery = make_celery(settings)
    ghost = uuid4()
    celery.send_task(EXPORT_TASK, args=[str(ghost)], task_id=str(uuid4()), queue="exports.fast")
    # a consumer takes the two oldest messages and does not acknowledge them (kombu's own
    # QoS: `unacked` hash + `unacked_index` set), exactly as a busy worker holds them
    with celery.connection_for_read() as conn:
        channel = conn.default_channel
        taken = [channel.basic_get("exports.fast", no_ack=False) for _ in range(2)]
        assert {m.decode()[0][0] for m in taken} == {str(held_live), str(held_stale)}
        keys = BrokerKeys()
        assert r.hlen(keys.unacked) == 2 and r.zcard(keys.unacked_index) == 2
        for job_id in (held_stale, ready_stale):
            request_cancel(pool, tenant_id=tid, job_id=job_id)

        inspector = BrokerInspector.from_settings(settings, pool)
        report = inspector.inspect()
        fast = report.queues["exports.fast"]
        assert (fast.ready, fast.unacked) == (3, 2)
        assert fast.oldest_unacked_age is not None and fast.oldest_unacked_age < 60
        assert report.oldest_unacked_age == fast.oldest_unacked_age
        assert sorted((m.state, str(m.job_id)) for m in report.stale) == sorted(
            [("unacked", str(held_stale)), ("ready", str(ready_stale))]
        )

        purged = inspector.inspect(purge_stale=True)
        assert purged.purged == {"ready": 1, "unacked": 1}
        after = inspector.inspect()
        assert after.stale == [] and [m.job_id for m in after.unknown] == [ghost]
        assert (after.queues["exports.fast"].ready, after.queues["exports.fast"].unacked) == (
            2,
            1,
        )
        assert r.hlen(keys.unacked) == 1 and r.zcard(keys.unacked_index) == 1
        remaining = {json.loads(_body(m))[0][0] for m in r.lrange("exports.fast", 0, -1)}
        assert remaining == {str(ready_live), str(ghost)}  # the unknown job is never removed
        # the consumer acknowledges what it still holds; the purged one's ack is harmless
        for m in taken:
            m.ack()
    assert r.hlen(keys.unacked) == 0 and r.zcard(keys.unacked_index) == 0


def test_the_gauges_and_the_cli(pool, settings: Settings, tenant, r) -> None:
    tid, ids = tenant
    live, stale = published(pool, settings, tid, ids, 2)
    request_cancel(pool, tenant_id=tid, job_id=stale)
    gauges = BrokerGauges(BrokerInspector.from_settings(settings, pool))
    registry = CollectorRegistry()
    registry.register(gauges)
    assert generate_latest(registry).decode().count("exports_broker_") == 3  # up 0 only
    assert "exports_broker_up 0.0" in generate_latest(registry).decode()
    assert gauges.refresh()
    text = generate_latest(registry).decode()
    assert "exports_broker_up 1.0" in text and "exports_broker_report_age_seconds" in text
    assert 'exports_broker_messages{queue="exports.fast",state="ready"} 2.0' in text
    assert 'exports_broker_messages{queue="exports.fast",state="unacked"} 0.0' in text
    assert 'exports_broker_reconciliation{kind="stale",queue="exports.fast"} 1.0' in text
    assert "exports_broker_oldest_unacked_age_seconds 0.0" in text

    down = settings.model_copy(
        update={"celery_broker_url": "redis://127.0.0.1:1/0", "broker_publish_timeout": 0.5}
    )
    failing = BrokerGauges(BrokerInspector.from_settings(down, pool))
    assert not failing.refresh()
    broken = CollectorRegistry()
    broken.register(failing)
    assert "exports_broker_up 0.0" in generate_latest(broken).decode()
    # the background refresh: started, it inspects at once and then every interval
    started = BrokerGauges(BrokerInspector.from_settings(settings, pool), interval=0.2).start()
    live_registry = CollectorRegistry()
    live_registry.register(started)
    try:
        wait_for(
            lambda: "exports_broker_up 1.0" in generate_latest(live_registry).decode(),
            10,
            "a background refresh",
        )
    finally:
        started.stop()

    env = {
        **os.environ,
        "DATABASE_URL": str(settings.database_url),
        "CELERY_BROKER_URL": settings.broker_url,
        "COLUMNS": "200",
    }

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [EXPORTCTL, "broker", "inspect", *args], env=env, capture_output=True, text=True
        )

    table = cli()
    assert table.returncode == 0, table.stderr
    assert "exports.fast" in table.stdout and str(stale) in table.stdout
    as_json = json.loads(cli("--json").stdout)
    assert as_json["queues"]["exports.fast"]["ready"] == 2
    assert [m["job_id"] for m in as_json["stale"]] == [str(stale)]
    purge = cli("--purge-stale")
    assert purge.returncode == 0 and "purged 1 ready and 0 unacked" in purge.stderr
    with pool.connection() as conn:  # the purge is audited, with what it removed
        [audited] = conn.execute(
            "SELECT actor_kind, actor, count, detail FROM operator_actions "
            "WHERE action = 'purge_stale'"
        ).fetchall()
    assert audited["actor_kind"] == "database" and audited["actor"].startswith("exportctl as ")
    assert (audited["count"], audited["detail"]) == (1, {"ready": 1, "unacked": 0})
    assert json.loads(cli("--json").stdout)["stale"] == []
    unreachable = subprocess.run(
        [EXPORTCTL, "broker", "inspect"],
        env={**env, "CELERY_BROKER_URL": "redis://127.0.0.1:1/0", "BROKER_PUBLISH_TIMEOUT": "0.5"},
        capture_output=True,
        text=True,
    )
    # an unreachable broker is "unavailable, retry later" like an unreachable database
    assert unreachable.returncode == EXIT_UNAVAILABLE, unreachable.stderr
    assert "cannot read the broker" in unreachable.stderr
    assert "Traceback" not in unreachable.stderr
    assert live


def test_a_batch_message_is_stale_only_when_every_job_it_names_is_terminal(
    pool, settings: Settings, tenant, r
) -> None:
    tid, ids = tenant
    jobs = published(pool, settings, tid, ids, 3, message_jobs=10)
    assert r.llen("exports.fast") == 1  # the three small jobs travel in one message
    for job_id in jobs[:2]:
        request_cancel(pool, tenant_id=tid, job_id=job_id)
    inspector = BrokerInspector.from_settings(settings, pool)
    report = inspector.inspect(purge_stale=True)
    assert report.stale == [] and report.unknown == [] and report.unreadable == []
    assert report.purged == {"ready": 0, "unacked": 0}  # one job in it is still queued
    assert r.llen("exports.fast") == 1
    request_cancel(pool, tenant_id=tid, job_id=jobs[2])
    report = inspector.inspect(purge_stale=True)
    [stale] = report.stale
    assert set(stale.job_ids) == set(jobs) and stale.job_status == "cancelled"
    assert report.purged == {"ready": 1, "unacked": 0} and r.llen("exports.fast") == 0
