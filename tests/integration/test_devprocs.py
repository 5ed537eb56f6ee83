"""make dev's supervisor (devtools/devprocs.py) on real processes: a stop sends TERM to each
Procfile process's main process only, so its children finish their work (a Celery worker's
warm shutdown), and exits 0 when all of them stopped cleanly; whatever still runs when the
grace is over is killed, children included, and the exit status says so.
tests/e2e/test_dev_stack.py shows the same with the real stack and an export in flight."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from devtools.drills.harness import pid_alive
from devtools.stack import ROOT
from tests.support import wait_for

# A main process with one child in its process group (like a Celery worker and its pool):
# the child works until the test releases it; the main waits for the child on TERM.
POOL = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    from pathlib import Path
    d = Path(sys.argv[1])
    child = subprocess.Popen([sys.executable, "-c", '''
    import signal, sys, time
    from pathlib import Path
    d = Path(sys.argv[1])
    def term(*_):
        (d / "child-got-term").touch()
        sys.exit(1)
    signal.signal(signal.SIGTERM, term)
    (d / "child-working").write_text(str(__import__("os").getpid()))
    while not (d / "release").exists():
        time.sleep(0.02)
    (d / "child-done").touch()
    ''', str(d)])
    signal.signal(signal.SIGTERM, lambda *_: (d / "main-got-term").touch())
    while child.poll() is None:  # on TERM too: the main waits for its child's work
        time.sleep(0.02)
    sys.exit(child.returncode)
    """
)

# A main process that ignores TERM, with a child that ignores it too.
STUBBORN = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    from pathlib import Path
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    Path(sys.argv[1], "stubborn-child").write_text(str(child.pid))
    time.sleep(600)
    """
)


def start(tmp_path: Path, procfile: str, grace: float) -> subprocess.Popen[bytes]:
    (tmp_path / "pool.py").write_text(POOL)
    (tmp_path / "stubborn.py").write_text(STUBBORN)
    (tmp_path / "Procfile").write_text(procfile)
    log = (tmp_path / "devprocs.log").open("wb")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "devtools.devprocs",
            "--procfile",
            str(tmp_path / "Procfile"),
            "--grace",
            str(grace),
        ],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def test_a_stop_terms_only_the_main_process_and_its_child_finishes(tmp_path: Path) -> None:
    sup = start(tmp_path, f"pool: exec {sys.executable} {tmp_path}/pool.py {tmp_path}\n", 60)
    try:
        wait_for(lambda: (tmp_path / "child-working").exists(), 30, "the child to start")
        sup.send_signal(signal.SIGTERM)
        wait_for(lambda: (tmp_path / "main-got-term").exists(), 30, "the main process's TERM")
        assert sup.poll() is None  # still waiting for the child's work
        (tmp_path / "release").touch()
        # a requested stop that every process finished cleanly: 0, whoever asked for it
        assert sup.wait(30) == 0, (tmp_path / "devprocs.log").read_text()
    finally:
        if sup.poll() is None:
            os.killpg(sup.pid, signal.SIGKILL)
    assert (tmp_path / "child-done").exists()
    assert not (tmp_path / "child-got-term").exists(), "the child was signalled"


def test_what_ignores_the_stop_is_killed_with_its_children_after_the_grace(
    tmp_path: Path,
) -> None:
    sup = start(tmp_path, f"stubborn: exec {sys.executable} {tmp_path}/stubborn.py {tmp_path}\n", 1)
    try:
        wait_for(lambda: (tmp_path / "stubborn-child").exists(), 30, "the stubborn child")
        child = int((tmp_path / "stubborn-child").read_text())
        sup.send_signal(signal.SIGINT)  # Ctrl-C
        # the stop was requested, but something had to be killed: not a clean stop
        assert sup.wait(30) == 130, (tmp_path / "devprocs.log").read_text()
    finally:
        if sup.poll() is None:
            os.killpg(sup.pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(child), 10, "the child to be killed")
    assert "SIGKILL" in (tmp_path / "devprocs.log").read_text()


def test_workers_get_their_heartbeat_file_under_the_run_dir(tmp_path: Path) -> None:
    from devtools.devprocs import process_env

    env = process_env("fast-worker", {"A": "1"}, tmp_path)
    assert env == {"A": "1", "HEARTBEAT_FILE": str(tmp_path / "fast-worker.heartbeat")}
    assert process_env("api", {"A": "1"}, tmp_path) == {"A": "1"}
    assert process_env("bulk-worker", {}, None) == {}
