"""The drill environment: its own PostgreSQL and Redis, the six Procfile processes, and the
tools drills use to inject one fault and reach what the system did about it (its database,
broker, artifacts, logs and metrics). What is observed and checked of every job — the
workers' log index, the job watcher, the read-back and the invariants — is in
``devtools.drills.evidence``.

Everything runs under ``.drills/`` on free ports, never on the servers of the test harness
(drills restart and flush them). Faults go only to processes this environment started,
addressed by their PIDs: the Procfile processes (``devtools.stack.ManagedProcess``), their
children (Celery prefork children, gunicorn workers: checked to be children of the process
we started) and the two servers.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import uuid4

import httpx
import psycopg
import redis
from prometheus_client.parser import text_string_to_metric_families

from devtools import waiting
from devtools.api_client import ApiClient
from devtools.drills.config import DrillSettings
from devtools.drills.evidence import LogIndex
from devtools.drills.servers import DrillServers, Topology
from devtools.ha.topology import HATopology
from devtools.probe import DatabaseProbe
from devtools.s3 import MotoServer
from devtools.stack import ROOT, ManagedProcess, Servers, Stack, migrate
from exportcore import broker_inspect, faults
from exportcore.artifacts import ArtifactStore, open_store
from exportcore.auth import create_api_key, create_operator_key
from exportcore.db import session_defaults
from exportcore.domain import ArtifactMissing
from exportcore.redis_urls import redis_client
from exportcore.settings import Settings
from exportcore.store.tenants import tenant_upsert
from exportctl.importer import import_notes

DRILLS_HOME = ROOT / ".drills"
WORKERS = ("fast-worker", "bulk-worker")
NOTE_LIMIT = 80  # notes per drill tenant: > FAST_QUEUE_MAX_NOTES, so "all" goes to bulk
NOTE_MAX_BYTES = 100_000


class DrillTimeout(waiting.WaitTimeout):
    """An observed state did not arrive before its deadline."""


# What a drill's poll counts as "not yet": the servers may be down on purpose.
NOT_YET = (psycopg.OperationalError, httpx.TransportError, redis.ConnectionError)


def wait_for(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05
) -> Any:
    """:func:`devtools.waiting.wait_for` for drills: connection errors while polling count as
    "not yet" (the servers may be down on purpose); raises DrillTimeout."""
    return waiting.wait_for(
        predicate, timeout, what, interval=interval, retry_on=NOT_YET, error=DrillTimeout
    )


def drill_probe(database_url: str) -> DatabaseProbe:
    """The database probe of a drill environment: its waits retry like :func:`wait_for`."""
    return DatabaseProbe(database_url, retry_on=NOT_YET, error=DrillTimeout)


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def parent_of(pid: int) -> int | None:
    """The parent PID of ``pid`` (None when it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, IndexError, ValueError):
        return None


def process_state(pid: int) -> str | None:
    """The one-letter state of ``pid`` (``T`` stopped, ``S`` sleeping…), None when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return None


def wait_exit(proc: ManagedProcess, timeout: float, what: str) -> int:
    """The exit code of ``proc`` once it has exited by itself (a failpoint, a signal);
    negative for a signal (``subprocess``); DrillTimeout after ``timeout`` seconds."""
    popen = proc.popen
    assert popen is not None, f"{proc.name} was not started"
    return int(wait_for(lambda: popen.poll() is not None and (popen.returncode,), timeout, what)[0])


def pick_notes(source: Path, limit: int = NOTE_LIMIT) -> list[Path]:
    """Real Markdown (or text) files from ``source`` (``/usr/share/doc``), stable order."""
    files = sorted(p for p in source.rglob("*.md") if p.is_file() and not p.is_symlink())
    if len(files) < limit:
        files += sorted(p for p in source.rglob("*.txt") if p.is_file() and not p.is_symlink())
    files = [f for f in files if 0 < f.stat().st_size <= NOTE_MAX_BYTES]
    if len(files) < 40:
        raise RuntimeError(f"need at least 40 real Markdown/text files under {source}")
    return files[:limit]


def stage_notes(source: Path, notes_dir: Path) -> Path:
    """``notes_dir`` holding copies of :func:`pick_notes` of ``source`` (their paths below
    it kept); a folder that exists already is used as it is. Returns ``notes_dir``."""
    if not notes_dir.exists():
        for f in pick_notes(source):
            target = notes_dir / f.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, target)
    return notes_dir


@dataclass
class Tenant:
    """A tenant of the drill database: its id, its client of the api (its key and an
    operator key: ``api.auth``, ``api.admin``, ``api.submit``…) and its notes' ids."""

    id: str
    api: ApiClient
    note_ids: list[int]


class DrillEnvironment:
    """Servers, database, artifact store and the seven processes of one drill run."""

    def __init__(
        self,
        settings: DrillSettings,
        *,
        base: Path | None = None,
        artifact_tmpfs: bool = True,
        s3: MotoServer | None = None,
        notes_source: Path = Path("/usr/share/doc"),
        keep_data: bool = False,
        say: Callable[[str], None] = print,
        topology: Topology = "single",
        pooler: bool = False,
    ) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.base = (base or DRILLS_HOME / f"run-{stamp}-{os.getpid()}").resolve()
        self.settings = settings
        # Artifacts on the S3-compatible server ``s3`` (a new bucket) instead of a folder; the
        # folder's tmpfs (for the disk-full drills) is then not mounted.
        self.s3 = s3
        self.s3_env: dict[str, str] = {}
        self.want_tmpfs = artifact_tmpfs and s3 is None
        self.keep_data = keep_data
        self.notes_source = notes_source
        self.say = say
        # The servers (devtools/drills/servers.py): one PostgreSQL and one Redis, or Patroni
        # and Sentinel (``topology="ha"``); through PgBouncer with ``pooler``.
        self.topology = topology
        self.pooler = pooler
        self.drill_servers = DrillServers(self.base, topology, pooler)
        self.artifact_dir = self.base / "artifacts"
        self.faults_file = self.base / "faults.json"
        self.artifact_mount: str | None = None
        self.artifact_mount_size = "2g"
        self.database_url = ""
        self.broker_url = ""
        self.stack: Stack | None = None
        self.base_tenant: Tenant | None = None
        self._db: DatabaseProbe | None = None
        self._logs: LogIndex | None = None
        self._celery: Any = None
        self._redis: redis.Redis | None = None
        self.started_at = 0.0
        self.warmup: dict[str, Any] = {}

    # --- lifecycle --------------------------------------------------------------------------

    def __enter__(self) -> DrillEnvironment:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Servers, schema, notes, processes; then one export per queue end to end."""
        self.started_at = time.time()
        self.base.mkdir(parents=True, exist_ok=True)
        self.say(f"drill environment under {self.base}")
        self.say(f"servers: {self.topology}{' through PgBouncer' if self.pooler else ''}")
        self.drill_servers.start()
        self.database_url = self.drill_servers.database_url
        self.broker_url = self.drill_servers.broker_url
        if self.pooler:
            self.drill_servers.session_defaults(session_defaults(self.core_settings()))
        migrate(self.drill_servers.direct_url)
        # the harness reads the truth directly, never through the pooler
        self._db = drill_probe(self.drill_servers.direct_url)
        self.artifact_dir.mkdir(parents=True, exist_ok=True)
        if self.s3 is not None:
            bucket = self.s3.create_bucket(f"drills-{uuid4().hex[:16]}")
            self.s3_env = self.s3.env(bucket, "artifacts")
        if self.want_tmpfs:
            self._mount_artifacts()
        self.faults_file.write_text("{}")
        self.stack = Stack.build(
            database_url=self.database_url,
            broker_url=self.broker_url,
            artifact_dir=self.artifact_dir,
            log_dir=self.base / "logs",
            extra_env={
                **self.settings.env(),
                **self.s3_env,
                **self.drill_servers.env,
                faults.ENV: str(self.faults_file),
            },
        )
        notes_dir = stage_notes(self.notes_source, self.base / "notes")
        self.base_tenant = self._create_tenant("base", notes_dir=notes_dir)
        self.stack.start(wait=True)
        self._logs = LogIndex({n: self.stack.log_dir / f"{n}.log" for n in WORKERS})
        self._warm_up()

    @property
    def backend(self) -> str:
        """Where the artifacts go: ``file`` (a folder) or ``s3`` (a bucket)."""
        return "s3" if self.s3 is not None else "file"

    def _warm_up(self) -> None:
        """One small and one bulk export must succeed: every queue is consumed."""
        assert self.base_tenant is not None
        t0 = time.monotonic()
        api = self.base_tenant.api
        small = api.submit_ok({"note_ids": self.base_tenant.note_ids[:2]})
        bulk = api.submit_ok({"all": True, "format": "ndjson"})
        for job_id in (small, bulk):
            row = self.db.wait_terminal(job_id, timeout=120)
            if row["status"] != "succeeded":
                raise RuntimeError(f"warm-up export {job_id} ended {row['status']}")
        self.warmup = {"jobs": [small, bulk], "seconds": round(time.monotonic() - t0, 3)}
        self.say(f"stack ready: warm-up exports succeeded in {self.warmup['seconds']} s")

    def close(self) -> None:
        """Stop every process and server; unmount the artifact tmpfs."""
        with contextlib.suppress(Exception):
            faults.disarm_all(self.faults_file)
        if self.stack is not None:
            for proc in self.stack.procs.values():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    if proc.alive:
                        proc.signal(signal.SIGCONT, group=True)
            self.stack.stop(timeout=20)
        if self._db is not None:
            self._db.close()
        self.drill_servers.stop(self.keep_data)  # the logs stay; the server data goes
        if self.artifact_mount:
            subprocess.run(["umount", "-l", str(self.artifact_dir)], check=False)
            self.artifact_mount = None

    def _mount_artifacts(self) -> None:
        """A tmpfs under the artifact folder, so drills can make storage read-only or full
        (``mount -o remount``); needs root. Without it those drills are skipped."""
        if os.geteuid() != 0:
            self.say("not root: artifacts on the plain filesystem (storage drills skip)")
            return
        done = subprocess.run(
            [
                "mount",
                "-t",
                "tmpfs",
                "-o",
                f"size={self.artifact_mount_size},mode=0755",
                "drills-artifacts",
                str(self.artifact_dir),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode == 0:
            self.artifact_mount = str(self.artifact_dir)
        else:
            self.say(f"tmpfs mount failed ({done.stderr.strip()}); storage drills skip")

    def remount_artifacts(self, *options: str) -> None:
        """``mount -o remount,<options>`` of the artifact tmpfs (raises on failure)."""
        if not self.artifact_mount:
            raise RuntimeError("the artifact folder is not a tmpfs mount")
        subprocess.run(
            ["mount", "-o", ",".join(("remount", *options)), str(self.artifact_dir)],
            check=True,
            capture_output=True,
        )

    def restore_storage(self) -> None:
        """The artifact tmpfs writable and at its full size again (no-op without it)."""
        if self.artifact_mount:
            self.remount_artifacts("rw", f"size={self.artifact_mount_size}")

    def artifact_usage_kib(self) -> int:
        """KiB used on the artifact filesystem."""
        st = os.statvfs(self.artifact_dir)
        return int((st.f_blocks - st.f_bfree) * st.f_frsize // 1024)

    # --- the processes ----------------------------------------------------------------------

    @property
    def procs(self) -> dict[str, ManagedProcess]:
        """The Procfile processes by name."""
        assert self.stack is not None
        return self.stack.procs

    def proc(self, name: str) -> ManagedProcess:
        """One Procfile process."""
        return self.procs[name]

    @property
    def api_url(self) -> str:
        """Base URL of the api."""
        assert self.stack is not None
        return self.stack.api_url

    def children_of(self, name: str) -> list[int]:
        """PIDs of the direct children of a process this environment started."""
        return self.proc(name).children()

    def signal_child(self, name: str, pid: int, sig: int) -> None:
        """Send ``sig`` to ``pid`` after checking it is a child of our process ``name``."""
        parent = self.proc(name).pid
        if parent_of(pid) != parent:
            raise RuntimeError(f"pid {pid} is not a child of {name} (pid {parent})")
        os.kill(pid, sig)

    def log_offset(self, name: str) -> int:
        """Current size of a process's log (to wait for lines written after it)."""
        path = self.proc(name).log_path
        return path.stat().st_size if path.exists() else 0

    def wait_log(self, name: str, pattern: str, since: int, timeout: float) -> str:
        """Wait for a log line of ``name`` matching ``pattern`` written after ``since``."""
        rx = re.compile(pattern)

        def found() -> str | None:
            path = self.proc(name).log_path
            with open(path, "rb") as fh:
                fh.seek(since)
                for line in fh.read().decode(errors="replace").splitlines():
                    if rx.search(line):
                        return line
            return None

        line: str = wait_for(found, timeout, f"{name} log line /{pattern}/")
        return line

    def start_process(self, name: str, timeout: float = 60.0) -> float:
        """(Re)start ``name`` and wait until it serves: the api answers /readyz, a worker
        logs that it is ready, other processes are alive. Returns seconds taken."""
        assert self.stack is not None
        t0 = time.monotonic()
        since = self.log_offset(name)
        self.stack.restart(name)
        if name == "api":
            self.stack.wait_ready(timeout)
        elif name in WORKERS:
            self.wait_log(name, r"ready\.", since, timeout)
        elif not self.proc(name).alive:
            raise RuntimeError(f"{name} exited right after start")
        return time.monotonic() - t0

    def stop_process(self, name: str, timeout: float = 30.0) -> int | None:
        """Graceful stop (TERM, the process finishes what it holds); returns the exit code."""
        return self.proc(name).stop(timeout)

    def ensure_running(self) -> list[str]:
        """Restart every process that is not running (after a drill); returns their names."""
        restarted = []
        for name, proc in self.procs.items():
            if proc.alive and process_state(proc.pid) == "T":
                proc.signal(signal.SIGCONT, group=True)
            if not proc.alive:
                self.start_process(name)
                restarted.append(name)
        return restarted

    def restart_with(self, name: str, **env: str) -> None:
        """Restart ``name`` with some environment variables changed (``restore_env`` undoes
        it)."""
        proc = self.proc(name)
        proc.env = {**proc.env, **env}
        self.start_process(name)

    def restore_env(self, name: str) -> None:
        """Restart ``name`` with the stack's own environment again."""
        assert self.stack is not None
        self.proc(name).env = self.stack.env
        self.start_process(name)

    # --- servers ------------------------------------------------------------------------------

    @property
    def servers(self) -> Servers:
        """The one PostgreSQL and one Redis of a ``single`` environment (the infra drills
        stop and start them); RuntimeError in an ``ha`` environment."""
        if self.drill_servers.single is None:
            raise RuntimeError("this drill needs the single-server topology")
        return self.drill_servers.single

    @property
    def ha(self) -> HATopology:
        """Patroni and Sentinel of an ``ha`` environment; RuntimeError otherwise."""
        if self.drill_servers.ha is None:
            raise RuntimeError("this drill needs the high-availability topology")
        return self.drill_servers.ha

    def redis(self) -> redis.Redis:
        """A client of the drill Redis (the broker database; the master its Sentinels name
        in ``ha``), as the processes' ACL user (one client, reconnecting by itself)."""
        if self._redis is None:
            self._redis = redis_client(self.core_settings(), self.broker_url, timeout=3)
        return self._redis

    def redis_up(self) -> bool:
        """True when Redis answers PING."""
        try:
            return bool(self.redis().ping())
        except redis.RedisError:
            return False

    def pg_up(self) -> bool:
        """True when PostgreSQL (the primary) accepts a query."""
        return self.drill_servers.pg_up()

    def ensure_redis(self) -> None:
        """Start Redis unless it answers."""
        if not self.redis_up():
            self.servers.start_redis()

    def ensure_pg(self) -> None:
        """Start PostgreSQL unless it answers."""
        if not self.pg_up():
            self.servers.start_pg()

    def ensure_servers(self) -> list[str]:
        """Start PostgreSQL / Redis (PgBouncer, a Patroni member, a Sentinel…) if a drill
        left one down; returns what was started."""
        return self.drill_servers.ensure(self.redis_up())

    def postgres_pid(self) -> int | None:
        """PID of the postmaster we started (from ``postmaster.pid``)."""
        pidfile = self.servers.base / "pg" / "data" / "postmaster.pid"
        try:
            return int(pidfile.read_text().split()[0])
        except (FileNotFoundError, IndexError, ValueError):
            return None

    def pg_log_lines(self, text: str) -> list[str]:
        """The lines of PostgreSQL's own log (``pg_ctl -l``) that contain ``text``."""
        path = self.servers.base / "pg" / "pg.log"
        try:
            return [line for line in path.read_text(errors="replace").splitlines() if text in line]
        except FileNotFoundError:
            return []

    def redis_pid(self) -> int | None:
        """PID of the Redis server we started (from its pidfile)."""
        try:
            return int((self.servers.base / "redis" / "redis.pid").read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    # --- database ---------------------------------------------------------------------------

    @property
    def db(self) -> DatabaseProbe:
        """The probe of the drill database: statements, a job's row, history and outbox,
        and the waits for a status, a terminal state or an event (:mod:`devtools.probe`)."""
        assert self._db is not None, "the environment has not started"
        return self._db

    def core_settings(self) -> Settings:
        """exportcore settings pointing at this environment (for in-process library use)."""
        env = {**self.settings.env(), **self.s3_env, **self.drill_servers.env}
        values: dict[str, Any] = {k.lower(): v for k, v in env.items()}
        values.update(artifact_dir=self.artifact_dir)
        return Settings.model_validate(values)

    def _create_tenant(self, label: str, notes_dir: Path | None = None) -> Tenant:
        slug = re.sub(r"[^a-z0-9-]+", "-", label.lower()).strip("-")[:40] or "drill"
        tenant_id = f"{slug}-{uuid4().hex[:6]}"
        from exportcore.db import make_pool

        pool = make_pool(self.core_settings(), "drills-setup", min_size=1, max_size=2)
        try:
            with pool.connection() as conn:
                tenant_upsert(conn, tenant_id=tenant_id, name=label)
                key, _ = create_api_key(
                    conn, tenant_id=tenant_id, scopes=["exports:read", "exports:write"]
                )
                admin, _ = create_operator_key(conn, label=f"drills {tenant_id}")
            if notes_dir is not None:
                import_notes(pool, tenant_id, notes_dir)
            else:
                assert self.base_tenant is not None
                with pool.connection() as conn:
                    conn.execute(
                        "INSERT INTO notes (tenant_id, source_path, title, content, pinned,"
                        " updated_at) SELECT %s, source_path, title, content, pinned, updated_at"
                        " FROM notes WHERE tenant_id = %s ORDER BY id",
                        (tenant_id, self.base_tenant.id),
                    )
        finally:
            pool.close()
        api = ApiClient(self.api_url, key, admin)
        return Tenant(tenant_id, api, self.db.note_ids(tenant_id))

    def new_tenant(self, label: str) -> Tenant:
        """A fresh tenant (keys + a copy of the real notes) for one drill."""
        return self._create_tenant(label)

    # --- faults -----------------------------------------------------------------------------

    def arm(
        self, point: str, fault: str, times: int = 1, only: object = None, skip: int = 0
    ) -> None:
        """Arm one failpoint in every process of the stack (``only``/``skip``:
        :func:`exportcore.faults.arm`)."""
        faults.arm(self.faults_file, point, fault, times, only=only, skip=skip)

    def hits(self, point: str) -> list[dict[str, Any]]:
        """Injections of ``point`` since it was armed (pid, time, fault)."""
        return faults.hits(self.faults_file, point)

    def wait_hits(self, point: str, n: int, timeout: float) -> list[dict[str, Any]]:
        """Wait until ``point`` has injected ``n`` faults."""
        injected: list[dict[str, Any]] = wait_for(
            lambda: (h := self.hits(point)) and len(h) >= n and h,
            timeout,
            f"{n} injection(s) at {point}",
        )
        return injected

    def disarm(self) -> None:
        """Disarm every failpoint."""
        faults.disarm_all(self.faults_file)

    # --- jobs -------------------------------------------------------------------------------

    def jobs_for_keys(self, tenant_id: str, keys: Sequence[str]) -> dict[str, str]:
        """``{idempotency key: job id}`` for those ``keys`` that have a committed job (the
        key row is written in the submit's own transaction)."""
        found: dict[str, str] = {}
        keys = list(keys)
        for i in range(0, len(keys), 500):
            for row in self.db.sql(
                "SELECT key, job_id FROM export_idempotency_keys"
                " WHERE tenant_id = %s AND key = ANY(%s)",
                (tenant_id, keys[i : i + 500]),
            ):
                found[row["key"]] = str(row["job_id"])
        return found

    def active_jobs(self) -> int:
        """Jobs queued or running, all tenants."""
        return int(
            self.db.scalar("SELECT count(*) FROM export_jobs WHERE status IN ('queued', 'running')")
        )

    # --- the broker ---------------------------------------------------------------------------

    def celery(self) -> Any:
        """A Celery producer on the drill broker (to send duplicate messages)."""
        if self._celery is None:
            from exportcore.broker import make_celery

            self._celery = make_celery(self.core_settings(), main="drills")
        return self._celery

    def send_duplicate(self, job_id: str, queue: str) -> str:
        """Send one more message for ``job_id`` straight to the broker (a duplicate or
        late delivery); returns its message id."""
        from exportcore.broker import EXPORT_TASK

        message_id = str(uuid4())
        self.celery().send_task(EXPORT_TASK, args=[job_id], task_id=message_id, queue=queue)
        return message_id

    def queued_messages(self, queue: str) -> list[dict[str, Any]]:
        """Messages waiting in a Redis queue list, as :func:`parse_message` reads them."""
        return [parse_message(raw, queue) for raw in self.redis().lrange(queue, 0, -1)]

    # --- artifacts ----------------------------------------------------------------------------

    @property
    def store(self) -> ArtifactStore:
        """The artifact store, opened the way the processes open it."""
        return open_store(self.core_settings())

    def read_artifact(self, ref: str) -> tuple[str, int]:
        """``(sha256, bytes)`` of an artifact read back through the store API."""
        stream, size = self.store.open_reader(ref)
        digest = hashlib.sha256()
        read = 0
        with stream:
            while chunk := stream.read(1 << 20):
                digest.update(chunk)
                read += len(chunk)
        if read != size:
            raise OSError(f"artifact {ref}: read {read} bytes, the store said {size}")
        return digest.hexdigest(), read

    def artifacts_of(self, tenant_id: str, job_id: str) -> list[dict[str, Any]]:
        """Every stored object of a job, complete or half-written, from the store listing."""
        prefix = f"{tenant_id}/{job_id}/"
        found: dict[str, dict[str, Any]] = {}
        future = datetime.now(UTC) + timedelta(days=1)
        for key, modified in self.store.list_older_than(future):
            if not key.startswith(prefix):
                continue
            entry = found.setdefault(key, {"key": key, "modified": modified.isoformat()})
            try:
                entry["sha256"], entry["bytes"] = self.read_artifact(key)
                entry["complete"] = True
            except (ArtifactMissing, OSError):
                entry["complete"] = False
        return sorted(found.values(), key=lambda e: e["key"])

    # --- logs and metrics ---------------------------------------------------------------------

    @property
    def logs(self) -> LogIndex:
        """Parsed JSON log lines of both workers."""
        assert self._logs is not None
        return self._logs

    def scrape(self, name: str) -> dict[str, float]:
        """The samples of a process's /metrics: ``{'name{label="v",…}': value}``."""
        assert self.stack is not None
        text = httpx.get(self.stack.metrics_url(name), timeout=5).text
        samples: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                samples[f"{s.name}{{{labels}}}"] = s.value
        return samples

    def scanner_passes(self) -> int:
        """Passes the recovery-scanner completed since it started (from its /metrics)."""
        return int(self.scrape("recovery-scanner").get("exports_scanner_pass_seconds_count{}", 0))


def parse_message(raw: bytes | str, queue: str = "") -> dict[str, Any]:
    """A Celery message as stored in a Redis list (bytes, or text from a client that decodes
    responses), read by the broker reconciliation's own decoder
    (:func:`exportcore.broker_inspect.parse_message`): ``{id, task, job_id, job_ids, raw}``,
    ``job_ids`` every job it names (several for a batch message), ``job_id`` the first; the
    ids are None (``job_ids`` empty) for a tick or a message that does not decode."""
    m = broker_inspect.parse_message(queue, "ready", raw.encode() if isinstance(raw, str) else raw)
    return {
        "id": m.task_id,
        "task": m.task,
        "job_id": str(m.job_id) if m.job_id else None,
        "job_ids": [str(j) for j in m.job_ids],
        "raw": raw,
    }
