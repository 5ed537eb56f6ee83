"""Why a workload of the test cluster is not Ready, in one report a CI log can carry.

A ``kubectl rollout status`` or ``helm --wait`` that times out says only "timed out". The
report says what a person would look up next: the node's pressure conditions and taints
(a node short of disk refuses and evicts pods), the free space of the filesystems the
kubelet and containerd write to against the kubelet's eviction threshold, each pod's phase,
its unmet conditions and its containers' waiting or terminated reasons, the namespace's
recent Warning events, and the last log lines of the containers that are not ready.

``disk_report()`` is also the cluster's preflight: ``node.preflight()`` refuses to start a
cluster whose kubelet would at once report DiskPressure.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devtools.cluster import config as c
from devtools.cluster.kube import kubectl

GIB = 1024**3
# The kubelet's evictionHard nodefs/imagefs threshold (node.kubelet_config), in percent of
# the filesystem: below it the node reports DiskPressure, is tainted NoSchedule and evicts.
EVICTION_PERCENT = 1
# What one run of the cluster tests writes on top: the images unpacked by containerd
# (about 2 GiB), the PostgreSQL volume, pod logs and etcd (measured: docs/kubernetes.md).
RUN_HEADROOM_BYTES = 4 * GIB


@dataclass(frozen=True)
class Disk:
    """Free space of one filesystem, as the kubelet counts it (statvfs: blocks available
    to unprivileged users over total blocks)."""

    path: Path
    free_bytes: int
    total_bytes: int

    @property
    def eviction_bytes(self) -> int:
        """Below this many free bytes the kubelet reports DiskPressure."""
        return self.total_bytes * EVICTION_PERCENT // 100

    @property
    def enough(self) -> bool:
        """True when a cluster run fits above the eviction threshold."""
        return self.free_bytes >= self.eviction_bytes + RUN_HEADROOM_BYTES

    def describe(self) -> str:
        """``/path: 7.0 GiB free of 252 GiB (the kubelet evicts below 2.5 GiB)``."""
        return (
            f"{self.path}: {self.free_bytes / GIB:.1f} GiB free of {self.total_bytes / GIB:.0f} "
            f"GiB (the kubelet evicts below {self.eviction_bytes / GIB:.1f} GiB)"
        )


def _existing(path: Path) -> Path:
    """``path`` or its nearest parent that exists (the folder a run will create is on the
    filesystem of that parent)."""
    while not path.exists():
        path = path.parent
    return path


def disk_of(path: Path) -> Disk:
    """Free and total bytes of the filesystem holding ``path`` (its nearest existing
    parent). Raises OSError when it cannot be read."""
    st = os.statvfs(_existing(path))
    return Disk(path, st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize)


def disks() -> list[Disk]:
    """The filesystems the node writes to: the kubelet's (nodefs: pods, volumes, logs,
    under .cluster/state) and containerd's image store (imagefs, under the cluster tools
    folder); one entry when both are on the same filesystem."""
    seen: dict[int, Disk] = {}
    for path in (c.STATE, c.TOOLS / "containerd"):
        seen.setdefault(os.stat(_existing(path)).st_dev, disk_of(path))
    return list(seen.values())


def disk_report() -> tuple[bool, str]:
    """(every filesystem has room for a run, one line per filesystem)."""
    found = disks()
    return all(d.enough for d in found), "\n".join(d.describe() for d in found)


def _kubectl_json(*args: str) -> dict[str, Any]:
    try:
        return dict(json.loads(kubectl(*args, "-o", "json", timeout=30)))
    except Exception as exc:  # the report must not hide the first failure behind its own
        return {"items": [], "error": str(exc)[-300:]}


def node_lines() -> list[str]:
    """The node's Ready condition, every pressure condition that is True, and its taints."""
    out: list[str] = []
    for node in _kubectl_json("get", "nodes").get("items", []):
        name = node["metadata"]["name"]
        for cond in node.get("status", {}).get("conditions", []):
            if cond["type"] == "Ready" or cond["status"] == "True":
                out.append(
                    f"node {name}: {cond['type']}={cond['status']} "
                    f"({cond.get('reason', '')}: {cond.get('message', '')})"
                )
        for taint in node.get("spec", {}).get("taints", []) or []:
            out.append(f"node {name}: taint {taint['key']}:{taint['effect']}")
    return out


def pod_lines(pod: dict[str, Any]) -> list[str]:
    """One pod's phase, unmet conditions and its containers' states (pure: a pod object as
    the API server returns it)."""
    meta, status = pod["metadata"], pod.get("status", {})
    out = [f"pod {meta['name']}: {status.get('phase', '?')} {status.get('reason', '')}".rstrip()]
    if status.get("message"):
        out.append(f"  {status['message']}")
    for cond in status.get("conditions", []):
        if cond["status"] != "True":
            detail = f"{cond.get('reason', '')} {cond.get('message', '')}".strip()
            out.append(f"  {cond['type']}=False {detail}".rstrip())
    for ctr in status.get("initContainerStatuses", []) + status.get("containerStatuses", []):
        state = ctr.get("state", {})
        last = ctr.get("lastState", {}).get("terminated")
        for kind in ("waiting", "terminated"):
            if kind in state:
                s = state[kind]
                out.append(
                    f"  container {ctr['name']} {kind}: {s.get('reason', '')} "
                    f"{s.get('message', '')} exit={s.get('exitCode', '-')}".rstrip()
                )
        if last:
            out.append(
                f"  container {ctr['name']} restarts={ctr.get('restartCount', 0)}, last exit "
                f"{last.get('exitCode')} ({last.get('reason', '')})"
            )
    return out


def _ready(pod: dict[str, Any]) -> bool:
    return any(
        x["type"] == "Ready" and x["status"] == "True"
        for x in pod.get("status", {}).get("conditions", [])
    )


def report(namespace: str, selector: str | None = None, log_lines: int = 30) -> str:
    """Everything above for the pods of ``namespace`` (matching ``selector``, a label
    selector, when given). Never raises: a part it cannot read says so."""
    lines = ["--- why it is not ready ---"]
    try:
        lines += disk_report()[1].splitlines()
    except OSError as exc:
        lines.append(f"disk: {exc}")
    lines += node_lines()
    sel = ["-l", selector] if selector else []
    pods = _kubectl_json("-n", namespace, "get", "pods", *sel)
    if "error" in pods:
        lines.append(f"pods: {pods['error']}")
    for pod in pods.get("items", []):
        lines += pod_lines(pod)
    events = _kubectl_json("-n", namespace, "get", "events", "--field-selector", "type=Warning")
    for ev in sorted(
        events.get("items", []),
        key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "",
    )[-20:]:
        obj = ev.get("involvedObject", {})
        lines.append(
            f"event {ev.get('lastTimestamp') or ev.get('eventTime')} {obj.get('kind')}/"
            f"{obj.get('name')} {ev.get('reason')}: {ev.get('message', '').strip()[:300]}"
        )
    for pod in pods.get("items", []):
        if _ready(pod) or pod.get("status", {}).get("phase") == "Pending":
            continue
        for ctr in pod["spec"].get("containers", []):
            try:
                tail = kubectl(
                    "-n", namespace, "logs", pod["metadata"]["name"], "-c", ctr["name"],
                    f"--tail={log_lines}", timeout=30,
                )  # fmt: skip
            except Exception as exc:
                tail = str(exc)[-300:]
            lines.append(f"logs of {pod['metadata']['name']}/{ctr['name']}:")
            lines += [f"  {x}" for x in tail.splitlines()]
    return "\n".join(lines)
