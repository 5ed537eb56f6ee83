"""The lock files (requirements.lock, requirements-dev.lock; docs/development.md "Lock files")
agree with the pyproject files: every dependency pinned within its range with sha256 hashes,
the runtime lock a subset of the dev lock at the same versions, and the local packages
(exportcore, exportctl) never names to fetch. A failure here after a pyproject change means: run ``make lock``."""

from __future__ import annotations

import json
import re
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from devtools.stack import ROOT

LOCAL = {"exportcore", "exportctl", "notes-exports"}
ENTRY = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==(\S+)", re.MULTILINE)


def locked(path: Path) -> dict[str, tuple[Version, int]]:
    """``{canonical name: (version, number of sha256 hashes)}`` of a uv/pip-tools lock."""
    text = path.read_text()
    entries: dict[str, tuple[Version, int]] = {}
    blocks = re.split(r"\n(?=[A-Za-z0-9])", text)
    for block in blocks:
        m = ENTRY.match(block)
        if m:
            hashes = len(re.findall(r"--hash=sha256:[0-9a-f]{64}\b", block))
            entries[canonicalize_name(m.group(1))] = (Version(m.group(3)), hashes)
    return entries


def project(path: str) -> dict[str, object]:
    return tomllib.loads((ROOT / path).read_text())


def requirements(*, dev: bool) -> list[Requirement]:
    root = project("pyproject.toml")["project"]
    core = project("libs/exportcore/pyproject.toml")["project"]
    cli = project("libs/exportctl/pyproject.toml")["project"]
    deps = [*root["dependencies"], *core["dependencies"], *cli["dependencies"]]  # type: ignore[index]
    if dev:
        deps += root["optional-dependencies"]["dev"]  # type: ignore[index]
    build = (ROOT / "requirements-build.in").read_text().splitlines()
    deps += [line for line in build if line.strip() and not line.startswith("#")]
    return [Requirement(d) for d in deps]


RUNTIME = locked(ROOT / "requirements.lock")
DEV = locked(ROOT / "requirements-dev.lock")


def test_every_entry_of_both_locks_carries_hashes() -> None:
    assert len(RUNTIME) > 40 and len(DEV) > len(RUNTIME)
    for name, (version, hashes) in {**RUNTIME, **DEV}.items():
        assert hashes >= 1, f"{name}=={version} has no --hash: run make lock"


def test_every_dependency_is_locked_within_its_range() -> None:
    for lock, dev in ((RUNTIME, False), (DEV, True)):
        for req in requirements(dev=dev):
            name = canonicalize_name(req.name)
            if name in LOCAL:
                continue
            assert name in lock, f"{req} is not in the {'dev ' if dev else ''}lock: run make lock"
            version = lock[name][0]
            assert req.specifier.contains(version, prereleases=True), (
                f"{name}=={version} in the lock is outside {req}: run make lock"
            )


def test_the_runtime_lock_is_the_dev_lock_minus_the_dev_tools() -> None:
    for name, (version, _) in RUNTIME.items():
        assert name in DEV and DEV[name][0] == version, f"{name}: runtime and dev locks differ"
    dev_only = set(DEV) - set(RUNTIME)
    for tool in ("pytest", "mypy", "moto", "schemathesis", "uv"):
        assert tool in dev_only, f"{tool} must not be in the runtime lock (make dev, the image)"


def _installed_from(name: str) -> Path:
    """The folder this checkout's venv installed the distribution ``name`` from."""
    direct = json.loads(metadata.distribution(name).read_text("direct_url.json") or "{}")
    assert direct.get("url", "").startswith("file://"), f"{name} was not installed by path"
    return Path(direct["url"].removeprefix("file://")).resolve()


def test_exportcore_is_never_fetched_by_name() -> None:
    assert not LOCAL & (set(RUNTIME) | set(DEV)), "the local packages must not be in a lock"
    sources = project("pyproject.toml")["tool"]["uv"]["sources"]  # type: ignore[index]
    path = ROOT / sources["exportcore"]["path"]
    assert project(str(path.relative_to(ROOT) / "pyproject.toml"))["project"]["name"] == (  # type: ignore[index]
        "exportcore"
    )
    # ... and this checkout's venv has it from that path, not from an index.
    assert _installed_from("exportcore") == path.resolve()


def test_exportctl_is_never_fetched_by_name_and_resolves_exportcore_by_path() -> None:
    """The command line is a package of its own (libs/exportctl), installed by path; its own
    ``[tool.uv.sources]`` points at the library, so `make lock` never looks exportcore up."""
    cli = ROOT / "libs/exportctl"
    sources = project("libs/exportctl/pyproject.toml")["tool"]["uv"]["sources"]  # type: ignore[index]
    assert (cli / sources["exportcore"]["path"]).resolve() == (ROOT / "libs/exportcore").resolve()
    assert _installed_from("exportctl") == cli.resolve()
    makefile = (ROOT / "Makefile").read_text()
    assert "--no-emit-package exportctl" in makefile
    assert "libs/exportctl/pyproject.toml" in makefile.split("LOCK_INPUTS =", 1)[1].splitlines()[0]


def test_installs_require_hashes_and_never_resolve_dependencies() -> None:
    makefile = (ROOT / "Makefile").read_text()
    dockerfile = (ROOT / "Dockerfile").read_text()
    for text, lock in ((makefile, "$(1)"), (dockerfile, "requirements.lock")):
        assert f"pip install --require-hashes --no-deps -r {lock}" in re.sub(
            r"\s+-q|\s+--disable-pip-version-check", "", text
        )
    installs = [line for line in dockerfile.splitlines() if "pip install" in line]
    assert installs and all("--no-deps" in line for line in installs), installs


BENCH = locked(ROOT / "requirements-bench.lock")


def test_the_benchmark_peers_come_from_a_lock_with_hashes() -> None:
    """`make bench-install` installs the peers (the root pyproject's ``bench`` extra) from
    requirements-bench.lock with --require-hashes, never by range from an index; the lock
    is `make lock`'s, constrained by the dev lock, so a package both use is the same."""
    extra = project("pyproject.toml")["project"]["optional-dependencies"]["bench"]  # type: ignore[index]
    for req in map(Requirement, extra):
        name = canonicalize_name(req.name)
        assert name in BENCH, f"{req} is not in requirements-bench.lock: run make lock"
        assert req.specifier.contains(BENCH[name][0], prereleases=True), (
            f"{name}=={BENCH[name][0]} in requirements-bench.lock is outside {req}: run make lock"
        )
    for name, (version, hashes) in BENCH.items():
        assert hashes >= 1, f"{name}=={version} has no --hash: run make lock"
        if name in DEV:
            assert DEV[name][0] == version, f"{name}: the bench and dev locks differ"
    assert not LOCAL & set(BENCH), "the local packages must not be in a lock"
    makefile = (ROOT / "Makefile").read_text()
    install = re.sub(r"\s+-q|\s+--disable-pip-version-check", "", makefile)
    assert "pip install --require-hashes --no-deps -r $(BENCH_LOCK)" in install
    assert "--extra bench \\\n\t  --constraint $(DEV_LOCK) -o $(BENCH_LOCK)" in makefile
    assert "BENCH_PEERS" not in makefile, "the peers are installed from the lock only"
