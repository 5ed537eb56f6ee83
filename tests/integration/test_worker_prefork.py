"""The worker's delivery guarantees are asserted on a real prefork worker, not only
exercised by the drills:

- the configuration the running worker reports over remote control (``inspect conf``,
  ``stats``, ``registered``) has ``task_acks_late``, ``task_reject_on_worker_lost`` and a
  prefetch multiplier of 1, on the app and on both export tasks (docs/architecture.md,
  "Queues and shutdown": a message is acknowledged only after its task ran, comes back when
  a child dies, and no child holds a message it has not started);
- a forked child never uses its parent's database connections: the parent's pool is open
  before the children fork, and every child's queries run on backends of its own, through
  a pool that belongs to it (exportcore.db.ProcessPool re-creates the pool per process).

tests/unit/test_worker_config.py checks the same configuration on the imported app.
"""

from __future__ import annotations

import json
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools import waiting
from devtools.stack import ManagedProcess, Stack, free_port
from exportcore.broker import EXPORT_BATCH_TASK, EXPORT_TASK, make_celery
from exportcore.domain import FAST_QUEUE
from exportcore.settings import Settings
from tests.integration.fork_probe_app import PROBE_TASK

NODE = f"fork@{socket.gethostname()}"
CONCURRENCY = 2


@pytest.fixture
def prefork(
    settings: Settings, artifact_dir: Path, tmp_path: Path
) -> Iterator[tuple[ManagedProcess, Path]]:
    """A real prefork worker (two children) of the worker app with the fork probe."""
    probes = tmp_path / "probes"
    probes.mkdir()
    stack = Stack.build(
        database_url=str(settings.database_url),
        broker_url=settings.broker_url,
        artifact_dir=artifact_dir,
        log_dir=tmp_path / "logs",
        names=(),
        extra_env={"FORK_PROBE_DIR": str(probes), "METRICS_PORT": str(free_port())},
    )
    proc = ManagedProcess(
        name="fork-worker",
        command=(
            "exec celery -A tests.integration.fork_probe_app worker -Q exports.fast "
            f"-n {NODE} --concurrency {CONCURRENCY} --loglevel INFO"
        ),
        env=stack.env,
        log_path=tmp_path / "logs" / "fork-worker.log",
    )
    proc.start()
    try:
        yield proc, probes
    finally:
        if proc.alive:
            proc.signal(signal.SIGCONT)
        assert proc.stop(30) == 0, proc.log_text()[-3000:]


def answer(replies: dict[str, Any] | None, proc: ManagedProcess) -> Any:
    """The one worker's reply to an ``inspect`` call."""
    assert replies and NODE in replies, f"no reply from {NODE}:\n{proc.log_text()[-3000:]}"
    return replies[NODE]


def test_a_real_prefork_worker_acks_late_prefetches_one_and_forks_clean_connections(
    prefork: tuple[ManagedProcess, Path], settings: Settings
) -> None:
    proc, probes = prefork
    client = make_celery(settings)
    inspect = client.control.inspect(destination=[NODE], timeout=5)
    waiting.wait_for(
        lambda: inspect.ping(),
        60,
        "the worker to answer",
        detail=lambda: proc.log_text()[-3000:],
    )

    conf = answer(inspect.conf(), proc)
    assert conf["task_acks_late"] is True
    assert conf["task_reject_on_worker_lost"] is True
    assert conf["worker_prefetch_multiplier"] == 1
    stats = answer(inspect.stats(), proc)
    assert stats["pool"]["max-concurrency"] == CONCURRENCY
    assert stats["prefetch_count"] == CONCURRENCY  # one message per child, no more
    registered = answer(inspect.registered("acks_late", "reject_on_worker_lost"), proc)
    for task in (EXPORT_TASK, EXPORT_BATCH_TASK):
        assert f"{task} [acks_late=True reject_on_worker_lost=True]" in registered, registered

    for _ in range(3 * CONCURRENCY):
        client.send_task(PROBE_TASK, queue=FAST_QUEUE)

    def children() -> list[dict[str, Any]]:
        found = [json.loads(p.read_text()) for p in probes.glob("[0-9]*.json")]
        return found if len(found) >= CONCURRENCY else []

    seen = waiting.wait_for(
        children, 60, "a probe from every child", detail=lambda: proc.log_text()[-3000:]
    )
    parent = json.loads((probes / "parent.json").read_text())
    assert len(parent["backends"]) == 2  # the parent's own connections were open
    for child in seen:
        assert child["parent"] == parent["pid"] != child["pid"]
        assert child["pool_pid"] == child["pid"], child  # the child's own pool
        assert child["backend"] not in parent["backends"], (child, parent)
    assert len({c["backend"] for c in seen}) == len(seen)  # and no two children share one
