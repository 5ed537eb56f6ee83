"""The Celery application shared by the publisher (producer) and the workers (consumers).

Redis is only a transport: no result backend, JSON only, late acknowledgement, and a
visibility timeout longer than the longest task (docs/architecture.md,
"Queues and shutdown").
"""

from __future__ import annotations

from celery import Celery

from exportcore.domain import BULK_QUEUE, FAST_QUEUE
from exportcore.redis_urls import celery_ssl, sentinel_transport_options
from exportcore.settings import Settings

EXPORT_TASK = "notes_exports.run_export"
"""One job per message: ``args=[job_id]``, task id = the job's outbox event id."""
EXPORT_BATCH_TASK = "notes_exports.run_exports"
"""Several small jobs per message: ``args=[[job_id, ...], [outbox event id, ...]]``, task id =
the first event's id. Only job ids and event ids travel (docs/architecture.md
INV-2 message-carries-ids-only)."""
"""The stable task name; messages carry only ``[job_id]`` and task id = outbox event id."""

TICK_TASK = "notes_exports.schedules_tick"
"""Emitted by beat every SCHEDULER_TICK_SECONDS on exports.fast; no arguments."""


def make_celery(settings: Settings, main: str = "notes_exports") -> Celery:
    """A Celery app configured from ``settings``; it does not connect until first use.

    The broker is one Redis (``redis://``, ``rediss://`` verified with
    ``BROKER_TLS_CA_FILE``) or the master a set of Sentinels names (``sentinel://``,
    ``BROKER_SENTINEL_MASTER``): kombu's sentinel transport asks them for the master
    again after a connection error, so a Sentinel failover is one reconnect."""
    app = Celery(main, broker=settings.broker_url, set_as_current=False)
    app.conf.update(
        # JSON only, both ways: a message of any other content type (a pickle above all,
        # whose loading runs code) is refused before it is decoded and discarded unrun
        # (tests/integration/test_worker_messages.py); remote control and events alike.
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        result_accept_content=["json"],
        event_serializer="json",
        result_backend=None,
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_time_limit=settings.task_time_limit,
        worker_max_tasks_per_child=settings.worker_max_tasks_per_child or None,
        task_default_queue=FAST_QUEUE,
        task_queues=None,
        task_create_missing_queues=True,
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            "visibility_timeout": settings.broker_visibility_timeout,
            "socket_connect_timeout": settings.broker_publish_timeout,
            "socket_timeout": settings.broker_publish_timeout,
            "queue_order_strategy": "priority",
            # a sentinel:// broker: the master's name and the Sentinels' own password
            **sentinel_transport_options(settings),
        },
        broker_use_ssl=celery_ssl(settings),
        broker_pool_limit=4,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
        worker_send_task_events=False,
        task_send_sent_event=False,
        worker_enable_remote_control=True,
        enable_utc=True,
    )
    return app


__all__ = [
    "BULK_QUEUE",
    "EXPORT_BATCH_TASK",
    "EXPORT_TASK",
    "FAST_QUEUE",
    "TICK_TASK",
    "make_celery",
]
