"""The publisher process: relays the transactional outbox to Celery until TERM.

Run: ``python -m services.publisher``. It first checks that the broker's Redis runs with
``maxmemory-policy noeviction`` (:mod:`exportcore.broker_memory`): otherwise it exits 78
(EX_CONFIG) naming the policy, unless ``BROKER_EVICTION_CHECK=warn``.
"""

from __future__ import annotations

import logging

from exportcore.broker import make_celery
from exportcore.broker_memory import EvictingBroker, check_broker_redis
from exportcore.db import make_pool
from exportcore.observability import start_process, stop_process
from exportcore.publisher import Publisher
from exportcore.service import ServiceLoop
from exportcore.settings import get_settings

log = logging.getLogger("services.publisher")


def main() -> int:
    """Run the relay loop; returns 0 after a clean stop."""
    settings = get_settings()
    start_process("publisher", settings)
    try:
        check_broker_redis(settings)  # maxmemory-policy noeviction (lesson 08)
    except EvictingBroker as exc:
        log.critical("publisher refuses to start: %s", exc)
        stop_process()
        return 78  # EX_CONFIG: a configuration to fix, not a crash to retry
    pool = make_pool(settings, "exports-publisher", min_size=1, max_size=2)
    publisher = Publisher(settings, pool, make_celery(settings))
    loop = ServiceLoop(publisher, interval=settings.publisher_poll_seconds)
    loop.install_signal_handlers()
    try:
        loop.run()
        publisher.flush()  # what the last pass sent is marked now, not re-sent later
    finally:
        publisher.close_listener()
        pool.close()
        stop_process()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
