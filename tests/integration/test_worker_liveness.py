"""A real Celery worker's liveness heartbeat advances only while it consumes its queue.

Proves the contract the chart's worker liveness probe relies on: the heartbeat advances while
the worker consumes, stops after ``celery control cancel_consumer`` (the worker is alive and
answers pings, but no longer consumes), and stops while the process is frozen.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools import waiting
from devtools.stack import ManagedProcess
from services.worker.liveness_bootstep import TOUCH_INTERVAL
from tests.support import fast_worker

BIN = Path(sys.executable).parent
NODE = f"fast@{socket.gethostname()}"


def mtime(path: Path) -> float:
    return path.stat().st_mtime


def wait_for(predicate, timeout: float, what: str, proc: ManagedProcess) -> None:
    """:func:`devtools.waiting.wait_for`, failing at once (with its log) if the worker exits."""

    def alive() -> None:
        assert proc.alive, f"worker exited:\n{proc.log_text()[-3000:]}"

    waiting.wait_for(predicate, timeout, what, check=alive, detail=lambda: proc.log_text()[-3000:])


def healthcheck(env: dict[str, str], path: Path, max_age: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "exportctl"), "healthcheck", "--file", str(path), "--max-age", str(max_age)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def celery(env: dict[str, str], *args: str) -> str:
    proc = subprocess.run(
        [str(BIN / "celery"), "-A", "services.worker.app", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, f"celery {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture
def worker(
    database_url: str, broker_url: str, artifact_dir: Path, tmp_path: Path
) -> Iterator[tuple[ManagedProcess, Path, dict[str, str]]]:
    hb = tmp_path / "run" / "heartbeat"
    proc, env = fast_worker(
        database_url, broker_url, artifact_dir, tmp_path / "logs", {"HEARTBEAT_FILE": str(hb)}
    )
    try:
        yield proc, hb, env
    finally:
        if proc.alive:
            proc.signal(signal.SIGCONT)
        assert proc.stop(30) == 0, proc.log_text()[-3000:]


def test_heartbeat_advances_while_consuming_and_stops_after_cancel_consumer(worker) -> None:
    proc, hb, env = worker
    wait_for(hb.exists, 60, "the first heartbeat", proc)
    first = mtime(hb)
    wait_for(lambda: mtime(hb) > first, 4 * TOUCH_INTERVAL, "a second heartbeat", proc)
    second = mtime(hb)
    wait_for(lambda: mtime(hb) > second, 4 * TOUCH_INTERVAL, "a third heartbeat", proc)
    probe = healthcheck(env, hb, 3 * TOUCH_INTERVAL)
    assert probe.returncode == 0, probe.stdout + probe.stderr

    out = celery(env, "control", "cancel_consumer", "exports.fast", "-d", NODE, "--timeout", "10")
    assert "no longer consuming from" in out, out
    time.sleep(TOUCH_INTERVAL)  # a beat already past its consuming check may still land
    after_cancel = mtime(hb)
    time.sleep(3 * TOUCH_INTERVAL + 0.5)
    assert mtime(hb) == after_cancel, "the heartbeat advanced although nothing is consumed"

    # Alive (answers a ping) but not consuming: the liveness probe fails.
    assert "pong" in celery(env, "inspect", "ping", "-d", NODE, "--timeout", "10")
    probe = healthcheck(env, hb, 3 * TOUCH_INTERVAL)
    assert probe.returncode == 1, probe.stdout
    assert "stale" in probe.stdout

    # Consuming again brings the heartbeat back.
    celery(env, "control", "add_consumer", "exports.fast", "-d", NODE, "--timeout", "10")
    wait_for(lambda: mtime(hb) > after_cancel, 4 * TOUCH_INTERVAL, "heartbeat after add", proc)


def test_heartbeat_stops_while_the_worker_is_frozen(worker) -> None:
    proc, hb, env = worker
    wait_for(hb.exists, 60, "the first heartbeat", proc)
    first = mtime(hb)
    wait_for(lambda: mtime(hb) > first, 4 * TOUCH_INTERVAL, "a second heartbeat", proc)

    os.kill(proc.pid, signal.SIGSTOP)  # a hung event loop: the main process does not run
    try:
        time.sleep(0.5)
        frozen = mtime(hb)
        time.sleep(3 * TOUCH_INTERVAL)
        assert mtime(hb) == frozen
        assert healthcheck(env, hb, 2 * TOUCH_INTERVAL).returncode == 1
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    wait_for(lambda: mtime(hb) > frozen, 4 * TOUCH_INTERVAL, "heartbeat after thaw", proc)
