"""The CI subset of the fault drills (through PgBouncer; those marked ``s3`` also on an S3
artifact store; the failover drills on Patroni and Sentinel) and a two-minute chaos soak
(``make drills`` and ``make soak`` run the full versions). Each drill writes its evidence
file; a drill passes only when every check it made on observed evidence held."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devtools.drills.harness import DrillEnvironment
from devtools.drills.registry import REGISTRY, run_drill, select
from devtools.drills.soak import SoakOptions, run_soak

pytestmark = [pytest.mark.drills, pytest.mark.e2e]


def _run_and_check(env: DrillEnvironment, evidence_dir: Path, name: str) -> None:
    ev = run_drill(env, REGISTRY[name])
    path = ev.write(evidence_dir)
    if ev.verdict == "skipped":
        pytest.skip(ev.reason)
    assert ev.passed, f"{ev.reason}\nevidence: {path}"
    written = json.loads(path.read_text())
    assert written["passed"] and written["checks"]
    assert written["job_ids"] == list(ev.tracked)


@pytest.mark.parametrize("name", [d.name for d in select(ci=True) if d.topology == "single"])
def test_drill(drill_env: DrillEnvironment, evidence_dir: Path, name: str) -> None:
    _run_and_check(drill_env, evidence_dir, name)


@pytest.mark.parametrize("name", [d.name for d in select(ci=True) if d.topology == "ha"])
def test_failover_drill(drill_env_ha: DrillEnvironment, evidence_dir: Path, name: str) -> None:
    """A PostgreSQL switchover and a primary killed under load (Patroni), through
    PgBouncer: every 202 succeeds once, the evidence records the unavailable window and
    the time to the first dispatch."""
    _run_and_check(drill_env_ha, evidence_dir, name)
    written = json.loads((evidence_dir / f"{name}.json").read_text())
    assert {"unavailable_window", "new_primary_to_first_dispatch"} <= set(
        written["recovery_seconds"]
    )


@pytest.mark.parametrize("name", [d.name for d in select(ci=True, s3=True)])
def test_drill_on_s3(drill_env_s3: DrillEnvironment, evidence_dir: Path, name: str) -> None:
    """The drills whose checks read artifacts through the store API, once more with the
    artifacts on an S3-compatible server (they replace e2e copies of the same scenarios)."""
    ev = run_drill(drill_env_s3, REGISTRY[name])
    path = ev.write(evidence_dir / "s3")
    assert ev.passed, f"{ev.reason}\nevidence: {path}"
    assert ev.observations["artifact_backend"] == "s3"


@pytest.mark.timeout(900)
def test_chaos_soak_two_minutes(drill_env: DrillEnvironment, evidence_dir: Path) -> None:
    options = SoakOptions(duration=120, rate=3, settings=drill_env.settings, seed=20261129)
    result = run_soak(options, evidence_dir / "soak", env=drill_env)
    failed = [f"{c.name}: {c.detail}" for c in result.checks if not c.ok]
    assert result.passed, "\n".join(failed)
    assert result.summary["lost"] == 0 and result.summary["duplicated"] == 0
    assert result.summary["accepted"] > 0
