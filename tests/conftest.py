"""Test harness: real PostgreSQL and Redis servers started once per session.

Each test that asks for ``settings`` gets its own database, created from a migrated template
(so tests never see each other's rows), its own Redis logical database (flushed), and its own
artifact directory. Set ``TEST_PG_PORT`` / ``TEST_REDIS_PORT`` to move the servers, and
``KEEP_TEST_SERVERS=1`` to leave them running after the session.

Under pytest-xdist (``make test`` runs ``-n``), every worker is a session of its own: worker
``gwN`` starts its own servers under ``.test/gwN/`` on ``TEST_PG_PORT + 1 + N`` /
``TEST_REDIS_PORT + 1 + N`` (``-n 0``, a serial run, keeps ``.test/`` and the base ports).
:func:`pytest_collection_modifyitems` hands the longest modules out first; a module runs on one
worker (``--dist loadscope``: ``tests/xdist_groups.py``).

The S3 backend is tested against a real S3-compatible server: ``moto_server`` started once
per session on a free port (``s3_server``); each test that asks for ``s3_settings`` gets
its own bucket.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from uuid import uuid4

import pytest
import redis
from hypothesis import settings as hypothesis_settings
from pydantic import SecretStr

from devtools.ha.pgbouncer import PgBouncer
from devtools.s3 import MotoServer
from devtools.stack import ROOT, WEBHOOK_SECRET_KEY, Servers, free_port, migrate
from exportcore.db import make_pool
from exportcore.settings import Settings
from tests.xdist_groups import order_longest_first

# "gw0", "gw1", ... under pytest-xdist; None in a serial run (-n 0, or pytest without -n).
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
WORKER_INDEX = int(WORKER.removeprefix("gw")) if WORKER else -1

TEMPLATE_DB = "exports_template"

# Property tests check behaviour, not speed (speed lives in `make bench`): no per-example
# deadline, which would otherwise fail a correct example on a loaded CI machine.
hypothesis_settings.register_profile("notes-exports", deadline=None)
hypothesis_settings.load_profile("notes-exports")

# The benchmark smoke test needs the peers installed and minutes of machine time: it is
# collected only by `make bench-smoke` (BENCH_SMOKE=1), never by `make test`.
collect_ignore = [] if os.environ.get("BENCH_SMOKE") else ["benchmarks"]
# The cluster tests run a kubelet as root and take the machine's cores for minutes: only
# `make test-cluster` (CLUSTER_TESTS=1, which .ci/run calls after `make test`) collects them.
if not os.environ.get("CLUSTER_TESTS"):
    collect_ignore.append("cluster")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under xdist, after pytest's own reordering by fixture scope: the longest modules first
    (``tests/xdist_groups.py``)."""
    order_longest_first(items)


def session_home() -> Path:
    """This session's folder under ``.test/``: ``.test/`` itself in a serial run,
    ``.test/gwN/`` on xdist worker ``gwN``."""
    return ROOT / ".test" / WORKER if WORKER else ROOT / ".test"


def worker_ports(env: str, default: int) -> list[int]:
    """The ports this session's server may take, in order: ``$env`` (else ``default``) in a
    serial run; on xdist worker ``gwN`` of W, base + 1 + N, then + W, + 2W, ... up to base + 9
    (the workers' candidates never meet; a checkout's ten ports are base .. base + 9)."""
    base = int(os.environ.get(env, str(default)))
    if WORKER is None:
        return [base]
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return list(range(base + 1 + WORKER_INDEX, base + 10, max(workers, 1)))


def _bindable(port: int) -> bool:
    """True when a server could listen on 127.0.0.1:``port`` now. The test ports lie in
    Linux's ephemeral range (32768-60999): a client connection of any process may hold one as
    its local port for minutes, and a server then fails to bind it."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _start_on(
    what: str, ports: list[int], start: Callable[[int], None], stop: Callable[[], None]
) -> None:
    """Start ``what`` on the first of ``ports`` it can bind; raises RuntimeError naming each
    port's reason when none is left. A serial run has one port: the error says what holds it."""
    reasons = []
    for port in ports:
        if len(ports) > 1 and not _bindable(port):
            reasons.append(f"{port}: held by another socket")
            continue
        try:
            start(port)
            return
        except subprocess.CalledProcessError as exc:
            reasons.append(f"{port}: {exc}")
            if port != ports[-1]:
                stop()  # the next candidate starts from a stopped server of this folder
    raise RuntimeError(f"{what} could not start on any of its ports: {'; '.join(reasons)}")


@pytest.fixture(scope="session")
def servers() -> Iterator[Servers]:
    """PostgreSQL and Redis under ``.test/`` (``.test/gwN/`` on xdist worker N) for the whole
    session, on ``TEST_PG_PORT`` / ``TEST_REDIS_PORT`` (on worker N: the first free one of
    :func:`worker_ports`, from base + 1 + N)."""
    pg_ports = worker_ports("TEST_PG_PORT", 55433)
    redis_ports = worker_ports("TEST_REDIS_PORT", 56380)
    srv = Servers(base=session_home(), pg_port=pg_ports[0], redis_port=redis_ports[0])

    def start_pg(port: int) -> None:
        srv.pg_port = port
        srv.start_pg()

    def start_redis(port: int) -> None:
        srv.redis_port = port
        srv.start_redis()

    _start_on("PostgreSQL", pg_ports, start_pg, srv.stop_pg)
    _start_on("Redis", redis_ports, start_redis, srv.stop_redis)
    yield srv
    if not os.environ.get("KEEP_TEST_SERVERS"):
        srv.stop()


@pytest.fixture(scope="session")
def pgbouncer(servers: Servers) -> Iterator[PgBouncer]:
    """PgBouncer 1.18 in transaction mode in front of the session's PostgreSQL (every
    database of it), for the tests and the e2e flow that run behind a transaction pooler."""
    bouncer = PgBouncer(servers.base / "pgbouncer", free_port(), servers.pg_port)
    bouncer.start()
    yield bouncer
    bouncer.stop()


@pytest.fixture(scope="session")
def template_db(servers: Servers) -> str:
    """A database migrated to head, used as the template of every test database."""
    migrate(servers.create_database(TEMPLATE_DB))
    return TEMPLATE_DB


@pytest.fixture
def database_url(servers: Servers, template_db: str) -> Iterator[str]:
    """A fresh, migrated database for one test."""
    name = f"t_{uuid4().hex[:16]}"
    url = servers.create_database(name, template=template_db)
    yield url
    servers.drop_database(name)


_redis_db = iter(range(10**9))


@pytest.fixture
def broker_url(servers: Servers) -> str:
    """A flushed Redis logical database (1-15, rotating) for one test."""
    db = 1 + next(_redis_db) % 15
    url = servers.redis_url(db)
    redis.Redis.from_url(url).flushdb()
    return url


@pytest.fixture
def artifact_dir(tmp_path: Path) -> Path:
    """An empty artifact directory for one test."""
    path = tmp_path / "artifacts"
    path.mkdir()
    return path


@pytest.fixture
def settings(database_url: str, broker_url: str, artifact_dir: Path) -> Settings:
    """Settings pointing at this test's database, Redis database and artifact directory."""
    return Settings(
        database_url=database_url,
        celery_broker_url=broker_url,
        artifact_dir=artifact_dir,
        db_pool_max_size=20,
        render_chunk_size=50,
        webhook_secret_keys=SecretStr(WEBHOOK_SECRET_KEY),
    )


@pytest.fixture(scope="session")
def s3_server() -> Iterator[MotoServer]:
    """A real S3-compatible server (moto in server mode) for the whole session."""
    srv = MotoServer(log_path=session_home() / "moto" / f"moto-{os.getpid()}.log").start()
    yield srv
    srv.stop()


@pytest.fixture
def s3_bucket(s3_server: MotoServer) -> str:
    """A new, empty bucket for one test."""
    return s3_server.create_bucket(f"t-{uuid4().hex[:20]}")


@pytest.fixture
def s3_settings(
    database_url: str, broker_url: str, s3_server: MotoServer, s3_bucket: str
) -> Settings:
    """Like ``settings``, with artifacts in ``s3://<fresh bucket>/artifacts`` on the moto
    server (5 MiB parts, the S3 minimum, and the same multipart threshold)."""
    return Settings(
        database_url=database_url,
        celery_broker_url=broker_url,
        db_pool_max_size=20,
        render_chunk_size=50,
        s3_multipart_threshold=5 * 1024 * 1024,
        s3_multipart_part_size=5 * 1024 * 1024,
        s3_max_attempts=2,
        webhook_secret_keys=SecretStr(WEBHOOK_SECRET_KEY),
        **s3_server.settings_kwargs(s3_bucket, "artifacts"),
    )


@pytest.fixture
def pool(settings: Settings) -> Iterator[object]:
    """An open connection pool on the test database."""
    p = make_pool(settings, "tests", min_size=1, max_size=20, open_wait=True)
    yield p
    p.close()


@pytest.fixture(scope="session")
def notes_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of real Markdown notes: the documentation that ships in /usr/share/doc.

    Copied (relative paths kept) so that tests see a stable set; at least 40 files so that
    one export of all of them is routed to the bulk queue.
    """
    src = Path(os.environ.get("TEST_NOTES_SOURCE", "/usr/share/doc"))
    files = sorted(p for p in src.rglob("*.md") if p.is_file() and not p.is_symlink())
    if len(files) < 40:
        files += sorted(p for p in src.rglob("*.txt") if p.is_file() and not p.is_symlink())
    if len(files) < 40:
        pytest.fail(f"need at least 40 real Markdown/text files under {src}, found {len(files)}")
    dst = tmp_path_factory.mktemp("notes")
    for f in files[:400]:
        target = dst / f.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, target)
    return dst
