"""What the cluster may change on this machine, recorded before ``cluster-up`` and compared
after ``cluster-down``: network interfaces, routes, iptables / ip6tables rules, mounts,
kernel settings, host paths the runtime creates, cgroups and processes.

Other test servers run on this machine at the same time, so the comparison looks only at
what can be the cluster's: every interface, route and firewall rule (those change only when
someone adds a network, and the cluster's are recognisable), mounts below the cluster's
folders or of the kinds a container runtime makes, and processes that run inside a pod's
cgroup or from the cluster's folders.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from devtools.cluster import config as c

SYSCTLS = (
    *c.KUBELET_SYSCTLS,
    "net.ipv4.ip_forward",
    "net.ipv4.conf.all.forwarding",
    "net.ipv4.conf.all.route_localnet",
    "net.ipv6.conf.all.forwarding",
    "net.bridge.bridge-nf-call-iptables",
    "net.bridge.bridge-nf-call-ip6tables",
    "net.netfilter.nf_conntrack_max",
    "net.netfilter.nf_conntrack_tcp_timeout_established",
    "net.netfilter.nf_conntrack_tcp_timeout_close_wait",
    "net.netfilter.nf_conntrack_tcp_be_liberal",
)
WATCHED_PATHS = (
    *c.HOST_PATHS,
    "/var/lib/kubelet",
    "/var/lib/containerd",
    "/opt/containerd",
    "/etc/cni",
    "/opt/cni",
    "/var/lib/cni",
    "/var/log/pods",
    "/etc/kubernetes",
    "/var/lib/containers",
)
CGROUP_ROOT = Path("/sys/fs/cgroup")
RUNTIME_FSTYPES = {"overlay", "nsfs"}


def _sh(*cmd: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return proc.stdout if proc.returncode == 0 else ""


def sysctl_path(key: str) -> Path:
    """/proc/sys path of a sysctl key (``net.ipv4.ip_forward``)."""
    return Path("/proc/sys") / key.replace(".", "/")


def read_sysctl(key: str) -> str | None:
    """The value of a kernel setting, or None when this kernel has no such key."""
    try:
        return " ".join(sysctl_path(key).read_text().split())
    except OSError:
        return None


def iptables_rules(family: str) -> list[str]:
    """Chains and rules of every table, without counters: ``"nat -A POSTROUTING ..."``."""
    out: list[str] = []
    builtin: dict[tuple[str, str], str] = {}
    used: set[tuple[str, str]] = set()
    table = "?"
    for line in _sh(f"{family}-save").splitlines():
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith(":"):
            name, policy = line[1:].split()[:2]
            if policy == "-":
                out.append(f"{table} chain {name}")
            else:
                builtin[(table, name)] = policy
        elif line.startswith("-A"):
            out.append(f"{table} {line}")
            used.add((table, line.split()[1]))
    # A built-in chain with no rule and policy ACCEPT filters nothing: the same as a table
    # that was never loaded (adding and deleting one rule leaves such chains behind).
    for (tbl, name), policy in builtin.items():
        if policy != "ACCEPT" or (tbl, name) in used:
            out.append(f"{tbl} chain {name} policy {policy}")
    return sorted(out)


def mounts() -> list[tuple[str, str]]:
    """``(mount point, fstype)`` of every mount of this mount namespace."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        point = left.split()[4].replace("\\040", " ")
        found.append((point, right.split()[0]))
    return found


def cgroups_with_kubepods() -> list[str]:
    """cgroup hierarchies holding a ``kubepods`` group (the kubelet's, cgroupfs driver)."""
    if not CGROUP_ROOT.is_dir():
        return []
    found = [str(p) for p in CGROUP_ROOT.glob("*/kubepods")]
    if (CGROUP_ROOT / "kubepods").is_dir():
        found.append(str(CGROUP_ROOT / "kubepods"))
    return sorted(found)


def cluster_processes() -> list[dict[str, Any]]:
    """Processes that are the cluster's: inside a pod cgroup, run from its binaries
    (.tools/cluster/bin), or with its state (.cluster) on their command line. A build that
    merely writes into the binaries' folder (``go build -o .../bin/``, the prebuild of a
    platform tool still running) is not the cluster's."""
    state_marks = (str(c.STATE), str(c.HOME))
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cgroup = (proc / "cgroup").read_text()
            exe = os.readlink(proc / "exe")
        except OSError:
            continue
        ours = exe.startswith(str(c.BIN)) or any(m in cmdline for m in state_marks)
        if "kubepods" in cgroup or ours or exe.startswith(state_marks):
            found.append({"pid": int(proc.name), "exe": exe, "cmdline": cmdline[:300]})
    return found


@dataclass
class HostState:
    """One reading of everything the cluster may touch."""

    links: list[str] = field(default_factory=list)
    routes: list[str] = field(default_factory=list)
    iptables: list[str] = field(default_factory=list)
    ip6tables: list[str] = field(default_factory=list)
    mounts: list[list[str]] = field(default_factory=list)
    sysctls: dict[str, str | None] = field(default_factory=dict)
    paths: dict[str, bool] = field(default_factory=dict)
    netns: list[str] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)

    @classmethod
    def read(cls) -> HostState:
        """Read the machine now."""
        links = sorted(
            m.group(1)
            for line in _sh("ip", "-o", "link", "show").splitlines()
            if (m := re.match(r"\d+: ([^:@]+)", line))
        )
        routes = sorted(
            f"v{v} {' '.join(line.split())}"
            for v in ("4", "6")
            for line in _sh("ip", f"-{v}", "route", "show", "table", "all").splitlines()
            if line.strip()
        )
        netns_dir = Path("/run/netns")
        return cls(
            links=links,
            routes=routes,
            iptables=iptables_rules("iptables"),
            ip6tables=iptables_rules("ip6tables"),
            mounts=[[p, t] for p, t in mounts()],
            sysctls={k: read_sysctl(k) for k in SYSCTLS},
            paths={p: os.path.lexists(p) for p in WATCHED_PATHS},
            netns=sorted(p.name for p in netns_dir.iterdir()) if netns_dir.is_dir() else [],
            cgroups=cgroups_with_kubepods(),
        )

    def save(self, path: Path) -> None:
        """Write the reading as JSON."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> HostState:
        """A reading written by :meth:`save`."""
        return cls(**json.loads(path.read_text()))


def _ours(point: str, fstype: str) -> bool:
    """A mount the cluster may have made (buildah's, during an image build, are not)."""
    if point.startswith(str(c.BUILDAH_ROOT)):
        return False
    prefixes = (str(c.HOME), str(c.TOOLS), *c.HOST_PATHS, "/var/run/netns", "/var/lib/kubelet")
    return fstype in RUNTIME_FSTYPES or point.startswith(prefixes)


def leftovers(before: HostState, after: HostState | None = None) -> dict[str, Any]:
    """What differs from ``before`` in what the cluster may touch (empty: nothing left).
    Keys: links, routes, iptables, ip6tables, mounts, sysctls, paths, netns, cgroups,
    processes — each lists additions (``+``) and removals (``-``)."""
    now = after or HostState.read()
    diff: dict[str, Any] = {}

    def sets(name: str, old: list[str], new: list[str]) -> None:
        added = sorted(set(new) - set(old))
        removed = sorted(set(old) - set(new))
        if added or removed:
            diff[name] = [f"+ {x}" for x in added] + [f"- {x}" for x in removed]

    sets("links", before.links, now.links)
    sets("routes", before.routes, now.routes)
    sets("iptables", before.iptables, now.iptables)
    sets("ip6tables", before.ip6tables, now.ip6tables)
    sets("netns", before.netns, now.netns)
    sets("cgroups", before.cgroups, now.cgroups)
    old_mounts = {tuple(m) for m in before.mounts}
    new_mounts = [
        f"{p} ({t})" for p, t in map(tuple, now.mounts) if (p, t) not in old_mounts and _ours(p, t)
    ]
    if new_mounts:
        diff["mounts"] = [f"+ {m}" for m in sorted(new_mounts)]
    changed = {
        k: f"{before.sysctls.get(k)} -> {v}"
        for k, v in now.sysctls.items()
        if before.sysctls.get(k) != v
    }
    if changed:
        diff["sysctls"] = changed
    paths = {
        p: f"{before.paths.get(p)} -> {e}" for p, e in now.paths.items() if before.paths.get(p) != e
    }
    if paths:
        diff["paths"] = paths
    procs = cluster_processes()
    if procs:
        diff["processes"] = procs
    return diff
