"""The webhook-delivery process: relays the webhook outbox to the tenants' endpoints until
TERM, then lets the attempts in flight finish and records them. Serves the webhook gauges
(backlog, its age, endpoints by state, the longest failure run) on its /metrics.

Its own component rather than a second duty of the publisher: it waits on other people's
servers (up to WEBHOOK_TIMEOUT_SECONDS per attempt, dozens at once), which must never delay
the relay of export messages (pickup within 1 s); it is the one process that opens
connections to the internet, so it alone needs that egress; and it scales with the number
of endpoints and their slowness, not with the export rate.

It decrypts the endpoints' signing secrets (``WEBHOOK_SECRET_KEYS``): at start it checks
that it holds every key the stored secrets use, and exits with 78 (EX_CONFIG) and a message
that says what to set when it does not (docs/webhooks.md "Encryption at rest").

Run: ``python -m services.webhook_delivery``.
"""

from __future__ import annotations

import logging

from exportcore import metrics
from exportcore.db import make_pool
from exportcore.observability import start_process, stop_process, webhook_gauges
from exportcore.service import ServiceLoop
from exportcore.settings import get_settings
from exportcore.webhooks import events, policy, secret_keys
from exportcore.webhooks.delivery import WebhookDelivery
from exportcore.webhooks.encryption import SecretKeysMissing

log = logging.getLogger("services.webhook_delivery")

EXIT_CONFIG = 78  # sysexits.h EX_CONFIG: the secret keys do not match the stored secrets


def main() -> int:
    """Run the delivery loop; returns 0 after a clean stop, 78 when ``WEBHOOK_SECRET_KEYS``
    lacks a key the stored secrets use."""
    settings = get_settings()
    start_process("webhook-delivery", settings, serve_metrics=False)
    pool = make_pool(settings, "exports-webhook-delivery", min_size=1, max_size=3)
    delivery = WebhookDelivery(settings, pool)
    loop = ServiceLoop(delivery, interval=settings.webhook_poll_seconds)
    loop.install_signal_handlers()
    try:
        box = settings.webhook_secret_box()
        try:
            census = secret_keys.check_keys_at_start(
                pool, box, retry_seconds=settings.webhook_poll_seconds, stop=loop.stop_event
            )
        except SecretKeysMissing as exc:
            log.error("cannot start: %s", exc.detail, extra={"code": exc.code})
            return EXIT_CONFIG
        if census is None:  # stopped while waiting for the database
            return 0
        log.info(
            "webhook secret keys checked",
            extra={"key_ids": list(box.key_ids) if box else [], "secrets_by_key_id": census},
        )
        metrics.init_webhook_series(policy.OUTCOMES, (*events.EVENT_TYPES, events.TEST_EVENT))
        metrics.serve(
            settings.metrics_port,
            str(settings.metrics_bind_address),
            extra=webhook_gauges(pool, settings),
        )
        loop.run()
    finally:
        delivery.close(timeout=10.0)
        pool.close()
        stop_process()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
