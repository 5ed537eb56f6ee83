"""The Dockerfile agrees with the chart (no Docker engine here, so its structure is checked)."""

from __future__ import annotations

import fnmatch
import json
import re

import pytest
import yaml

from devtools.stack import ROOT
from tests.chart.conftest import CHART

pytestmark = pytest.mark.chart

DOCKERFILE = (ROOT / "Dockerfile").read_text()
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())


def instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def final_stage() -> list[tuple[str, str]]:
    ins = instructions()
    last_from = max(i for i, (w, _) in enumerate(ins) if w == "FROM")
    return ins[last_from:]


def test_multi_stage_slim_base_without_build_tools_in_the_final_stage() -> None:
    froms = [rest for w, rest in instructions() if w == "FROM"]
    assert len(froms) >= 2
    args = dict(rest.split("=", 1) for w, rest in instructions() if w == "ARG" and "=" in rest)
    assert "slim" in args["PYTHON_IMAGE"] and ":latest" not in args["PYTHON_IMAGE"]
    runs = " ".join(rest for w, rest in final_stage() if w == "RUN")
    for tool in ("gcc", "build-essential", "make ", "git "):
        assert tool not in runs, tool
    assert "pip install" not in runs, "dependencies come from the build stage's venv"
    assert ("COPY", "--from=build /opt/venv /opt/venv") in final_stage()


def test_non_root_fixed_uid_matches_the_chart() -> None:
    stage = final_stage()
    uid = next(
        rest.split("=", 1)[1] for w, rest in stage if w == "ARG" and rest.startswith("APP_UID=")
    )
    user = next(rest for w, rest in stage if w == "USER")
    assert user in ("${APP_UID}:${APP_UID}", f"{uid}:{uid}")
    assert (
        int(uid)
        == VALUES["podSecurityContext"]["runAsUser"]
        == VALUES["securityContext"]["runAsUser"]
    )
    assert int(uid) == VALUES["podSecurityContext"]["fsGroup"]


def test_exec_form_entrypoint_through_tini_and_exec_form_cmd() -> None:
    stage = dict(final_stage())
    assert json.loads(stage["ENTRYPOINT"]) == ["/usr/bin/tini", "--"]
    cmd = json.loads(stage["CMD"])
    assert cmd == VALUES["components"]["api"]["args"]
    assert "tini" in " ".join(rest for w, rest in final_stage() if w == "RUN")


def test_writable_paths_are_volumes_the_chart_mounts() -> None:
    stage = final_stage()
    volumes = json.loads(next(rest for w, rest in stage if w == "VOLUME"))
    assert set(volumes) == {VALUES["artifacts"]["mountPath"], VALUES["runtimeDir"]["mountPath"]}
    env = " ".join(rest for w, rest in stage if w == "ENV")
    assert f"ARTIFACT_DIR={VALUES['artifacts']['mountPath']}" in env
    assert "PYTHONDONTWRITEBYTECODE=1" in env  # nothing is written beside the code


def _ignored(path: str, patterns: list[str]) -> bool:
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        if fnmatch.fnmatch(path, pat):  # `*` spans `/`, like Docker's `**`
            ignored = not negate
    return ignored


def test_everything_the_processes_need_is_copied_and_not_dockerignored() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copies = [rest.split() for w, rest in instructions() if w == "COPY" and "--from" not in rest]
    sources = [src for parts in copies for src in parts[:-1] if not src.startswith("--")]
    for src in sources:
        path = ROOT / src
        assert path.exists(), src
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        kept = [f for f in files if not _ignored(str(f.relative_to(ROOT)), patterns)]
        assert kept, f"{src} is entirely excluded by .dockerignore"
    # The migration Job runs `exportctl migrate` in WORKDIR /app: alembic.ini and migrations/.
    stage = final_stage()
    assert ("WORKDIR", "/app") in stage
    copied = " ".join(rest for w, rest in stage if w == "COPY")
    for needed in ("alembic.ini", "migrations", "services"):
        assert needed in copied, needed
    assert not _ignored("migrations/versions/0001_initial.py", patterns)
    assert not _ignored("services/api/gunicorn_conf.py", patterns)
    assert not _ignored("libs/exportctl/src/exportctl/main.py", patterns)
    assert _ignored(".venv/bin/python", patterns) and _ignored("tests/conftest.py", patterns)
    # the real-stack harness, the drills and the benchmarks run from a checkout, never the image
    assert _ignored("devtools/stack.py", patterns) and _ignored("bench/env.py", patterns)


def test_the_base_image_is_a_build_arg_pinned_by_tag_or_digest() -> None:
    """PYTHON_IMAGE stays a build argument (a local base replaces it: MACHINE-NOTES, buildah)
    whose default is `name:tag` or `name:tag@sha256:<digest>` (make pin-base-image)."""
    ins = instructions()
    first_from = next(i for i, (w, _) in enumerate(ins) if w == "FROM")
    args = dict(rest.split("=", 1) for w, rest in ins[:first_from] if w == "ARG" and "=" in rest)
    assert re.fullmatch(r"[\w./-]+:[\w.-]+(@sha256:[0-9a-f]{64})?", args["PYTHON_IMAGE"])
    froms = [rest.split()[0] for w, rest in ins if w == "FROM"]
    assert froms == ["${PYTHON_IMAGE}"] * len(froms)


def test_the_build_stage_installs_the_runtime_lock_with_hashes_then_the_local_packages_by_path() -> (
    None
):
    """The runtime lock, then exportcore (what the processes share) and exportctl (the
    operators' `kubectl exec ... exportctl`) from their paths; devtools never enters."""
    runs = [
        rest for w, rest in instructions()[: len(instructions()) - len(final_stage())] if w == "RUN"
    ]
    text = " ".join(runs)
    assert "pip install --require-hashes --no-deps -r requirements.lock" in text
    assert "pip install --no-deps --no-build-isolation ./libs/exportcore ./libs/exportctl" in text
    assert ("COPY", "libs/exportctl libs/exportctl") in instructions()
    assert "pip check" in text
    assert ("COPY", "requirements.lock ./") in instructions()
    assert "requirements-dev.lock" not in DOCKERFILE  # the image never gets the test tools
