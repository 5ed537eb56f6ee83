"""The worker's answer to the workers page: a Celery remote-control inspect command,
``exports_worker_state``, that a worker answers from what it already holds.

One broadcast (:func:`exportcore.workers.list_workers`, bounded by a timeout) asks every
worker at once; each replies with its queues (the consumer's), the jobs in hand (the export
tasks it runs now, and the ones it has reserved: prefetched, acknowledged late, not started)
and its last heartbeat: the modification time of its liveness file (``HEARTBEAT_FILE``,
advanced by :mod:`services.worker.liveness_bootstep` only while it consumes), or none when
the worker has no liveness file. Nothing new is recorded anywhere for it.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

from celery.worker import state as worker_state
from celery.worker.control import inspect_command

from exportcore.broker import EXPORT_BATCH_TASK, EXPORT_TASK
from exportcore.settings import get_settings
from exportcore.workers import COMMAND as COMMAND


def job_ids(request: Any) -> list[str]:
    """The job ids an export task request names (``EXPORT_TASK``: ``[job_id]``;
    ``EXPORT_BATCH_TASK``: ``[[job_id, …], [event id, …]]``); none for other tasks."""
    args = list(getattr(request, "args", None) or [])
    if request.name == EXPORT_TASK and args:
        return [str(args[0])]
    if request.name == EXPORT_BATCH_TASK and args and isinstance(args[0], list):
        return [str(j) for j in args[0]]
    return []


def heartbeat_at() -> str | None:
    """The liveness file's modification time (ISO 8601, UTC), or None (none configured, or
    not written yet)."""
    path = get_settings().heartbeat_file
    if path is None:
        return None
    try:
        return datetime.fromtimestamp(path.stat().st_mtime, UTC).isoformat()
    except OSError:
        return None


@inspect_command()
def exports_worker_state(state: Any, **_: Any) -> dict[str, Any]:
    """This worker's queues, jobs in hand and last heartbeat (see the module docstring)."""
    consumer = state.consumer
    queues = sorted(q.name for q in consumer.task_consumer.queues) if consumer.task_consumer else []
    active = sorted({j for r in worker_state.active_requests for j in job_ids(r)})
    reserved = sorted({j for r in worker_state.reserved_requests for j in job_ids(r)} - set(active))
    return {
        "pid": os.getpid(),
        "queues": queues,
        "concurrency": getattr(consumer.pool, "num_processes", None),
        "active_jobs": active,
        "reserved_jobs": reserved,
        "heartbeat_at": heartbeat_at(),
        "liveness_file": get_settings().heartbeat_file is not None,
    }
