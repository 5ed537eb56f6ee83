"""The drill environments for pytest: their own PostgreSQL, Redis and processes under
``.drills/`` (never the harness's servers: drills stop, restart and flush them), the
failover drills' on Patroni and Sentinel."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.drills.config import CI_SETTINGS
from devtools.drills.harness import DRILLS_HOME, DrillEnvironment
from devtools.s3 import MotoServer


@pytest.fixture(scope="session")
def drill_env() -> Iterator[DrillEnvironment]:
    """One environment for every drill of the session (started once, ~10 s): one
    PostgreSQL and one Redis, the processes through PgBouncer in transaction mode (so
    every CI drill also runs behind a transaction pooler, once)."""
    with DrillEnvironment(CI_SETTINGS, say=lambda m: print(m, flush=True), pooler=True) as env:
        yield env


@pytest.fixture(scope="session")
def drill_env_ha() -> Iterator[DrillEnvironment]:
    """The failover drills' environment (started once, ~25 s): PostgreSQL under Patroni
    (two members, synchronous replication) with PgBouncer in front of the primary, Redis
    with Sentinel."""
    with DrillEnvironment(
        CI_SETTINGS, say=lambda m: print(m, flush=True), topology="ha", pooler=True
    ) as env:
        yield env


@pytest.fixture(scope="session")
def drill_env_s3(s3_server: MotoServer) -> Iterator[DrillEnvironment]:
    """A second environment whose artifacts go to a bucket of the session's moto server
    (for the drills marked ``s3``: the same drills, on the other artifact store)."""
    with DrillEnvironment(CI_SETTINGS, s3=s3_server, say=lambda m: print(m, flush=True)) as env:
        yield env


@pytest.fixture(scope="session")
def evidence_dir() -> Path:
    """Where the session's evidence files go (kept after the run)."""
    path = (
        DRILLS_HOME
        / "pytest"
        / (time.strftime("%Y%m%d-%H%M%S") + os.environ.get("PYTEST_XDIST_WORKER", ""))
    )
    path.mkdir(parents=True, exist_ok=True)
    return path
