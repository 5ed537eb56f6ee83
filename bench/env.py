"""The benchmark's own servers and databases under ``.bench/`` (never the test servers).

PostgreSQL keeps its default durability (fsync on, synchronous_commit on, logged tables):
the same for notes-exports and for the peers, and so is ``pg_stat_statements``, loaded for
every system (:mod:`bench.pgstats`). A migrated template database holds the tenant
``bench``, its API key, real notes imported from ``/usr/share/doc``, the peers' schemas and
the ``pg_stat_statements`` extension; every measured run gets a fresh copy of it.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata as md
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import redis

from bench import pgstats
from bench.common import BENCH_DIR
from devtools.stack import ROOT, Servers, migrate
from exportcore.auth import create_api_key
from exportcore.db import make_pool
from exportcore.settings import Settings
from exportcore.store import tenants as tenant_store
from exportctl.importer import import_notes

TEMPLATE = "bench_template"
TENANT = "bench"
NOTES_SOURCE = Path(os.environ.get("BENCH_NOTES_SOURCE", "/usr/share/doc"))


@dataclass
class Seed:
    api_key: str
    five_note_ids: list[int]
    five_note_bytes: int
    notes: int


class BenchEnv:
    """Servers on BENCH_PG_PORT / BENCH_REDIS_PORT (default 55451 / 56391); PostgreSQL
    with ``pg_stat_statements`` loaded (:data:`bench.pgstats.SERVER_SETTINGS`)."""

    def __init__(self) -> None:
        self.base = BENCH_DIR
        self.servers = Servers(
            base=self.base,
            pg_port=int(os.environ.get("BENCH_PG_PORT", "55451")),
            redis_port=int(os.environ.get("BENCH_REDIS_PORT", "56391")),
        )
        self.seed: Seed | None = None
        self._dbs = 0
        self._lock: Any = None

    # --- servers ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the servers; one harness at a time per ``.bench/`` (each run rebuilds the
        template database, which would pull the API key from under another run)."""
        self.base.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.base / "lock", "w")  # noqa: SIM115 - held until exit
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SystemExit(
                f"another benchmark is running on {self.base} (lock held); wait for it, "
                "or set BENCH_HOME, BENCH_PG_PORT and BENCH_REDIS_PORT for a separate one"
            ) from None
        self.servers.start()
        # pg_stat_statements for every system alike (the per-statement table of the e2e)
        pgstats.enable(self.servers)

    def stop(self) -> None:
        self.servers.stop()

    @property
    def pg_dir(self) -> Path:
        return self.base / "pg"

    @property
    def redis_dir(self) -> Path:
        return self.base / "redis"

    def broker_url(self, db: int = 0) -> str:
        url = self.servers.redis_url(db)
        redis.Redis.from_url(url).flushdb()
        return url

    # --- databases -------------------------------------------------------------------------

    def prepare_template(self) -> Seed:
        """(Re)build the template: schema, tenant, key, real notes, peers' schemas."""
        dsn = self.servers.create_database(TEMPLATE)
        migrate(dsn)
        pgstats.create_extension(dsn)  # in the bench's databases only, not a migration
        settings = Settings.model_validate({"database_url": dsn})
        pool = make_pool(settings, "bench-seed", min_size=1, max_size=2, open_wait=True)
        try:
            with pool.connection() as conn:
                tenant_store.tenant_upsert(conn, tenant_id=TENANT, name="Benchmark")
                key, _ = create_api_key(
                    conn, tenant_id=TENANT, scopes=["exports:write", "exports:read"]
                )
            report = import_notes(pool, TENANT, NOTES_SOURCE)
        finally:
            pool.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            # five real notes around the median length: the "small export" of every system
            rows = conn.execute(
                "SELECT id, octet_length(content) AS n FROM notes WHERE tenant_id = %s "
                "ORDER BY octet_length(content), id",
                (TENANT,),
            ).fetchall()
            mid = len(rows) // 2
            five = sorted(rows[max(0, mid - 2) : mid + 3])
        from bench.peers import pgqueuer_peer, procrastinate_peer

        procrastinate_peer.install_schema(dsn)
        pgqueuer_peer.install_schema(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
            conn.execute("CHECKPOINT")
        self.seed = Seed(
            api_key=key,
            five_note_ids=[r[0] for r in five],
            five_note_bytes=sum(r[1] for r in five),
            notes=report.imported,
        )
        return self.seed

    def fresh_database(self, label: str) -> str:
        """A new copy of the template for one measurement; returns its URL."""
        self._dbs += 1
        name = f"bench_{label.replace('-', '_')}_{self._dbs}"
        return self.servers.create_database(name, template=TEMPLATE)

    def drop(self, url: str) -> None:
        self.servers.drop_database(url.rsplit("/", 1)[1])

    def discard(self, url: str) -> None:
        """:meth:`drop` at the end of a measurement, where a failure to drop must not hide
        the measurement's own result or error: it is ignored (a database left behind goes
        with the bench's servers at the end of the run)."""
        with contextlib.suppress(Exception):
            self.drop(url)

    # --- facts for the report --------------------------------------------------------------

    def postgres_settings(self) -> dict[str, str]:
        with psycopg.connect(self.servers.admin_dsn, autocommit=True) as conn:
            names = (
                "server_version",
                "fsync",
                "synchronous_commit",
                "wal_sync_method",
                "full_page_writes",
                "shared_buffers",
                "max_connections",
                "wal_level",
                "checkpoint_timeout",
                "max_wal_size",
                *pgstats.SERVER_SETTINGS,
            )
            out: dict[str, str] = {}
            for n in names:
                row = conn.execute("SELECT current_setting(%s)", (n,)).fetchone()
                assert row is not None, f"SHOW {n} returned no row"
                out[n] = str(row[0])
            return out

    def redis_info(self) -> dict[str, Any]:
        info = redis.Redis.from_url(self.servers.redis_url(0)).info()
        return {
            "redis_version": info.get("redis_version"),
            "aof_enabled": info.get("aof_enabled"),
            "rdb_bgsave_in_progress": info.get("rdb_bgsave_in_progress"),
        }


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for pkg in (
        "celery",
        "kombu",
        "redis",
        "psycopg",
        "psycopg-pool",
        "fastapi",
        "uvicorn",
        "gunicorn",
        "procrastinate",
        "pgqueuer",
        "asyncpg",
        "py-spy",
        "exportcore",
    ):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    wrk = shutil.which("wrk")
    out["wrk"] = (
        subprocess.run([wrk, "-v"], capture_output=True, text=True).stdout.split("\n")[0].strip()
        if wrk
        else None
    )
    try:
        out["git_commit"] = subprocess.run(
            ["git", "-C", str(ROOT), "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        out["git_commit"] = None
    return out


def machine() -> dict[str, Any]:
    import psutil

    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu_model": model,
        "logical_cpus": psutil.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "kernel": platform.release(),
        "os": platform.platform(),
        "python_executable": sys.executable,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }
