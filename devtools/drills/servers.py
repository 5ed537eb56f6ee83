"""The servers under one drill environment, in one of two topologies:

- ``single``: one PostgreSQL and one Redis (:class:`devtools.stack.Servers`), the servers
  the infra drills stop, restart, flush and kill;
- ``ha``: PostgreSQL under Patroni (two members, synchronous replication) and Redis with
  Sentinel (:class:`devtools.ha.topology.HATopology`), for the failover drills.

With ``pooler`` the processes reach PostgreSQL through PgBouncer in transaction mode (in
front of the single server, or of whichever member is the primary in ``ha``), with the
direct URL beside it for LISTEN and migrations. Redis always asks for a password: the
processes authenticate as the ACL user ``exports``. The drill harness itself reads the
database directly, never through the pooler.
"""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path
from typing import Literal

import psycopg
from psycopg import sql

from devtools.ha.pgbouncer import PgBouncer
from devtools.ha.topology import HATopology
from devtools.stack import Servers, free_port

Topology = Literal["single", "ha"]
DATABASE = "exports"


class DrillServers:
    """Start, observe and restore the servers of one environment under ``base``."""

    def __init__(self, base: Path, topology: Topology = "single", pooler: bool = False) -> None:
        self.base = base
        self.topology = topology
        self.pooler = pooler
        self.single: Servers | None = None
        self.bouncer: PgBouncer | None = None
        self.ha: HATopology | None = None
        if topology == "single":
            self.single = Servers(
                base, free_port(), free_port(), redis_password=secrets.token_urlsafe(18)
            )
            if pooler:
                self.bouncer = PgBouncer(base / "pgbouncer", free_port(), self.single.pg_port)
        elif topology == "ha":
            self.ha = HATopology(base / "ha", pooler=pooler)
        else:
            raise ValueError(f"unknown topology {topology!r}")
        self.direct_url = ""
        self.env: dict[str, str] = {}

    @property
    def database_url(self) -> str:
        """The URL the processes use (through the pooler when there is one)."""
        return self.env["DATABASE_URL"]

    @property
    def broker_url(self) -> str:
        """The broker URL of the processes (with the ACL user's credentials)."""
        return self.env["CELERY_BROKER_URL"]

    def start(self) -> None:
        """Start the servers and create the empty database ``exports``; fills :attr:`env`
        (the processes' connection settings) and :attr:`direct_url`."""
        if self.single is not None:
            self.single.start()
            self.direct_url = self.single.create_database(DATABASE)
            self.env = {
                "DATABASE_URL": self.direct_url,
                "CELERY_BROKER_URL": self.single.redis_url(0),
            }
            if self.bouncer is not None:
                self.bouncer.start()
                self.env.update(
                    DATABASE_URL=f"postgresql://postgres@127.0.0.1:{self.bouncer.port}/{DATABASE}",
                    DATABASE_POOLER="transaction",
                    DATABASE_DIRECT_URL=self.direct_url,
                )
        else:
            assert self.ha is not None
            self.ha.start()
            self.direct_url = self.ha.postgres.create_database(DATABASE)
            self.env = self.ha.process_env(DATABASE)

    def session_defaults(self, values: dict[str, str]) -> None:
        """``ALTER DATABASE exports SET`` each of ``values``: what the pooler's server
        sessions start with (the processes cannot set them there)."""
        with psycopg.connect(self.direct_url, autocommit=True) as conn:
            for key, value in values.items():
                conn.execute(
                    sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                        sql.Identifier(DATABASE), sql.Identifier(key), sql.Literal(value)
                    )
                )

    def pg_up(self) -> bool:
        """True when the primary accepts a query (directly, not through the pooler)."""
        try:
            with psycopg.connect(self.direct_url, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def ensure(self, redis_up: bool) -> list[str]:
        """Start whatever a drill left stopped (``redis_up``: whether Redis answers now);
        returns what was started."""
        started: list[str] = []
        if self.single is not None:
            if not self.pg_up():
                self.single.start_pg()
                started.append("postgresql")
            if not redis_up:
                self.single.start_redis()
                started.append("redis")
            if self.bouncer is not None and not self.bouncer.running:
                self.bouncer.start()
                started.append("pgbouncer")
        else:
            assert self.ha is not None
            started = self.ha.ensure_running()
        return started

    def stop(self, keep_data: bool) -> None:
        """Stop every server; unless ``keep_data``, remove their data (the logs stay)."""
        if self.bouncer is not None:
            self.bouncer.stop()
        if self.single is not None:
            self.single.stop()
            data = [self.base / "pg", self.base / "redis"]
        else:
            assert self.ha is not None
            self.ha.stop()
            pg = self.ha.base / "pg"
            data = [*(pg.glob("pg*/data")), pg / "etcd" / "data"]
        if not keep_data:  # ~50 MB a server
            for path in data:
                shutil.rmtree(path, ignore_errors=True)
