"""A local notes-exports stack of real processes, for tests, drills and benchmarks.

- :class:`Servers` starts throwaway PostgreSQL and Redis servers (``scripts/localstack.sh``)
  and creates databases from a migrated template.
- :class:`Stack` starts the Procfile's processes (exactly the lines ``make dev`` runs) with
  a given environment, each as its own process group with a log file, and can signal,
  restart or stop each one by name.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote
from uuid import uuid4

import httpx
import psycopg

from devtools.waiting import wait_for
from exportcore.webhooks.encryption import new_key

ROOT = Path(__file__).resolve().parent.parent
LOCALSTACK = ROOT / "scripts" / "localstack.sh"
DEFAULT_PROCESSES = (
    "api",
    "publisher",
    "recovery-scanner",
    "beat",
    "fast-worker",
    "bulk-worker",
    "webhook-delivery",
)
METRICS_PORT_ENV = {
    "api": "API_METRICS_PORT",
    "publisher": "PUBLISHER_METRICS_PORT",
    "recovery-scanner": "SCANNER_METRICS_PORT",
    "beat": "BEAT_METRICS_PORT",
    "fast-worker": "FAST_WORKER_METRICS_PORT",
    "bulk-worker": "BULK_WORKER_METRICS_PORT",
    "webhook-delivery": "WEBHOOK_METRICS_PORT",
}


def free_port() -> int:
    """An unused TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def read_procfile(path: Path = ROOT / "Procfile") -> dict[str, str]:
    """``{process name: shell command}`` from a Procfile (comments and blanks ignored)."""
    entries: dict[str, str] = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_-]+):\s*(.+)$", line.strip())
        if m and not line.lstrip().startswith("#"):
            entries[m.group(1)] = m.group(2)
    return entries


@dataclass
class Servers:
    """Throwaway PostgreSQL + Redis under ``base`` (ports chosen by the caller). With a
    ``redis_password``, Redis admits only the ACL user ``redis_user`` (the default user
    off) and :meth:`redis_url` carries both."""

    base: Path
    pg_port: int
    redis_port: int
    redis_user: str = "exports"
    redis_password: str | None = None

    @property
    def admin_dsn(self) -> str:
        """libpq URL of the ``postgres`` maintenance database."""
        return f"postgresql://postgres@127.0.0.1:{self.pg_port}/postgres"

    def dsn(self, database: str) -> str:
        """libpq URL of ``database`` on this server."""
        return f"postgresql://postgres@127.0.0.1:{self.pg_port}/{database}"

    def redis_url(self, db: int = 0) -> str:
        """Redis URL of logical database ``db`` (with the ACL user's credentials)."""
        auth = ""
        if self.redis_password is not None:
            auth = f"{quote(self.redis_user, safe='')}:{quote(self.redis_password, safe='')}@"
        return f"redis://{auth}127.0.0.1:{self.redis_port}/{db}"

    def _redis_env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.redis_password is not None:
            env.update(REDIS_USER=self.redis_user, REDIS_PASSWORD=self.redis_password)
        return env

    def start(self) -> None:
        """Start both servers (idempotent); raises CalledProcessError with the script's output."""
        self.start_pg()
        self.start_redis()

    def start_pg(self) -> None:
        """Start (or restart) PostgreSQL."""
        subprocess.run(
            ["bash", str(LOCALSTACK), "pg-start", str(self.base / "pg"), str(self.pg_port)],
            check=True,
        )

    def stop_pg(self) -> None:
        """Stop PostgreSQL (fast shutdown)."""
        subprocess.run(["bash", str(LOCALSTACK), "pg-stop", str(self.base / "pg")], check=False)

    def start_redis(self) -> None:
        """Start (or restart) Redis."""
        subprocess.run(
            [
                "bash",
                str(LOCALSTACK),
                "redis-start",
                str(self.base / "redis"),
                str(self.redis_port),
            ],
            check=True,
            env=self._redis_env(),
        )

    def stop_redis(self) -> None:
        """Stop Redis without saving."""
        subprocess.run(
            ["bash", str(LOCALSTACK), "redis-stop", str(self.base / "redis"), str(self.redis_port)],
            check=False,
        )

    def stop(self) -> None:
        """Stop both servers."""
        self.stop_redis()
        self.stop_pg()

    def create_database(self, name: str, template: str | None = None) -> str:
        """(Re)create ``name`` (optionally from ``template``); returns its URL."""
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            tmpl = f' TEMPLATE "{template}"' if template else ""
            conn.execute(f'CREATE DATABASE "{name}"{tmpl}')
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        """Drop ``name`` if it exists, disconnecting its sessions."""
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def migrate(database_url: str) -> None:
    """Run ``alembic upgrade head`` on ``database_url`` in-process."""
    from alembic import command
    from alembic.config import Config

    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.attributes["database_url"] = database_url
    cfg.attributes["configure_logger"] = False
    command.upgrade(cfg, "head")


@dataclass
class ManagedProcess:
    """One process started from a shell command, in its own process group."""

    name: str
    command: str
    env: dict[str, str]
    log_path: Path
    cwd: Path = ROOT
    popen: subprocess.Popen[bytes] | None = None
    restarts: int = 0

    def start(self) -> None:
        """Start (again); output goes to ``log_path`` (appended)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        log.write(f"--- start {self.name} at {time.time():.3f}\n".encode())
        log.flush()
        self.popen = subprocess.Popen(
            ["bash", "-c", self.command],
            cwd=self.cwd,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    @property
    def pid(self) -> int:
        """PID of the process (after ``exec``, the real program, e.g. gunicorn's master)."""
        assert self.popen is not None, f"{self.name} was not started"
        return self.popen.pid

    @property
    def alive(self) -> bool:
        """True while the process has not exited."""
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: int, group: bool = False) -> None:
        """Send ``sig`` to the process (or its whole process group)."""
        if not self.alive:
            return
        if group:
            os.killpg(self.pid, sig)
        else:
            os.kill(self.pid, sig)

    def children(self) -> list[int]:
        """PIDs of direct children (e.g. Celery prefork children, gunicorn workers)."""
        try:
            out = subprocess.run(
                ["pgrep", "-P", str(self.pid)], capture_output=True, text=True, check=False
            ).stdout
        except FileNotFoundError:
            return []
        return [int(p) for p in out.split()]

    def wait(self, timeout: float) -> int | None:
        """Exit code, or None if still running after ``timeout`` seconds."""
        if self.popen is None:
            return None
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = 15.0) -> int | None:
        """TERM, then KILL of the process group after ``timeout``; returns the exit code."""
        if self.popen is None:
            return None
        if self.alive:
            self.signal(signal.SIGTERM)
            code = self.wait(timeout)
            if code is not None:
                self._reap_group()
                return code
            self.signal(signal.SIGKILL, group=True)
        code = self.wait(5)
        self._reap_group()
        return code

    def _reap_group(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)

    def log_text(self) -> str:
        """Everything this process wrote so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


WEBHOOK_SECRET_KEY = new_key()
"""The ``WEBHOOK_SECRET_KEYS`` of the stacks and tests of this Python process (generated at
import, never written to a file) unless the environment sets one."""


@dataclass
class Stack:
    """The Procfile processes running against one database and one Redis database."""

    env: dict[str, str]
    log_dir: Path
    names: Iterable[str] = DEFAULT_PROCESSES
    api_port: int = field(default_factory=free_port)
    procs: dict[str, ManagedProcess] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        *,
        database_url: str,
        broker_url: str,
        artifact_dir: Path,
        log_dir: Path,
        names: Iterable[str] = DEFAULT_PROCESSES,
        extra_env: Mapping[str, str] | None = None,
    ) -> Stack:
        """A stack whose processes share the settings given here (plus ``extra_env``)."""
        env = dict(os.environ)
        venv_bin = str(Path(sys.executable).parent)
        env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
        env.update(
            {
                "DATABASE_URL": database_url,
                "CELERY_BROKER_URL": broker_url,
                "ARTIFACT_DIR": str(artifact_dir),
                "API_WORKERS": env.get("API_WORKERS", "2"),
                "LOG_LEVEL": env.get("LOG_LEVEL", "INFO"),
                "PYTHONUNBUFFERED": "1",
                "STACK_ID": uuid4().hex[:8],
                "BEAT_SCHEDULE_FILE": str(log_dir / "celerybeat-schedule"),
                "METRICS_DIR": str(log_dir / "metrics"),
                # the key that encrypts the webhook signing secrets (docs/webhooks.md)
                "WEBHOOK_SECRET_KEYS": env.get("WEBHOOK_SECRET_KEYS") or WEBHOOK_SECRET_KEY,
                **{var: str(free_port()) for var in METRICS_PORT_ENV.values()},
            }
        )
        env.update(extra_env or {})
        stack = cls(env=env, log_dir=log_dir, names=tuple(names))
        stack.env["API_BIND"] = f"127.0.0.1:{stack.api_port}"
        return stack

    @property
    def api_url(self) -> str:
        """Base URL of the api process."""
        return f"http://127.0.0.1:{self.api_port}"

    def metrics_url(self, name: str) -> str:
        """URL of the /metrics of process ``name`` (each on its own port, the api's too)."""
        return f"http://127.0.0.1:{self.env[METRICS_PORT_ENV[name]]}/metrics"

    def start(self, wait: bool = True) -> Stack:
        """Start every named process; with ``wait``, until the api answers /readyz."""
        commands = read_procfile()
        for name in self.names:
            proc = ManagedProcess(
                name=name,
                command=commands[name],
                env=self.env,
                log_path=self.log_dir / f"{name}.log",
            )
            proc.start()
            self.procs[name] = proc
        if wait and "api" in self.procs:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Poll ``/readyz`` until 200; raises RuntimeError with the tail of the api's log
        when the api exits first or after ``timeout`` seconds."""
        api = self.procs["api"]

        def still_running() -> None:
            if not api.alive:
                raise RuntimeError("api exited during start:\n" + api.log_text()[-3000:])

        wait_for(
            lambda: httpx.get(self.api_url + "/readyz", timeout=1.0).status_code == 200,
            timeout,
            "the api's /readyz to answer 200",
            interval=0.1,
            retry_on=(httpx.TransportError,),
            check=still_running,
            detail=lambda: "api log:\n" + api.log_text()[-3000:],
            error=RuntimeError,
        )

    def restart(self, name: str) -> None:
        """Start ``name`` again after it stopped or was killed."""
        proc = self.procs[name]
        if proc.alive:
            proc.stop()
        proc.restarts += 1
        proc.start()

    def stop(self, timeout: float = 15.0) -> dict[str, int | None]:
        """Stop every process (TERM, then KILL); returns exit codes by name."""
        return {name: proc.stop(timeout) for name, proc in self.procs.items()}

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def shell_quote_env(env: Mapping[str, str], keys: Iterable[str]) -> str:
    """``export K=V`` lines for ``keys`` (shell-quoted), e.g. for ``.dev/env``."""
    return "".join(f"export {k}={shlex.quote(env[k])}\n" for k in keys if k in env)
