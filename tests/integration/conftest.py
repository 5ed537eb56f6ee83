"""Fixtures shared by the integration suites that run the job protocol in-process."""

from __future__ import annotations

from pathlib import Path

import pytest

from exportcore import faults
from exportcore.artifacts import FileArtifactStore
from exportcore.runner import JobRunner
from exportcore.settings import Settings


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
