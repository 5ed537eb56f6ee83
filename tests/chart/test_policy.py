"""Policy over the rendered YAML of every ci/*-values.yaml scenario."""

from __future__ import annotations

import base64
import ipaddress
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from exportcore.settings import Settings
from exportcore.webhooks import netguard
from tests.chart.conftest import (
    CHART,
    KUBE_VERSION,
    RELEASE,
    by_kind,
    find,
    helm,
    pod_specs,
    render,
)

pytestmark = pytest.mark.chart

PREFIX = f"{RELEASE}-notes-exports"
WORKERS = ("fast-worker", "bulk-worker")
HEARTBEAT_COMPONENTS = ("publisher", "recovery-scanner", "beat", *WORKERS, "webhook-delivery")
SECRET_ENV = ("DATABASE_URL", "CELERY_BROKER_URL", "RATE_LIMIT_REDIS_URL")
PRESTOP_BUDGET = 15  # the worker preStop's own `--timeout 10` plus interpreter start


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return spec.get("initContainers", []) + spec["containers"]


def component(obj: dict[str, Any]) -> str:
    return obj["metadata"]["labels"]["app.kubernetes.io/component"]


def main_container(dep: dict[str, Any]) -> dict[str, Any]:
    """The component's own container of a Deployment (sidecars may sit beside it)."""
    (c,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == component(dep)]
    return c


def env_of(objs: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, str]:
    """The container's effective plain env: ConfigMaps from envFrom, then env values."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" not in source:
            continue  # a Secret (extraEnvFrom): not plain env
        cm = find(objs, "ConfigMap", source["configMapRef"]["name"])
        env.update({source.get("prefix", "") + k: v for k, v in cm["data"].items()})
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
    return env


def test_every_container_has_requests_limits_and_hardening(scenario) -> None:
    _, objs = scenario
    for obj, spec in pod_specs(objs):
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        psc = spec["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["runAsUser"] > 0, where
        assert psc["seccompProfile"]["type"] == "RuntimeDefault", where
        assert spec["automountServiceAccountToken"] is False, where
        for c in containers(spec):
            res = c["resources"]
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(res[kind]), (where, c["name"], kind)
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["privileged"] is False, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"], where


def test_images_are_pinned(scenario) -> None:
    _, objs = scenario
    for obj, spec in pod_specs(objs):
        for c in containers(spec):
            image = c["image"]
            if "@sha256:" in image:
                assert re.fullmatch(r"[^@]+@sha256:[0-9a-f]{64}", image), image
                continue
            repo, _, tag = image.rpartition(":")
            assert repo and "/" not in tag, f"{obj['metadata']['name']}: {image} has no tag"
            assert tag not in ("latest", "main", "master", ""), image


def test_every_deployment_container_has_meaningful_probes(scenario) -> None:
    _, objs = scenario
    for dep in by_kind(objs, "Deployment"):
        c = main_container(dep)
        name = component(dep)
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert probe in c, (name, probe)
        if name == "api":
            assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
            assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
            assert c["livenessProbe"]["httpGet"]["port"] == "http"
            assert c["ports"][0]["name"] == "http"
            continue
        assert name in HEARTBEAT_COMPONENTS
        env = env_of(objs, c)
        hb = env.get("HEARTBEAT_FILE", "")
        assert hb.startswith("/run/notes-exports/"), (name, hb)
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        assert "/run/notes-exports" in mounts, name
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            cmd = c[probe]["exec"]["command"]
            # The light probe (standard library only, tests/unit/test_liveness.py), not
            # exportctl: on the test cluster exportctl took over the 10 s probe timeout.
            assert cmd[:3] == ["python", "-m", "exportcore.liveness"], (name, probe, cmd)
            max_age = float(cmd[cmd.index("--max-age") + 1])
            # The probe must be able to see a heartbeat: several beats fit into max-age.
            assert max_age >= 10, (name, probe)
            assert c[probe]["timeoutSeconds"] >= 5, (name, probe)


def test_workers_stop_consuming_before_term_and_outlive_their_task_limit(scenario) -> None:
    _, objs = scenario
    for name in WORKERS:
        dep = find(objs, "Deployment", f"{PREFIX}-{name}")
        spec = dep["spec"]["template"]["spec"]
        c = main_container(dep)
        queue = c["args"][c["args"].index("-Q") + 1]
        node = c["args"][c["args"].index("-n") + 1].split("@")[0]
        pre = " ".join(c["lifecycle"]["preStop"]["exec"]["command"])
        assert f"cancel_consumer {queue}" in pre and f'"{node}@$(hostname)"' in pre, pre
        limit = int(env_of(objs, c)["TASK_TIME_LIMIT"])
        grace = spec["terminationGracePeriodSeconds"]
        assert grace > limit + PRESTOP_BUDGET, (name, grace, limit)
    fast = find(objs, "Deployment", f"{PREFIX}-fast-worker")["spec"]["template"]["spec"]
    bulk = find(objs, "Deployment", f"{PREFIX}-bulk-worker")["spec"]["template"]["spec"]
    assert bulk["terminationGracePeriodSeconds"] > fast["terminationGracePeriodSeconds"]


def test_api_drains_before_term(scenario) -> None:
    _, objs = scenario
    api = find(objs, "Deployment", f"{PREFIX}-api")
    spec = api["spec"]["template"]["spec"]
    c = main_container(api)
    pause = c["lifecycle"]["preStop"]["exec"]["command"]
    assert pause[0] == "sleep" and 0 < int(pause[1]) < spec["terminationGracePeriodSeconds"]
    graceful = int(env_of(objs, c).get("API_GRACEFUL_TIMEOUT", "20"))
    assert spec["terminationGracePeriodSeconds"] > int(pause[1]) + graceful


def test_beat_is_a_singleton_replaced_with_recreate() -> None:
    # The scenarios that run beat (the kind values leave it off until services/beat exists).
    for values in ("default-values.yaml", "production-values.yaml"):
        check_beat(render([CHART / "ci" / values]))


def check_beat(objs: list[dict[str, Any]]) -> None:
    beat = find(objs, "Deployment", f"{PREFIX}-beat")
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}
    assert not [
        o
        for o in objs
        if o["kind"] in ("HorizontalPodAutoscaler", "ScaledObject")
        and o["spec"]["scaleTargetRef"]["name"] == beat["metadata"]["name"]
    ]
    args = beat["spec"]["template"]["spec"]["containers"][0]["args"]
    schedule = args[args.index("--schedule") + 1]
    assert schedule.startswith("/run/notes-exports/"), (
        "the beat schedule must be on a writable volume"
    )


def test_recommended_labels_on_every_object(scenario) -> None:
    _, objs = scenario
    for o in objs:
        labels = o["metadata"].get("labels", {})
        for key in (
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/version",
            "app.kubernetes.io/managed-by",
            "app.kubernetes.io/part-of",
            "helm.sh/chart",
        ):
            assert key in labels, (o["kind"], o["metadata"]["name"], key)
        if o["kind"] == "Deployment":
            pod_labels = o["spec"]["template"]["metadata"]["labels"]
            assert (
                pod_labels["app.kubernetes.io/component"] == labels["app.kubernetes.io/component"]
            )
            assert o["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_secrets_never_reach_a_configmap(scenario) -> None:
    _, objs = scenario
    secret_values = set()
    for s in by_kind(objs, "Secret"):
        secret_values |= {base64.b64decode(v).decode() for v in s.get("data", {}).values()}
    for cm in by_kind(objs, "ConfigMap"):
        for key, value in cm.get("data", {}).items():
            assert key not in SECRET_ENV, (cm["metadata"]["name"], key)
            assert not re.search(r"://[^/\s]*:[^/\s]*@", value), (cm["metadata"]["name"], key)
            assert not any(sv and sv in value for sv in secret_values), (
                cm["metadata"]["name"],
                key,
            )
    for obj, spec in pod_specs(objs):
        for c in containers(spec):
            for item in c.get("env", []):
                if item["name"] in SECRET_ENV:
                    assert "secretKeyRef" in item["valueFrom"], (obj["metadata"]["name"], item)


RATE_LIMIT_URL = "redis://:rl-secret@ratelimit-redis:6379/1"


def rate_limit_env(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The RATE_LIMIT_REDIS_URL entries of every container of the rendered objects."""
    return [
        item
        for _, spec in pod_specs(objs)
        for c in containers(spec)
        for item in c.get("env", [])
        if item["name"] == "RATE_LIMIT_REDIS_URL"
    ]


def test_the_rate_limit_redis_url_comes_from_a_secret_never_the_configmap() -> None:
    """RATE_LIMIT_REDIS_URL carries a password like the broker URL: rateLimitRedis.url goes
    into the chart's Secret (or rateLimitRedis.existingSecret is named), every container
    reads it through secretKeyRef, and config.RATE_LIMIT_REDIS_URL is refused (by the schema,
    and by the template when the schema is skipped)."""
    base = [CHART / "ci" / "default-values.yaml"]
    assert rate_limit_env(render(base)) == []  # unset: the broker's Redis, nothing rendered
    objs = render(base, {"rateLimitRedis.url": RATE_LIMIT_URL})
    (secret,) = [s for s in by_kind(objs, "Secret") if s["metadata"]["name"] == PREFIX]
    assert base64.b64decode(secret["data"]["RATE_LIMIT_REDIS_URL"]).decode() == RATE_LIMIT_URL
    assert all(RATE_LIMIT_URL not in str(cm["data"]) for cm in by_kind(objs, "ConfigMap"))
    refs = rate_limit_env(objs)
    assert refs and all(
        r["valueFrom"]["secretKeyRef"] == {"name": PREFIX, "key": "RATE_LIMIT_REDIS_URL"}
        for r in refs
    )
    existing = render(
        base, {"rateLimitRedis.existingSecret": "rl", "rateLimitRedis.existingSecretKey": "url"}
    )
    assert {str(r["valueFrom"]["secretKeyRef"]) for r in rate_limit_env(existing)} == {
        str({"name": "rl", "key": "url"})
    }
    no_schema = helm(
        "template",
        RELEASE,
        str(CHART),
        "--kube-version",
        KUBE_VERSION,
        "--skip-schema-validation",
        "-f",
        str(base[0]),
        "--set",
        f"image.tag=0.1.0,config.RATE_LIMIT_REDIS_URL={RATE_LIMIT_URL}",
        check=False,
    )
    assert no_schema.returncode != 0
    assert "config.RATE_LIMIT_REDIS_URL is a secret" in no_schema.stderr, no_schema.stderr
    assert "rateLimitRedis.url / rateLimitRedis.existingSecret" in no_schema.stderr


def test_config_checksum_rolls_pods_when_config_changes() -> None:
    base = [CHART / "ci" / "default-values.yaml"]

    def checksums(objs: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
        return {
            d["metadata"]["name"]: {
                k: v
                for k, v in d["spec"]["template"]["metadata"]["annotations"].items()
                if k.startswith("checksum/")
            }
            for d in by_kind(objs, "Deployment")
        }

    before = checksums(render(base))
    assert all(set(c) == {"checksum/config", "checksum/secret"} for c in before.values())
    after_config = checksums(render(base, {"config.LEASE_SECONDS": "45"}))
    after_secret = checksums(render(base, {"database.url": "postgresql://u:other@db:5432/x"}))
    for name in before:
        assert after_config[name]["checksum/config"] != before[name]["checksum/config"]
        assert after_secret[name]["checksum/secret"] != before[name]["checksum/secret"]
        assert after_config[name]["checksum/secret"] == before[name]["checksum/secret"]


def test_scaled_deployments_leave_replicas_to_their_autoscaler() -> None:
    objs = render([CHART / "ci" / "production-values.yaml"])
    owned = {
        o["spec"]["scaleTargetRef"]["name"]
        for o in objs
        if o["kind"] in ("HorizontalPodAutoscaler", "ScaledObject")
    }
    assert owned
    for d in by_kind(objs, "Deployment"):
        assert ("replicas" in d["spec"]) == (d["metadata"]["name"] not in owned), d["metadata"][
            "name"
        ]


def test_network_policies_cover_every_pod_and_open_only_the_api(scenario) -> None:
    _, objs = scenario
    policies = by_kind(objs, "NetworkPolicy")
    assert policies
    for obj, _spec in pod_specs(objs):
        labels = (
            obj["spec"]["template"]["metadata"]["labels"]
            if obj["kind"] != "Pod"
            else obj["metadata"]["labels"]
        )
        selecting = [
            p for p in policies if p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
        ]
        assert selecting, f"{obj['metadata']['name']} is not covered by a NetworkPolicy"
        inbound = [rule for p in selecting for rule in p["spec"].get("ingress", [])]
        if labels["app.kubernetes.io/component"] == "api":
            assert inbound and all(r["ports"][0]["port"] in ("http", "metrics") for r in inbound)
        else:
            assert all(r["ports"][0]["port"] == "metrics" for r in inbound), obj["metadata"]["name"]
    common = find(objs, "NetworkPolicy", PREFIX)
    egress_ports = {p["port"] for r in common["spec"]["egress"] for p in r.get("ports", [])}
    assert {53, 5432, 6379} <= egress_ports


def test_artifacts_volume_is_shared_by_api_workers_and_scanner_only(scenario) -> None:
    path, objs = scenario
    s3 = "ARTIFACT_URL" in find(objs, "ConfigMap", PREFIX)["data"]
    for d in by_kind(objs, "Deployment"):
        spec = d["spec"]["template"]["spec"]
        c = main_container(d)
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        env = env_of(objs, c)
        if s3:
            # Object storage: every process reaches the bucket, no pod has an artifact volume.
            assert env["ARTIFACT_URL"].startswith("s3://") and "ARTIFACT_DIR" not in env
            assert "artifacts" not in mounts
            assert "artifacts" not in {v["name"] for v in spec["volumes"]}
        elif component(d) in ("api", "recovery-scanner", *WORKERS):
            # api reads, workers write, the scanner deletes orphans and expired files
            assert mounts["artifacts"] == env["ARTIFACT_DIR"], (path.name, d["metadata"]["name"])
        else:
            assert "artifacts" not in mounts
    pvcs = by_kind(objs, "PersistentVolumeClaim")
    assert len(pvcs) == (0 if s3 else 1)


def test_the_ingress_lets_every_body_the_api_accepts_through(scenario) -> None:
    """ingress-nginx refuses bodies over 1m with its own HTML 413; the api's limit
    (MAX_REQUEST_BYTES) must be the one that answers, with problem+json."""
    _, objs = scenario
    ingresses = by_kind(objs, "Ingress")
    if not ingresses:
        pytest.skip("no Ingress in this scenario")
    (ingress,) = ingresses
    limit = ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-body-size"]
    size, unit = re.fullmatch(r"(\d+)([kmg]?)", limit.lower()).groups()  # type: ignore[union-attr]
    allowed = int(size) * 1024 ** " kmg".index(unit or " ")
    assert allowed >= Settings().max_request_bytes


def test_only_webhook_delivery_reaches_the_receivers_and_only_public_addresses(scenario) -> None:
    _, objs = scenario
    own = find(objs, "NetworkPolicy", f"{PREFIX}-webhook-delivery")
    assert own["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == (
        "webhook-delivery"
    )
    assert own["spec"]["policyTypes"] == ["Egress"]
    (rule,) = own["spec"]["egress"]
    assert [p["port"] for p in rule["ports"]] == [443]
    blocks = {peer["ipBlock"]["cidr"]: set(peer["ipBlock"]["except"]) for peer in rule["to"]}
    assert {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"} <= blocks[
        "0.0.0.0/0"
    ]
    assert set(blocks) == {"0.0.0.0/0", "2000::/3"}  # IPv6: global unicast only
    # no policy selecting another component opens the internet
    for policy in by_kind(objs, "NetworkPolicy"):
        if policy is own:
            continue
        for r in policy["spec"].get("egress", []):
            cidrs = {peer.get("ipBlock", {}).get("cidr") for peer in r.get("to", [])}
            assert not cidrs & {"0.0.0.0/0", "::/0"}, policy["metadata"]["name"]


def test_the_webhook_egress_refuses_exactly_the_ranges_the_ssrf_guard_refuses() -> None:
    """The chart's default webhook egress and exportcore.webhooks.netguard list the same
    ranges: IPv4 as one 0.0.0.0/0 block without every refused range; IPv6 as the global
    unicast block 2000::/3 without the refused ranges inside it, the refused ranges outside
    it tiling the rest of the address space (so nothing outside 2000::/3 is let through)."""
    objs = render([CHART / "ci" / "default-values.yaml"])
    (rule,) = find(objs, "NetworkPolicy", f"{PREFIX}-webhook-delivery")["spec"]["egress"]
    blocks = {
        ipaddress.ip_network(p["ipBlock"]["cidr"]): {
            ipaddress.ip_network(c) for c in p["ipBlock"]["except"]
        }
        for p in rule["to"]
    }
    v4 = {r.network for r in netguard.REFUSED_NETWORKS if r.network.version == 4}
    v6 = {r.network for r in netguard.REFUSED_NETWORKS if r.network.version == 6}
    unicast = netguard.GLOBAL_UNICAST_V6
    assert blocks == {
        ipaddress.ip_network("0.0.0.0/0"): v4,
        unicast: {n for n in v6 if n.subnet_of(unicast)},  # type: ignore[arg-type]
    }
    outside = [n for n in v6 if not n.subnet_of(unicast)]  # type: ignore[arg-type]
    assert list(ipaddress.collapse_addresses([*outside, unicast])) == [  # type: ignore[list-item]
        ipaddress.ip_network("::/0")
    ]
    # every range the chart leaves out is one the process refuses, whole
    for net in v4 | v6:
        for ip in (net.network_address, net.broadcast_address):
            assert netguard.address_refusal(ip) is not None or any(
                r.embeds_ipv4 and ip in r.network for r in netguard.REFUSED_NETWORKS
            ), ip


def helm_values(path: Path | None) -> dict[str, Any]:
    """values.yaml merged with the scenario ``path`` as helm merges them (maps key by key,
    everything else replaced)."""

    def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
        out = dict(base)
        for key, value in over.items():
            both = isinstance(value, dict) and isinstance(base.get(key), dict)
            out[key] = merge(base[key], value) if both else value
        return out

    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return merge(values, yaml.safe_load(path.read_text()) or {}) if path else values


def test_database_broker_and_object_store_egress_stay_in_the_release_namespace(
    scenario,
) -> None:
    """Unless a scenario names its peers, PostgreSQL, Redis and the object store are reached
    only in the release's namespace, and DNS only at the cluster DNS."""
    path, objs = scenario
    values = helm_values(path)
    egress = values["networkPolicy"]["egress"]
    rules = find(objs, "NetworkPolicy", PREFIX)["spec"]["egress"]
    by_port = {p["port"]: r for r in rules for p in r.get("ports", [])}
    assert by_port[53]["to"] == egress["dnsTo"]
    for which, port in (("database", 5432), ("broker", 6379)):
        assert by_port[port]["to"] == egress[which]["to"], (path.name, which)
        if egress[which]["to"] == [{"podSelector": {}}]:
            assert "namespaceSelector" not in by_port[port]["to"][0]
    defaults = helm_values(None)["networkPolicy"]["egress"]
    assert defaults["database"]["to"] == defaults["broker"]["to"] == [{"podSelector": {}}]
    assert defaults["objectStore"]["to"] == [{"podSelector": {}}]
    assert defaults["dnsTo"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        }
    ]
