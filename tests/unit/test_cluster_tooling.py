"""Pure logic of the test cluster's tooling (devtools/cluster): the drills' settings agree
with the values the release runs with, and the machine comparison reports what the cluster
leaves behind and nothing else. The cluster itself is tested by tests/cluster."""

from __future__ import annotations

from dataclasses import replace

import yaml

from devtools.cluster import config as c
from devtools.cluster import host
from devtools.cluster.drills import CLUSTER_DRILL_SETTINGS
from devtools.stack import ROOT


def test_the_drills_judge_with_the_settings_the_release_runs_with() -> None:
    values = yaml.safe_load((ROOT / "devtools" / "cluster" / "values.yaml").read_text())
    config = values["config"]
    s = CLUSTER_DRILL_SETTINGS
    assert float(config["LEASE_SECONDS"]) == s.lease_seconds
    assert float(config["SCANNER_INTERVAL_SECONDS"]) == s.scanner_interval_seconds
    assert float(config["RETRY_BASE_SECONDS"]) == s.retry_base_seconds
    assert float(config["RETRY_CAP_SECONDS"]) == s.retry_cap_seconds
    bulk = values["components"]["bulkWorker"]
    assert int(bulk["env"]["TASK_TIME_LIMIT"]) < bulk["terminationGracePeriodSeconds"]


def _state(**kw: object) -> host.HostState:
    base = host.HostState(
        links=["eth0", "lo"],
        routes=["v4 default via 192.0.2.1 dev eth0"],
        iptables=[],
        ip6tables=[],
        mounts=[["/", "ext4"], ["/work/other/.drills/artifacts", "tmpfs"]],
        sysctls={"kernel.panic": "1"},
        paths={"/run/containerd": False},
        netns=[],
        cgroups=[],
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def test_nothing_left_is_an_empty_report(monkeypatch) -> None:
    monkeypatch.setattr(host, "cluster_processes", lambda: [])
    assert host.leftovers(_state(), _state()) == {}


def test_what_the_cluster_leaves_is_reported(monkeypatch) -> None:
    monkeypatch.setattr(
        host, "cluster_processes", lambda: [{"pid": 1, "exe": "x", "cmdline": "kubelet"}]
    )
    after = _state(
        links=["eth0", "lo", c.BRIDGE],
        routes=["v4 default via 192.0.2.1 dev eth0", f"v4 {c.SERVICE_CIDR} dev {c.BRIDGE}"],
        iptables=["nat chain KUBE-SERVICES"],
        mounts=[
            ["/", "ext4"],
            ["/work/other/.drills/artifacts", "tmpfs"],
            [f"{c.HOME}/state/kubelet/pods/x", "tmpfs"],
            ["/run/containerd/x/rootfs", "overlay"],
        ],
        sysctls={"kernel.panic": "10"},
        paths={"/run/containerd": True},
    )
    left = host.leftovers(_state(), after)
    assert left["links"] == [f"+ {c.BRIDGE}"]
    assert left["routes"] == [f"+ v4 {c.SERVICE_CIDR} dev {c.BRIDGE}"]
    assert left["iptables"] == ["+ nat chain KUBE-SERVICES"]
    assert left["sysctls"] == {"kernel.panic": "1 -> 10"}
    assert left["paths"] == {"/run/containerd": "False -> True"}
    assert len(left["mounts"]) == 2  # the other helper's tmpfs is not the cluster's
    assert left["processes"][0]["cmdline"] == "kubelet"


def test_an_empty_accept_builtin_chain_is_the_same_as_no_table(monkeypatch) -> None:
    save = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [3:4]\n:MINE - [0:0]\n-A OUTPUT -j MINE\nCOMMIT\n"
    monkeypatch.setattr(host, "_sh", lambda *cmd: save)
    assert host.iptables_rules("iptables") == [
        "filter -A OUTPUT -j MINE",
        "filter chain FORWARD policy DROP",
        "filter chain MINE",
        "filter chain OUTPUT policy ACCEPT",
    ]
