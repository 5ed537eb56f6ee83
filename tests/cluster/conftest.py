"""The test cluster for the cluster tests (``make test-cluster``, pytest -m cluster).

The session builds what is not cached (binaries, images), starts the cluster once, and
records the time of every step in ``.cluster/timings.json``; the last test of
test_cluster.py takes it down and checks the machine, and a finaliser takes it down anyway
if a run stops earlier. Collected only with CLUSTER_TESTS=1 (tests/conftest.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from devtools.cluster import config as c


@dataclass
class ClusterRun:
    """Timings of one cluster session (seconds per step) and what later tests share."""

    timings: dict[str, Any] = field(default_factory=dict)
    tag: str = ""
    shared: dict[str, Any] = field(default_factory=dict)

    def record(self, step: str, seconds: float | dict[str, Any]) -> None:
        """Record a step's time and write the file."""
        self.timings[step] = round(seconds, 1) if isinstance(seconds, float) else seconds
        c.HOME.mkdir(parents=True, exist_ok=True)
        (c.HOME / "timings.json").write_text(json.dumps(self.timings, indent=1) + "\n")


def say(msg: str) -> None:
    print(f"[cluster] {msg}", flush=True)


@pytest.fixture(scope="session")
def cluster() -> Iterator[ClusterRun]:
    """Binaries, images, a running cluster."""
    from devtools.cluster import addons, build, node

    run = ClusterRun(tag=build.app_image_tag())
    t = time.monotonic()
    build.build_binaries(say)
    run.record("build_binaries", time.monotonic() - t)
    t = time.monotonic()
    run.record("build_addons", addons.build_addons(say))  # nothing with CLUSTER_PLATFORM=0
    run.record("build_addons_total", time.monotonic() - t)
    t = time.monotonic()
    run.record("images_built", build.build_images(say, run.tag))
    run.record("images", time.monotonic() - t)
    took = node.up(say)
    run.record("cluster_up", {k: round(v, 1) for k, v in took.items()})
    yield run
    if node.is_up() or c.SNAPSHOT.exists():
        node.down(say, check=False)
