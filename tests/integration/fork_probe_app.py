"""The real worker app (services.worker.app) plus what tests/integration/test_worker_prefork.py
needs to watch its prefork children: the MAIN process opens its database pool before any
child is forked (what the worker's own code never does, and the case ProcessPool exists
for) and writes the backend PIDs of its connections to ``$FORK_PROBE_DIR/parent.json``; the
task ``tests.fork_probe`` reports, from a child, which process it is, which process its pool
belongs to and which PostgreSQL backend served its query (``$FORK_PROBE_DIR/<pid>.json``).

Run: ``celery -A tests.integration.fork_probe_app worker -Q exports.fast --concurrency 2``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from celery.signals import worker_init

from services.worker import app as worker_module

app = worker_module.app
PROBE_TASK = "tests.fork_probe"


def _out() -> Path:
    return Path(os.environ["FORK_PROBE_DIR"])


@worker_init.connect
def _open_the_parents_pool(**_: Any) -> None:
    """In the main process, before the pool of children starts: open both connections of
    the worker's pool and record their backends."""
    pool = worker_module._pool.get()
    backends = []
    with pool.connection() as a, pool.connection() as b:
        for conn in (a, b):
            backends.append(conn.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"])
    (_out() / "parent.json").write_text(json.dumps({"pid": os.getpid(), "backends": backends}))


@app.task(name=PROBE_TASK)
def fork_probe() -> None:
    """Record, in this child, its pid, the pid its pool belongs to and its query's backend;
    holds the child a moment so that the next message goes to the other child."""
    pool = worker_module._pool.get()
    with pool.connection() as conn:
        backend = conn.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"]
    record = {
        "pid": os.getpid(),
        "parent": os.getppid(),
        "pool_pid": worker_module._pool._pid,
        "backend": backend,
    }
    (_out() / f"{os.getpid()}.json").write_text(json.dumps(record))
    time.sleep(0.5)
