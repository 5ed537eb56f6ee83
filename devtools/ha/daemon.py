"""One server process of the high-availability topology: started in its own session with a
log file and a pid file, found again by that pid file (from another process too: ``make
dev`` starts the topology with one command and stops it with another), and stopped or
killed by its pid, never by a name or a port."""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path


def proc_state(pid: int) -> str | None:
    """The one-letter state of ``pid`` (``Z`` zombie, ``T`` stopped…), None when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    return proc_state(pid) not in (None, "Z")


def cmdline(pid: int) -> str:
    """The command line of ``pid`` with spaces between its arguments ('' when gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def children(pid: int) -> list[int]:
    """The direct children of ``pid``."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
    return [int(p) for p in out.stdout.split()]


def as_postgres() -> dict[str, object]:
    """``subprocess.Popen`` keyword arguments that run a program as the ``postgres`` user
    when we are root (PostgreSQL, Patroni and PgBouncer refuse to run as root), else as
    ourselves."""
    if os.geteuid() != 0:
        return {}
    user = pwd.getpwnam("postgres")
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


def give_to_postgres(*paths: Path) -> None:
    """Make ``paths`` (folders or files) belong to ``postgres`` when we are root, and every
    folder above them traversable, so the servers running as ``postgres`` can use them."""
    if os.geteuid() != 0:
        return
    user = pwd.getpwnam("postgres")
    for path in paths:
        os.chown(path, user.pw_uid, user.pw_gid)
        parent = path.resolve().parent
        while parent != parent.parent:
            mode = parent.stat().st_mode
            if not mode & 0o001:
                parent.chmod(mode | 0o001)
            parent = parent.parent


@dataclass
class Daemon:
    """A server started from ``argv`` (exec'd directly, no shell) in its own session.

    ``marker`` must occur in the command line of the process the pid file names: a pid
    reused by another program is never signalled. ``popen_kwargs`` (``user``, ``group``)
    go to ``subprocess.Popen``."""

    name: str
    argv: Sequence[str]
    log_path: Path
    pid_path: Path
    marker: str
    env: Mapping[str, str] | None = None
    cwd: Path | None = None
    popen_kwargs: dict[str, object] = field(default_factory=dict)
    _popen: subprocess.Popen[bytes] | None = None

    def start(self) -> int:
        """Start the server unless its pid file names a live one; returns its pid."""
        running = self.pid()
        if running is not None:
            return running
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"--- start {self.name} at {time.time():.3f}\n".encode())
            log.flush()
            self._popen = subprocess.Popen(
                list(self.argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=dict(self.env) if self.env is not None else None,
                cwd=self.cwd,
                **self.popen_kwargs,  # type: ignore[call-overload]
            )
        self.pid_path.write_text(f"{self._popen.pid}\n")
        return self._popen.pid

    def pid(self) -> int | None:
        """The pid of the live server of this pid file, else None (zombies are reaped)."""
        if self._popen is not None:
            self._popen.poll()
        try:
            pid = int(self.pid_path.read_text().split()[0])
        except (FileNotFoundError, IndexError, ValueError):
            return None
        if not alive(pid) or self.marker not in cmdline(pid):
            return None
        return pid

    @property
    def running(self) -> bool:
        """True while the server runs."""
        return self.pid() is not None

    def signal(self, sig: int) -> int | None:
        """Send ``sig`` to the server; returns its pid (None when it was not running)."""
        pid = self.pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return pid

    def wait_gone(self, timeout: float) -> bool:
        """Wait until the server has exited; True when it did within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.pid() is not None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def stop(self, timeout: float = 20.0) -> None:
        """TERM (resumed first, should it be stopped), then KILL after ``timeout`` s."""
        pid = self.signal(signal.SIGCONT)
        if pid is None:
            return
        self.signal(signal.SIGTERM)
        if not self.wait_gone(timeout):
            self.signal(signal.SIGKILL)
            self.wait_gone(5)

    def kill(self) -> int | None:
        """SIGKILL (what the death of its machine does); returns the pid it had."""
        pid = self.signal(signal.SIGKILL)
        if pid is not None:
            self.wait_gone(10)
        return pid
