"""The Ingress and the Gateway API HTTPRoute route the public API only; a host name is
never served over plain HTTP unless the values say so; a ReadWriteOnce artifact claim puts
every pod that mounts it on one node; metrics have their own port and Service, the api's
too; the image tag is the user's to give."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart.conftest import CHART, by_kind, find, pod_specs, render, render_error
from tests.chart.test_schemas import validate_custom

pytestmark = pytest.mark.chart

URLS = {"database.url": "postgresql://u:p@db:5432/x", "broker.url": "redis://exports:pw@r:6379/0"}
# the proxies in front of the api (a route or an Ingress needs them: test_proxies_and_broker.py)
PROXIES = {"trustedProxies.addresses": "{10.0.0.0/8}"}
KIND = CHART / "ci" / "kind-values.yaml"
PUBLIC = {("/v1", "Prefix"), ("/healthz", "Exact"), ("/readyz", "Exact")}


def _route_paths(route: dict[str, Any]) -> set[tuple[str, str]]:
    kind = {"PathPrefix": "Prefix", "Exact": "Exact"}
    return {
        (m["path"]["value"], kind[m["path"]["type"]])
        for rule in route["spec"]["rules"]
        for m in rule["matches"]
    }


def _ingress_paths(ingress: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (p["path"], p["pathType"])
        for rule in ingress["spec"]["rules"]
        for p in rule["http"]["paths"]
    }


def test_the_defaults_create_no_route() -> None:
    objs = render(sets=URLS)
    assert by_kind(objs, "Ingress") == [] and by_kind(objs, "HTTPRoute") == []


def test_the_kind_values_route_the_public_api_through_the_gateway() -> None:
    objs = render([KIND])
    (route,) = by_kind(objs, "HTTPRoute")
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert _route_paths(route) == PUBLIC
    (backend,) = route["spec"]["rules"][0]["backendRefs"]
    service = find(objs, "Service", backend["name"])
    assert backend["port"] == service["spec"]["ports"][0]["port"]
    assert route["spec"]["parentRefs"] == [
        {"name": "notes-exports", "namespace": "envoy-gateway-system", "sectionName": "http"}
    ]
    assert by_kind(objs, "Ingress") == []
    results = validate_custom([route])
    assert results[0]["valid"], results[0]["errors"]


@pytest.mark.parametrize("kind", ["ingress", "httpRoute"])
def test_only_the_public_api_is_routed_unless_the_values_ask(kind: str) -> None:
    sets = {**URLS, **PROXIES, f"{kind}.enabled": True}
    if kind == "httpRoute":
        sets["httpRoute.parentRefs[0].name"] = "gw"
    paths = _paths(render(sets=sets), kind)
    assert paths == PUBLIC
    assert not any(
        p.startswith(("/metrics", "/docs", "/openapi", "/console")) or p == "/" for p, _ in paths
    )
    more = _paths(
        render(
            sets={
                **sets,
                "exposure.docs": True,
                "exposure.console": True,
                "exposure.extraPathPrefixes[0]": "/extra",
            }
        ),
        kind,
    )
    assert more == PUBLIC | {
        ("/docs", "Prefix"), ("/redoc", "Exact"), ("/openapi.json", "Exact"),
        ("/console", "Prefix"), ("/extra", "Prefix"),
    }  # fmt: skip


def _paths(objs: list[dict[str, Any]], kind: str) -> set[tuple[str, str]]:
    if kind == "ingress":
        (ingress,) = by_kind(objs, "Ingress")
        return _ingress_paths(ingress)
    (route,) = by_kind(objs, "HTTPRoute")
    return _route_paths(route)


def test_a_host_over_plain_http_fails_unless_asked_for() -> None:
    ing = {**URLS, **PROXIES, "ingress.enabled": True, "ingress.host": "exports.example.com"}
    assert "plain HTTP" in render_error(sets=ing)
    assert by_kind(render(sets={**ing, "ingress.allowInsecureHost": True}), "Ingress")
    tls = {**ing, "ingress.tls.enabled": True, "ingress.tls.secretName": "cert"}
    (ingress,) = by_kind(render(sets=tls), "Ingress")
    assert ingress["spec"]["tls"][0]["hosts"] == ["exports.example.com"]
    route = {
        **URLS,
        **PROXIES,
        "httpRoute.enabled": True,
        "httpRoute.parentRefs[0].name": "gw",
        "httpRoute.hostnames[0]": "exports.example.com",
    }
    assert "plain HTTP" in render_error(sets=route)
    for opt in ("httpRoute.listenerTLS", "httpRoute.allowInsecureHost"):
        (r,) = by_kind(render(sets={**route, opt: True}), "HTTPRoute")
        assert r["spec"]["hostnames"] == ["exports.example.com"]


def test_a_route_needs_a_gateway() -> None:
    assert "parentRefs is required" in render_error(sets={**URLS, "httpRoute.enabled": True})


def test_without_an_image_tag_rendering_says_what_to_do() -> None:
    err = render_error(sets={**URLS, "image.tag": ""})
    assert "image.tag" in err and "no notes-exports image is published" in err


def _artifact_pods(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        obj["metadata"]["name"]: spec
        for obj, spec in pod_specs(objs)
        if any(v.get("name") == "artifacts" for v in spec.get("volumes", []))
    }


def test_a_read_write_once_claim_puts_every_pod_that_mounts_it_on_one_node() -> None:
    objs = render(sets=URLS)
    (pvc,) = by_kind(objs, "PersistentVolumeClaim")
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    mounting = _artifact_pods(objs)
    assert len(mounting) >= 4
    for name, spec in mounting.items():
        (term,) = spec["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == "kubernetes.io/hostname", name
        assert term["labelSelector"]["matchLabels"]["notes-exports/artifacts"] == "true"
    for d in by_kind(objs, "Deployment"):
        labels = d["spec"]["template"]["metadata"]["labels"]
        assert (labels.get("notes-exports/artifacts") == "true") == (
            d["metadata"]["name"] in mounting
        )
    rwx = render(sets={**URLS, "artifacts.persistence.accessModes[0]": "ReadWriteMany"})
    assert all("affinity" not in s for s in _artifact_pods(rwx).values())
    assert "ReadWriteOncePod cannot work" in render_error(
        sets={**URLS, "artifacts.persistence.accessModes[0]": "ReadWriteOncePod"}
    )


def test_metrics_have_their_own_port_and_service_for_every_process() -> None:
    objs = render([CHART / "ci" / "production-values.yaml"])
    config = by_kind(objs, "ConfigMap")[0]["data"]
    assert config["METRICS_BIND_ADDRESS"] == "0.0.0.0" and config["METRICS_PORT"] == "9100"
    for d in by_kind(objs, "Deployment"):
        (ctr,) = d["spec"]["template"]["spec"]["containers"]
        assert {"name": "metrics", "containerPort": 9100, "protocol": "TCP"} in ctr["ports"]
        component = d["metadata"]["labels"]["app.kubernetes.io/component"]
        svc = find(objs, "Service", f"{d['metadata']['name']}-metrics")
        assert svc["spec"]["ports"][0]["targetPort"] == "metrics"
        monitor = find(objs, "ServiceMonitor", d["metadata"]["name"])
        assert monitor["spec"]["endpoints"][0]["port"] == "metrics", component
    api_service = find(objs, "Service", "rel-notes-exports-api")
    assert [p["name"] for p in api_service["spec"]["ports"]] == ["http"]


def test_helm_test_keeps_its_pod_so_logs_can_be_read() -> None:
    """`helm test --logs` (make deploy, make cluster-deploy) reads the test pod's output
    after it finished: a hook-succeeded delete policy removed it first and the command failed
    on the real cluster although the test had passed."""
    (pod,) = [o for o in render(sets=URLS) if o["kind"] == "Pod"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    policy = pod["metadata"]["annotations"]["helm.sh/hook-delete-policy"].split(",")
    assert "hook-succeeded" not in policy and "before-hook-creation" in policy
