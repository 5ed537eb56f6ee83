"""Raw Celery on the same Redis: ``send_task`` straight from the producer; no outbox, no
leases, no database state. The same Celery settings as notes-exports (JSON, late acks,
prefetch 1, no result backend), so the difference is only the durability machinery.

Worker: ``celery -A bench.peers.celery_peer worker -Q bench.peer -c 2 --loglevel WARNING``
(the peers write no line per job; notes-exports is measured at its default level and at
``LOG_LEVEL=WARNING``).
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

from bench import workload

QUEUE = "bench.peer"
TASK = "bench.peer_export"

app = Celery("bench_peer", broker=os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:1/0"))
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    result_backend=None,
    task_ignore_result=True,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_default_queue=QUEUE,
    broker_connection_retry_on_startup=True,
    broker_transport_options={"visibility_timeout": 7200},
    worker_hijack_root_logger=False,
    worker_send_task_events=False,
    task_send_sent_event=False,
)


@app.task(name=TASK, acks_late=True)
def peer_export(tenant: str, note_ids: list[int], job_id: str, t_enqueued: float) -> None:
    workload.task_body(tenant, note_ids, job_id, t_enqueued)


class Producer:
    def __init__(self) -> None:
        self.app = app

    def enqueue(self, tenant: str, note_ids: list[int], job_id: str, t_enqueued: float) -> Any:
        return self.app.send_task(TASK, args=[tenant, note_ids, job_id, t_enqueued], queue=QUEUE)

    def close(self) -> None:
        self.app.close()


def worker_command(processes: int) -> str:
    return (
        f"exec celery -A bench.peers.celery_peer worker -Q {QUEUE} -c {processes} "
        "-n benchpeer@%h --loglevel WARNING"
    )
