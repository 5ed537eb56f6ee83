"""The test cluster's disk preflight, its not-ready report and its image pruning (pure
parts; the cluster tests run them on the real kubelet)."""

from __future__ import annotations

from pathlib import Path

from devtools.cluster import build, diagnose
from devtools.cluster import config as c

GIB = diagnose.GIB


def test_a_disk_is_enough_only_with_a_run_above_the_eviction_threshold() -> None:
    total = 252 * GIB  # the kubelet evicts below 1 %: 2.52 GiB
    just = diagnose.Disk(Path("/"), total // 100 + diagnose.RUN_HEADROOM_BYTES, total)
    short = diagnose.Disk(Path("/"), 7 * GIB - diagnose.RUN_HEADROOM_BYTES, total)
    assert just.enough
    assert not short.enough
    assert short.describe() == "/: 3.0 GiB free of 252 GiB (the kubelet evicts below 2.5 GiB)"


def test_the_disk_of_a_path_not_made_yet_is_its_parents(tmp_path: Path) -> None:
    disk = diagnose.disk_of(tmp_path / "not" / "yet")
    assert disk.path == tmp_path / "not" / "yet"
    assert 0 < disk.free_bytes <= disk.total_bytes


def test_a_pod_the_scheduler_refused_says_why() -> None:
    pod = {
        "metadata": {"name": "postgresql-0"},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/1 nodes are available: 1 node(s) had untolerated taint "
                    "{node.kubernetes.io/disk-pressure: }.",
                }
            ],
        },
    }
    assert diagnose.pod_lines(pod) == [
        "pod postgresql-0: Pending",
        "  PodScheduled=False Unschedulable 0/1 nodes are available: 1 node(s) had "
        "untolerated taint {node.kubernetes.io/disk-pressure: }.",
    ]


def test_a_crashing_container_shows_its_state_and_last_exit() -> None:
    pod = {
        "metadata": {"name": "redis-1"},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady"}],
            "containerStatuses": [
                {
                    "name": "redis",
                    "restartCount": 4,
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 1m"}},
                    "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}},
                }
            ],
        },
    }
    lines = diagnose.pod_lines(pod)
    assert "  Ready=False ContainersNotReady" in lines
    assert "  container redis waiting: CrashLoopBackOff back-off 1m exit=-" in lines
    assert "  container redis restarts=4, last exit 1 (Error)" in lines


def test_an_evicted_pod_carries_the_kubelets_message() -> None:
    pod = {
        "metadata": {"name": "s3-7d9"},
        "status": {
            "phase": "Failed",
            "reason": "Evicted",
            "message": "The node was low on resource: ephemeral-storage.",
        },
    }
    assert diagnose.pod_lines(pod) == [
        "pod s3-7d9: Failed Evicted",
        "  The node was low on resource: ephemeral-storage.",
    ]


def test_stale_project_images_are_all_tags_but_this_one_and_the_newest_other() -> None:
    r = c.APP_IMAGE_REPO
    saved = [f"{r}:new", f"{r}:current", f"{r}:older", f"{r}:oldest"]  # newest first
    listed = [f"{r}:current", f"{r}:interrupted", f"{r}:older"]
    assert build.stale_app_images(saved, listed, "current") == [
        f"{r}:older",
        f"{r}:oldest",
        f"{r}:interrupted",
    ]
    assert build.stale_app_images(saved, listed, "current", spare=0)[0] == f"{r}:new"
    assert build.stale_app_images([], [f"{r}:current"], "current") == []


def test_a_removed_archive_takes_its_name_file_and_stamp(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(c, "IMAGE_ARCHIVES", tmp_path)
    for tag in ("a1", "b2"):
        archive = build.archive_path(f"{c.APP_IMAGE_REPO}:{tag}")
        archive.write_bytes(b"tar")
        archive.with_suffix(".name").write_text(f"{c.APP_IMAGE_REPO}:{tag}\n")
        (tmp_path / f".{archive.stem}.stamp").write_text("digest")
    build.remove_archive(f"{c.APP_IMAGE_REPO}:a1")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".notes-exports_b2.stamp",
        "notes-exports_b2.name",
        "notes-exports_b2.tar",
    ]
    assert list(build.app_archives()) == [f"{c.APP_IMAGE_REPO}:b2"]


def test_diagnose_and_node_import_no_cycle() -> None:
    """diagnose (node's preflight) reaches kubectl through kube, never through node."""
    import subprocess
    import sys

    code = (
        "import sys, devtools.cluster.diagnose; "
        "assert 'devtools.cluster.node' not in sys.modules, 'diagnose imported node'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
