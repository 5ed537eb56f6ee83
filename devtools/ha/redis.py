"""Redis with Sentinel on this machine: one master, one replica and three Sentinels
(Debian's ``redis-server`` and ``redis-sentinel``), every connection authenticated.

ACL users (``users.acl`` of each Redis, the default user off):

- ``exports``: the processes (every key and channel, every command but the administrative
  ones: ``+@all -@admin``);
- ``replica``: what a replica needs of its master (``PSYNC``, ``REPLCONF``, ``PING``);
- ``sentinel``: what the Sentinels need of the Redis servers (Redis' documentation, "Redis
  Sentinel", ACL).

The Sentinels themselves ask for a password (``requirepass``, and ``sentinel-pass``
among themselves). Redis keeps no data on disk here: PostgreSQL is the truth and a lost
message is re-dispatched (docs/architecture.md), so a master that restarts comes back
empty; the Sentinels make it a replica of the new master.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import redis

from devtools.ha.daemon import Daemon
from devtools.waiting import wait_for

MASTER_NAME = "exports"
APP_USER = "exports"
# Sentinel's ACL needs (Redis documentation, "Redis Sentinel", "Redis Access Control List
# authentication"), plus CONFIG REWRITE so a reconfigured server keeps its new role.
SENTINEL_RULES = (
    "allchannels +multi +slaveof +replicaof +ping +exec +subscribe +config|rewrite +role "
    "+publish +info +client|setname +client|kill +script|kill"
)
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 10000


@dataclass(frozen=True)
class RedisPasswords:
    """The secrets of one topology: the app user's, the replication and Sentinel users',
    and the Sentinels' own."""

    app: str
    replica: str
    sentinel_user: str
    sentinel: str


class RedisHA:
    """``r0`` (the first master), ``r1`` (its replica) and Sentinels ``s0``, ``s1``, ``s2`` under
    ``base`` on the ports given."""

    def __init__(
        self,
        base: Path,
        *,
        redis_ports: tuple[int, int],
        sentinel_ports: tuple[int, int, int],
        passwords: RedisPasswords,
    ) -> None:
        self.base = base
        self.passwords = passwords
        self.redis_ports = dict(zip(("r0", "r1"), redis_ports, strict=True))
        self.sentinel_ports = dict(zip(("s0", "s1", "s2"), sentinel_ports, strict=True))
        self.nodes = {
            name: self._daemon(f"redis-{name}", "redis-server", name, port)
            for name, port in self.redis_ports.items()
        }
        self.sentinels = {
            name: self._daemon(f"sentinel-{name}", "redis-sentinel", name, port)
            for name, port in self.sentinel_ports.items()
        }

    def _daemon(self, label: str, program: str, name: str, port: int) -> Daemon:
        # Redis names itself "<program> 127.0.0.1:<port>" in its command line.
        return Daemon(
            label,
            [shutil.which(program) or program, str(self.base / f"{name}.conf")],
            self.base / f"{name}.log",
            self.base / f"{name}.pid",
            marker=f":{port}",
        )

    # --- addresses ---------------------------------------------------------------------------

    def broker_url(self, db: int = 0) -> str:
        """The ``sentinel://`` URL of the processes (kombu's form: every Sentinel, joined by
        ``;``; the first carries the ``exports`` user's credentials and the database)."""
        auth = f"{APP_USER}:{quote(self.passwords.app, safe='')}@"
        return ";".join(
            f"sentinel://{auth}127.0.0.1:{port}/{db}" for port in self.sentinel_ports.values()
        )

    def node_client(self, name: str, timeout: float = 2.0) -> redis.Redis:
        """A client of one Redis server as the ``exports`` user."""
        return redis.Redis(
            port=self.redis_ports[name],
            username=APP_USER,
            password=self.passwords.app,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
        )

    def sentinel_client(self, name: str, timeout: float = 2.0) -> redis.Redis:
        """A client of one Sentinel."""
        return redis.Redis(
            port=self.sentinel_ports[name],
            password=self.passwords.sentinel,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            decode_responses=True,
        )

    # --- configuration -----------------------------------------------------------------------

    def _write_configs(self, first_master: str) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        p = self.passwords
        acl = self.base / "users.acl"
        acl.write_text(  # passwords stored as their SHA-256 (Redis ACL "#<hash>")
            "user default off\n"
            f"user {APP_USER} on #{_sha256(p.app)} ~* &* +@all -@admin\n"
            f"user replica on #{_sha256(p.replica)} +psync +replconf +ping\n"
            f"user sentinel on #{_sha256(p.sentinel_user)} {SENTINEL_RULES}\n"
        )
        acl.chmod(0o600)
        master_port = self.redis_ports[first_master]
        for name, port in self.redis_ports.items():
            conf = self.base / f"{name}.conf"
            if conf.exists():  # a server that restarts keeps what the Sentinels wrote
                continue
            lines = [
                f"port {port}",
                "bind 127.0.0.1",
                f"dir {self.base}",
                f"aclfile {acl}",
                'save ""',
                "appendonly no",
                "masteruser replica",
                f"masterauth {p.replica}",
                "replica-read-only yes",
                "repl-diskless-sync-delay 0",  # no data to wait for: sync a replica at once
            ]
            if name != first_master:
                lines.append(f"replicaof 127.0.0.1 {master_port}")
            conf.write_text("\n".join(lines) + "\n")
            conf.chmod(0o600)
        for name, port in self.sentinel_ports.items():
            conf = self.base / f"{name}.conf"
            if conf.exists():  # Sentinels rewrite their own file: keep what they learnt
                continue
            conf.write_text(
                "\n".join(
                    [
                        f"port {port}",
                        "bind 127.0.0.1",
                        f"dir {self.base}",
                        f"requirepass {p.sentinel}",
                        f"sentinel sentinel-pass {p.sentinel}",
                        f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2",
                        f"sentinel auth-user {MASTER_NAME} sentinel",
                        f"sentinel auth-pass {MASTER_NAME} {p.sentinel_user}",
                        f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}",
                        f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}",
                        f"sentinel parallel-syncs {MASTER_NAME} 1",
                        "",
                    ]
                )
            )
            conf.chmod(0o600)

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> None:
        """Start both servers and the three Sentinels; wait until the Sentinels agree on the
        master and know its replica and each other."""
        self._write_configs("r0")
        for daemon in [*self.nodes.values(), *self.sentinels.values()]:
            daemon.start()
        self.wait_healthy(timeout)

    def stop(self) -> None:
        """Stop the Sentinels first (no failover while the servers stop), then the servers."""
        for daemon in [*self.sentinels.values(), *self.nodes.values()]:
            daemon.stop()

    def ensure_running(self) -> list[str]:
        """Start every server or Sentinel that is not running; returns their names (a master
        that comes back is made a replica of the new one by the Sentinels)."""
        self._write_configs("r0")
        started = []
        for name, daemon in [*self.nodes.items(), *self.sentinels.items()]:
            if not daemon.running:
                daemon.start()
                started.append(name)
        return started

    # --- observation -------------------------------------------------------------------------

    def master(self) -> str | None:
        """The server every running Sentinel names as the master (and that says it is one),
        else None."""
        named: set[int | None] = set()
        for name, daemon in self.sentinels.items():
            if not daemon.running:
                continue
            try:
                found = self.sentinel_client(name).sentinel_get_master_addr_by_name(MASTER_NAME)
            except redis.RedisError:
                return None
            named.add(int(found[1]) if isinstance(found, tuple | list) else None)
        if len(named) != 1:
            return None
        port = named.pop()
        node = next((n for n, p in self.redis_ports.items() if p == port), None)
        if node is None or not self.nodes[node].running:
            return None
        try:  # INFO, not ROLE: ROLE is an administrative command the app user lacks
            role = self.node_client(node).info("replication").get("role")
        except redis.RedisError:
            return None
        return node if role == "master" else None

    def healthy(self) -> bool:
        """One master that every Sentinel names, a replica streaming from it, and each Sentinel
        knowing the two others and seeing that replica's link to the master up."""
        master = self.master()
        if master is None:
            return False
        try:
            info = self.node_client(master).info("replication")
            replica = info.get("slave0")
            if not isinstance(replica, dict) or replica.get("state") != "online":
                return False
            for name in self.sentinels:
                s = self.sentinel_client(name)
                known = s.sentinel_sentinels(MASTER_NAME)
                if not isinstance(known, list) or len(known) < len(self.sentinels) - 1:
                    return False
                # The Sentinels elect from what the replicas' INFO told them (every 10 s):
                # until each has seen the replica's link up, a failover finds "no good
                # replica" (-failover-abort-no-good-slave).
                replicas = s.sentinel_slaves(MASTER_NAME)
                if not isinstance(replicas, list) or not any(
                    r.get("master-link-status") == "ok"
                    and r.get("is_slave")
                    and not r.get("is_sdown")
                    for r in replicas
                ):
                    return False
        except redis.RedisError:
            return False
        return True

    def wait_healthy(self, timeout: float = 60.0) -> None:
        """Wait until :meth:`healthy` (raises WaitTimeout)."""
        wait_for(
            self.healthy, timeout, "a Redis master with a replica and 3 Sentinels", interval=0.2
        )

    # --- faults ------------------------------------------------------------------------------

    def kill_master(self) -> tuple[str, int]:
        """SIGKILL the master; returns its name and pid."""
        master = self.master()
        if master is None:
            raise RuntimeError("no Redis master to kill")
        pid = self.nodes[master].kill()
        if pid is None:
            raise RuntimeError(f"redis {master} was not running")
        return master, pid

    def wait_new_master(self, old: str, timeout: float = 60.0) -> tuple[str, float]:
        """Wait until the Sentinels name a master other than ``old``; returns it and the Unix
        time it was first seen."""
        name: str = wait_for(
            lambda: (m := self.master()) not in (None, old) and m,
            timeout,
            f"the Sentinels to promote a new Redis master (not {old})",
            interval=0.05,
        )
        return name, time.time()


def _sha256(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()
