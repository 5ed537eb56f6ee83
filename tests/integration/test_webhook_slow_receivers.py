"""A slow or hostile receiver holds nothing but its own attempts, against real sockets and
real PostgreSQL: an attempt ends at its wall-clock deadline however the receiver trickles
its answer, a message whose attempt is still running is never claimed again, and one
tenant's slow endpoints take only its share of the senders while another tenant's message
goes out at once."""

from __future__ import annotations

import dataclasses
import threading
import time
from datetime import UTC, datetime
from uuid import uuid4

from devtools.webhook_receiver import Answer, Receiver, TricklingReceiver
from exportcore.settings import Settings
from exportcore.webhooks import endpoints, events
from exportcore.webhooks.delivery import DeliveryConfig, WebhookDelivery
from exportcore.webhooks.sender import Delivery, Sender
from tests.integration.test_webhooks import messages, pump, wh_settings  # noqa: F401
from tests.support import count, create_tenant


def _with(settings: Settings, **changes: object) -> Settings:
    return Settings(**{**settings.model_dump(), **changes})


def _test_delivery(url: str) -> Delivery:
    mid = uuid4()
    return Delivery(
        message_id=mid,
        webhook_id=events.webhook_id(mid),
        endpoint_id=uuid4(),
        url=url,
        body='{"type":"webhook.test"}',
        signing_secrets=("whsec_" + "A" * 43 + "=",),
        attempt=1,
        budget_used=1,
        redelivery=False,
        claim_token=uuid4(),
        event_type="webhook.test",
        created_at=datetime.now(UTC),
    )


def test_an_attempt_ends_at_its_deadline_whatever_the_receiver_trickles(
    wh_settings: Settings,  # noqa: F811
) -> None:
    # the receiver sends "HTTP/1.1 200 OK\r\nX-Slow: " and then a byte every 0.5 s: each
    # read returns well within the 2 s timeout, so only a deadline on the attempt ends it
    settings = _with(wh_settings, webhook_timeout_seconds=2.0, webhook_claim_seconds=8.0)
    sender = Sender(settings)
    try:
        with TricklingReceiver(interval=0.5, limit=8) as receiver:
            t0 = time.monotonic()
            result = sender.send(_test_delivery(receiver.url + "/hook"))
            elapsed = time.monotonic() - t0
    finally:
        sender.close()
    assert result.outcome == "timeout", result
    assert "deadline" in (result.error or ""), result.error
    # bounded by the deadline (plus scheduling slack), not by the receiver
    assert elapsed < settings.webhook_timeout_seconds + 1.0, elapsed
    assert result.latency_ms < (settings.webhook_timeout_seconds + 1.0) * 1000
    assert receiver.connections == 1


def test_a_message_whose_attempt_is_running_is_never_claimed_again(
    pool,
    wh_settings: Settings,  # noqa: F811
) -> None:
    # an attempt that outlives its claim (here: a 1 s claim against a 3 s deadline, a
    # stalled sender in real life) keeps its claim while it runs: one connection, not three
    settings = _with(wh_settings, webhook_timeout_seconds=3.0, webhook_claim_seconds=8.0)
    config = dataclasses.replace(DeliveryConfig.from_settings(settings), claim_seconds=1.0)
    tid = create_tenant(pool)
    with TricklingReceiver(interval=0.25, limit=8) as receiver:
        ep = endpoints.create_endpoint(pool, settings, tenant_id=tid, url=receiver.url)
        msg = endpoints.send_test(pool, tenant_id=tid, endpoint_id=ep["id"])
        d = WebhookDelivery(settings, pool, config=config)
        try:
            pump(
                d,
                lambda: count(pool, "SELECT count(*) FROM webhook_attempts") >= 1,
                timeout=15,
            )
        finally:
            d.close(timeout=5)
    assert receiver.webhook_ids == [events.webhook_id(msg["id"])]
    assert receiver.connections == 1
    with pool.connection() as conn:
        [attempt] = conn.execute("SELECT outcome, attempt FROM webhook_attempts").fetchall()
    assert attempt == {"outcome": "timeout", "attempt": 1}
    assert messages(pool)[0]["attempts"] == 1


def test_one_tenants_slow_endpoints_cannot_hold_another_tenants_message(
    pool,
    wh_settings: Settings,  # noqa: F811
) -> None:
    # four senders; tenant A's receivers hold every request until released (within the
    # 8 s deadline). A's share is 2: its 4 test messages take 2 senders, and tenant B's
    # message is delivered while A's attempts are still held.
    settings = _with(
        wh_settings,
        webhook_timeout_seconds=8.0,
        webhook_claim_seconds=15.0,
        webhook_max_in_flight=4,
        webhook_tenant_concurrency=2,
    )
    release = threading.Event()

    def hold(n: int, headers: dict[str, str]) -> Answer:
        release.wait(10)
        return Answer(status=204)

    tenant_a, tenant_b = create_tenant(pool), create_tenant(pool)
    with Receiver(respond=hold) as slow, Receiver() as fast:
        slow_endpoints = [
            endpoints.create_endpoint(pool, settings, tenant_id=tenant_a, url=slow.url)
            for _ in range(2)
        ]
        for ep in slow_endpoints:
            for _ in range(2):
                endpoints.send_test(pool, tenant_id=tenant_a, endpoint_id=ep["id"])
        d = WebhookDelivery(settings, pool)
        try:
            pump(d, lambda: slow.concurrent >= 2, timeout=10)
            b_ep = endpoints.create_endpoint(pool, settings, tenant_id=tenant_b, url=fast.url)
            b_msg = endpoints.send_test(pool, tenant_id=tenant_b, endpoint_id=b_ep["id"])
            pump(
                d,
                lambda: messages(pool, id=b_msg["id"])[0]["status"] == "delivered",
                timeout=4,
            )
            # delivered while every one of A's attempts was still held by its receiver
            assert not release.is_set() and slow.concurrent == 2
            assert d.in_flight == 2  # A's share, not all four senders
            assert slow.max_concurrent == 2
            release.set()
            pump(
                d,
                lambda: all(m["status"] == "delivered" for m in messages(pool)),
                timeout=20,
            )
        finally:
            release.set()
            d.close(timeout=5)
    assert slow.max_concurrent == 2  # never more than A's share at once
    assert fast.ids() == [events.webhook_id(b_msg["id"])]
