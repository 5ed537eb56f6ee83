"""Rate limits against real Redis and PostgreSQL: the shared token bucket under concurrency,
the local fallback while Redis is unreachable, the per-tenant override, the API's 429 that
copies no snapshot and writes no row; the read limit (lists, history, downloads), the
webhook test and redeliver limit, and the paged history."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
import redis
from fastapi.testclient import TestClient

from devtools.stack import free_port
from exportcore import metrics
from exportcore.artifacts import FileArtifactStore
from exportcore.auth import create_api_key
from exportcore.ratelimit import KEY_PREFIX, Limit, RateLimiter
from exportcore.runner import JobRunner
from exportcore.settings import Settings
from exportcore.store import tenants as tenant_store
from services.api.app import create_app
from tests.support import count, tenant_with_notes


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_concurrent_takes_from_one_bucket_never_overshoot(settings: Settings) -> None:
    limiters = [RateLimiter(settings) for _ in range(4)]  # four api processes' worth
    limit = Limit(rate=0.001, burst=25)  # no refill to speak of during the test
    barrier, decisions = threading.Barrier(16), []

    def hammer(limiter: RateLimiter) -> None:
        barrier.wait()
        for _ in range(10):
            decisions.append(limiter.check("acme", limit))

    threads = [threading.Thread(target=hammer, args=(limiters[i % 4],)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(d.allowed for d in decisions) == 25
    assert {d.backend for d in decisions} == {"redis"}
    refused = [d for d in decisions if not d.allowed]
    assert len(refused) == 135 and all(d.retry_after > 100 for d in refused)  # 1 token / 1000 s
    assert limiters[0].check("other-tenant", limit).allowed  # buckets are per tenant
    ttl = redis.Redis.from_url(settings.broker_url).pttl(KEY_PREFIX + "acme")
    assert 0 < ttl <= 25 / 0.001 * 1000 + 1000  # expires once it would be full again


def test_retry_after_comes_from_the_bucket(settings: Settings) -> None:
    limiter = RateLimiter(settings)
    limit = Limit(rate=2.0, burst=1)
    assert limiter.check("t", limit).allowed
    refused = limiter.check("t", limit)
    assert not refused.allowed and 0.3 < refused.retry_after <= 0.5
    assert refused.retry_after_header == "1"


def test_while_redis_is_unreachable_the_local_share_decides_then_redis_again(
    settings: Settings,
) -> None:
    down = settings.model_copy(
        update={
            "rate_limit_redis_url": f"redis://127.0.0.1:{free_port()}/0",
            "rate_limit_local_share": 0.5,
        }
    )
    clock = Clock()
    limiter = RateLimiter(down, clock=clock, redis_retry_seconds=5.0)
    limit = Limit(rate=0.001, burst=10)
    decisions = [limiter.check("t", limit) for _ in range(8)]
    # neither unlimited nor refuse-all: half the burst in this process
    assert [d.allowed for d in decisions] == [True] * 5 + [False] * 3
    assert {d.backend for d in decisions} == {"local"}
    # Redis is back (the test's server); the circuit stays open until its retry time
    limiter.client = redis.Redis.from_url(settings.broker_url)
    limiter.script = limiter.client.register_script(limiter.script.script)
    assert limiter.check("t", limit).backend == "local"
    clock.t += 5.0
    back = limiter.check("t", limit)
    assert back.backend == "redis" and back.allowed  # the shared bucket, full


def _limited_api(
    settings: Settings, pool, notes_dir: Path, **limits: Any
) -> Iterator[tuple[TestClient, dict, str]]:
    """The api with ``limits`` over ``settings``, and a tenant with notes and a key:
    ``(client, auth headers, tenant id)``."""
    tid, _ = tenant_with_notes(pool, notes_dir)
    with pool.connection() as conn:
        key, _ = create_api_key(conn, tenant_id=tid, scopes=["exports:read", "exports:write"])
    with TestClient(create_app(settings.model_copy(update=limits))) as client:
        yield client, {"Authorization": f"Bearer {key}"}, tid


@pytest.fixture
def api(settings: Settings, pool, notes_dir: Path) -> Iterator[tuple[TestClient, dict, str]]:
    yield from _limited_api(
        settings,
        pool,
        notes_dir,
        tenant_submit_rate=0.001,
        tenant_submit_burst=3,
        tenant_limits_cache_seconds=0,
    )


def _state(pool) -> tuple[int, int, int, dict[str, float]]:
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM export_jobs) AS jobs,"
            " (SELECT count(*) FROM export_job_items) AS items,"
            " (SELECT count(*) FROM export_outbox) AS outbox"
        ).fetchone()
    submits = {
        outcome: metrics.SUBMITS.labels(outcome, "api")._value.get()
        for outcome in (
            "accepted",
            "quota_exceeded",
            "capacity_exceeded",
            "invalid",
            "rate_limited",
        )
    }
    return row["jobs"], row["items"], row["outbox"], submits


def test_over_the_rate_the_api_answers_429_and_writes_nothing(api, pool) -> None:
    client, auth, tid = api
    for _ in range(3):
        assert client.post("/v1/exports", json={"all": True}, headers=auth).status_code == 202
    jobs, items, outbox, submits = _state(pool)
    refused = client.post("/v1/exports", json={"all": True}, headers=auth)
    assert refused.status_code == 429
    assert refused.headers["content-type"].startswith("application/problem+json")
    problem = refused.json()
    assert problem["type"].endswith("/rate_limited") and problem["retry_after"] > 100
    assert int(refused.headers["retry-after"]) == int(-(-problem["retry_after"] // 1))
    after = _state(pool)
    assert after[:3] == (jobs, items, outbox)  # no job, no snapshot, no outbox event
    # refused before the submit path began: no snapshot was copied, admission never ran
    assert after[3] == {**submits, "rate_limited": submits["rate_limited"] + 1}
    # the override applies at once here (cache 0 s): a higher rate lets the next one in
    with pool.connection() as conn:
        tenant_store.tenant_set_rate(conn, tenant_id=tid, rate=1000.0, burst=10)
    assert client.post("/v1/exports", json={"all": True}, headers=auth).status_code == 202
    with pool.connection() as conn:
        tenant_store.tenant_set_rate(conn, tenant_id=tid, rate=None, burst=None)
    assert count(pool, "SELECT count(*) FROM tenants WHERE submit_rate IS NULL AND id = %s", tid)


def test_run_now_takes_from_the_same_bucket(api, pool) -> None:
    client, auth, _ = api
    with pool.connection() as conn:
        note = conn.execute("SELECT min(id) AS id FROM notes").fetchone()["id"]
    sched = client.post(
        "/v1/schedules", json={"interval_seconds": 3600, "note_ids": [note]}, headers=auth
    ).json()
    answers = [
        client.post(f"/v1/schedules/{sched['id']}/runs", headers=auth).status_code for _ in range(3)
    ]
    answers.append(client.post("/v1/exports", json={"all": True}, headers=auth).status_code)
    assert answers == [202, 202, 202, 429]


@pytest.fixture
def reads(settings: Settings, pool, notes_dir: Path) -> Iterator[tuple[TestClient, dict, str]]:
    """The api with small read and webhook-action buckets (no refill during a test)."""
    yield from _limited_api(
        settings,
        pool,
        notes_dir,
        tenant_read_rate=0.001,
        tenant_read_burst=4,
        webhook_action_rate=0.001,
        webhook_action_burst=3,
        webhook_allow_http=True,
        webhook_allow_private_networks=True,
    )


def _refused(r: Any) -> None:
    assert r.status_code == 429, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["type"].endswith("/rate_limited") and int(r.headers["retry-after"]) > 100


def _small_export(client: TestClient, pool, tid: str, auth: dict) -> str:
    with pool.connection() as conn:
        ids = [
            r["id"]
            for r in conn.execute(
                "SELECT id FROM notes WHERE tenant_id = %s ORDER BY id LIMIT 3", (tid,)
            )
        ]
    return str(client.post("/v1/exports", json={"note_ids": ids}, headers=auth).json()["id"])


def test_list_history_and_download_share_the_tenants_read_bucket(reads, pool, settings) -> None:
    client, auth, tid = reads
    job_id = _small_export(client, pool, tid, auth)
    JobRunner(settings, pool, FileArtifactStore(settings.artifact_dir)).run(job_id, uuid4())
    answers = [
        client.get("/v1/exports?limit=500", headers=auth).status_code,
        client.get(f"/v1/exports/{job_id}/events", headers=auth).status_code,
        client.get(f"/v1/exports/{job_id}/download", headers=auth).status_code,
        client.get("/v1/webhooks", headers=auth).status_code,
    ]
    assert answers == [200, 200, 200, 200]
    for path in ("/v1/exports?limit=500", f"/v1/exports/{job_id}/events", "/v1/schedules"):
        _refused(client.get(path, headers=auth))
    _refused(client.get(f"/v1/exports/{job_id}/download", headers=auth))
    # one export's status is not a bulk read: a client polling it is never refused
    assert all(
        client.get(f"/v1/exports/{job_id}", headers=auth).status_code == 200 for _ in range(10)
    )


def test_webhook_tests_redeliveries_and_recovers_share_a_small_bucket(reads, pool) -> None:
    client, auth, _ = reads
    hook = client.post("/v1/webhooks", json={"url": "http://127.0.0.1:9/hook"}, headers=auth).json()
    assert client.post(f"/v1/webhooks/{hook['id']}/test", headers=auth).status_code == 202
    with pool.connection() as conn:  # an attempt to redeliver, as the sender records one
        message = conn.execute("SELECT id FROM webhook_messages").fetchone()["id"]
        attempt = conn.execute(
            "INSERT INTO webhook_attempts (message_id, endpoint_id, attempt, redelivery,"
            " started_at, outcome, signatures) VALUES (%s, %s, 1, false, now(),"
            " 'connection_error', 1) RETURNING id",
            (message, hook["id"]),
        ).fetchone()["id"]
    redeliver = f"/v1/webhooks/{hook['id']}/deliveries/{attempt}/redeliver"
    assert client.post(redeliver, headers=auth).status_code == 202
    assert client.post(f"/v1/webhooks/{hook['id']}/test", headers=auth).status_code == 202
    _refused(client.post(redeliver, headers=auth))
    _refused(client.post(f"/v1/webhooks/{hook['id']}/test", headers=auth))
    # a recover (which resets the budgets of every failed message) shares the bucket
    with pool.connection() as conn:
        conn.execute("UPDATE webhook_messages SET status = 'failed' WHERE id = %s", (message,))
    recover = f"/v1/webhooks/{hook['id']}/recover"
    _refused(client.post(recover, json={"since": "2000-01-01T00:00:00Z"}, headers=auth))
    # refused before anything was written: the two accepted tests' messages, no third, and
    # the failed one not recovered
    assert count(pool, "SELECT count(*) FROM webhook_messages") == 2
    assert count(pool, "SELECT count(*) FROM webhook_messages WHERE status = 'failed'") == 1


def test_the_history_is_paged_with_a_link_to_the_next_page(api, pool, settings) -> None:
    client, auth, tid = api
    job_id = _small_export(client, pool, tid, auth)
    JobRunner(settings, pool, FileArtifactStore(settings.artifact_dir)).run(job_id, uuid4())
    everything = client.get(f"/v1/exports/{job_id}/events", headers=auth)
    assert "link" not in everything.headers  # the whole history fits the default page
    kinds = [e["kind"] for e in everything.json()]
    assert kinds == ["submitted", "claimed", "succeeded"]
    page = client.get(f"/v1/exports/{job_id}/events?limit=2", headers=auth)
    assert [e["kind"] for e in page.json()] == kinds[:2]
    link = page.headers["link"]
    assert link.startswith(f"</v1/exports/{job_id}/events?limit=2&cursor=")
    assert link.endswith('>; rel="next"')
    rest = client.get(link[1 : link.index(">")], headers=auth)
    assert [e["kind"] for e in rest.json()] == kinds[2:] and "link" not in rest.headers
    bad = client.get(f"/v1/exports/{job_id}/events?cursor=nonsense", headers=auth)
    assert bad.status_code == 400 and bad.json()["type"].endswith("/invalid_cursor")
    too_many = client.get(f"/v1/exports/{job_id}/events?limit=1001", headers=auth)
    assert too_many.status_code == 422
