"""The webhook-delivery process: relays the webhook outbox to the tenants' endpoints until
TERM, then lets the attempts in flight finish and records them. Serves the webhook gauges
(backlog, its age, endpoints by state, the longest failure run) on its /metrics.

Its own component rather than a second duty of the publisher: it waits on other people's
servers (up to WEBHOOK_TIMEOUT_SECONDS per attempt, dozens at once), which must never delay
the relay of export messages (pickup within 1 s); it is the one process that opens
connections to the internet, so it alone needs that egress; and it scales with the number
of endpoints and their slowness, not with the export rate.

Run: ``python -m services.webhook_delivery``.
"""

from __future__ import annotations

from exportcore import metrics
from exportcore.db import make_pool
from exportcore.observability import start_process, stop_process, webhook_gauges
from exportcore.service import ServiceLoop
from exportcore.settings import get_settings
from exportcore.webhooks import events, policy
from exportcore.webhooks.delivery import WebhookDelivery


def main() -> int:
    """Run the delivery loop; returns 0 after a clean stop."""
    settings = get_settings()
    start_process("webhook-delivery", settings, serve_metrics=False)
    pool = make_pool(settings, "exports-webhook-delivery", min_size=1, max_size=3)
    metrics.init_webhook_series(policy.OUTCOMES, (*events.EVENT_TYPES, events.TEST_EVENT))
    metrics.serve(
        settings.metrics_port,
        str(settings.metrics_bind_address),
        extra=webhook_gauges(pool, settings),
    )
    delivery = WebhookDelivery(settings, pool)
    loop = ServiceLoop(delivery, interval=settings.webhook_poll_seconds)
    loop.install_signal_handlers()
    try:
        loop.run()
    finally:
        delivery.close(timeout=10.0)
        pool.close()
        stop_process()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
