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


def test_every_platform_tool_is_pinned_and_stamped_by_its_recipe(tmp_path, monkeypatch) -> None:
    """The platform's Go tools build pinned versions; a changed recipe (version, flags,
    revision) makes the stamp stale, so CI's cache rebuilds exactly that tool."""
    from devtools.cluster import addons

    monkeypatch.setattr(c, "BIN", tmp_path)
    names = [t.name for t in addons.ADDONS]
    assert names == ["jaeger", "prometheus-operator", "prometheus", "keda", "traefik"]
    assert all(t.version.startswith("v") and "@" not in t.module for t in addons.ADDONS)
    tool = addons.addon("keda")
    assert [b.name for b in tool.binaries] == ["operator", "adapter"]
    stamp = tool.stamp()
    stamp.write()
    for b in tool.binaries:
        b.parent.mkdir(parents=True, exist_ok=True)
        b.write_bytes(b"")
    assert tool.current()
    assert not replace(tool, version="v2.21.1").current()
    assert not replace(tool, revision=tool.revision + 1).current()
    assert not replace(tool, ldflags=("-X a=b",)).current()


def test_platform_images_keep_the_upstream_entrypoints() -> None:
    """prometheus-operator starts the reloader as /bin/prometheus-config-reloader and
    Prometheus with its image's entrypoint; KEDA's manifests name /keda and /keda-adapter."""
    from devtools.cluster import addons

    images = {i.name: i for i in addons.addon_images()}
    assert images[c.CONFIG_RELOADER_IMAGE].entrypoint == "/bin/prometheus-config-reloader"
    assert images[c.PROMETHEUS_IMAGE].entrypoint == "/bin/prometheus"
    assert set(images[c.KEDA_IMAGE].files) == {"/keda", "/keda-adapter"}
    assert all(name.startswith("localhost/") for name in images)


def test_local_images_replace_only_the_named_upstream_images() -> None:
    from devtools.cluster.platform import _local_images

    docs = [
        {"kind": "Deployment", "spec": {"template": {"spec": {"containers": [
            {"name": "a", "image": "ghcr.io/kedacore/keda:latest", "imagePullPolicy": "Always"},
            {"name": "b", "image": "other:1"},
        ]}}}}
    ]  # fmt: skip
    _local_images(docs, {"ghcr.io/kedacore/": c.KEDA_IMAGE})
    a, b = docs[0]["spec"]["template"]["spec"]["containers"]
    assert (a["image"], a["imagePullPolicy"]) == (c.KEDA_IMAGE, "Never")
    assert b == {"name": "b", "image": "other:1"}


def test_the_platform_runs_unless_cluster_platform_is_0(monkeypatch) -> None:
    """The platform is on by default (make test-cluster runs it); with CLUSTER_PLATFORM=0
    the deploy installs no platform part (and touches no cluster: it returns before the
    first kubectl)."""
    from devtools.cluster import config as c
    from devtools.cluster import platform

    monkeypatch.delenv("CLUSTER_PLATFORM", raising=False)
    assert c.platform_enabled()
    monkeypatch.setenv("CLUSTER_PLATFORM", "1")
    assert c.platform_enabled()
    monkeypatch.setenv("CLUSTER_PLATFORM", "0")
    assert not c.platform_enabled()
    said: list[str] = []
    assert platform.deploy_platform(said.append) == {"skipped": "CLUSTER_PLATFORM=0"}
    assert said and "CLUSTER_PLATFORM=0" in said[0]
