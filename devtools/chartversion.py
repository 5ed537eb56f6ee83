"""chart-testing's version rule for the chart: a chart that changed must raise its version.

``ct lint`` refuses a chart whose files differ from the target branch while ``version`` in
``Chart.yaml`` is not higher than there; users and Artifact Hub see a chart version as
immutable, so two different charts must never carry the same one. :func:`check` applies the
same rule with git alone (no chart-testing, no network): it compares the chart directory of the
working tree (committed, staged and unstaged changes, and untracked files that git does not
ignore) with the chart at the merge base of ``HEAD`` and the base ref (``main``), and the two
``version`` fields as SemVer 2 (the ordering helm uses; pre-releases sort below the release).

On ``main`` itself the merge base is ``HEAD``: nothing changed, nothing to bump, so CI on main
passes. ``python -m devtools.chartversion`` (``make chart-version-check``) prints the verdict;
exit code 0 = fine, 1 = a change without a bump (or a lower / invalid version), 2 = the base
ref or git is missing.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import semver
import yaml

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CHART = "charts/notes-exports"


class CheckError(Exception):
    """The comparison cannot be made (no git, the base ref is unknown); the message says what
    to do."""


@dataclass(frozen=True)
class Verdict:
    """The outcome of :func:`check`.

    ``ok``: the chart may go in as it is; ``changed``: its paths (relative to the repository)
    that differ from the merge base; ``base_version`` / ``version``: ``Chart.yaml``'s version
    there (``None`` when the chart is new) and in the working tree; ``message``: one line for
    a person.
    """

    ok: bool
    changed: tuple[str, ...]
    base_version: str | None
    version: str
    message: str


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, check=False
        )
    except FileNotFoundError as exc:
        raise CheckError("git is not installed") from exc


def _resolve_base(repo: Path, base: str) -> str:
    """The commit of ``base``, else of ``origin/<base>`` (a CI clone of a pull request)."""
    for ref in (base, f"origin/{base}"):
        proc = _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
        if proc.returncode == 0:
            return proc.stdout.strip()
    raise CheckError(
        f"the base ref {base!r} (or origin/{base}) is not in this clone: fetch it "
        f"(git fetch origin {base}) or name another with CHART_BASE_REF"
    )


def _version(text: str, where: str) -> str:
    meta = yaml.safe_load(text) or {}
    version = str(meta.get("version", ""))
    if not semver.Version.is_valid(version):
        raise ValueError(f"{where}: version {version!r} is not SemVer 2 (MAJOR.MINOR.PATCH)")
    return version


def check(repo: Path = ROOT, chart: str = DEFAULT_CHART, base: str = "main") -> Verdict:
    """Whether ``chart`` (a directory relative to ``repo``) may go in against ``base``.

    Raises :class:`CheckError` when git or the base ref is missing. An invalid version in
    the working tree is a failed verdict, not an exception.
    """
    base_commit = _resolve_base(repo, base)
    merge_base = _git(repo, "merge-base", "HEAD", base_commit)
    if merge_base.returncode != 0:
        raise CheckError(
            f"HEAD and {base} have no merge base here (a shallow clone?): "
            f"git fetch --unshallow, or fetch {base} with its history"
        )
    mb = merge_base.stdout.strip()
    diff = _git(repo, "diff", "--name-only", mb, "--", chart)
    untracked = _git(repo, "ls-files", "--others", "--exclude-standard", "--", chart)
    changed = tuple(sorted({*diff.stdout.split(), *untracked.stdout.split()}))
    chart_yaml = repo / chart / "Chart.yaml"
    try:
        version = _version(chart_yaml.read_text(), str(chart_yaml.relative_to(repo)))
    except ValueError as exc:
        return Verdict(False, changed, None, "", str(exc))
    old = _git(repo, "show", f"{mb}:{chart}/Chart.yaml")
    base_version = None
    if old.returncode == 0:
        try:
            base_version = _version(old.stdout, f"{chart}/Chart.yaml at {mb[:12]}")
        except ValueError as exc:
            raise CheckError(str(exc)) from exc
    short = f"{base}@{mb[:12]}"
    if not changed:
        message = f"{chart} {version}: unchanged since the merge base with {short}"
        return Verdict(True, changed, base_version, version, message)
    if base_version is None:
        message = f"{chart} {version}: a new chart (not at {short})"
        return Verdict(True, changed, base_version, version, message)
    if semver.Version.parse(version) > semver.Version.parse(base_version):
        message = f"{chart}: {base_version} -> {version}, {len(changed)} changed file(s)"
        return Verdict(True, changed, base_version, version, message)
    message = (
        f"{chart} changed since the merge base with {short} ({', '.join(changed)}) but its "
        f"version is {version} (there: {base_version}): raise `version` in Chart.yaml above "
        f"{base_version} and say what changed in its artifacthub.io/changes annotation"
    )
    return Verdict(False, changed, base_version, version, message)


def main(argv: list[str] | None = None) -> int:
    """The command line: prints the verdict; returns the exit code (0, 1 or 2)."""
    parser = argparse.ArgumentParser(prog="python -m devtools.chartversion", description=__doc__)
    parser.add_argument("--chart", default=DEFAULT_CHART, help="chart directory (repo-relative)")
    parser.add_argument("--base", default="main", help="the branch the chart goes into")
    parser.add_argument("--repo", type=Path, default=ROOT, help="the repository")
    args = parser.parse_args(argv)
    try:
        verdict = check(args.repo, args.chart, args.base)
    except CheckError as exc:
        print(f"chart-version-check: {exc}", file=sys.stderr)
        return 2
    print(f"chart-version-check: {verdict.message}", file=sys.stdout if verdict.ok else sys.stderr)
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
