"""Command line of the high-availability topology (``make dev DEV_HA=1`` runs it):

    python -m devtools.ha start DIR [--pooler]   start (or adopt) everything under DIR; print
                                                 the processes' settings as `export` lines
    python -m devtools.ha stop DIR               stop everything under DIR (by pid files)
    python -m devtools.ha status DIR             Patroni's and Sentinel's view
    python -m devtools.ha switchover DIR         patronictl switchover to the synchronous standby
    python -m devtools.ha kill-primary DIR       SIGKILL the primary's Patroni and PostgreSQL
    python -m devtools.ha kill-redis-master DIR  SIGKILL the Redis master

The database ``exports`` is created when missing (never dropped). With ``--pooler`` the
processes go through PgBouncer in transaction mode; the server sessions' defaults are set on
the database from the settings in the environment (DB_STATEMENT_TIMEOUT_MS, …).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import psycopg
from psycopg import sql

from devtools.ha.topology import DATABASE, HATopology
from exportcore.db import session_defaults
from exportcore.settings import Settings


def _ensure_database(topology: HATopology) -> None:
    with psycopg.connect(topology.postgres.direct_url("postgres"), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone():
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
        if topology.pooler:
            direct = topology.postgres.direct_url(DATABASE)
            settings = Settings.model_validate({"database_url": direct})
            for key, value in session_defaults(settings).items():
                conn.execute(
                    sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                        sql.Identifier(DATABASE), sql.Identifier(key), sql.Literal(value)
                    )
                )


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m devtools.ha", description=__doc__)
    parser.add_argument(
        "command",
        choices=["start", "stop", "status", "switchover", "kill-primary", "kill-redis-master"],
    )
    parser.add_argument("dir", type=Path, help="the topology's folder (e.g. .dev/ha)")
    parser.add_argument("--pooler", action="store_true", help="PgBouncer in front of the primary")
    args = parser.parse_args(argv)
    base = args.dir.resolve()
    if args.command != "start" and not (base / "state.json").exists():
        print(f"no topology under {base}", file=sys.stderr)
        return 0 if args.command == "stop" else 1
    topology = HATopology(base, pooler=args.pooler)
    if args.command == "start":
        if args.pooler != topology.pooler:
            print(
                f"the topology under {base} was created {'with' if topology.pooler else 'without'}"
                " PgBouncer: remove the folder (make clean) to change that",
                file=sys.stderr,
            )
            return 1
        topology.start()
        _ensure_database(topology)
        for key, value in topology.process_env(DATABASE).items():
            print(f"export {key}={shlex.quote(value)}")
    elif args.command == "stop":
        topology.stop()
    elif args.command == "status":
        print(json.dumps({"postgres": topology.postgres.roles(), "redis": topology.redis.master()}))
    elif args.command == "switchover":
        print(f"switched over to {topology.postgres.switchover()}")
    elif args.command == "kill-primary":
        name, pids = topology.postgres.kill_leader()
        print(f"killed {name} (pids {pids}); Patroni promotes the synchronous standby")
    else:
        node, pid = topology.redis.kill_master()
        print(f"killed redis {node} (pid {pid}); the Sentinels promote the replica")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
