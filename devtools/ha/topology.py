"""The whole high-availability topology under one folder: PostgreSQL under Patroni (with a
PgBouncer in front of the primary when pooled) and Redis with Sentinel; its ports and
secrets kept in ``state.json`` (mode 0600) so that another process (``python -m
devtools.ha``, ``make dev``) finds, stops or faults the same servers."""

from __future__ import annotations

import json
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from devtools.ha.postgres import MemberPorts, PostgresHA
from devtools.ha.redis import MASTER_NAME, RedisHA, RedisPasswords
from devtools.stack import free_port

DATABASE = "exports"


@dataclass(frozen=True)
class HAState:
    """Ports and secrets of one topology (JSON in ``state.json``)."""

    etcd: tuple[int, int]
    members: tuple[MemberPorts, MemberPorts]
    redis: tuple[int, int]
    sentinels: tuple[int, int, int]
    passwords: RedisPasswords
    bouncer: int | None

    @classmethod
    def allocate(cls, pooler: bool) -> HAState:
        """Free loopback ports for everything, new random secrets."""
        return cls(
            etcd=(free_port(), free_port()),
            members=(MemberPorts(free_port(), free_port()), MemberPorts(free_port(), free_port())),
            redis=(free_port(), free_port()),
            sentinels=(free_port(), free_port(), free_port()),
            passwords=RedisPasswords(*(secrets.token_urlsafe(18) for _ in range(4))),
            bouncer=free_port() if pooler else None,
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HAState:
        """Read back what :meth:`to_json` wrote."""
        members = tuple(MemberPorts(**m) for m in data["members"])
        return cls(
            etcd=(data["etcd"][0], data["etcd"][1]),
            members=(members[0], members[1]),
            redis=(data["redis"][0], data["redis"][1]),
            sentinels=(data["sentinels"][0], data["sentinels"][1], data["sentinels"][2]),
            passwords=RedisPasswords(**data["passwords"]),
            bouncer=data.get("bouncer"),
        )

    def to_json(self) -> dict[str, Any]:
        """The state as JSON-able data."""
        return asdict(self)


class HATopology:
    """:class:`PostgresHA` (with a PgBouncer in front of the primary when ``pooler``) and
    :class:`RedisHA` under ``base`` (``base/pg``, ``base/redis``).

    The first use under a folder allocates ports and secrets and writes ``state.json``;
    later uses (another process, a restart) read it, so the servers are found by their pid
    files and keep their data and Sentinel configuration."""

    def __init__(self, base: Path, *, pooler: bool = False) -> None:
        self.base = base
        state_file = base / "state.json"
        if state_file.exists():
            self.state = HAState.from_json(json.loads(state_file.read_text()))
        else:
            base.mkdir(parents=True, exist_ok=True)
            self.state = HAState.allocate(pooler)
            state_file.touch(mode=0o600)
            state_file.write_text(json.dumps(self.state.to_json(), indent=2) + "\n")
        self.postgres = PostgresHA(
            base / "pg",
            etcd_ports=self.state.etcd,
            members=self.state.members,
            bouncer_port=self.state.bouncer,
        )
        self.redis = RedisHA(
            base / "redis",
            redis_ports=self.state.redis,
            sentinel_ports=self.state.sentinels,
            passwords=self.state.passwords,
        )

    @property
    def pooler(self) -> bool:
        """Whether the processes reach PostgreSQL through the PgBouncer."""
        return self.state.bouncer is not None

    def start(self) -> None:
        """Start (or adopt) every server; wait until both sides are replicated."""
        self.redis.start()
        self.postgres.start()

    def stop(self) -> None:
        """Stop every server."""
        self.redis.stop()
        self.postgres.stop()

    def ensure_running(self) -> list[str]:
        """Start whatever a fault left stopped; wait until both sides are replicated again.
        Returns what was started."""
        started = self.postgres.ensure_running() + self.redis.ensure_running()
        if started:
            self.postgres.wait_healthy()
            self.redis.wait_healthy()
        return started

    def process_env(self, database: str = DATABASE) -> dict[str, str]:
        """The connection settings of the processes: the multi-host database URL (when
        pooled, the PgBouncer in front of the primary, with the multi-host URL as the direct
        one beside it) and the Sentinel broker."""
        direct = self.postgres.direct_url(database)
        env = {
            "DATABASE_URL": self.postgres.pooled_url(database) if self.pooler else direct,
            "CELERY_BROKER_URL": self.redis.broker_url(0),
            "BROKER_SENTINEL_MASTER": MASTER_NAME,
            "BROKER_SENTINEL_PASSWORD": self.state.passwords.sentinel,
        }
        if self.pooler:
            env.update(DATABASE_POOLER="transaction", DATABASE_DIRECT_URL=direct)
        return env
