"""PostgreSQL with automatic failover on this machine: etcd, two PostgreSQL 15 members under
Patroni with synchronous replication, and (optionally) a PgBouncer in transaction mode in
front of whichever member is the primary.

Every decision is the engines': Patroni holds the leader key in etcd, promotes only the
synchronous standby (``synchronous_mode: true``: a commit that answered is on both
servers), demotes and rewinds the old primary (``use_pg_rewind``). This module starts,
observes and injects faults: ``patronictl switchover``, SIGKILL of a member's Patroni and
PostgreSQL together (what the death of its machine does).

Clients reach the primary with a multi-host URL and ``target_session_attrs=read-write``
(libpq tries the hosts in turn and keeps the one that accepts writes:
:meth:`PostgresHA.direct_url`), or through the PgBouncer (:meth:`PostgresHA.pooled_url`),
which Patroni's ``on_role_change`` callback of the new primary repoints at it (what a
pooler in front of an operator's ``-rw`` Service does). Not one PgBouncer per member behind
a multi-host URL: PgBouncer replays the parameters its first server reported
(``in_hot_standby``), so libpq's read-write check would keep choosing a demoted member's
PgBouncer.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import yaml
from psycopg import sql

from devtools.ha.daemon import Daemon, as_postgres, children, give_to_postgres
from devtools.ha.pgbouncer import PgBouncer
from devtools.waiting import wait_for

PG_BIN = Path(
    os.environ.get("PG_BIN", f"/usr/lib/postgresql/{os.environ.get('PG_VERSION', '15')}/bin")
)
SCOPE = "notes-exports"


@dataclass(frozen=True)
class PatroniTiming:
    """Patroni's timing (its dynamic configuration, seconds), which bounds a failover.

    - ``ttl``: the leader key's lease. The leader renews it every ``loop_wait``; when its
      machine dies the key lives on until the lease runs out, ``ttl`` after the last renewal,
      and only then may the synchronous standby take it and promote itself. Patroni raises a
      smaller value to 20 at run time (``patroni/config.py``,
      ``_validate_and_adjust_timeouts``), and its maintainers advise against less (false
      failovers, https://github.com/patroni/patroni/issues/2040).
    - ``loop_wait``: seconds between two runs of a member's HA loop (at least 1).
    - ``retry_timeout``: how long a DCS or PostgreSQL call is retried (at least 3); a leader
      that cannot renew its key within it demotes itself.
    - Patroni's rule ``loop_wait + 2 * retry_timeout <= ttl``: a leader cut off from etcd
      has stopped accepting writes before its key can expire and another member promote.
    - ``primary_start_timeout``: how long a primary whose PostgreSQL crashed (its Patroni
      alive) is restarted in place before the key is released; 0 releases it at once, safe
      with ``synchronous_mode`` (the standby that takes over has every commit that answered).

    :meth:`check` raises ValueError naming the rule a value breaks."""

    ttl: int = 20
    loop_wait: int = 1
    retry_timeout: int = 5
    primary_start_timeout: int = 0

    def check(self) -> PatroniTiming:
        """Raise ValueError when Patroni would not run with these values as given (it would
        silently raise ``ttl`` to 20, or lower ``loop_wait``/``retry_timeout``); returns
        self."""
        if self.ttl < 20:
            raise ValueError(f"ttl={self.ttl}: Patroni raises any ttl under 20 s to 20")
        if self.loop_wait < 1 or self.retry_timeout < 3:
            raise ValueError("Patroni needs loop_wait >= 1 and retry_timeout >= 3")
        if self.loop_wait + 2 * self.retry_timeout > self.ttl:
            raise ValueError(
                f"loop_wait + 2 * retry_timeout = {self.loop_wait + 2 * self.retry_timeout}"
                f" exceeds ttl={self.ttl}: a leader cut off from etcd would still accept"
                " writes when its key expires"
            )
        if self.primary_start_timeout < 0:
            raise ValueError("primary_start_timeout must be >= 0")
        return self

    @property
    def key_expiry_after_death(self) -> float:
        """Longest time from a leader's death (machine, or Patroni and PostgreSQL killed
        together) until its key expires: ``ttl`` from its last renewal, which came at most
        one loop (``loop_wait`` plus the loop's own work) before the death, so at most
        ``ttl`` seconds."""
        return float(self.ttl)

    def dcs(self) -> dict[str, int]:
        """The timing keys of Patroni's ``bootstrap.dcs`` configuration."""
        return {
            "ttl": self.ttl,
            "loop_wait": self.loop_wait,
            "retry_timeout": self.retry_timeout,
            "primary_start_timeout": self.primary_start_timeout,
        }


TIMING = PatroniTiming().check()
"""The timing of the drills' and ``make dev DEV_HA=1``'s Patroni (docs/operations.md,
"What bounds the unavailability")."""


class PatroniUnavailable(RuntimeError):
    """No Patroni member of the cluster answered its REST API."""


def patroni_command() -> tuple[list[str], dict[str, str]]:
    """The command (and extra environment) that runs Patroni from this virtual environment
    as the user PostgreSQL runs as.

    As root, Patroni must run as ``postgres`` (``initdb`` and ``postgres`` refuse root).
    When that user cannot execute this environment's interpreter (a pyenv build under the
    0700 ``/root``), the same packages run under the system's CPython of the same minor
    version with this environment's ``site-packages`` on ``PYTHONPATH``. Raises
    RuntimeError naming what is missing when neither works."""
    if os.geteuid() != 0 or _runs_as_postgres(sys.executable):
        return [sys.executable, "-m", "patroni"], {}
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    system = shutil.which(f"python{version}", path="/usr/bin:/usr/local/bin")
    if system and _runs_as_postgres(system):
        paths = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
        # -S: no site module, so none of the system's dist-packages shadow these
        return [system, "-S", "-m", "patroni"], {"PYTHONPATH": os.pathsep.join(paths)}
    raise RuntimeError(
        f"Patroni must run as the postgres user, which cannot execute {sys.executable} "
        f"(its folders are not readable by postgres) and no /usr/bin/python{version} is "
        f"installed: install python{version} or create .venv from an interpreter postgres "
        "can execute"
    )


def _runs_as_postgres(python: str) -> bool:
    try:
        done = subprocess.run(
            [python, "-c", "import sys"],
            capture_output=True,
            check=False,
            **as_postgres(),  # type: ignore[call-overload]
        )
    except PermissionError:
        return False
    return bool(done.returncode == 0)


@dataclass(frozen=True)
class MemberPorts:
    """The ports of one member: PostgreSQL and Patroni's REST API."""

    pg: int
    rest: int


class Etcd:
    """A one-node etcd (Debian's ``etcd-server``, v3 API) on two loopback ports of our own."""

    def __init__(self, base: Path, client_port: int, peer_port: int) -> None:
        self.base = base
        self.client_port = client_port
        self.peer_port = peer_port
        client, peer = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
        self.daemon = Daemon(
            "etcd",
            [
                shutil.which("etcd") or "etcd",
                "--name=ha",
                f"--data-dir={base / 'data'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=ha={peer}",
                "--initial-cluster-state=new",
                f"--initial-cluster-token={SCOPE}-{client_port}",
            ],
            base / "etcd.log",
            base / "etcd.pid",
            marker=f"--listen-client-urls={client}",
        )

    @property
    def endpoint(self) -> str:
        """``host:port`` of the client API."""
        return f"127.0.0.1:{self.client_port}"

    def start(self) -> None:
        """Start etcd and wait until it answers its health endpoint."""
        self.base.mkdir(parents=True, exist_ok=True)
        self.daemon.start()
        wait_for(
            lambda: (
                httpx.get(f"http://{self.endpoint}/health", timeout=1).json().get("health")
                == "true"
            ),
            30,
            "etcd to answer /health",
            interval=0.1,
            retry_on=(httpx.HTTPError, ValueError),
        )

    def stop(self) -> None:
        """Stop etcd."""
        self.daemon.stop()


class Member:
    """One PostgreSQL server under its Patroni, and the PgBouncer in front of it."""

    def __init__(self, cluster: PostgresHA, name: str, ports: MemberPorts) -> None:
        self.cluster = cluster
        self.name = name
        self.ports = ports
        self.base = cluster.base / name
        self.config_path = self.base / "patroni.yml"
        command, env = patroni_command()
        self.patroni = Daemon(
            f"patroni-{name}",
            [*command, str(self.config_path)],
            self.base / "patroni.log",
            self.base / "patroni.pid",
            marker=str(self.config_path),
            env={**os.environ, **env, "PATRONI_LOG_LEVEL": "INFO"},
            cwd=self.base,
            popen_kwargs=as_postgres(),
        )
        self.callback = self.base / "on_role_change.sh"

    # --- configuration -----------------------------------------------------------------------

    def write_config(self) -> None:
        """Patroni's YAML for this member (rewritten on every start)."""
        self.base.mkdir(parents=True, exist_ok=True)
        give_to_postgres(self.base)
        self.config_path.write_text(yaml.safe_dump(self._patroni_config(), sort_keys=False))
        give_to_postgres(self.config_path)
        if self.cluster.bouncer is not None:
            self.callback.write_text(self.cluster.bouncer.retarget_script(self.ports.pg))
            self.callback.chmod(0o755)

    def _patroni_config(self) -> dict[str, Any]:
        hba = [
            "local all all trust",
            "host all all 127.0.0.1/32 trust",
            "host replication all 127.0.0.1/32 trust",
        ]
        return {
            "scope": SCOPE,
            "name": self.name,
            "restapi": {
                "listen": f"127.0.0.1:{self.ports.rest}",
                "connect_address": f"127.0.0.1:{self.ports.rest}",
            },
            "etcd3": {"hosts": [self.cluster.etcd.endpoint], "protocol": "http"},
            "bootstrap": {
                "dcs": {
                    **TIMING.dcs(),
                    "maximum_lag_on_failover": 1048576,
                    "synchronous_mode": True,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {
                            "max_connections": 300,
                            "shared_buffers": "64MB",
                            "wal_level": "replica",
                            "hot_standby": "on",
                            "wal_log_hints": "on",
                            "max_wal_senders": 10,
                            "max_replication_slots": 10,
                            "wal_keep_size": "256MB",
                            "timezone": "UTC",
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C.UTF-8"}],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{self.ports.pg}",
                "connect_address": f"127.0.0.1:{self.ports.pg}",
                "data_dir": str(self.base / "data"),
                "bin_dir": str(PG_BIN),
                "pgpass": str(self.base / "pgpass"),
                "pg_hba": hba,
                "authentication": {
                    "superuser": {"username": "postgres"},
                    "replication": {"username": "postgres"},
                    "rewind": {"username": "postgres"},
                },
                "parameters": {"unix_socket_directories": str(self.base)},
                **(
                    {
                        "callbacks": {
                            "on_start": str(self.callback),
                            "on_role_change": str(self.callback),
                        }
                    }
                    if self.cluster.bouncer is not None
                    else {}
                ),
            },
            "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False},
        }

    # --- processes ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start Patroni (which starts, bootstraps or rejoins PostgreSQL)."""
        self.write_config()
        self.patroni.start()

    def postmaster_pid(self) -> int | None:
        """The pid of this member's postmaster (``postmaster.pid``), None when not running."""
        try:
            pid = int((self.base / "data" / "postmaster.pid").read_text().split()[0])
        except (FileNotFoundError, IndexError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        return pid

    def kill(self) -> list[int]:
        """SIGKILL this member's Patroni and its PostgreSQL (postmaster and every backend)
        at once: the machine died. Returns the pids killed."""
        pids = [p for p in (self.patroni.pid(),) if p]
        postmaster = self.postmaster_pid()
        if postmaster is not None:
            pids += [postmaster, *children(postmaster)]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
        self.patroni.wait_gone(10)
        wait_for(lambda: self.postmaster_pid() is None, 10, f"{self.name}'s postmaster to die")
        return pids

    def crash(self) -> list[int]:
        """SIGKILL this member's PostgreSQL (postmaster and every backend), not its Patroni:
        the server crashed (the OOM killer), its machine lives. Returns the pids killed."""
        postmaster = self.postmaster_pid()
        if postmaster is None:
            raise RuntimeError(f"{self.name}'s PostgreSQL is not running")
        pids = [postmaster, *children(postmaster)]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
        return pids

    def stop(self) -> None:
        """Stop Patroni (which stops its PostgreSQL)."""
        self.patroni.stop(timeout=60)
        postmaster = self.postmaster_pid()
        if postmaster is not None:  # Patroni died before it could stop its server
            subprocess.run(
                [str(PG_BIN / "pg_ctl"), "-D", str(self.base / "data"), "-m", "fast", "-w", "stop"],
                capture_output=True,
                check=False,
                **as_postgres(),  # type: ignore[call-overload]
            )


class PostgresHA:
    """etcd and two Patroni members (``pg0``, ``pg1``) under ``base``, and a PgBouncer in
    front of the primary on ``bouncer_port`` when given; ports given by the caller
    (:class:`devtools.ha.topology`)."""

    def __init__(
        self,
        base: Path,
        *,
        etcd_ports: tuple[int, int],
        members: Sequence[MemberPorts],
        bouncer_port: int | None = None,
    ) -> None:
        self.base = base
        self.etcd = Etcd(base / "etcd", *etcd_ports)
        self.bouncer = (
            PgBouncer(base / "pgbouncer", bouncer_port, members[0].pg)
            if bouncer_port is not None
            else None
        )
        self.members = {f"pg{i}": Member(self, f"pg{i}", ports) for i, ports in enumerate(members)}

    # --- addresses ---------------------------------------------------------------------------

    def direct_url(self, database: str) -> str:
        """libpq URL of ``database`` on whichever member is the primary (multi-host,
        ``target_session_attrs=read-write``)."""
        hosts = ",".join(f"127.0.0.1:{m.ports.pg}" for m in self.members.values())
        return f"postgresql://postgres@{hosts}/{database}?target_session_attrs=read-write"

    @property
    def pooler(self) -> bool:
        """Whether a PgBouncer runs in front of the primary."""
        return self.bouncer is not None

    def pooled_url(self, database: str) -> str:
        """libpq URL of ``database`` through the PgBouncer (which follows the primary)."""
        if self.bouncer is None:
            raise RuntimeError("this cluster runs without PgBouncer")
        return f"postgresql://postgres@127.0.0.1:{self.bouncer.port}/{database}"

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout: float = 180.0) -> None:
        """Start etcd, then the members, and wait for a primary with a streaming
        synchronous standby."""
        self.base.mkdir(parents=True, exist_ok=True)
        self.etcd.start()
        first, *others = self.members.values()
        first.start()
        wait_for(
            lambda: self.leader() is not None,
            timeout,
            "a Patroni leader",
            interval=0.2,
            retry_on=(PatroniUnavailable,),
            detail=lambda: _tail(first.patroni.log_path),
        )
        for member in others:
            member.start()
        self.wait_healthy(timeout)
        self._ensure_bouncer()

    def _ensure_bouncer(self) -> bool:
        """Start the PgBouncer (pointed at the primary) unless it runs; True if started."""
        if self.bouncer is None or self.bouncer.running:
            return False
        leader = self.leader()
        self.bouncer.start(self.members[leader].ports.pg if leader else None)
        return True

    def stop(self) -> None:
        """Stop every member (replicas first, so the primary does not wait for them), then
        etcd."""
        if self.bouncer is not None:
            self.bouncer.stop()
        leader = self.leader_or_none()
        for _, member in sorted(self.members.items(), key=lambda kv: kv[0] == leader):
            member.stop()
        self.etcd.stop()

    # --- observation -------------------------------------------------------------------------

    def cluster(self) -> dict[str, Any]:
        """Patroni's view of the cluster (``GET /cluster`` of the first member that answers):
        ``members`` with ``name``, ``role`` (``leader``, ``sync_standby``, ``replica``),
        ``state`` (``running``, ``streaming``…), ``timeline``, ``lag``."""
        for member in self.members.values():
            try:
                r = httpx.get(f"http://127.0.0.1:{member.ports.rest}/cluster", timeout=2)
                if r.status_code == 200:
                    data: dict[str, Any] = r.json()
                    return data
            except httpx.HTTPError:
                continue
        raise PatroniUnavailable("no Patroni REST API answered")

    def roles(self) -> dict[str, tuple[str, str]]:
        """``{member: (role, state)}`` as Patroni reports them."""
        return {m["name"]: (m["role"], m["state"]) for m in self.cluster().get("members", [])}

    def leader(self) -> str | None:
        """The member holding the leader key and running as primary, else None."""
        for name, (role, state) in self.roles().items():
            if role == "leader" and state == "running":
                return name
        return None

    def leader_or_none(self) -> str | None:
        """:meth:`leader`, None while no Patroni answers either."""
        try:
            return self.leader()
        except PatroniUnavailable:
            return None

    def sync_standby(self) -> str | None:
        """The synchronous standby, streaming, else None."""
        for name, (role, state) in self.roles().items():
            if role == "sync_standby" and state == "streaming":
                return name
        return None

    def healthy(self) -> bool:
        """A running primary and a streaming synchronous standby, and the primary reports the
        standby in ``synchronous_standby_names`` (commits wait for it)."""
        try:
            leader, standby = self.leader(), self.sync_standby()
        except PatroniUnavailable:
            return False
        if leader is None or standby is None:
            return False
        try:
            with psycopg.connect(self.member_url(leader, "postgres"), connect_timeout=2) as conn:
                names = conn.execute("SHOW synchronous_standby_names").fetchone()
        except psycopg.Error:
            return False
        return bool(names and standby in str(names[0]))

    def wait_healthy(self, timeout: float = 180.0) -> None:
        """Wait until :meth:`healthy` (raises WaitTimeout naming what Patroni reports)."""
        wait_for(
            self.healthy,
            timeout,
            "a primary with a streaming synchronous standby",
            interval=0.2,
            detail=lambda: json.dumps(self._roles_or_error()),
        )

    def _roles_or_error(self) -> Any:
        try:
            return self.roles()
        except PatroniUnavailable as exc:
            return str(exc)

    def member_url(self, name: str, database: str) -> str:
        """libpq URL of ``database`` on one member, whatever its role."""
        return f"postgresql://postgres@127.0.0.1:{self.members[name].ports.pg}/{database}"

    def timeline(self) -> int | None:
        """The primary's timeline (it grows by one per promotion)."""
        for m in self.cluster().get("members", []):
            if m.get("role") == "leader":
                return int(m["timeline"]) if m.get("timeline") is not None else None
        return None

    # --- faults ------------------------------------------------------------------------------

    def switchover(self, candidate: str | None = None) -> str:
        """``patronictl switchover`` from the leader to ``candidate`` (default: the synchronous
        standby), now and without asking; returns the candidate. Raises CalledProcessError
        with patronictl's output when it refuses."""
        leader = self.leader()
        if leader is None:
            raise RuntimeError("no leader to switch over from")
        target = candidate or self.sync_standby()
        if target is None:
            raise RuntimeError("no synchronous standby to switch over to")
        first = next(iter(self.members.values()))
        subprocess.run(
            [
                str(Path(sys.executable).parent / "patronictl"),
                "-c",
                str(first.config_path),
                "switchover",
                SCOPE,
                "--leader",
                leader,
                "--candidate",
                target,
                "--force",
            ],
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return target

    def kill_leader(self) -> tuple[str, list[int]]:
        """SIGKILL the primary's Patroni and PostgreSQL (:meth:`Member.kill`); returns its
        name and the pids killed."""
        leader = self.leader()
        if leader is None:
            raise RuntimeError("no leader to kill")
        return leader, self.members[leader].kill()

    def crash_leader(self) -> tuple[str, list[int]]:
        """SIGKILL the primary's PostgreSQL, its Patroni left running (:meth:`Member.crash`);
        returns its name and the pids killed."""
        leader = self.leader()
        if leader is None:
            raise RuntimeError("no leader to crash")
        return leader, self.members[leader].crash()

    def ensure_running(self) -> list[str]:
        """Start every member whose Patroni is not running (a killed member rejoins as a
        replica, rewound if need be) and the PgBouncer; returns what was started."""
        started = []
        for name, member in self.members.items():
            if not member.patroni.running:
                member.start()
                started.append(name)
        if self._ensure_bouncer():
            started.append("pgbouncer")
        return started

    def create_database(self, name: str) -> str:
        """(Re)create ``name`` on the primary; returns its direct (multi-host) URL."""
        with psycopg.connect(self.direct_url("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.direct_url(name)

    def session_defaults(self, database: str, values: dict[str, str]) -> None:
        """``ALTER DATABASE … SET`` each of ``values`` (the session defaults a transaction
        pooler's connections start with; docs/operations.md, "Behind PgBouncer")."""
        with psycopg.connect(self.direct_url("postgres"), autocommit=True) as conn:
            for key, value in values.items():
                conn.execute(
                    sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                        sql.Identifier(database), sql.Identifier(key), sql.Literal(value)
                    )
                )


def _tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log (for a timeout's message)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return f"({path} does not exist)"
