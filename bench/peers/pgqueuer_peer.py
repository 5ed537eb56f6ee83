"""PgQueuer 1.6: jobs are rows in PostgreSQL, LISTEN/NOTIFY wake-ups. Driver psycopg (async
connection, autocommit, as PgQueuer requires) or asyncpg (``BENCH_PGQ_DRIVER``).

Worker: ``python -m bench.peers.pgqueuer_peer`` (default run settings). The sync work
function runs on a thread pool of ``BENCH_PEER_THREADS`` threads (1: the harness starts one
process per execution slot, as for Procrastinate): PgQueuer still picks its batches as it
likes, but runs no more jobs at once than the other systems do. With ``asyncio.to_thread``
(the loop's default pool: 6 threads on 2 cores) each process ran up to 6.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

from bench import workload

ENTRYPOINT = "peer_export"


async def _driver(dsn: str, driver: str) -> Any:
    from pgqueuer.adapters.drivers.asyncpg import AsyncpgDriver
    from pgqueuer.adapters.drivers.psycopg import PsycopgDriver

    if driver == "asyncpg":
        import asyncpg

        return AsyncpgDriver(await asyncpg.connect(dsn))
    return PsycopgDriver(await psycopg.AsyncConnection.connect(dsn, autocommit=True))


def install_schema(dsn: str) -> None:
    from pgqueuer.queries import Queries

    async def go() -> None:
        await Queries(await _driver(dsn, "psycopg")).install()

    asyncio.run(go())


class Producer:
    def __init__(self) -> None:
        from pgqueuer.adapters.drivers.psycopg import SyncPsycopgDriver
        from pgqueuer.queries import SyncQueries

        self.conn = psycopg.connect(os.environ["BENCH_DATABASE_URL"], autocommit=True)
        self.queries = SyncQueries(SyncPsycopgDriver(self.conn))

    def enqueue(self, tenant: str, note_ids: list[int], job_id: str, t_enqueued: float) -> Any:
        """Enqueue one job; returns PgQueuer's job id (its log rows name it)."""
        payload = json.dumps([tenant, note_ids, job_id, t_enqueued]).encode()
        return self.queries.enqueue(ENTRYPOINT, payload)[0]

    def close(self) -> None:
        self.conn.close()


def worker_command(processes: int) -> str:
    del processes
    return f"exec {sys.executable} -m bench.peers.pgqueuer_peer"


async def amain() -> None:
    from pgqueuer import PgQueuer

    driver = os.environ.get("BENCH_PGQ_DRIVER", "psycopg")
    pgq = PgQueuer(await _driver(os.environ["BENCH_DATABASE_URL"], driver))
    pool = ThreadPoolExecutor(max_workers=int(os.environ.get("BENCH_PEER_THREADS", "1")))

    @pgq.entrypoint(ENTRYPOINT)
    async def peer_export(job: Any) -> None:
        tenant, note_ids, job_id, t_enqueued = json.loads(job.payload)
        await asyncio.get_running_loop().run_in_executor(
            pool, workload.task_body, tenant, note_ids, job_id, t_enqueued
        )

    await pgq.run()


if __name__ == "__main__":
    asyncio.run(amain())
