"""The worker processes (fast-worker, bulk-worker): one Celery app, one thin task.

Run: ``celery -A services.worker.app worker -Q exports.fast -n fast@%h`` (or ``exports.bulk``).
Each prefork child builds its own connection pool on first use (never inherited) and its
own tracer; the main process empties the metrics directory, serves /metrics for all
children on METRICS_PORT, and every exiting child flushes its spans and is marked dead.
"""

from __future__ import annotations

import os
from typing import Any
from uuid import UUID

from celery import Task
from celery.signals import (
    celeryd_init,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_shutdown,
)

from exportcore import metrics, telemetry
from exportcore.artifacts import open_store
from exportcore.broker import EXPORT_BATCH_TASK, EXPORT_TASK, TICK_TASK, make_celery
from exportcore.db import ProcessPool
from exportcore.domain import BULK_QUEUE
from exportcore.downstream import DownstreamLimiter
from exportcore.logs import govern_celery_logging
from exportcore.runner import JobRunner
from exportcore.schedules.ticker import ScheduleTicker
from exportcore.settings import get_settings
from services.worker import liveness_bootstep, remote_state

settings = get_settings()
govern_celery_logging("worker", settings.log_level, settings.log_format)  # LOG_LEVEL only
app = make_celery(settings)
# Reconnect after every broker loss, also while exports hold unacknowledged messages.
app.conf.worker_consumer = "services.worker.consumer:Consumer"
liveness_bootstep.install(app)  # HEARTBEAT_FILE advances only while consuming
assert remote_state.COMMAND  # the workers page's inspect command, registered on import
_pool = ProcessPool(settings, "exports-worker", min_size=1, max_size=2)
_runner: JobRunner | None = None


def runner() -> JobRunner:
    """The job runner of this (child) process."""
    global _runner
    if _runner is None:
        # the deployment's downstream rate limits: object-store calls, snapshot reads
        downstream = DownstreamLimiter(settings)
        _runner = JobRunner(
            settings, _pool.get(), open_store(settings, downstream), downstream=downstream
        )
    return _runner


@celeryd_init.connect
def _concurrency_per_queue(conf: Any, options: dict[str, Any], **_: Any) -> None:
    """Size the pool from the queue this worker consumes (``--concurrency`` still wins):
    BULK_WORKER_CONCURRENCY for exports.bulk, FAST_WORKER_CONCURRENCY otherwise."""
    queues = options.get("queues") or []
    queues = queues.split(",") if isinstance(queues, str) else list(queues)
    bulk = BULK_QUEUE in queues
    conf.worker_concurrency = (
        settings.bulk_worker_concurrency if bulk else settings.fast_worker_concurrency
    )


@worker_init.connect
def _main_start(**_: Any) -> None:
    """In the main process, before any child starts: a clean metrics directory and the
    /metrics server that aggregates every child."""
    metrics.prepare_multiprocess_dir()
    metrics.init_worker_series()
    metrics.serve(settings.metrics_port, str(settings.metrics_bind_address))


@worker_process_init.connect
def _child_start(**_: Any) -> None:
    global _runner
    _runner = None  # never reuse anything created in the parent
    telemetry.setup_tracing("worker")


@worker_process_shutdown.connect
def _child_stop(**_: Any) -> None:
    """A child exits (``max_tasks_per_child`` recycling, shutdown): flush its spans."""
    telemetry.flush()
    metrics.mark_dead(os.getpid())
    _pool.close()


@worker_shutdown.connect
def _main_stop(**_: Any) -> None:
    telemetry.shutdown()


@app.task(name=EXPORT_TASK, bind=True, acks_late=True, reject_on_worker_lost=True)
def run_export(self: Task[[str], str], job_id: str) -> str:
    """Claim the job (on exports.fast with the due jobs its claim takes beside it), render,
    finish; returns the message's job's outcome (``succeeded``, ``refused``…)."""
    message_id = UUID(self.request.id) if self.request.id else None
    outcome = runner().run(UUID(job_id), message_id, queue=_queue(self))
    return outcome.result


@app.task(name=EXPORT_BATCH_TASK, bind=True, acks_late=True, reject_on_worker_lost=True)
def run_exports(
    self: Task[[list[str], list[str]], list[str]], job_ids: list[str], message_ids: list[str]
) -> list[str]:
    """Claim several small jobs of one message together (a message of a publisher before
    messages carried one job each), render each, finish them together; returns each job's
    outcome. ``message_ids`` are the jobs' outbox event ids."""
    if len(job_ids) != len(message_ids):
        raise ValueError("a batch message needs one outbox event id per job id")
    outcomes = runner().run_batch(
        [
            (UUID(job_id), UUID(message_id))
            for job_id, message_id in zip(job_ids, message_ids, strict=True)
        ],
        queue=_queue(self),
        carrier=UUID(self.request.id) if self.request.id else None,
    )
    return [o.result for o in outcomes]


def _queue(task: Task[Any, Any]) -> str | None:
    """The queue the message came from (its routing key; None when not known)."""
    info = task.request.delivery_info or {}
    queue = info.get("routing_key")
    return str(queue) if queue else None


@app.task(name=TICK_TASK, ignore_result=True)
def schedules_tick() -> dict[str, int]:
    """Advance every due schedule (one job per slot; see exportcore.schedules)."""
    return ScheduleTicker(settings, _pool.get()).tick().as_dict()
