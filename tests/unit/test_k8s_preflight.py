"""`make kind-up` / `make minikube-up` start with scripts/k8s-preflight.sh: on a machine
without kind, minikube, kubectl or a running Docker they name what is missing and how to
get it (exit 1), never make's bare "command not found" (127). The tools are stand-ins on a
PATH of their own (the script only asks whether they exist and whether `docker info` works)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from devtools.stack import ROOT

SCRIPT = ROOT / "scripts" / "k8s-preflight.sh"


def _path_with(tmp_path: Path, tools: dict[str, int]) -> str:
    """A PATH of the shell's own needs plus stand-ins exiting with the given codes."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for real in ("bash", "timeout"):
        found = shutil.which(real)
        assert found, real
        (bin_dir / real).symlink_to(found)
    for name, code in tools.items():
        stub = bin_dir / name
        stub.write_text(f"#!{shutil.which('bash')}\nexit {code}\n")
        stub.chmod(0o755)
    return str(bin_dir)


def _run(tmp_path: Path, what: str, tools: dict[str, int]) -> subprocess.CompletedProcess[str]:
    env = {"PATH": _path_with(tmp_path, tools), "HOME": str(tmp_path)}
    return subprocess.run(
        [shutil.which("bash") or "bash", str(SCRIPT), what],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("what", ["kind", "minikube"])
def test_nothing_installed_names_each_missing_tool_and_where_to_get_it(
    tmp_path: Path, what: str
) -> None:
    proc = _run(tmp_path, what, {})
    assert proc.returncode == 1, proc
    err = proc.stderr
    assert f"{what} is not installed: https://" in err
    assert "kubectl is not installed: https://kubernetes.io/docs/tasks/tools/" in err
    assert "no container engine" in err and "https://docs.docker.com/engine/install/" in err
    assert "command not found" not in err


def test_docker_installed_but_not_running_is_said(tmp_path: Path) -> None:
    proc = _run(tmp_path, "kind", {"kind": 0, "kubectl": 0, "docker": 1})
    assert proc.returncode == 1
    assert "its daemon does not answer" in proc.stderr
    assert "kind is not installed" not in proc.stderr


@pytest.mark.parametrize("what", ["kind", "minikube"])
def test_everything_there_passes(tmp_path: Path, what: str) -> None:
    proc = _run(tmp_path, what, {what: 0, "kubectl": 0, "docker": 0})
    assert proc.returncode == 0, proc.stderr
    assert "ready" in proc.stdout


def test_the_make_targets_run_the_preflight_before_anything_else() -> None:
    make = shutil.which("make")
    if make is None:
        pytest.fail("make is missing")
    for target, what in (("kind-up", "kind"), ("minikube-up", "minikube")):
        out = subprocess.run(
            [make, "-n", "--no-print-directory", "-C", str(ROOT), target, "HELM=/bin/true"],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "MAKEFLAGS": ""},
        ).stdout
        first = next(line for line in out.splitlines() if line.strip())
        assert f"scripts/k8s-preflight.sh {what}" in first, out
