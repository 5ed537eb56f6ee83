"""``make dev``'s process supervisor: the Procfile under honcho, stopped the way Kubernetes
stops a pod.

``honcho start`` stops its processes with ``killpg``: every process of each group gets TERM,
so a Celery worker's pool children die in the middle of their export (``WorkerLostError``:
the export loses an attempt and waits out its lease). Here only each process's MAIN process
(the one the Procfile line ``exec``s) gets TERM: a Celery worker then stops consuming and
waits for its children to finish the task they run (warm shutdown), gunicorn lets its
workers finish their requests, the loops finish their round. Whatever still runs after the
grace period gets SIGKILL, as a kubelet does after ``terminationGracePeriodSeconds``.

Usage (scripts/dev.sh)::

    python -m devtools.devprocs [--procfile Procfile] [--grace 30] [--run-dir DIR]

``--run-dir`` gives each worker a liveness heartbeat file, ``DIR/<name>.heartbeat``
(``HEARTBEAT_FILE``, written only while it consumes), so the script can tell when the
workers are ready. Exit status: 0 after a clean stop (TERM or INT asked for it and every
process then exited 0 within the grace); else honcho's: the first process's own status when
one ended by itself, 143 / 130 when a requested stop had to kill something or a process
failed on its way out. The status is what ``scripts/dev.sh`` returns, so its clean stop does
not depend on the shell's own ``trap`` (a shell started with SIGINT ignored cannot trap it).
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import honcho.manager
from honcho.compat import ProcessManager
from honcho.printer import Printer

from devtools.stack import ROOT, read_procfile

DEFAULT_GRACE = 30.0
"""Seconds between TERM and SIGKILL: the chart's default terminationGracePeriodSeconds."""

WORKERS = ("fast-worker", "bulk-worker")
"""The Procfile processes that get a heartbeat file with ``--run-dir``."""


class WarmStop(ProcessManager):  # type: ignore[misc]
    """honcho's process manager with Kubernetes' stop: TERM to the main process only, SIGKILL
    to the whole process group (its children included) when the grace is over."""

    def terminate(self, pid: int) -> None:
        """TERM to ``pid`` alone (honcho passes the shell that ``exec``ed the command)."""
        _signal(os.kill, pid, signal.SIGTERM)

    def kill(self, pid: int) -> None:
        """SIGKILL to everything left in the process group of ``pid``."""
        _signal(os.killpg, pid, signal.SIGKILL)


def _signal(send: Callable[[int, int], None], pid: int, signum: int) -> None:
    try:
        send(pid, signum)
    except OSError as exc:
        if exc.errno not in (errno.ESRCH, errno.EPERM):
            raise


def process_env(name: str, base: Mapping[str, str], run_dir: Path | None) -> dict[str, str]:
    """The environment of Procfile process ``name``: ``base`` plus, for a worker when a run
    directory is given, its own ``HEARTBEAT_FILE``."""
    env = dict(base)
    if run_dir is not None and name in WORKERS:
        env["HEARTBEAT_FILE"] = str(run_dir / f"{name}.heartbeat")
    return env


class WarmStopManager(honcho.manager.Manager):  # type: ignore[misc]
    """honcho's Manager with :class:`WarmStop` and the grace counted from the stop request
    (honcho itself counts from the first process that exits, and never escalates while
    none does)."""

    def __init__(self, printer: Printer, grace: float) -> None:
        super().__init__(printer)
        self._procmgr = WarmStop()
        self.grace = grace
        self._deadline: threading.Timer | None = None
        self.stop_requested = False
        """A signal asked for the stop (no process had ended by itself before it)."""
        self.killed = False
        """Something still ran when the grace was over and got SIGKILL."""

    def terminate(self) -> None:
        """TERM to every main process; SIGKILL to what is left ``grace`` seconds later. The
        first call comes from honcho's signal handler (a requested stop) or from its loop
        once a process has ended by itself."""
        if self._deadline is None:
            self.stop_requested = not self._any_stopped()
            self._deadline = threading.Timer(self.grace, self.kill)
            self._deadline.daemon = True
            self._deadline.start()
        super().terminate()

    def kill(self) -> None:
        """SIGKILL to every process still running (recorded in ``killed``)."""
        self.killed = self.killed or not self._all_stopped()
        super().kill()

    def exit_status(self) -> int:
        """What the supervisor exits with (see the module docstring)."""
        codes = [p.get("returncode") for p in self._processes.values()]
        if self.stop_requested and not self.killed and all(c == 0 for c in codes):
            return 0
        return int(self.returncode or 0)


def build(procfile: Path, grace: float, run_dir: Path | None) -> WarmStopManager:
    """A :class:`WarmStopManager` with every process of ``procfile``."""
    # honcho's own escalation (KILL_WAIT after the first process exited) must not come first;
    # the lock pins honcho 2.0.0, whose loop reads this module global
    # (tests/integration/test_devprocs.py runs the supervisor on real processes).
    honcho.manager.KILL_WAIT = grace
    manager = WarmStopManager(Printer(sys.stdout, colour=sys.stdout.isatty()), grace)
    if run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        for name in WORKERS:
            (run_dir / f"{name}.heartbeat").unlink(missing_ok=True)
    for name, cmd in read_procfile(procfile).items():
        manager.add_process(name, cmd, env=process_env(name, os.environ, run_dir))
    return manager


def main(argv: list[str] | None = None) -> int:
    """Run the Procfile until one process exits or TERM/INT arrives; returns the exit status
    (:meth:`WarmStopManager.exit_status`)."""
    parser = argparse.ArgumentParser(prog="python -m devtools.devprocs", description=__doc__)
    parser.add_argument("--procfile", type=Path, default=ROOT / "Procfile")
    parser.add_argument("--grace", type=float, default=DEFAULT_GRACE, help="seconds, TERM→KILL")
    parser.add_argument("--run-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.grace <= 0:
        parser.error("--grace must be a positive number of seconds")
    manager = build(args.procfile, args.grace, args.run_dir)
    manager.loop()
    return manager.exit_status()


if __name__ == "__main__":
    sys.exit(main())
