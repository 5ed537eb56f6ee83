"""chart-testing's version rule (devtools/chartversion.py) on real git repositories: a chart
that changed since the merge base with main must raise its version; main itself passes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from devtools.chartversion import ROOT, CheckError, check

CHART = "charts/demo"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout


def write(repo: Path, path: str, text: str) -> None:
    target = repo / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def chart_yaml(version: str) -> str:
    return f"apiVersion: v2\nname: demo\nversion: {version}\nappVersion: '1.0'\n"


def commit(repo: Path, message: str) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository whose main holds the chart at 0.1.0, checked out on a branch from it."""
    git(tmp_path, "init", "-q", "-b", "main")
    git(tmp_path, "config", "user.email", "test@localhost")
    git(tmp_path, "config", "user.name", "test")
    write(tmp_path, f"{CHART}/Chart.yaml", chart_yaml("0.1.0"))
    write(tmp_path, f"{CHART}/templates/cm.yaml", "kind: ConfigMap\n")
    write(tmp_path, "README.md", "demo\n")
    commit(tmp_path, "the chart")
    git(tmp_path, "checkout", "-q", "-b", "feature")
    return tmp_path


def test_main_itself_passes_even_after_chart_changes(repo: Path) -> None:
    git(repo, "checkout", "-q", "main")
    write(repo, f"{CHART}/templates/cm.yaml", "kind: ConfigMap\ndata: {}\n")
    commit(repo, "a chart change merged without a bump")
    verdict = check(repo, CHART, "main")
    assert verdict.ok and verdict.changed == ()
    assert "unchanged since the merge base" in verdict.message


def test_a_change_outside_the_chart_needs_no_bump(repo: Path) -> None:
    write(repo, "README.md", "more\n")
    commit(repo, "docs")
    verdict = check(repo, CHART, "main")
    assert verdict.ok and verdict.changed == ()


def test_a_chart_change_without_a_bump_fails_and_says_what_to_do(repo: Path) -> None:
    write(repo, f"{CHART}/templates/cm.yaml", "kind: ConfigMap\ndata: {a: b}\n")
    commit(repo, "change a template")
    verdict = check(repo, CHART, "main")
    assert not verdict.ok
    assert verdict.changed == (f"{CHART}/templates/cm.yaml",)
    assert (verdict.base_version, verdict.version) == ("0.1.0", "0.1.0")
    assert "raise `version` in Chart.yaml above 0.1.0" in verdict.message


def test_a_bump_lets_it_pass(repo: Path) -> None:
    write(repo, f"{CHART}/templates/cm.yaml", "kind: ConfigMap\ndata: {a: b}\n")
    write(repo, f"{CHART}/Chart.yaml", chart_yaml("0.1.1"))
    commit(repo, "change and bump")
    verdict = check(repo, CHART, "main")
    assert verdict.ok and verdict.version == "0.1.1" and "0.1.0 -> 0.1.1" in verdict.message


@pytest.mark.parametrize("version", ["0.0.9", "0.1.0-rc.1", "0.1.0"])
def test_a_lower_or_equal_version_fails(repo: Path, version: str) -> None:
    # SemVer 2: a pre-release of 0.1.0 sorts below 0.1.0 itself
    write(repo, f"{CHART}/Chart.yaml", chart_yaml(version))
    write(repo, f"{CHART}/values.yaml", "x: 1\n")
    commit(repo, "lower")
    assert not check(repo, CHART, "main").ok


def test_uncommitted_and_untracked_changes_count(repo: Path) -> None:
    write(repo, f"{CHART}/templates/new.yaml", "kind: Secret\n")  # untracked
    verdict = check(repo, CHART, "main")
    assert not verdict.ok and verdict.changed == (f"{CHART}/templates/new.yaml",)
    write(repo, f"{CHART}/Chart.yaml", chart_yaml("0.2.0"))  # unstaged bump
    assert check(repo, CHART, "main").ok


def test_the_merge_base_is_the_reference_not_mains_tip(repo: Path) -> None:
    write(repo, f"{CHART}/templates/cm.yaml", "kind: ConfigMap\ndata: {a: b}\n")
    write(repo, f"{CHART}/Chart.yaml", chart_yaml("0.2.0"))
    commit(repo, "feature: 0.2.0")
    git(repo, "checkout", "-q", "main")
    write(repo, f"{CHART}/Chart.yaml", chart_yaml("0.3.0"))
    commit(repo, "main moved on: 0.3.0")
    git(repo, "checkout", "-q", "feature")
    verdict = check(repo, CHART, "main")
    assert verdict.ok and verdict.base_version == "0.1.0"


def test_a_new_chart_passes(repo: Path) -> None:
    write(repo, "charts/other/Chart.yaml", chart_yaml("0.1.0"))
    commit(repo, "a second chart")
    verdict = check(repo, "charts/other", "main")
    assert verdict.ok and verdict.base_version is None


def test_an_invalid_version_fails(repo: Path) -> None:
    write(repo, f"{CHART}/Chart.yaml", chart_yaml("v1"))
    verdict = check(repo, CHART, "main")
    assert not verdict.ok and "is not SemVer 2" in verdict.message


def test_the_base_ref_falls_back_to_origin_and_else_says_what_to_fetch(repo: Path) -> None:
    write(repo, f"{CHART}/values.yaml", "x: 1\n")
    commit(repo, "change")
    # a clone of a pull request: no local main, only origin/main
    git(repo, "update-ref", "refs/remotes/origin/main", "main")
    git(repo, "branch", "-q", "-D", "main")
    assert not check(repo, CHART, "main").ok
    with pytest.raises(CheckError, match="git fetch origin trunk"):
        check(repo, CHART, "trunk")


def test_the_command_line_exit_codes(repo: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "devtools.chartversion", "--repo", str(repo), *args]
        return subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)

    assert run("--chart", CHART).returncode == 0
    write(repo, f"{CHART}/values.yaml", "x: 1\n")
    failed = run("--chart", CHART)
    assert failed.returncode == 1 and "raise `version`" in failed.stderr
    missing = run("--chart", CHART, "--base", "nope")
    assert missing.returncode == 2 and "CHART_BASE_REF" in missing.stderr
