"""The worker processes (fast-worker, bulk-worker): one Celery app, one thin task.

Run: ``celery -A services.worker.app worker -Q exports.fast -n fast@%h`` (or ``exports.bulk``).
Each prefork child builds its own connection pool on first use (never inherited).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from celery import Task
from celery.signals import worker_process_init, worker_process_shutdown

from exportcore.artifacts import open_store
from exportcore.broker import EXPORT_TASK, make_celery
from exportcore.db import ProcessPool
from exportcore.execution import JobRunner
from exportcore.logs import setup_logging
from exportcore.settings import get_settings

settings = get_settings()
setup_logging("worker", settings.log_level)
app = make_celery(settings)
_pool = ProcessPool(settings, "exports-worker", min_size=1, max_size=2)
_runner: JobRunner | None = None


def runner() -> JobRunner:
    """The job runner of this (child) process."""
    global _runner
    if _runner is None:
        _runner = JobRunner(settings, _pool.get(), open_store(settings))
    return _runner


@worker_process_init.connect
def _child_start(**_: Any) -> None:
    global _runner
    _runner = None  # never reuse anything created in the parent


@worker_process_shutdown.connect
def _child_stop(**_: Any) -> None:
    _pool.close()


@app.task(name=EXPORT_TASK, bind=True, acks_late=True, reject_on_worker_lost=True)
def run_export(self: Task, job_id: str) -> str:
    """Claim the job, render it, finish it; returns the outcome (``succeeded``, ``refused``…)."""
    outcome = runner().run(UUID(job_id), UUID(self.request.id) if self.request.id else None)
    return outcome.result
