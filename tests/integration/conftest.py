"""Fixtures shared by the integration suites that run the job protocol in-process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from exportcore import faults
from exportcore.artifacts import FileArtifactStore
from exportcore.auth import create_api_key, create_operator_key
from exportcore.runner import JobRunner
from exportcore.settings import Settings
from services.api.app import create_app
from tests.support import tenant_with_notes


@pytest.fixture
def failpoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A failpoints file armed for this test (``faults.arm(failpoints, ...)``)."""
    path = tmp_path / "faults.json"
    monkeypatch.setenv(faults.ENV, str(path))
    return path


@pytest.fixture
def runner(settings: Settings, pool) -> JobRunner:
    """The job protocol of a worker, in this process, on the test's folder store."""
    return JobRunner(settings, pool, FileArtifactStore(settings.artifact_dir))


@pytest.fixture
def tenant(pool, notes_dir: Path) -> tuple[str, list[int]]:
    """A new tenant holding the real notes of ``notes_dir``: ``(tenant id, note ids)``. A
    suite whose tenant also carries an API key defines its own ``tenant``."""
    return tenant_with_notes(pool, notes_dir)


@pytest.fixture
def api(settings: Settings, pool, tenant) -> Iterator[tuple[TestClient, dict, dict]]:
    """The api app in this process with two credentials: ``(client, user headers, operator
    headers)``. The user is an API key of ``tenant`` with exports:read and exports:write;
    the operator an operator key labelled ``alice``, whose headers also carry the key's
    prefix as ``X-Prefix`` (a header the API ignores) for the checks of who acted
    (``"<prefix> (alice)"``)."""
    tid, _ = tenant
    with pool.connection() as conn:
        user, _ = create_api_key(conn, tenant_id=tid, scopes=["exports:read", "exports:write"])
        operator, row = create_operator_key(conn, label="alice")
    with TestClient(create_app(settings)) as client:
        yield (
            client,
            {"Authorization": f"Bearer {user}"},
            {"Authorization": f"Bearer {operator}", "X-Prefix": row["prefix"]},
        )
