"""End-to-end fixtures: the Procfile's real processes (gunicorn api, publisher, workers)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from uuid import uuid4

import pytest
import redis

from devtools.stack import Servers, Stack


@dataclass
class E2E:
    """A running stack plus what a user of it needs."""

    stack: Stack
    database_url: str
    broker_url: str
    artifact_dir: Path
    tenant: str
    api_key: str
    admin_key: str

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    @property
    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_key}"}


def exportctl(env: dict[str, str], *args: str) -> str:
    """Run the real CLI; returns stdout (raises with stderr on failure)."""
    exe = Path(sys.executable).parent / "exportctl"
    proc = subprocess.run([str(exe), *args], env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"exportctl {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


@contextmanager
def running_stack(
    servers: Servers,
    template_db: str,
    notes_dir: Path,
    base: Path,
    extra_env: dict[str, str] | None = None,
    names: tuple[str, ...] | None = None,
) -> Iterator[E2E]:
    """A fresh database and Redis db, a tenant with real notes and keys, and the Procfile
    processes running against them; everything is stopped (and checked to exit 0) after."""
    name = f"e2e_{uuid4().hex[:12]}"
    database_url = servers.create_database(name, template=template_db)
    broker_url = servers.redis_url(0)
    redis.Redis.from_url(broker_url).flushdb()
    artifacts = base / "artifacts"
    stack = Stack.build(
        database_url=database_url,
        broker_url=broker_url,
        artifact_dir=artifacts,
        log_dir=base / "logs",
        extra_env=extra_env,
        **({"names": names} if names else {}),
    )
    env = stack.env
    tenant = "e2e-" + uuid4().hex[:6]
    exportctl(env, "tenant", "create", tenant)
    key = exportctl(env, "apikey", "create", tenant, "--quiet").strip()
    admin_key = exportctl(env, "apikey", "create", tenant, "--scope", "admin", "--quiet").strip()
    exportctl(env, "notes", "import", str(notes_dir), "--tenant", tenant)
    stack.start()
    try:
        yield E2E(stack, database_url, broker_url, artifacts, tenant, key, admin_key)
    finally:
        codes = stack.stop()
        if os.environ.get("E2E_SHOW_LOGS"):
            for proc in stack.procs.values():
                print(f"===== {proc.name} =====\n{proc.log_text()[-5000:]}")
        servers.drop_database(name)
        assert all(c == 0 for c in codes.values()), f"processes did not stop cleanly: {codes}"


@pytest.fixture(scope="module")
def e2e(servers: Servers, template_db: str, notes_dir: Path, tmp_path_factory) -> Iterator[E2E]:
    """The stack with default settings."""
    with running_stack(servers, template_db, notes_dir, tmp_path_factory.mktemp("e2e")) as e:
        yield e
