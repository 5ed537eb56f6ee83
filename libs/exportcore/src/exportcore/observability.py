"""Process start-up and shut-down of logs, traces and metrics — one call per entrypoint."""

from __future__ import annotations

from typing import Any

from psycopg_pool import ConnectionPool

from exportcore import metrics, telemetry
from exportcore.db import Conn, transaction
from exportcore.logs import setup_logging
from exportcore.settings import Settings
from exportcore.store import webhook_messages as message_store
from exportcore.store.metrics import metrics_snapshot


def start_process(service: str, settings: Settings, *, serve_metrics: bool = True) -> None:
    """JSON logs, tracing, a clean multi-process metrics directory and (for processes other
    than the api) ``/metrics`` on ``METRICS_PORT``. Call once in the (parent) process."""
    setup_logging(service, settings.log_level, settings.log_format)
    telemetry.setup_tracing(service)
    metrics.prepare_multiprocess_dir()
    if serve_metrics:
        metrics.serve(settings.metrics_port, str(settings.metrics_bind_address))


def database_gauges(pool: ConnectionPool[Conn], settings: Settings) -> metrics.DatabaseGauges:
    """The scrape-time gauges collector, querying through ``pool``."""

    def query() -> dict[str, Any]:
        # one transaction: its statement timeout (set_config local) covers every query
        with transaction(pool, timeout=settings.metrics_db_timeout_ms / 1000) as conn:
            return metrics_snapshot(conn, settings, settings.metrics_db_timeout_ms)

    return metrics.DatabaseGauges(query)


def webhook_gauges(pool: ConnectionPool[Conn], settings: Settings) -> metrics.WebhookGauges:
    """The scrape-time webhook gauges collector (webhook-delivery), querying through
    ``pool`` within METRICS_DB_TIMEOUT_MS."""

    def query() -> Any:
        with transaction(pool, timeout=settings.metrics_db_timeout_ms / 1000) as conn:
            conn.execute(
                "SELECT set_config('statement_timeout', %s, true)",
                (str(settings.metrics_db_timeout_ms),),
            )
            return message_store.gauges(conn)

    return metrics.WebhookGauges(query)


def broker_gauges(pool: ConnectionPool[Conn], settings: Settings) -> metrics.BrokerGauges:
    """The ``exports_broker_*`` collector, refreshing every BROKER_METRICS_INTERVAL_SECONDS
    on its own thread (read-only inspection of Redis, reconciled through ``pool``)."""
    # imported here: only the recovery-scanner inspects the broker (kombu's Redis layout)
    from exportcore.broker_inspect import BrokerInspector

    inspector = BrokerInspector.from_settings(
        settings, pool, timeout_ms=settings.metrics_db_timeout_ms
    )
    return metrics.BrokerGauges(
        inspector, interval=settings.broker_metrics_interval_seconds
    ).start()


def stop_process() -> None:
    """Flush and stop tracing (on TERM, before exit)."""
    telemetry.shutdown()
