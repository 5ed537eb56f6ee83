"""The platform around the pods on the test cluster, installed from the projects' own
manifests where they publish them (the Go module zips carry them), with this machine's
images (``addons.addon_images``):

- **Traefik** (namespace ``traefik``) as the Gateway API controller: its documented RBAC
  (``docs/content/reference/dynamic-configuration/kubernetes-gateway-rbac.yml``), a
  Deployment with ``--providers.kubernetesgateway``, a Service at the fixed address
  ``GATEWAY_SERVICE_IP``, the GatewayClass ``traefik`` and the Gateway ``notes-exports``
  with an HTTP listener (8000) and an HTTPS one (8443) whose certificate is made here for
  that address (its CA in ``.cluster/state/gateway-ca.crt``).
- **KEDA** (namespace ``keda``): ``config/minimal`` of its module rendered by
  ``kubectl kustomize`` (CRDs, RBAC, the operator, the metrics API server and its
  APIService); the operator makes and rotates the certificates itself.
- **Jaeger all-in-one** (namespace ``observability``): OTLP/HTTP on 4318, the query API on
  16686, spans in memory.
- **prometheus-operator** (namespace ``monitoring``): its ``bundle.yaml`` (CRDs, RBAC, the
  operator) with the config reloader image of this machine, and a ``Prometheus`` that
  selects every ServiceMonitor and PrometheusRule (the chart's), evaluating every 5 s.

``deploy_platform`` is idempotent (``kubectl apply``) and returns the seconds of each part.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from devtools.cluster import config as c
from devtools.cluster.build import crds_dir
from devtools.cluster.kube import kubectl

Say = Callable[[str], None]
GATEWAY_NAMESPACE = "traefik"
GATEWAY_NAME = "notes-exports"
GATEWAY_HTTP_PORT = 8000
GATEWAY_HTTPS_PORT = 8443
TLS_SECRET = "gateway-tls"
GATEWAY_CONTROLLER = "traefik.io/gateway-controller"
GATEWAY_CA = c.PKI / "ca.crt"
_DEFAULT_CERT_DIR = "/etc/traefik/dynamic"
_DEFAULT_CERT_FILE = "default-certificate.yaml"
_GATEWAY_TLS_DIR = "/etc/traefik/gateway-tls"
JAEGER_NAMESPACE = "observability"
MONITORING_NAMESPACE = "monitoring"
KEDA_NAMESPACE = "keda"


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads a bare ``=`` as the string it is (YAML 1.1 gives it the
    ``value`` tag, which PyYAML cannot construct; prometheus-operator's CRDs list it as an
    enum value)."""


_Loader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: node.value)


def load_all(text: str) -> list[dict[str, Any]]:
    """The non-empty documents of a YAML stream."""
    return [d for d in yaml.load_all(text, Loader=_Loader) if d]


def apply(docs: list[dict[str, Any]], *, server_side: bool = False) -> None:
    """kubectl apply of objects (server-side for the large CRDs)."""
    extra = ["--server-side", "--force-conflicts"] if server_side else []
    kubectl("apply", *extra, "-f", "-", input=yaml.safe_dump_all(docs), timeout=300)


def rollout(namespace: str, what: str, timeout: int = 300) -> None:
    """Wait for a Deployment or StatefulSet to be rolled out."""
    kubectl(
        "-n", namespace, "rollout", "status", what, f"--timeout={timeout}s", timeout=timeout + 20
    )


def _namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def _local_images(docs: list[dict[str, Any]], images: dict[str, str]) -> None:
    """Point every container whose image starts with a key of ``images`` at the local
    image, never pulled."""
    for d in docs:
        spec = d.get("spec", {}).get("template", {}).get("spec", {})
        for ctr in spec.get("containers", []) + spec.get("initContainers", []):
            for prefix, local in images.items():
                if ctr.get("image", "").startswith(prefix):
                    ctr["image"], ctr["imagePullPolicy"] = local, "Never"


_RESTRICTED = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def _deployment(
    namespace: str,
    name: str,
    image: str,
    args: list[str],
    ports: dict[str, int],
    probe: dict[str, Any],
    account: str | None = None,
    user: int = 65532,
) -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    **({"serviceAccountName": account} if account else {}),
                    "securityContext": {"runAsUser": user, "runAsGroup": user},
                    "containers": [
                        {
                            "name": name,
                            "image": image,
                            "imagePullPolicy": "Never",
                            "args": args,
                            "ports": [{"name": n, "containerPort": p} for n, p in ports.items()],
                            "readinessProbe": probe,
                            "resources": {
                                "requests": {"cpu": "20m", "memory": "64Mi"},
                                "limits": {"memory": "512Mi"},
                            },
                            "securityContext": _RESTRICTED,
                        }
                    ],
                },
            },
        },
    }


def _service(
    namespace: str, name: str, ports: dict[str, tuple[int, int]], cluster_ip: str | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": {"app.kubernetes.io/name": name},
        "ports": [
            {"name": n, "port": port, "targetPort": target, "protocol": "TCP"}
            for n, (port, target) in ports.items()
        ],
    }
    if cluster_ip:
        spec["clusterIP"] = cluster_ip
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


# --- Traefik: the Gateway API controller ------------------------------------------------------


def gateway_certificate() -> tuple[Path, Path]:
    """The Gateway's serving certificate for its fixed address, signed by the cluster's CA
    (``GATEWAY_CA``, what a client of the HTTPS listener trusts); made once per cluster.
    Returns (certificate, key)."""
    from devtools.cluster.node import issue_certificate

    crt, key = c.PKI / "gateway.crt", c.PKI / "gateway.key"
    if not (crt.is_file() and key.is_file()):
        issue_certificate(
            "gateway", "/CN=notes-exports-gateway", [f"IP:{c.GATEWAY_SERVICE_IP}"], "serverAuth"
        )
    return crt, key


def traefik_manifests() -> list[dict[str, Any]]:
    """Namespace, RBAC (Traefik's documented role), Deployment, Service, GatewayClass,
    Gateway, its certificate Secret, and the file-provider ConfigMap that makes that
    certificate Traefik's default (served to clients that send no SNI)."""
    import base64

    ns = GATEWAY_NAMESPACE
    docs_dir = crds_dir(
        "github.com/traefik/traefik/v3",
        c.TRAEFIK_VERSION,
        "docs/content/reference/dynamic-configuration",
    )
    rbac = [
        d for d in yaml.safe_load_all((docs_dir / "kubernetes-gateway-rbac.yml").read_text()) if d
    ]
    for d in rbac:
        for s in d.get("subjects", []):
            s.update(name="traefik", namespace=ns)
    crt, key = gateway_certificate()
    args = [
        "--providers.kubernetesgateway=true",
        # The address Traefik writes into the Gateway's status. Its ``statusaddress.service``
        # form copies only the Service's status.loadBalancer.ingress, which a ClusterIP
        # Service never has (no load balancer here): the Gateway stayed without an address.
        # The Service's fixed ClusterIP is the address clients use, so it is given as is.
        f"--providers.kubernetesgateway.statusaddress.ip={c.GATEWAY_SERVICE_IP}",
        f"--entrypoints.web.address=:{GATEWAY_HTTP_PORT}",
        f"--entrypoints.websecure.address=:{GATEWAY_HTTPS_PORT}",
        "--entrypoints.traefik.address=:9000",
        # This machine plays the load balancer in front of the Gateway: Traefik keeps the
        # X-Forwarded-For it sends (the "client" address a test names) and appends the
        # peer; from any other peer it replaces the header. The api trusts Traefik's pods
        # (trustedProxies in devtools/cluster/values.yaml), so each client has its own
        # sign-in throttle (tests/cluster/test_cluster.py).
        f"--entrypoints.web.forwardedHeaders.trustedIPs={c.NODE_IP}/32",
        f"--entrypoints.websecure.forwardedHeaders.trustedIPs={c.NODE_IP}/32",
        # The listener's certificate is also Traefik's default one: a client that names
        # the Gateway by its IP sends no SNI (RFC 6066, section 3), and without a default
        # Traefik answers such a handshake with its self-signed "TRAEFIK DEFAULT CERT"
        # (found on the real cluster: the Secret's certificate was served only with SNI).
        f"--providers.file.filename={_DEFAULT_CERT_DIR}/{_DEFAULT_CERT_FILE}",
        "--ping=true",
        "--accesslog=true",
        "--log.level=INFO",
        # no telemetry and no update check: nothing leaves the machine
        "--global.checknewversion=false",
        "--global.sendanonymoususage=false",
    ]
    probe = {"httpGet": {"path": "/ping", "port": 9000}, "periodSeconds": 2}
    deployment = _deployment(
        ns,
        "traefik",
        c.TRAEFIK_IMAGE,
        args,
        {"web": GATEWAY_HTTP_PORT, "websecure": GATEWAY_HTTPS_PORT, "traefik": 9000},
        probe,
        account="traefik",
    )
    pod = deployment["spec"]["template"]["spec"]
    pod["volumes"] = [
        {"name": "default-certificate", "configMap": {"name": "traefik-default-certificate"}},
        {"name": "gateway-tls", "secret": {"secretName": TLS_SECRET}},
    ]
    pod["containers"][0]["volumeMounts"] = [
        {"name": "default-certificate", "mountPath": _DEFAULT_CERT_DIR, "readOnly": True},
        {"name": "gateway-tls", "mountPath": _GATEWAY_TLS_DIR, "readOnly": True},
    ]
    default_certificate = {
        "tls": {
            "stores": {
                "default": {
                    "defaultCertificate": {
                        "certFile": f"{_GATEWAY_TLS_DIR}/tls.crt",
                        "keyFile": f"{_GATEWAY_TLS_DIR}/tls.key",
                    }
                }
            }
        }
    }
    service = _service(
        ns,
        "traefik",
        {
            "web": (GATEWAY_HTTP_PORT, GATEWAY_HTTP_PORT),
            "websecure": (GATEWAY_HTTPS_PORT, GATEWAY_HTTPS_PORT),
        },
        cluster_ip=c.GATEWAY_SERVICE_IP,
    )

    def b64(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    listeners = [
        {"name": "http", "protocol": "HTTP", "port": GATEWAY_HTTP_PORT},
        {
            "name": "https",
            "protocol": "HTTPS",
            "port": GATEWAY_HTTPS_PORT,
            "tls": {
                "mode": "Terminate",
                "certificateRefs": [{"kind": "Secret", "name": TLS_SECRET}],
            },
        },
    ]
    for lst in listeners:
        lst["allowedRoutes"] = {"namespaces": {"from": "All"}}
    return [
        _namespace(ns),
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "traefik", "namespace": ns},
        },
        *rbac,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {"name": TLS_SECRET, "namespace": ns},
            "data": {"tls.crt": b64(crt), "tls.key": b64(key)},
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "traefik-default-certificate", "namespace": ns},
            "data": {_DEFAULT_CERT_FILE: yaml.safe_dump(default_certificate)},
        },
        deployment,
        service,
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GatewayClass",
            "metadata": {"name": "traefik"},
            "spec": {"controllerName": GATEWAY_CONTROLLER},
        },
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": GATEWAY_NAME, "namespace": ns},
            "spec": {"gatewayClassName": "traefik", "listeners": listeners},
        },
    ]


def gateway_programmed() -> bool:
    """True when Traefik reports the Gateway Programmed with the Service's address (False
    while there is no Gateway)."""
    out = kubectl(
        "-n",
        GATEWAY_NAMESPACE,
        "get",
        "gateway",
        GATEWAY_NAME,
        "-o",
        "json",
        "--ignore-not-found",
        check=False,
    )
    if not out.strip():
        return False
    gw = json.loads(out)
    conds = {x["type"]: x["status"] for x in gw.get("status", {}).get("conditions", [])}
    addresses = [a["value"] for a in gw.get("status", {}).get("addresses", [])]
    return conds.get("Programmed") == "True" and c.GATEWAY_SERVICE_IP in addresses


def gateway_url(https: bool = False) -> str:
    """The Gateway's address as its status reports it, with the listener's port."""
    gw = json.loads(kubectl("-n", GATEWAY_NAMESPACE, "get", "gateway", GATEWAY_NAME, "-o", "json"))
    (address,) = {a["value"] for a in gw["status"]["addresses"]}
    if https:
        return f"https://{address}:{GATEWAY_HTTPS_PORT}"
    return f"http://{address}:{GATEWAY_HTTP_PORT}"


# --- KEDA --------------------------------------------------------------------------------------


def keda_manifests() -> list[dict[str, Any]]:
    """KEDA's own ``config/minimal`` (kubectl kustomize), with the local image; the operator
    patches the APIService's CA and skips the admission webhooks, which this install omits."""
    folder = crds_dir("github.com/kedacore/keda/v2", c.KEDA_VERSION, "config/minimal")
    docs = [d for d in yaml.safe_load_all(kubectl("kustomize", str(folder), timeout=120)) if d]
    _local_images(docs, {"ghcr.io/kedacore/": c.KEDA_IMAGE})
    for d in docs:
        if d["kind"] == "Deployment":
            for ctr in d["spec"]["template"]["spec"]["containers"]:
                ctr["resources"] = {
                    "requests": {"cpu": "20m", "memory": "64Mi"},
                    "limits": {"memory": "1Gi"},
                }
                if "/keda" in ctr.get("command", []):
                    ctr["args"] = [*ctr.get("args", []), "--enable-webhook-patching=false"]
    return docs


def external_metrics_served() -> bool:
    """True when the aggregated external metrics API answers (KEDA's APIService)."""
    out = kubectl("get", "apiservice", "v1beta1.external.metrics.k8s.io", "-o", "json")
    conds = json.loads(out).get("status", {}).get("conditions", [])
    return any(x["type"] == "Available" and x["status"] == "True" for x in conds)


# --- Jaeger ------------------------------------------------------------------------------------


def jaeger_manifests() -> list[dict[str, Any]]:
    """Jaeger all-in-one with in-memory storage: OTLP/HTTP 4318, query API 16686."""
    ns = JAEGER_NAMESPACE
    probe = {"httpGet": {"path": "/", "port": 14269}, "periodSeconds": 2}
    deployment = _deployment(
        ns,
        "jaeger",
        c.JAEGER_IMAGE,
        ["--memory.max-traces=50000"],
        {"otlp-http": 4318, "query": 16686, "admin": 14269},
        probe,
        user=10001,
    )
    return [
        _namespace(ns),
        deployment,
        _service(ns, "jaeger", {"otlp-http": (4318, 4318), "query": (16686, 16686)}),
    ]


def jaeger_url() -> str:
    """http://<ClusterIP>:16686 of Jaeger's query API."""
    spec = json.loads(kubectl("-n", JAEGER_NAMESPACE, "get", "service", "jaeger", "-o", "json"))[
        "spec"
    ]
    return f"http://{spec['clusterIP']}:16686"


# --- prometheus-operator and Prometheus --------------------------------------------------------


def monitoring_manifests() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(CRDs, everything else): prometheus-operator's bundle.yaml moved to ``monitoring``
    with the local images, Prometheus's example RBAC, and a Prometheus selecting every
    ServiceMonitor and PrometheusRule of every namespace."""
    ns = MONITORING_NAMESPACE
    module = crds_dir(
        "github.com/prometheus-operator/prometheus-operator", c.PROMETHEUS_OPERATOR_VERSION, ""
    )
    bundle = load_all((module / "bundle.yaml").read_text())
    crds = [d for d in bundle if d["kind"] == "CustomResourceDefinition"]
    rest = [d for d in bundle if d["kind"] != "CustomResourceDefinition"]
    for d in rest:
        if "namespace" in d["metadata"]:
            d["metadata"]["namespace"] = ns
        for s in d.get("subjects", []):
            s["namespace"] = ns
        if d["kind"] == "Deployment":
            (ctr,) = d["spec"]["template"]["spec"]["containers"]
            ctr["args"] = [
                a
                for a in ctr["args"]
                if not a.startswith(("--prometheus-config-reloader=", "--kubelet-"))
            ] + [f"--prometheus-config-reloader={c.CONFIG_RELOADER_IMAGE}"]
    _local_images(
        rest, {"quay.io/prometheus-operator/prometheus-operator": c.PROMETHEUS_OPERATOR_IMAGE}
    )
    rbac_dir = module / "example" / "rbac" / "prometheus"
    rbac = [
        d
        for f in sorted(rbac_dir.glob("*.yaml"))
        for d in yaml.safe_load_all(f.read_text())
        if d and d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")
    ]
    for d in rbac:
        d["metadata"]["namespace"] = ns
        for s in d.get("subjects", []):
            s["namespace"] = ns
    prometheus = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "Prometheus",
        "metadata": {"name": "prometheus", "namespace": ns},
        "spec": {
            "image": c.PROMETHEUS_IMAGE,
            "version": c.PROMETHEUS_VERSION,
            "replicas": 1,
            "serviceAccountName": "prometheus",
            # test: short intervals, so the drills see alerts within seconds of the rules
            "scrapeInterval": "5s",
            "evaluationInterval": "5s",
            "serviceMonitorSelector": {},
            "serviceMonitorNamespaceSelector": {},
            "ruleSelector": {},
            "ruleNamespaceSelector": {},
            "retention": "2h",
            "resources": {
                "requests": {"cpu": "20m", "memory": "128Mi"},
                "limits": {"memory": "1Gi"},
            },
            "securityContext": {
                "runAsUser": 65534,
                "runAsGroup": 65534,
                "fsGroup": 65534,
                "runAsNonRoot": True,
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "prometheus", "namespace": ns},
        "spec": {
            "selector": {"app.kubernetes.io/name": "prometheus"},
            "ports": [{"name": "web", "port": 9090, "targetPort": 9090}],
        },
    }
    return crds, [_namespace(ns), *rest, *rbac, prometheus, service]


def prometheus_url() -> str:
    """http://<ClusterIP>:9090 of the test cluster's Prometheus."""
    spec = json.loads(
        kubectl("-n", MONITORING_NAMESPACE, "get", "service", "prometheus", "-o", "json")
    )["spec"]
    return f"http://{spec['clusterIP']}:9090"


# --- all of it ---------------------------------------------------------------------------------


def _wait(what: str, probe: Callable[[], bool], timeout: float) -> None:
    from devtools.cluster.node import wait_until

    wait_until(what, probe, timeout)


def _install_monitoring() -> None:
    crds, rest = monitoring_manifests()
    apply(crds, server_side=True)
    names = [f"crd/{d['metadata']['name']}" for d in crds]
    kubectl("wait", "--for=condition=Established", "--timeout=120s", *names, timeout=140)
    apply(rest, server_side=True)
    rollout(MONITORING_NAMESPACE, "deployment/prometheus-operator")
    _wait(
        "the Prometheus StatefulSet",
        lambda: bool(kubectl("-n", MONITORING_NAMESPACE, "get", "statefulset",
                             "prometheus-prometheus", "-o", "name", check=False)),
        120,
    )  # fmt: skip
    rollout(MONITORING_NAMESPACE, "statefulset/prometheus-prometheus")


def _install_keda() -> None:
    docs = keda_manifests()
    apply(docs, server_side=True)
    # The Deployments its manifests name (the operator, keda-metrics-apiserver): the Helm
    # chart's name for the latter, keda-operator-metrics-apiserver, is not what
    # config/minimal makes (found by the first install on the real kubelet).
    for d in docs:
        if d["kind"] == "Deployment":
            rollout(KEDA_NAMESPACE, f"deployment/{d['metadata']['name']}")
    _wait("the external metrics API (KEDA)", external_metrics_served, 180)


def _install_jaeger() -> None:
    apply(jaeger_manifests())
    rollout(JAEGER_NAMESPACE, "deployment/jaeger")


def _install_traefik() -> None:
    apply(traefik_manifests())
    rollout(GATEWAY_NAMESPACE, "deployment/traefik")
    _wait("the Gateway to be Programmed", gateway_programmed, 120)


# (name, the images it runs, install): installed in this order, each until Ready.
PARTS: tuple[tuple[str, tuple[str, ...], Callable[[], None]], ...] = (
    ("monitoring", (c.PROMETHEUS_OPERATOR_IMAGE, c.CONFIG_RELOADER_IMAGE, c.PROMETHEUS_IMAGE),
     _install_monitoring),
    ("keda", (c.KEDA_IMAGE,), _install_keda),
    ("jaeger", (c.JAEGER_IMAGE,), _install_jaeger),
    ("traefik", (c.TRAEFIK_IMAGE,), _install_traefik),
)  # fmt: skip


def missing_parts() -> dict[str, list[str]]:
    """{part: images without a saved archive}: what ``make cluster-images`` has not made
    (its binaries were not built)."""
    from devtools.cluster.build import archive_path

    out = {}
    for name, images, _ in PARTS:
        absent = [i for i in images if not archive_path(i).is_file()]
        if absent:
            out[name] = absent
    return out


def deploy_platform(say: Say = print) -> dict[str, Any]:
    """Install every part of the platform whose images exist (prometheus-operator +
    Prometheus, KEDA, Jaeger, Traefik + Gateway), each until Ready; returns the seconds of
    each and the parts left out for want of an image (the tests that need one fail saying
    so). Nothing with ``CLUSTER_PLATFORM=0`` (:func:`devtools.cluster.config.platform_enabled`).
    The Gateway API CRDs come from ``deploy.apply_crds``."""
    took: dict[str, Any] = {}
    if not c.platform_enabled():
        say("the platform is left out (CLUSTER_PLATFORM=0; unset, make cluster-deploy installs it)")
        return {"skipped": "CLUSTER_PLATFORM=0"}
    missing = missing_parts()
    for name, _, install in PARTS:
        if name in missing:
            say(f"platform part {name} left out: no image {missing[name]} (make cluster-images)")
            continue
        say(f"platform part {name}")
        t = time.monotonic()
        install()
        took[name] = round(time.monotonic() - t, 1)
    if missing:
        took["missing"] = missing
    return took
