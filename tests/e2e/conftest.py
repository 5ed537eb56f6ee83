"""End-to-end fixtures: the Procfile's real processes (gunicorn api, publisher, workers).

Every stack runs once per artifact backend: ``file`` (a folder) and ``s3`` (a bucket on
the session's real moto S3 server), so each e2e test runs against both.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import uuid4

import httpx
import psycopg
import pytest
import redis
from psycopg import sql
from pydantic import SecretStr

from devtools.api_client import ApiClient
from devtools.ha.pgbouncer import PgBouncer
from devtools.probe import DatabaseProbe
from devtools.s3 import MotoServer
from devtools.stack import ROOT, Servers, Stack, free_port, read_procfile
from devtools.waiting import wait_for
from exportcore import faults
from exportcore.artifacts import ArtifactStore, open_store
from exportcore.db import session_defaults
from exportcore.settings import Settings

BACKENDS = ("file", "s3")


@dataclass
class E2E:
    """A running stack plus what a user of it needs: ``api``, the tenant's client of the
    api (its key and the operator key); ``db``, the probe of the stack's database (a job's
    row, history and outbox, the waits for its status)."""

    stack: Stack
    database_url: str
    broker_url: str
    artifact_dir: Path
    tenant: str
    api: ApiClient
    db: DatabaseProbe
    backend: str
    settings: Settings
    store: ArtifactStore

    def note_ids(self, n: int) -> list[int]:
        """The ids of the tenant's first ``n`` notes."""
        return self.db.note_ids(self.tenant, n)


# Recovery in seconds instead of minutes, for suites that kill, stall or lose things.
FAST_RECOVERY_ENV = {
    "SCANNER_INTERVAL_SECONDS": "0.3",
    "RETRY_BASE_SECONDS": "0.1",
    "RETRY_CAP_SECONDS": "0.3",
    "PUBLISHER_POLL_SECONDS": "0.2",
}


@contextmanager
def failpoint_stack(
    servers: Servers,
    template_db: str,
    notes_dir: Path,
    base: Path,
    extra_env: dict[str, str] | None = None,
    **kwargs: Any,
) -> Iterator[tuple[E2E, Path]]:
    """:func:`running_stack` with a failpoints file shared by its processes (``faults``),
    5 s leases and :data:`FAST_RECOVERY_ENV`; yields the stack and the file to arm."""
    fault_file = base / "faults.json"
    env = {faults.ENV: str(fault_file), "LEASE_SECONDS": "5", **FAST_RECOVERY_ENV}
    with running_stack(
        servers, template_db, notes_dir, base, {**env, **(extra_env or {})}, **kwargs
    ) as e:
        yield e, fault_file


@contextmanager
def gunicorn_api(settings: Settings, workdir: Path, **env: str) -> Iterator[tuple[str, Path]]:
    """The api alone, as the Procfile runs it (gunicorn, one worker, JSON logs), on
    ``settings``' database and Redis with ``env`` added: ``(base URL, log file)`` once
    ``/healthz`` answers; stopped (TERM) when the block ends."""
    port = free_port()
    full = {
        **os.environ,
        "DATABASE_URL": str(settings.database_url),
        "CELERY_BROKER_URL": str(settings.celery_broker_url),
        "ARTIFACT_DIR": str(workdir / "artifacts"),
        "API_BIND": f"127.0.0.1:{port}",
        "API_METRICS_PORT": str(free_port()),  # never the default 9100 another stack may hold
        "API_WORKERS": "1",
        "METRICS_DIR": str(workdir / "metrics"),
        "LOG_FORMAT": "json",
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        **env,
    }
    log = workdir / "api.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", "-c", read_procfile()["api"]], cwd=ROOT, env=full, stdout=out, stderr=out
        )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return proc.poll() is not None

    try:
        wait_for(ready, 60, "the api")
        assert proc.poll() is None, log.read_text()
        yield url, log
    finally:
        proc.terminate()
        proc.wait(30)


def exportctl(env: dict[str, str], *args: str) -> str:
    """Run the real CLI; returns stdout (raises with stderr on failure)."""
    exe = Path(sys.executable).parent / "exportctl"
    proc = subprocess.run([str(exe), *args], env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"exportctl {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


# Redis logical databases of the stacks alive now. Two stacks of one module (e.g. the module's
# `e2e` stack and a failpoint stack) must not share a broker: each one's workers would take
# the other's messages (refused by their own database's claim) and its beat ticks would sit
# in the other's queue. Db 0 first, then 15, 14, ... (the `broker_url` fixture of the
# integration tests rotates through 1-15, one test at a time).
_STACK_REDIS_DBS: set[int] = set()


def _claim_redis_db() -> int:
    for db in (0, *range(15, 0, -1)):
        if db not in _STACK_REDIS_DBS:
            _STACK_REDIS_DBS.add(db)
            return db
    raise RuntimeError("more than 16 stacks alive at once")


@contextmanager
def running_stack(
    servers: Servers,
    template_db: str,
    notes_dir: Path,
    base: Path,
    extra_env: dict[str, str] | None = None,
    names: tuple[str, ...] | None = None,
    *,
    backend: str = "file",
    s3: MotoServer | None = None,
    pooler: PgBouncer | None = None,
) -> Iterator[E2E]:
    """A fresh database and Redis db, a tenant with real notes and keys, and the Procfile
    processes running against them; everything is stopped (and checked to exit 0) after.

    ``backend="s3"`` puts the artifacts in a new bucket of the moto server ``s3`` (under
    the prefix ``artifacts``); with ``pooler`` (a PgBouncer in front of ``servers``) the
    processes and the CLI reach the database through it in transaction mode
    (``DATABASE_POOLER=transaction``, LISTEN over the direct URL), the database's session
    defaults set for them; ``extra_env`` is applied last."""
    name = f"e2e_{uuid4().hex[:12]}"
    database_url = servers.create_database(name, template=template_db)
    redis_db = _claim_redis_db()
    broker_url = servers.redis_url(redis_db)
    redis.Redis.from_url(broker_url).flushdb()
    artifacts = base / "artifacts"
    env_over: dict[str, str] = {}
    if backend == "s3":
        assert s3 is not None, "the s3 backend needs the moto server"
        env_over.update(s3.env(s3.create_bucket(f"e2e-{uuid4().hex[:16]}"), "artifacts"))
    elif backend != "file":
        raise ValueError(f"unknown artifact backend {backend!r}")
    if pooler is not None:
        pooled = f"postgresql://postgres@127.0.0.1:{pooler.port}/{name}"
        env_over.update(
            DATABASE_URL=pooled, DATABASE_POOLER="transaction", DATABASE_DIRECT_URL=database_url
        )
        with psycopg.connect(database_url, autocommit=True) as conn:
            for key, value in session_defaults(Settings(database_url=database_url)).items():
                conn.execute(
                    sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                        sql.Identifier(name), sql.Identifier(key), sql.Literal(value)
                    )
                )
    env_over.update(extra_env or {})
    stack = Stack.build(
        database_url=database_url,
        broker_url=broker_url,
        artifact_dir=artifacts,
        log_dir=base / "logs",
        extra_env=env_over,
        **({"names": names} if names else {}),
    )
    # The test process opens the same store the processes use (for inspection only).
    settings = Settings(
        celery_broker_url=broker_url,
        artifact_dir=artifacts,
        **{
            k.lower(): v
            for k, v in env_over.items()
            if k.lower() in Settings.model_fields
            and not k.startswith("DATABASE_")
            and k != "WEBHOOK_SECRET_KEYS"
        },
        database_url=database_url,
        webhook_secret_keys=SecretStr(stack.env["WEBHOOK_SECRET_KEYS"]),
    )
    env = stack.env
    tenant = "e2e-" + uuid4().hex[:6]
    exportctl(env, "tenant", "create", tenant)
    key = exportctl(env, "apikey", "create", tenant, "--quiet").strip()
    admin_key = exportctl(env, "operator-key", "create", "--label", "e2e", "--quiet").strip()
    exportctl(env, "notes", "import", str(notes_dir), "--tenant", tenant)
    stack.start()
    db = DatabaseProbe(database_url)
    try:
        yield E2E(
            stack,
            database_url,
            broker_url,
            artifacts,
            tenant,
            ApiClient(stack.api_url, key, admin_key),
            db,
            backend,
            settings,
            open_store(settings),
        )
    finally:
        db.close()
        codes = stack.stop()
        _STACK_REDIS_DBS.discard(redis_db)  # its processes are gone
        if os.environ.get("E2E_SHOW_LOGS"):
            for proc in stack.procs.values():
                print(f"===== {proc.name} =====\n{proc.log_text()[-5000:]}")
        servers.drop_database(name)
        assert all(c == 0 for c in codes.values()), f"processes did not stop cleanly: {codes}"


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The artifact backend of this module's stacks (every e2e module runs with each)."""
    return str(request.param)


def moto_for(request: pytest.FixtureRequest, backend: str) -> MotoServer | None:
    """The session's moto server when ``backend`` needs it (started only then)."""
    return request.getfixturevalue("s3_server") if backend == "s3" else None


@pytest.fixture(scope="module")
def e2e(
    request: pytest.FixtureRequest,
    servers: Servers,
    template_db: str,
    notes_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    backend: str,
) -> Iterator[E2E]:
    """The stack with default settings, on ``backend``."""
    with running_stack(
        servers,
        template_db,
        notes_dir,
        tmp_path_factory.mktemp(f"e2e-{backend}"),
        backend=backend,
        s3=moto_for(request, backend),
    ) as e:
        yield e
