"""PgBouncer (Debian's ``pgbouncer`` 1.18) in transaction mode in front of one PostgreSQL
server: what a deployment puts between many processes and one server.

Transaction pooling hands a server connection to a client for one transaction only, so a
session's state does not survive between transactions: no prepared statements, no
``options`` startup parameter (PgBouncer refuses it), no LISTEN, no session advisory lock.
The processes cope (``DATABASE_POOLER=transaction``, docs/operations.md "Behind
PgBouncer"); the server sessions start with the database's defaults (``ALTER DATABASE …
SET``, which :class:`devtools.ha.postgres.PostgresHA` and the drill environment apply).
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

from devtools.ha.daemon import Daemon, as_postgres, give_to_postgres
from devtools.waiting import wait_for


class PgBouncer:
    """One PgBouncer under ``base`` listening on ``port`` and serving every database of the
    PostgreSQL server on ``server_port`` (trust authentication on loopback)."""

    def __init__(self, base: Path, port: int, server_port: int, name: str = "pgbouncer") -> None:
        self.base = base
        self.port = port
        self.server_port = server_port
        self.ini = base / f"{name}.ini"
        self.daemon = Daemon(
            name,
            [shutil.which("pgbouncer") or "/usr/sbin/pgbouncer", str(self.ini)],
            base / f"{name}.log",
            base / f"{name}.pid",
            marker=str(self.ini),
            cwd=base,
            popen_kwargs=as_postgres(),
        )

    def write_config(self) -> None:
        """The ini and the user list (the server's ``postgres`` user, no password)."""
        self.base.mkdir(parents=True, exist_ok=True)
        give_to_postgres(self.base)
        users = self.base / f"{self.ini.stem}.users"
        users.write_text('"postgres" ""\n')
        # Errors come at once while the server is down (server_login_retry), a client waits
        # at most query_wait_timeout for a server connection, never PgBouncer's 120 s.
        self.ini.write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = host=127.0.0.1 port={self.server_port}",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {self.port}",
                    f"unix_socket_dir = {self.base}",
                    "auth_type = trust",
                    f"auth_file = {users}",
                    "pool_mode = transaction",
                    "max_client_conn = 1000",
                    "default_pool_size = 40",
                    "server_login_retry = 1",
                    "query_wait_timeout = 10",
                    "server_connect_timeout = 3",
                    "server_check_delay = 1",
                    "log_connections = 0",
                    "log_disconnections = 0",
                    "",
                ]
            )
        )
        for path in (users, self.ini):
            give_to_postgres(path)

    def start(self, server_port: int | None = None) -> None:
        """Start (unless running), pointed at ``server_port`` when given (else at the
        server it was made for), and wait until it listens."""
        if server_port is not None:
            self.server_port = server_port
        if self.daemon.running and f"listen_port = {self.port}\n" not in self.ini.read_text():
            self.daemon.stop()  # one left by an earlier run, on another port
        if not self.daemon.running:
            self.write_config()
        self.daemon.start()
        wait_for(
            self._accepts,
            30,
            f"PgBouncer to listen on 127.0.0.1:{self.port}",
            interval=0.05,
            check=self._alive,
            detail=lambda: self.daemon.log_path.read_text(errors="replace")[-2000:],
        )

    def _accepts(self) -> bool:
        with socket.socket() as s:
            s.settimeout(1)
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def _alive(self) -> None:
        if not self.daemon.running:
            log = self.daemon.log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"PgBouncer exited at start:\n{log}")

    def retarget_script(self, server_port: int) -> str:
        """A shell script that points this PgBouncer at ``server_port`` and reloads it
        (SIGHUP): PgBouncer closes its server connections to the old address as they are
        released and opens new ones to the new address. What a Patroni ``on_role_change``
        callback of the member on ``server_port`` runs when it becomes the primary."""
        return "\n".join(
            [
                "#!/bin/sh",
                "# Patroni callback: $1 = action, $2 = role, $3 = scope.",
                'case "$2" in primary|master) ;; *) exit 0 ;; esac',
                f"ini={self.ini}",
                'tmp="$ini.$$"',
                f'sed "s/^\\* = host=127.0.0.1 port=[0-9]*$/* = host=127.0.0.1 port={server_port}/"'
                ' "$ini" >"$tmp" && mv "$tmp" "$ini"',
                f'kill -HUP "$(cat {self.daemon.pid_path})" 2>/dev/null || true',
                "",
            ]
        )

    def stop(self) -> None:
        """Stop PgBouncer."""
        self.daemon.stop()

    @property
    def running(self) -> bool:
        """True while PgBouncer runs."""
        return self.daemon.running
