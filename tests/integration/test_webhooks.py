"""Webhooks against real PostgreSQL and a real receiver on loopback: the triggers write the
outbox in the transaction of the state change; the delivery process (run in this process,
pass by pass) signs, sends, retries, opens the breaker and disables; SSRF is refused."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest

from devtools.webhook_receiver import Answer, Receiver
from exportcore.artifacts import FileArtifactStore
from exportcore.cancel import request_cancel
from exportcore.recovery import RecoveryScanner
from exportcore.runner import JobRunner
from exportcore.settings import Settings
from exportcore.webhooks import endpoints, events
from exportcore.webhooks.delivery import WebhookDelivery
from exportcore.webhooks.sender import Sender
from tests.support import count, create_tenant, shift_job, submit


@pytest.fixture
def wh_settings(settings: Settings) -> Settings:
    """Test settings that allow loopback http receivers, with short waits."""
    return Settings(
        **{
            **settings.model_dump(),
            "webhook_allow_http": True,
            "webhook_allow_private_networks": True,
            "webhook_retry_schedule": "0.05,0.1,0.2,0.2,0.2,0.2,0.2",
            "webhook_breaker_base_seconds": 0.2,
            "webhook_breaker_cap_seconds": 0.5,
            "webhook_timeout_seconds": 1.0,
            "webhook_claim_seconds": 6.0,
            "webhook_poll_seconds": 0.05,
        }
    )


@pytest.fixture
def delivery(pool, wh_settings: Settings) -> Iterator[WebhookDelivery]:
    d = WebhookDelivery(wh_settings, pool)
    yield d
    d.close(timeout=5)


def pump(d: WebhookDelivery, until: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Run delivery passes (as the service loop does) until ``until()`` is truthy."""
    stop = threading.Event()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        counts = d.run_once()
        value = until()
        if value:
            return value
        wait = d.next_wait(counts, 0.05)
        if wait > 0:
            d.idle(wait, stop)
    raise AssertionError(f"timed out; last counts {counts}")


def finish(pool, settings: Settings, job_id: UUID) -> None:
    """Run the job to succeeded, as a worker does."""
    runner = JobRunner(settings, pool, FileArtifactStore(settings.artifact_dir))
    assert runner.run(job_id, uuid4()).result == "succeeded"


def messages(pool, **where: Any) -> list[dict[str, Any]]:
    sql = "SELECT * FROM webhook_messages"
    if where:
        sql += " WHERE " + " AND ".join(f"{k} = %({k})s" for k in where)
    with pool.connection() as conn:
        return conn.execute(sql + " ORDER BY created_at", where).fetchall()


def endpoint_row(pool, endpoint_id: UUID) -> dict[str, Any]:
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT * FROM webhook_endpoints WHERE id = %s", (endpoint_id,)
        ).fetchone()
    assert row is not None
    return row


# --- the outbox triggers ------------------------------------------------------------------


def test_terminal_transitions_write_one_message_per_subscribed_enabled_endpoint(
    pool, wh_settings: Settings, tenant
) -> None:
    tid, ids = tenant
    all_events = endpoints.create_endpoint(
        pool, wh_settings, tenant_id=tid, url="http://127.0.0.1:9/a"
    )
    only_failed = endpoints.create_endpoint(
        pool, wh_settings, tenant_id=tid, url="http://127.0.0.1:9/b", event_types=["export.failed"]
    )
    off = endpoints.create_endpoint(
        pool, wh_settings, tenant_id=tid, url="http://127.0.0.1:9/c", enabled=False
    )
    other_tenant = create_tenant(pool)
    endpoints.create_endpoint(pool, wh_settings, tenant_id=other_tenant, url="http://127.0.0.1:9/d")

    job = submit(pool, wh_settings, tid, ids[:2])
    # claim and renew are not terminal: nothing yet
    assert messages(pool) == []
    finish(pool, wh_settings, job["id"])
    [m] = messages(pool)
    assert (m["endpoint_id"], m["event_type"], m["subject_id"]) == (
        all_events["id"],
        "export.succeeded",
        job["id"],
    )
    export = m["data"]["export"]
    assert export["status"] == "succeeded" and export["note_count"] == 2
    assert set(export["result"]) == {"rows", "bytes", "sha256"}
    cancelled = submit(pool, wh_settings, tid, ids[:1])
    request_cancel(pool, tenant_id=tid, job_id=cancelled["id"])
    assert [m["event_type"] for m in messages(pool, subject_id=cancelled["id"])] == [
        "export.cancelled"
    ]
    failed = submit(pool, wh_settings, tid, ids[:1])
    shift_job(pool, failed["id"], deadline_at="-2 hours")
    RecoveryScanner(wh_settings, pool, FileArtifactStore(wh_settings.artifact_dir)).run_once()
    got = {(m["endpoint_id"], m["event_type"]) for m in messages(pool, subject_id=failed["id"])}
    assert got == {(all_events["id"], "export.failed"), (only_failed["id"], "export.failed")}
    assert messages(pool, endpoint_id=off["id"]) == []
    assert (
        count(pool, "SELECT count(*) FROM webhook_messages WHERE tenant_id = %s", other_tenant) == 0
    )


def test_a_rolled_back_transition_leaves_no_message(pool, wh_settings: Settings, tenant) -> None:
    tid, ids = tenant
    endpoints.create_endpoint(pool, wh_settings, tenant_id=tid, url="http://127.0.0.1:9/")
    job = submit(pool, wh_settings, tid, ids[:1])
    with (
        pool.connection() as conn,
        pytest.raises(psycopg.errors.RaiseException),
        conn.transaction(),
    ):
        conn.execute(
            "UPDATE export_jobs SET status = 'cancelled', cancel_requested = true,"
            " finished_at = now() WHERE id = %s",
            (job["id"],),
        )
        assert conn.execute("SELECT count(*) AS n FROM webhook_messages").fetchone()["n"] == 1
        conn.execute("DO $$ BEGIN RAISE EXCEPTION 'roll back'; END $$")
    assert messages(pool) == []


def test_pausing_a_schedule_is_an_event(pool, wh_settings: Settings, tenant) -> None:
    from exportcore.schedules.management import create_schedule, update_schedule

    tid, _ = tenant
    ep = endpoints.create_endpoint(pool, wh_settings, tenant_id=tid, url="http://127.0.0.1:9/")
    schedule = create_schedule(
        pool, tenant_id=tid, fields={"interval_seconds": 3600, "all": True, "format": "json"}
    )
    update_schedule(pool, tenant_id=tid, schedule_id=schedule["id"], patch={"name": "renamed"})
    assert messages(pool) == []
    update_schedule(pool, tenant_id=tid, schedule_id=schedule["id"], patch={"enabled": False})
    update_schedule(pool, tenant_id=tid, schedule_id=schedule["id"], patch={"enabled": False})
    [m] = messages(pool)
    assert (m["endpoint_id"], m["event_type"]) == (ep["id"], "schedule.paused")
    assert m["data"]["schedule"]["id"] == str(schedule["id"])
    assert m["data"]["schedule"]["enabled"] is False


# --- delivery to a real receiver ----------------------------------------------------------


def test_each_finished_export_arrives_signed_verified_and_thin(
    pool, wh_settings: Settings, tenant, delivery: WebhookDelivery
) -> None:
    tid, ids = tenant
    with Receiver() as receiver:
        ep = endpoints.create_endpoint(
            pool, wh_settings, tenant_id=tid, url=receiver.url + "/hooks/notes?x=1"
        )
        receiver.secrets = [ep["secret"]]
        jobs = [submit(pool, wh_settings, tid, ids[:3]) for _ in range(3)]
        for j in jobs:
            finish(pool, wh_settings, j["id"])
        pump(delivery, lambda: len(receiver.received) >= 3)
        pump(delivery, lambda: all(m["status"] == "delivered" for m in messages(pool)))
    by_subject = {r.payload["data"]["export"]["id"]: r for r in receiver.received}
    assert set(by_subject) == {str(j["id"]) for j in jobs}
    for r in receiver.received:
        assert r.verified_by == (0,), "signature must verify with the library and the spec"
        assert r.path == "/hooks/notes?x=1"
        assert r.host == f"127.0.0.1:{receiver.port}"
        assert r.webhook_id.startswith("msg_") and "." not in r.webhook_id
        body = r.payload
        assert body["type"] == "export.succeeded"
        export = body["data"]["export"]
        assert export["links"]["download"] == f"/v1/exports/{export['id']}/download"
        # thin: ids, status, sizes, links, the client's metadata and tags; never note
        # content or titles
        assert set(export) == {
            "id",
            "status",
            "format",
            "note_count",
            "attempts",
            "replay_of",
            "created_at",
            "finished_at",
            "result",
            "error",
            "links",
            "metadata",
            "tags",
        }
    with pool.connection() as conn:
        titles = [
            r["title"]
            for r in conn.execute("SELECT title FROM notes WHERE id = ANY(%s)", (ids[:3],))
        ]
    for r in receiver.received:
        for title in titles:
            assert title.encode() not in r.body
    rows = messages(pool)
    assert {events.webhook_id(m["id"]) for m in rows} == set(receiver.ids())
    with pool.connection() as conn:
        attempts = conn.execute("SELECT * FROM webhook_attempts").fetchall()
    assert {a["outcome"] for a in attempts} == {"delivered"}
    assert all(a["status_code"] == 204 and a["latency_ms"] > 0 for a in attempts)
    assert all(a["address"] == "127.0.0.1" for a in attempts)
    assert endpoint_row(pool, ep["id"])["last_success_at"] is not None


def test_failing_timing_out_and_down_receivers_get_retries_then_the_endpoint_is_disabled(
    pool, wh_settings: Settings, tenant, delivery: WebhookDelivery
) -> None:
    tid, ids = tenant
    script = {"mode": "500"}

    def respond(n: int, headers: dict[str, str]) -> Answer:
        if script["mode"] == "500":
            return Answer(status=500)
        if script["mode"] == "slow":
            return Answer(delay=2.5)  # the sender's timeout is 1 s
        return Answer(status=200)

    receiver = Receiver(respond=respond).start()
    ep = endpoints.create_endpoint(pool, wh_settings, tenant_id=tid, url=receiver.url)
    receiver.secrets = [ep["secret"]]
    job = submit(pool, wh_settings, tid, ids[:1])
    finish(pool, wh_settings, job["id"])
    [msg] = messages(pool)

    def outcomes() -> list[str]:
        with pool.connection() as conn:
            return [
                r["outcome"]
                for r in conn.execute("SELECT outcome FROM webhook_attempts ORDER BY id")
            ]

    pump(delivery, lambda: outcomes().count("http_error") >= 2)
    script["mode"] = "slow"
    pump(delivery, lambda: "timeout" in outcomes())
    receiver.stop()  # down: connection refused
    pump(delivery, lambda: "connection_error" in outcomes())
    # the breaker opened after 5 consecutive failures: a single probe at a time from then on
    row = endpoint_row(pool, ep["id"])
    pump(delivery, lambda: endpoint_row(pool, ep["id"])["consecutive_failures"] >= 5)
    row = endpoint_row(pool, ep["id"])
    assert row["enabled"] and row["failing_since"] is not None
    # the same message every time, with the same webhook-id
    assert {r.webhook_id for r in receiver.received} == {events.webhook_id(msg["id"])}
    # a day of failures: move its start back instead of waiting
    with pool.connection() as conn:
        conn.execute(
            "UPDATE webhook_endpoints SET failing_since = now() - interval '25 hours',"
            " circuit_open_until = NULL WHERE id = %s",
            (ep["id"],),
        )
    pump(delivery, lambda: not endpoint_row(pool, ep["id"])["enabled"])
    row = endpoint_row(pool, ep["id"])
    assert "failing without a success for more than 24 h" in row["disabled_reason"]
    assert "ConnectError" in row["disabled_reason"]
    assert row["disabled_at"] is not None
    # disabled: no more attempts, the message waits
    n = len(outcomes())
    for _ in range(5):
        delivery.run_once()
    assert len(outcomes()) == n
    assert messages(pool)[0]["status"] == "pending"
    # probes of the open circuit gave their attempts back: the outage used up 5 of 20
    assert messages(pool)[0]["budget_used"] == 5 < wh_settings.webhook_max_attempts
    # the client fixes the receiver and enables the endpoint: the message is delivered
    script["mode"] = "ok"
    receiver.start()
    endpoints.update_endpoint(
        pool, wh_settings, tenant_id=tid, endpoint_id=ep["id"], patch={"enabled": True}
    )
    pump(delivery, lambda: messages(pool)[0]["status"] == "delivered")
    receiver.stop()
    assert endpoint_row(pool, ep["id"])["consecutive_failures"] == 0


def test_410_gone_disables_the_endpoint_at_once(
    pool, wh_settings: Settings, tenant, delivery: WebhookDelivery
) -> None:
    tid, ids = tenant
    with Receiver(respond=lambda n, h: Answer(status=410)) as receiver:
        ep = endpoints.create_endpoint(pool, wh_settings, tenant_id=tid, url=receiver.url)
        finish(pool, wh_settings, submit(pool, wh_settings, tid, ids[:1])["id"])
        pump(delivery, lambda: not endpoint_row(pool, ep["id"])["enabled"])
    assert "410 Gone" in endpoint_row(pool, ep["id"])["disabled_reason"]
    assert [m["status"] for m in messages(pool)] == ["failed"]


def test_redirects_are_not_followed(pool, wh_settings: Settings, tenant, delivery) -> None:
    tid, ids = tenant
    with (
        Receiver() as target,
        Receiver(
            respond=lambda n, h: Answer(status=307, headers={"Location": target.url + "/x"})
        ) as redirector,
    ):
        endpoints.create_endpoint(pool, wh_settings, tenant_id=tid, url=redirector.url)
        finish(pool, wh_settings, submit(pool, wh_settings, tid, ids[:1])["id"])
        pump(delivery, lambda: count(pool, "SELECT count(*) FROM webhook_attempts") >= 1)
        assert target.received == []
    with pool.connection() as conn:
        a = conn.execute("SELECT * FROM webhook_attempts").fetchone()
    assert (a["outcome"], a["status_code"]) == ("redirect", 307)


def test_redelivery_sends_the_same_webhook_id_again(
    pool, wh_settings: Settings, tenant, delivery: WebhookDelivery
) -> None:
    tid, ids = tenant
    with Receiver() as receiver:
        ep = endpoints.create_endpoint(pool, wh_settings, tenant_id=tid, url=receiver.url)
        receiver.secrets = [ep["secret"]]
        finish(pool, wh_settings, submit(pool, wh_settings, tid, ids[:1])["id"])
        pump(delivery, lambda: messages(pool)[0]["status"] == "delivered")
        with pool.connection() as conn:
            attempt = conn.execute("SELECT id FROM webhook_attempts").fetchone()
        endpoints.redeliver(pool, tenant_id=tid, endpoint_id=ep["id"], attempt_id=attempt["id"])
        pump(
            delivery,
            lambda: len(receiver.received) == 2 and messages(pool)[0]["status"] == "delivered",
        )
    first, second = receiver.received
    assert first.webhook_id == second.webhook_id
    assert first.body == second.body
    assert second.verified_by == (0,)
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT attempt, redelivery FROM webhook_attempts ORDER BY id"
        ).fetchall()
    assert [(r["attempt"], r["redelivery"]) for r in rows] == [(1, False), (2, True)]
    with pytest.raises(endpoints.WebhookNotFound):
        endpoints.redeliver(
            pool, tenant_id="someone-else", endpoint_id=ep["id"], attempt_id=attempt["id"]
        )


def test_secret_rotation_signs_with_both_during_the_overlap_then_only_the_new(
    pool, wh_settings: Settings, tenant, delivery: WebhookDelivery
) -> None:
    tid, ids = tenant
    with Receiver() as receiver:
        ep = endpoints.create_endpoint(pool, wh_settings, tenant_id=tid, url=receiver.url)
        old = ep["secret"]
        rotation = endpoints.rotate_secret(
            pool, wh_settings, tenant_id=tid, endpoint_id=ep["id"], overlap_seconds=3600
        )
        new = rotation.secret
        box = wh_settings.webhook_secret_box()
        assert box is not None and new != old
        assert box.open(rotation.endpoint["previous_secret_ciphertext"]) == old
        receiver.secrets = [old, new]
        finish(pool, wh_settings, submit(pool, wh_settings, tid, ids[:1])["id"])
        pump(delivery, lambda: len(receiver.received) == 1)
        during = receiver.received[0]
        assert len(during.signatures) == 2
        assert during.verified_by == (0, 1), "both the old and the new secret verify"
        # the overlap ends (moved in the database instead of waited for)
        with pool.connection() as conn:
            conn.execute(
                "UPDATE webhook_endpoints SET previous_secret_expires_at = now() - interval '1 second'"
                " WHERE id = %s",
                (ep["id"],),
            )
        finish(pool, wh_settings, submit(pool, wh_settings, tid, ids[:1])["id"])
        pump(delivery, lambda: len(receiver.received) == 2)
        after = receiver.received[1]
    assert len(after.signatures) == 1
    assert after.verified_by == (1,), "only the new secret verifies after the overlap"


def test_ssrf_loopback_and_metadata_addresses_are_refused_without_the_allow_setting(
    pool, settings: Settings, wh_settings: Settings, tenant, monkeypatch
) -> None:
    tid, ids = tenant
    strict = Settings(**{**wh_settings.model_dump(), "webhook_allow_private_networks": False})
    # registration refuses IP literals in refused ranges
    for url in (
        "http://127.0.0.1:8080/",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::ffff:127.0.0.1]/",
    ):
        with pytest.raises(endpoints.netguard.InvalidWebhookUrl):
            endpoints.create_endpoint(pool, strict, tenant_id=tid, url=url)
    # names are checked when resolved, at every attempt: register while allowed, send strictly
    connects: list[Any] = []
    real_connect = socket.socket.connect

    def guarded(self: socket.socket, address: Any) -> Any:
        connects.append(address)
        assert address[0] in ("127.0.0.1", "::1"), f"a test may only connect to loopback: {address}"
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)
    names = {"metadata.example.test": "169.254.169.254", "localhost.example.test": "127.0.0.1"}

    def resolver(host: str, port: int, **kw: Any) -> list[Any]:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (names[host], port))]

    with Receiver() as receiver:
        for name in names:
            endpoints.create_endpoint(
                pool, wh_settings, tenant_id=tid, url=f"http://{name}:{receiver.port}/"
            )
        endpoints.create_endpoint(pool, wh_settings, tenant_id=tid, url=receiver.url)
        d = WebhookDelivery(strict, pool, sender=Sender(strict, resolver=resolver))
        try:
            finish(pool, strict, submit(pool, strict, tid, ids[:1])["id"])
            pump(d, lambda: count(pool, "SELECT count(*) FROM webhook_attempts") >= 3)
        finally:
            d.close(timeout=5)
        assert receiver.received == []
    with pool.connection() as conn:
        rows = conn.execute("SELECT outcome, address, error FROM webhook_attempts").fetchall()
    assert [r["outcome"] for r in rows] == ["refused"] * 3
    errors = " | ".join(r["error"] for r in rows)
    # a name's internal address is not shown to the tenant; an IP literal is its own input
    assert "metadata.example.test resolves to a cloud metadata endpoint" in errors
    assert "localhost.example.test resolves to a loopback address" in errors
    assert "127.0.0.1 resolves to 127.0.0.1, a loopback address" in errors
    assert "169.254.169.254" not in errors
    assert all(r["address"] is None for r in rows)
    assert connects == [], "nothing may be connected to when the address is refused"
