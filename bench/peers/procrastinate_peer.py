"""Procrastinate 3.10 (psycopg 3): jobs are rows in PostgreSQL, workers LISTEN/poll.

Worker: ``python -m bench.peers.procrastinate_peer`` (one worker process, concurrency 1,
default settings; the harness starts as many processes as the others have workers).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import procrastinate

from bench import workload

QUEUE = "bench"


def make_app(connector: Any) -> procrastinate.App:
    app = procrastinate.App(connector=connector)

    @app.task(name="peer_export", queue=QUEUE)
    def peer_export(tenant: str, note_ids: list[int], job_id: str, t_enqueued: float) -> None:
        workload.task_body(tenant, note_ids, job_id, t_enqueued)

    return app


def install_schema(dsn: str) -> None:
    app = make_app(procrastinate.SyncPsycopgConnector(conninfo=dsn))
    with app.open():
        app.schema_manager.apply_schema()


class Producer:
    def __init__(self) -> None:
        self.app = make_app(
            procrastinate.SyncPsycopgConnector(
                conninfo=os.environ["BENCH_DATABASE_URL"], min_size=1, max_size=1
            )
        )
        self.app.open()
        self.task = self.app.tasks["peer_export"]

    def enqueue(self, tenant: str, note_ids: list[int], job_id: str, t_enqueued: float) -> Any:
        return self.task.defer(
            tenant=tenant, note_ids=note_ids, job_id=job_id, t_enqueued=t_enqueued
        )

    def close(self) -> None:
        self.app.close()


def worker_command(processes: int) -> str:
    del processes  # the harness starts one process per worker
    return f"exec {sys.executable} -m bench.peers.procrastinate_peer"


def main() -> None:
    app = make_app(procrastinate.PsycopgConnector(conninfo=os.environ["BENCH_DATABASE_URL"]))
    app.run_worker(queues=[QUEUE], concurrency=1)


if __name__ == "__main__":
    main()
