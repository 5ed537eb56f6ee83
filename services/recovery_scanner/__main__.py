"""The recovery-scanner process: expired leases, lost dispatches, cancels, deadlines, dead
letters, orphan artifacts and retention, until TERM. It also serves the database-derived
gauges (backlog, ages, expired leases, dead letters, admission usage) and the broker's
contents reconciled against them (``exports_broker_*``, refreshed every
BROKER_METRICS_INTERVAL_SECONDS) on its /metrics.

It also owns the bulk actions' runs: a second loop, in a thread, runs
:class:`exportcore.bulk_runner.BulkRunner` (claims unfinished bulk actions with a lease and
runs them; woken by LISTEN ``bulk_actions``). One TERM stops both loops: the bulk runner
hands its run back between two batches, and the process exits 0.

Run: ``python -m services.recovery_scanner``.
"""

from __future__ import annotations

import threading

from prometheus_client.registry import Collector

from exportcore import metrics
from exportcore.artifacts import open_store
from exportcore.bulk_runner import BulkRunner
from exportcore.db import make_pool
from exportcore.observability import (
    broker_gauges,
    database_gauges,
    start_process,
    stop_process,
)
from exportcore.recovery import RecoveryScanner
from exportcore.service import ServiceLoop
from exportcore.settings import get_settings


def main() -> int:
    """Run the scanner loop; returns 0 after a clean stop."""
    settings = get_settings()
    start_process("recovery-scanner", settings, serve_metrics=False)
    # the scanner's passes, the gauges' reads, and the bulk runner's batches
    pool = make_pool(settings, "exports-recovery-scanner", min_size=1, max_size=4)
    gauges: list[Collector] = [database_gauges(pool, settings)]
    broker = None
    if settings.metrics_port > 0 and settings.broker_metrics_interval_seconds > 0:
        broker = broker_gauges(pool, settings)
        gauges.append(broker)
    metrics.serve(
        settings.metrics_port,
        str(settings.metrics_bind_address),
        extra=metrics.CollectorGroup(*gauges),
    )
    scanner = RecoveryScanner(settings, pool, open_store(settings))
    stop = threading.Event()
    loop = ServiceLoop(
        scanner,
        interval=settings.scanner_interval_seconds,
        on_pass=lambda counts, seconds: metrics.SCANNER_PASS.observe(seconds),
        stop_event=stop,
    )
    runner = BulkRunner(settings, pool, stop=stop)
    bulk_loop = ServiceLoop(runner, interval=settings.scanner_interval_seconds, stop_event=stop)
    loop.install_signal_handlers()
    bulk_thread = threading.Thread(target=bulk_loop.run, name="bulk-runner", daemon=True)
    bulk_thread.start()
    try:
        loop.run()
    finally:
        stop.set()
        bulk_thread.join()
        runner.close()
        if broker is not None:
            broker.stop()
        pool.close()
        stop_process()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
