"""Versions, paths, address ranges and ports of the test cluster — one place for all of them.

Every address is this machine's own: the control plane listens on 127.0.0.1 or on the node
address of the project's bridge, pods get addresses on that bridge (no uplink, no
masquerade to the outside) and Services live in a range that is routed onto the same bridge,
so a packet to an address of the cluster can never leave the machine.
"""

from __future__ import annotations

import os
from pathlib import Path

from devtools.stack import ROOT

# --- versions (Kubernetes 1.34: kubelet 1.35+ refuses the cgroup v1 hierarchy of this VM) ---
KUBE_VERSION = "v1.34.4"
CRI_TOOLS_VERSION = "v1.34.0"
COREDNS_VERSION = "v1.14.7"
# The Gateway API release Envoy Gateway v1.9 is built against (docs/kubernetes.md).
GATEWAY_API_VERSION = "v1.6.1"
PROMETHEUS_OPERATOR_VERSION = "v0.85.0"
KEDA_VERSION = "v2.21.0"
# The platform around the pods (devtools/cluster/addons.py), built from the Go module proxy.
TRAEFIK_VERSION = "v3.6.12"  # v3.7 does not build from the proxy (a replaced module is not served)
# the module proxy serves v1.76.0 too, but v1.75.0 is the approved release (v1 is past its
# end of life: the v2 binary, ./cmd/jaeger of the same module, is the next step)
JAEGER_VERSION = "v1.75.0"
# Prometheus 3.16: its Go module is versioned v0.316.0.
PROMETHEUS_VERSION = "v3.16.0"
PROMETHEUS_MODULE_VERSION = "v0.316.0"
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = os.environ.get("CLUSTER_DEBIAN_MIRROR", "http://deb.debian.org/debian")

# --- paths -------------------------------------------------------------------------------------
GO_DIR = ROOT / "devtools" / "cluster" / "go"
IMAGES_DIR = ROOT / "devtools" / "cluster" / "images"
MANIFESTS_DIR = ROOT / "devtools" / "cluster" / "manifests"
# Cached between runs (ignored by git): binaries, image archives, buildah storage, CRDs.
TOOLS = Path(os.environ.get("CLUSTER_TOOLS", ROOT / ".tools" / "cluster"))
BIN = TOOLS / "bin"
IMAGE_ARCHIVES = TOOLS / "images"
BUILDAH_ROOT = TOOLS / "buildah"


def platform_enabled() -> bool:
    """True unless ``CLUSTER_PLATFORM=0``: the platform around the pods (Traefik and its
    Gateway, KEDA, Jaeger, prometheus-operator + Prometheus) is built, installed and tested
    by ``make test-cluster``. ``CLUSTER_PLATFORM=0`` leaves it out (the chart on its CRDs
    alone, tracing off; the platform's tests skip): what ``.ci/run`` does on a cold machine
    whose platform build has not finished within its budget (docs/kubernetes.md, "The
    platform around the pods")."""
    return os.environ.get("CLUSTER_PLATFORM", "1") != "0"


# Runtime state of one cluster (ignored by git): removed by `cluster-down`, logs kept.
HOME = Path(os.environ.get("CLUSTER_HOME", ROOT / ".cluster"))
STATE = HOME / "state"
LOGS = HOME / "logs"
PKI = STATE / "pki"
KUBECONFIG = HOME / "kubeconfig"
SNAPSHOT = HOME / "host-before.json"
EVIDENCE = HOME / "evidence"

# --- network (inside this machine only) ----------------------------------------------------------
BRIDGE = "notesexp0"
POD_CIDR = "10.244.0.0/16"
POD_RANGE = ("10.244.0.10", "10.244.0.250")  # addresses handed to pods (host-local IPAM)
NODE_IP = "10.244.0.1"  # the bridge's address: node, gateway, apiserver
SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"
DNS_SERVICE_IP = "10.96.0.10"
# The S3 server's Service has a fixed address so presigned URLs name one the host reaches.
S3_SERVICE_IP = "10.96.0.90"
# The Gateway's Service (Traefik) likewise: its test certificate names this address.
GATEWAY_SERVICE_IP = "10.96.0.80"
CLUSTER_DOMAIN = "cluster.local"
FORWARD_CHAIN = "NOTES-EXPORTS-FWD"

# --- ports (uncommon numbers: other test servers on this machine use the usual ones) --------
ETCD_CLIENT_PORT = 12379
ETCD_PEER_PORT = 12380
APISERVER_PORT = 16443
CONTROLLER_MANAGER_PORT = 11257
SCHEDULER_PORT = 11259
KUBELET_PORT = 11250
KUBELET_HEALTHZ_PORT = 11248
KUBE_PROXY_HEALTHZ_PORT = 11256
KUBE_PROXY_METRICS_PORT = 11249

NODE_NAME = "notes-exports-node"
APISERVER_URL = f"https://{NODE_IP}:{APISERVER_PORT}"

# --- images (all named under localhost/: nothing is ever pulled from a registry) ------------
PAUSE_IMAGE = "localhost/notes-exports-pause:3.10"
COREDNS_IMAGE = f"localhost/notes-exports-coredns:{COREDNS_VERSION}"
PYTHON_IMAGE = f"localhost/notes-exports-python:3.11-{DEBIAN_SUITE}"
POSTGRES_IMAGE = "localhost/notes-exports-postgresql:15"
REDIS_IMAGE = "localhost/notes-exports-redis:7"
MOTO_IMAGE = "localhost/notes-exports-moto:5"
APP_IMAGE_REPO = "localhost/notes-exports"
TRAEFIK_IMAGE = f"localhost/notes-exports-traefik:{TRAEFIK_VERSION}"
KEDA_IMAGE = f"localhost/notes-exports-keda:{KEDA_VERSION}"
JAEGER_IMAGE = f"localhost/notes-exports-jaeger:{JAEGER_VERSION}"
PROMETHEUS_OPERATOR_IMAGE = (
    f"localhost/notes-exports-prometheus-operator:{PROMETHEUS_OPERATOR_VERSION}"
)
CONFIG_RELOADER_IMAGE = (
    f"localhost/notes-exports-prometheus-config-reloader:{PROMETHEUS_OPERATOR_VERSION}"
)
PROMETHEUS_IMAGE = f"localhost/notes-exports-prometheus:{PROMETHEUS_VERSION}"

# Kernel settings the kubelet rewrites on start (container_manager_linux.go) and that
# `cluster-down` puts back as they were.
KUBELET_SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
)
# Host paths the runtime or the kubelet create whatever their configuration says (the
# shim sockets, network namespaces, the container log links).
HOST_PATHS = ("/run/containerd", "/run/netns", "/var/log/containers")
