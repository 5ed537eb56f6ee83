"""Starting and stopping the single-node cluster: network, certificates, etcd, the control
plane, containerd, the kubelet, kube-proxy and CoreDNS — and taking all of it away again.

``up()`` records the machine first (``host.HostState``), then starts each component as a
process of its own session (logs in ``.cluster/logs``, pid files in ``.cluster/state/run``)
and waits until it answers. ``down()`` stops them in reverse order, removes every pod
sandbox (their veths, addresses and network namespaces), kube-proxy's and the kubelet's
iptables chains, the bridge and its route, mounts, cgroups and the host paths the runtime
made, puts back the kernel settings the kubelet changed, and compares the machine with the
record: anything left is reported and makes ``down()`` fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from devtools.cluster import config as c
from devtools.cluster import diagnose
from devtools.cluster.build import app_image_tag, run
from devtools.cluster.host import HostState, leftovers, read_sysctl, sysctl_path
from devtools.cluster.kube import CONTAINERD_SOCK, crictl, kubectl
from devtools.waiting import wait_for

Say = Callable[[str], None]
RUN = c.STATE / "run"
COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "containerd",
    "kubelet",
    "kube-proxy",
)
REQUIRED = {
    "etcd": "etcd-server",
    "containerd": "containerd",
    "runc": "runc",
    "ctr": "containerd",
    "iptables": "iptables",
    "ip6tables": "iptables",
    "openssl": "openssl",
    "buildah": "buildah",
    "debootstrap": "debootstrap",
    "conntrack": "conntrack",
}
CNI_PLUGINS = Path("/usr/lib/cni")


# --- small helpers ---------------------------------------------------------------------------


def wait_until(
    what: str, probe: Callable[[], bool], timeout: float, log: Path | None = None
) -> float:
    """Poll ``probe`` (every 0.3 s; any error it raises means "not yet") until it is true;
    returns the seconds waited. On timeout raises RuntimeError with the tail of ``log``."""

    def tail() -> str:
        if log is None or not log.is_file():
            return ""
        lines = log.read_text(errors="replace").splitlines()
        return "\n".join([x for x in lines if "stats.go" not in x][-20:])

    t0 = time.monotonic()
    wait_for(
        probe,
        timeout,
        f"{what} to be ready",
        interval=0.3,
        retry_on=(Exception,),
        detail=tail,
        error=RuntimeError,
    )
    return time.monotonic() - t0


def pid_of(name: str) -> int | None:
    """The pid of a running component, from its pid file."""
    try:
        pid = int((RUN / f"{name}.pid").read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def start(name: str, cmd: Sequence[str | Path], env: dict[str, str] | None = None) -> int:
    """Start a component in its own session, output to ``.cluster/logs/<name>.log``."""
    RUN.mkdir(parents=True, exist_ok=True)
    c.LOGS.mkdir(parents=True, exist_ok=True)
    log = open(c.LOGS / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [str(x) for x in cmd],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, **(env or {})},
        cwd=c.STATE,
    )
    log.close()
    (RUN / f"{name}.pid").write_text(str(proc.pid))
    return proc.pid


def stop(name: str, timeout: float = 15.0) -> None:
    """TERM a component, KILL it after ``timeout`` seconds."""
    pid = pid_of(name)
    if pid is None:
        (RUN / f"{name}.pid").unlink(missing_ok=True)
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        while _alive(pid):
            time.sleep(0.05)
    (RUN / f"{name}.pid").unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):
        # our own child is reaped by nobody else: a zombie is gone for our purpose
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            return False
    return True


def ip(*args: str, check: bool = True) -> None:
    """Run ``ip ARGS``."""
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


def write_sysctl(key: str, value: str) -> None:
    """Set one kernel setting."""
    sysctl_path(key).write_text(value + "\n")


# --- certificates ------------------------------------------------------------------------------


def _openssl(*args: str | Path) -> None:
    run(["openssl", *args])


def issue_certificate(
    name: str, subject: str, sans: Sequence[str] = (), usage: str = "clientAuth"
) -> None:
    """An EC P-256 key and a certificate signed by the cluster CA: ``<PKI>/<name>.key`` and
    ``.crt``, valid 30 days, ``sans`` as openssl names them (``IP:10.96.0.80``), ``usage``
    the extended key usage (``clientAuth`` or ``serverAuth``)."""
    key, csr, crt = (c.PKI / f"{name}.{ext}" for ext in ("key", "csr", "crt"))
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", key)
    _openssl("req", "-new", "-key", key, "-subj", subject, "-out", csr)
    ext = c.PKI / f"{name}.ext"
    lines = [
        "basicConstraints=CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={usage}",
    ]
    if sans:
        lines.append("subjectAltName=" + ",".join(sans))
    ext.write_text("\n".join(lines) + "\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        csr,
        "-CA",
        c.PKI / "ca.crt",
        "-CAkey",
        c.PKI / "ca.key",
        "-CAcreateserial",
        "-days",
        "30",
        "-sha256",
        "-extfile",
        ext,
        "-out",
        crt,
    )
    csr.unlink()
    ext.unlink()


def make_pki() -> None:
    """A CA, serving certificates for the apiserver and the kubelet, client certificates for
    every component and the admin, and the service-account signing key pair."""
    c.PKI.mkdir(parents=True, exist_ok=True)
    os.chmod(c.PKI, 0o700)
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", c.PKI / "ca.key")
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        c.PKI / "ca.key",
        "-subj",
        "/CN=notes-exports-test-ca",
        "-days",
        "30",
        "-sha256",
        "-out",
        c.PKI / "ca.crt",
    )
    apiserver_sans = [
        f"IP:{c.NODE_IP}",
        f"IP:{c.KUBERNETES_SERVICE_IP}",
        "IP:127.0.0.1",
        "DNS:localhost",
        "DNS:kubernetes",
        "DNS:kubernetes.default",
        "DNS:kubernetes.default.svc",
        f"DNS:kubernetes.default.svc.{c.CLUSTER_DOMAIN}",
    ]
    issue_certificate("apiserver", "/CN=kube-apiserver", apiserver_sans, "serverAuth")
    issue_certificate(
        "kubelet-serving",
        f"/O=system:nodes/CN=system:node:{c.NODE_NAME}",
        [f"IP:{c.NODE_IP}", f"DNS:{c.NODE_NAME}"],
        "serverAuth",
    )
    issue_certificate(
        "apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client"
    )
    issue_certificate("admin", "/O=system:masters/CN=notes-exports-admin")
    issue_certificate("controller-manager", "/CN=system:kube-controller-manager")
    issue_certificate("scheduler", "/CN=system:kube-scheduler")
    issue_certificate("kube-proxy", "/CN=system:kube-proxy")
    issue_certificate("kubelet", f"/O=system:nodes/CN=system:node:{c.NODE_NAME}")
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", c.PKI / "sa.key")
    _openssl("ec", "-in", c.PKI / "sa.key", "-pubout", "-out", c.PKI / "sa.pub")
    # The aggregation layer (KEDA's metrics API server is an APIService): the apiserver
    # proxies to it with this client certificate and the X-Remote-* headers, which the
    # extension server trusts because the requestheader CA signed it.
    issue_certificate("front-proxy-client", "/CN=front-proxy-client")


def kubeconfig(path: Path, user: str) -> None:
    """A kubeconfig for ``user`` (its certificate in the PKI folder)."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "notes-exports",
                "cluster": {
                    "server": c.APISERVER_URL,
                    "certificate-authority": str(c.PKI / "ca.crt"),
                },
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": str(c.PKI / f"{user}.crt"),
                    "client-key": str(c.PKI / f"{user}.key"),
                },
            }
        ],
        "contexts": [
            {"name": "notes-exports", "context": {"cluster": "notes-exports", "user": user}}
        ],
        "current-context": "notes-exports",
    }
    path.write_text(yaml.safe_dump(doc))


# --- configuration files ------------------------------------------------------------------------


def containerd_config() -> Path:
    """containerd 1.6 (Debian) for this VM: runc with cgroupfs, oom_score_adj left alone (no
    CAP_SYS_RESOURCE here), our pause image, the CNI plugins of Debian's package, its image
    store under .tools (kept between runs), nothing under /opt or /var/lib."""
    root = c.TOOLS / "containerd"
    state = c.STATE / "containerd"
    cfg = f"""version = 2
root = "{root}"
state = "{state}"
disabled_plugins = [
  "io.containerd.internal.v1.opt",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
]

[grpc]
  address = "{CONTAINERD_SOCK}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{c.PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "/usr/bin/runc"
        Root = "{state}/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_PLUGINS}"
    conf_dir = "{c.STATE}/cni/net.d"
    max_conf_num = 1
"""
    path = c.STATE / "containerd.toml"
    path.write_text(cfg)
    return path


def cni_config() -> None:
    """The pod network: the project's bridge (created by ``up``, which gives it the node
    address), addresses from host-local IPAM, a route to the Service range and nothing else
    (no default route: a pod reaches only the cluster), no masquerade, no port mapping."""
    netd = c.STATE / "cni" / "net.d"
    netd.mkdir(parents=True, exist_ok=True)
    conf = {
        "cniVersion": "1.0.0",
        "name": "notes-exports",
        "plugins": [
            {
                "type": "bridge",
                "bridge": c.BRIDGE,
                "isGateway": False,
                "isDefaultGateway": False,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(c.STATE / "cni" / "ipam"),
                    "ranges": [
                        [
                            {
                                "subnet": c.POD_CIDR,
                                "rangeStart": c.POD_RANGE[0],
                                "rangeEnd": c.POD_RANGE[1],
                                "gateway": c.NODE_IP,
                            }
                        ]
                    ],
                    "routes": [{"dst": c.SERVICE_CIDR, "gw": c.NODE_IP}],
                },
            }
        ],
    }
    (netd / "10-notes-exports.conflist").write_text(json.dumps(conf, indent=2))


def kubelet_config() -> Path:
    """KubeletConfiguration for this VM: cgroup v1 allowed (failCgroupV1: false), cgroupfs,
    no swap check, everything it serves on the node address or loopback, its files under
    .cluster, image garbage collection and disk evictions out of the way of a test run."""
    doc = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": c.NODE_IP,
        "port": c.KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": c.KUBELET_HEALTHZ_PORT,
        "tlsCertFile": str(c.PKI / "kubelet-serving.crt"),
        "tlsPrivateKeyFile": str(c.PKI / "kubelet-serving.key"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(c.PKI / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCK}",
        "clusterDNS": [c.DNS_SERVICE_IP],
        "clusterDomain": c.CLUSTER_DOMAIN,
        "resolvConf": "",
        "podLogsDir": str(c.STATE / "pod-logs"),
        "volumePluginDir": str(c.STATE / "kubelet-plugins"),
        "maxPods": 80,
        "serializeImagePulls": False,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "shutdownGracePeriod": "0s",
        "registerNode": True,
    }
    path = c.STATE / "kubelet.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def kube_proxy_config() -> Path:
    """kube-proxy in iptables mode, limited to the cluster: node ports only on the node
    address (never on loopback or the machine's own interface), no conntrack sysctls
    rewritten, health and metrics on loopback."""
    doc = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(c.STATE / "kube-proxy.kubeconfig")},
        "mode": "iptables",
        "clusterCIDR": c.POD_CIDR,
        "hostnameOverride": c.NODE_NAME,
        "bindAddress": c.NODE_IP,
        "healthzBindAddress": f"127.0.0.1:{c.KUBE_PROXY_HEALTHZ_PORT}",
        "metricsBindAddress": f"127.0.0.1:{c.KUBE_PROXY_METRICS_PORT}",
        "nodePortAddresses": [f"{c.NODE_IP}/32"],
        "detectLocalMode": "ClusterCIDR",
        "iptables": {"localhostNodePorts": False, "masqueradeAll": False, "minSyncPeriod": "1s"},
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
            "udpTimeout": "0s",
            "udpStreamTimeout": "0s",
        },
    }
    path = c.STATE / "kube-proxy.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


# --- network -------------------------------------------------------------------------------------


def network_up() -> None:
    """The bridge with the node address, the Service range routed onto it, forwarding on
    the bridge only (the machine-wide ip_forward stays as it is), and a firewall chain of
    our own that drops anything forwarded between the bridge and any other interface."""
    ip("link", "add", c.BRIDGE, "type", "bridge")
    with contextlib.suppress(OSError):
        write_sysctl(f"net.ipv6.conf.{c.BRIDGE}.disable_ipv6", "1")
    prefix = c.POD_CIDR.split("/")[1]
    ip("addr", "add", f"{c.NODE_IP}/{prefix}", "dev", c.BRIDGE)
    ip("link", "set", c.BRIDGE, "up")
    ip("route", "add", c.SERVICE_CIDR, "dev", c.BRIDGE, "src", c.NODE_IP)
    write_sysctl(f"net.ipv4.conf.{c.BRIDGE}.forwarding", "1")
    ipt = ["iptables", "-w", "5"]
    run([*ipt, "-N", c.FORWARD_CHAIN])
    run([*ipt, "-A", c.FORWARD_CHAIN, "-i", c.BRIDGE, "!", "-o", c.BRIDGE, "-j", "DROP"])
    run([*ipt, "-A", c.FORWARD_CHAIN, "-o", c.BRIDGE, "!", "-i", c.BRIDGE, "-j", "DROP"])
    run([*ipt, "-I", "FORWARD", "1", "-j", c.FORWARD_CHAIN])


def _delete_chains(family: str, prefixes: tuple[str, ...]) -> None:
    """Remove every rule that jumps to a chain named with ``prefixes`` and those chains —
    never a rule or chain of anyone else, never a flush of a built-in chain."""
    table = ""
    jumps: list[tuple[str, str]] = []
    chains: list[tuple[str, str]] = []
    save = subprocess.run([f"{family}-save"], capture_output=True, text=True).stdout
    for line in save.splitlines():
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith(":"):
            name = line[1:].split()[0]
            if name.startswith(prefixes):
                chains.append((table, name))
        elif line.startswith("-A"):
            parts = line.split()
            target = parts[parts.index("-j") + 1] if "-j" in parts else ""
            if not parts[1].startswith(prefixes) and target.startswith(prefixes):
                jumps.append((table, line[3:]))
    for tbl, spec in jumps:
        subprocess.run(f"{family} -w 5 -t {tbl} -D {spec}", shell=True, capture_output=True)
    for tbl, name in chains:
        subprocess.run([family, "-w", "5", "-t", tbl, "-F", name], capture_output=True)
    for tbl, name in chains:
        subprocess.run([family, "-w", "5", "-t", tbl, "-X", name], capture_output=True)


def network_down() -> None:
    """Take away the veths left on the bridge, the bridge (with its address and route),
    our chain, and kube-proxy's and the kubelet's chains in both families."""
    links = subprocess.run(
        ["ip", "-o", "link", "show", "master", c.BRIDGE], capture_output=True, text=True
    ).stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        ip("link", "del", name, check=False)
    ip("link", "del", c.BRIDGE, check=False)
    for family in ("iptables", "ip6tables"):
        _delete_chains(family, ("KUBE-", c.FORWARD_CHAIN))


# --- components --------------------------------------------------------------------------------


def _https_ok(url: str, cert: str | None = "admin") -> bool:
    """GET ``url`` over TLS: verified against the cluster CA with a client certificate, or
    (``cert=None``, the components' self-signed health endpoints on loopback) unverified."""
    if cert:
        ctx = ssl.create_default_context(cafile=str(c.PKI / "ca.crt"))
        ctx.load_cert_chain(str(c.PKI / f"{cert}.crt"), str(c.PKI / f"{cert}.key"))
    else:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    r = httpx.get(url, timeout=5, verify=ctx)
    if r.status_code != 200:
        raise RuntimeError(f"{url}: {r.status_code} {r.text[-300:]}")
    return True


def start_control_plane(say: Say) -> dict[str, float]:
    """etcd, kube-apiserver, kube-controller-manager and kube-scheduler; seconds each."""
    took: dict[str, float] = {}
    etcd_url = f"http://127.0.0.1:{c.ETCD_CLIENT_PORT}"
    peer_url = f"http://127.0.0.1:{c.ETCD_PEER_PORT}"
    start(
        "etcd",
        [
            "etcd",
            "--name",
            "node",
            "--data-dir",
            c.STATE / "etcd",
            "--listen-client-urls",
            etcd_url,
            "--advertise-client-urls",
            etcd_url,
            "--listen-peer-urls",
            peer_url,
            "--initial-advertise-peer-urls",
            peer_url,
            "--initial-cluster",
            f"node={peer_url}",
            "--log-level",
            "warn",
        ],
    )
    took["etcd"] = wait_until(
        "etcd",
        lambda: httpx.get(f"{etcd_url}/health", timeout=2).status_code == 200,
        30,
        c.LOGS / "etcd.log",
    )
    pki = c.PKI
    start(
        "kube-apiserver",
        [
            c.BIN / "kube-apiserver",
            f"--etcd-servers={etcd_url}",
            f"--bind-address={c.NODE_IP}",
            f"--advertise-address={c.NODE_IP}",
            f"--secure-port={c.APISERVER_PORT}",
            f"--service-cluster-ip-range={c.SERVICE_CIDR}",
            f"--tls-cert-file={pki}/apiserver.crt",
            f"--tls-private-key-file={pki}/apiserver.key",
            f"--client-ca-file={pki}/ca.crt",
            f"--kubelet-client-certificate={pki}/apiserver-kubelet-client.crt",
            f"--kubelet-client-key={pki}/apiserver-kubelet-client.key",
            f"--kubelet-certificate-authority={pki}/ca.crt",
            "--kubelet-preferred-address-types=InternalIP",
            f"--service-account-issuer=https://kubernetes.default.svc.{c.CLUSTER_DOMAIN}",
            f"--service-account-key-file={pki}/sa.pub",
            f"--service-account-signing-key-file={pki}/sa.key",
            "--authorization-mode=Node,RBAC",
            # the aggregation layer (APIServices such as KEDA's external metrics)
            f"--requestheader-client-ca-file={pki}/ca.crt",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki}/front-proxy-client.crt",
            f"--proxy-client-key-file={pki}/front-proxy-client.key",
            "--enable-aggregator-routing=true",
            "--anonymous-auth=false",
            "--profiling=false",
            "--event-ttl=1h",
            "--v=1",
        ],
    )
    took["kube-apiserver"] = wait_until(
        "kube-apiserver",
        lambda: _https_ok(f"{c.APISERVER_URL}/readyz"),
        90,
        c.LOGS / "kube-apiserver.log",
    )
    for user in ("admin", "controller-manager", "scheduler", "kube-proxy", "kubelet"):
        kubeconfig(c.STATE / f"{user}.kubeconfig", user)
    shutil.copy2(c.STATE / "admin.kubeconfig", c.KUBECONFIG)
    start(
        "kube-controller-manager",
        [
            c.BIN / "kube-controller-manager",
            f"--kubeconfig={c.STATE}/controller-manager.kubeconfig",
            f"--authentication-kubeconfig={c.STATE}/controller-manager.kubeconfig",
            f"--authorization-kubeconfig={c.STATE}/controller-manager.kubeconfig",
            "--bind-address=127.0.0.1",
            f"--secure-port={c.CONTROLLER_MANAGER_PORT}",
            f"--service-account-private-key-file={pki}/sa.key",
            f"--root-ca-file={pki}/ca.crt",
            "--use-service-account-credentials=true",
            "--controllers=*,-nodeipam",
            "--allocate-node-cidrs=false",
            # test: the HPA (KEDA's) decides every 5 s, not 15, like KEDA's polling in the
            # test values: the KEDA drill's burst drains in ~15 s once a pod or two run, and
            # one 15 s period could see only its first seconds
            "--horizontal-pod-autoscaler-sync-period=5s",
            f"--service-cluster-ip-range={c.SERVICE_CIDR}",
            "--leader-elect=false",
            "--profiling=false",
            "--v=1",
        ],
    )
    start(
        "kube-scheduler",
        [
            c.BIN / "kube-scheduler",
            f"--kubeconfig={c.STATE}/scheduler.kubeconfig",
            f"--authentication-kubeconfig={c.STATE}/scheduler.kubeconfig",
            f"--authorization-kubeconfig={c.STATE}/scheduler.kubeconfig",
            "--bind-address=127.0.0.1",
            f"--secure-port={c.SCHEDULER_PORT}",
            "--leader-elect=false",
            "--profiling=false",
            "--v=1",
        ],
    )
    took["kube-controller-manager"] = wait_until(
        "kube-controller-manager",
        lambda: _https_ok(f"https://127.0.0.1:{c.CONTROLLER_MANAGER_PORT}/healthz", None),
        60,
        c.LOGS / "kube-controller-manager.log",
    )
    took["kube-scheduler"] = wait_until(
        "kube-scheduler",
        lambda: _https_ok(f"https://127.0.0.1:{c.SCHEDULER_PORT}/healthz", None),
        60,
        c.LOGS / "kube-scheduler.log",
    )
    return took


def import_images(say: Say, app_tag: str | None = None) -> float:
    """Import the saved image archives containerd does not have yet: the cluster's own
    images and the project image of ``app_tag`` (default: this checkout's), never another
    tag's, whose image containerd drops so that its layers can be collected."""
    t0 = time.monotonic()
    app = f"{c.APP_IMAGE_REPO}:{app_tag or app_image_tag()}"
    ctr = ["ctr", "--address", str(CONTAINERD_SOCK), "--namespace", "k8s.io"]
    have = set(
        subprocess.run([*ctr, "images", "ls", "-q"], capture_output=True, text=True).stdout.split()
    )

    def other_tag(name: str) -> bool:
        return name.startswith(f"{c.APP_IMAGE_REPO}:") and name != app

    stale = [n for n in have if other_tag(n)]
    if stale:
        subprocess.run([*ctr, "images", "rm", *stale], capture_output=True)
    for archive in sorted(c.IMAGE_ARCHIVES.glob("*.tar")):
        name = _archive_image_name(archive)
        if name and (name in have or other_tag(name)):
            continue
        say(f"importing {archive.name} into containerd")
        run([*ctr, "images", "import", "--no-unpack", archive])
    return time.monotonic() - t0


def _archive_image_name(archive: Path) -> str | None:
    """The image name saved in a docker-archive: the ``.name`` file written beside it, else
    its manifest.json RepoTags (at the end of the archive: tar reads all of it)."""
    side = archive.with_suffix(".name")
    if side.is_file():
        return side.read_text().strip()
    proc = subprocess.run(["tar", "-xOf", str(archive), "manifest.json"], capture_output=True)
    try:
        tags = json.loads(proc.stdout)[0]["RepoTags"]
    except (ValueError, LookupError, TypeError):
        return None
    return str(tags[0]) if tags else None


def start_node(say: Say) -> dict[str, float]:
    """containerd (with the images imported), the kubelet and kube-proxy; seconds each."""
    took: dict[str, float] = {}
    cni_config()
    cfg = containerd_config()
    start("containerd", ["containerd", "--config", cfg, "--log-level", "warn"])
    took["containerd"] = wait_until(
        "containerd", lambda: bool(crictl("info", timeout=10)), 30, c.LOGS / "containerd.log"
    )
    took["images"] = import_images(say)
    start(
        "kubelet",
        [
            c.BIN / "kubelet",
            f"--config={kubelet_config()}",
            f"--kubeconfig={c.STATE}/kubelet.kubeconfig",
            f"--root-dir={c.STATE}/kubelet",
            f"--node-ip={c.NODE_IP}",
            f"--hostname-override={c.NODE_NAME}",
            "--v=1",
        ],
    )
    start("kube-proxy", [c.BIN / "kube-proxy", f"--config={kube_proxy_config()}", "--v=1"])

    def node_ready() -> bool:
        out = kubectl("get", "node", c.NODE_NAME, "-o", "json", timeout=10)
        conds = json.loads(out)["status"]["conditions"]
        return any(x["type"] == "Ready" and x["status"] == "True" for x in conds)

    took["kubelet"] = wait_until("the node to be Ready", node_ready, 120, c.LOGS / "kubelet.log")
    took["kube-proxy"] = wait_until(
        "kube-proxy",
        lambda: (
            httpx.get(
                f"http://127.0.0.1:{c.KUBE_PROXY_HEALTHZ_PORT}/healthz", timeout=2
            ).status_code
            == 200
        ),
        60,
        c.LOGS / "kube-proxy.log",
    )
    return took


def start_dns(say: Say) -> float:
    """CoreDNS (kube-system), ready to answer for cluster.local."""
    t0 = time.monotonic()
    text = (c.MANIFESTS_DIR / "coredns.yaml").read_text()
    text = text.replace("@COREDNS_IMAGE@", c.COREDNS_IMAGE).replace(
        "@DNS_SERVICE_IP@", c.DNS_SERVICE_IP
    )
    text = text.replace("@CLUSTER_DOMAIN@", c.CLUSTER_DOMAIN)
    kubectl("apply", "-f", "-", input=text)
    kubectl(
        "-n",
        "kube-system",
        "rollout",
        "status",
        "deployment/coredns",
        "--timeout=180s",
        timeout=200,
    )
    return time.monotonic() - t0


# --- up / down ---------------------------------------------------------------------------------


def preflight() -> None:
    """Root, the Debian packages, the CNI plugins, the binaries, the images and the free
    disk the kubelet needs; a RuntimeError that says what to do for what is missing."""
    if os.geteuid() != 0:
        raise RuntimeError("the cluster runs a kubelet and changes the network: run it as root")
    missing = sorted({pkg for tool, pkg in REQUIRED.items() if shutil.which(tool) is None})
    if not (CNI_PLUGINS / "bridge").is_file():
        missing.append("containernetworking-plugins")
    if missing:
        raise RuntimeError(f"missing Debian packages: {' '.join(missing)} (make cluster-packages)")
    for name in ("kube-apiserver", "kubelet", "kube-proxy", "crictl", "coredns"):
        if not (c.BIN / name).is_file():
            raise RuntimeError(f"{c.BIN / name} is missing: run `make cluster-build`")
    if not any(c.IMAGE_ARCHIVES.glob("*pause*.tar")):
        raise RuntimeError("the cluster images are missing: run `make cluster-images`")
    enough, disk = diagnose.disk_report()
    if not enough:
        # The kubelet would report DiskPressure at once (or during the run): it then taints
        # the node, admits no pod and evicts running ones, and a rollout only times out.
        raise RuntimeError(
            f"not enough free disk for the test cluster:\n{disk}\na run needs "
            f"{diagnose.RUN_HEADROOM_BYTES // diagnose.GIB} GiB above that: free some space "
            "(old clones, their .cluster/ and .tools/, `make bench-clean`, `make drills-clean`)"
        )


def is_up() -> bool:
    """True when every component of a cluster started here is running."""
    return all(pid_of(n) is not None for n in COMPONENTS)


def up(say: Say = print) -> dict[str, float]:
    """Start the cluster (idempotent: an already running one is left as it is); returns
    the seconds each step took."""
    if is_up():
        say(f"the cluster is already up (KUBECONFIG={c.KUBECONFIG})")
        return {}
    if any(pid_of(n) is not None for n in COMPONENTS) or c.SNAPSHOT.exists():
        say("a previous cluster was not stopped completely: taking it down first")
        down(say)
    preflight()
    t0 = time.monotonic()
    c.HOME.mkdir(parents=True, exist_ok=True)
    if c.LOGS.is_dir():
        shutil.rmtree(c.HOME / "logs.previous", ignore_errors=True)
        c.LOGS.rename(c.HOME / "logs.previous")
    if Path(f"/sys/class/net/{c.BRIDGE}").exists():
        # Left by a cluster of another checkout that was not taken down (the name is the
        # project's own): its bridge, route and chains go before the machine is recorded.
        say(f"removing the {c.BRIDGE} bridge and KUBE-* chains a previous cluster left")
        network_down()
    HostState.read().save(c.SNAPSHOT)
    took: dict[str, float] = {}
    try:
        c.STATE.mkdir(parents=True, exist_ok=True)
        make_pki()
        network_up()
        took.update(start_control_plane(say))
        took.update(start_node(say))
        took["coredns"] = start_dns(say)
    except BaseException:
        say(f"cluster-up failed; the logs are in {c.LOGS}; taking down what was started")
        with contextlib.suppress(Exception):
            down(say, check=False)
        raise
    took["total"] = time.monotonic() - t0
    say(f"cluster up in {took['total']:.1f} s: export KUBECONFIG={c.KUBECONFIG}")
    return took


def _remove_pods(say: Say) -> None:
    """Stop and remove every pod sandbox (the runtime tears down its network) while
    containerd still runs; the kubelet is already stopped so nothing restarts them."""
    if pid_of("containerd") is None:
        return
    with contextlib.suppress(Exception):
        pods = crictl("pods", "-q", timeout=30).split()
        if pods:
            say(f"removing {len(pods)} pod sandboxes")
            crictl("stopp", *pods, check=False, timeout=120)
            crictl("rmp", "--force", *pods, check=False, timeout=120)


def _kill_shims() -> None:
    """KILL the runc shims of our containerd and whatever still runs in a pod cgroup."""
    marks = (str(c.STATE), str(CONTAINERD_SOCK))
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cgroup = (proc / "cgroup").read_text()
        except OSError:
            continue
        if "kubepods" in cgroup or (
            "containerd-shim" in cmdline and any(m in cmdline for m in marks)
        ):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)


def _unmount_ours() -> None:
    """Lazily unmount, deepest first, every mount below the cluster's folders and the
    runtime's host paths."""
    prefixes = tuple(str(p) for p in (c.HOME, c.TOOLS)) + c.HOST_PATHS + ("/var/run/netns",)
    before = HostState.load(c.SNAPSHOT).mounts if c.SNAPSHOT.exists() else []
    old = {m[0] for m in before}
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if (
            point.startswith(prefixes)
            and point not in old
            and not point.startswith(str(c.BUILDAH_ROOT))
        ):
            points.append(point)
    for point in sorted(set(points), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def _remove_cgroups() -> None:
    """rmdir the kubelet's kubepods groups, leaves first (empty once their tasks are gone)."""
    root = Path("/sys/fs/cgroup")
    for top in [*root.glob("*/kubepods"), root / "kubepods"]:
        if not top.is_dir():
            continue
        dirs = sorted(
            (p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
        )
        for d in [*dirs, top]:
            for _ in range(20):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


def down(say: Say = print, check: bool = True) -> dict[str, Any]:
    """Stop everything ``up`` started and put the machine back as the record says; returns
    what is left over (empty when the machine is as it was). With ``check``, leftovers
    raise."""
    before = HostState.load(c.SNAPSHOT) if c.SNAPSHOT.exists() else None
    stop("kubelet", timeout=10)
    _remove_pods(say)
    stop("containerd", timeout=10)
    _kill_shims()
    stop("kube-proxy", timeout=10)
    if (c.STATE / "kube-proxy.yaml").is_file() and (c.BIN / "kube-proxy").is_file():
        subprocess.run(
            [str(c.BIN / "kube-proxy"), "--cleanup", f"--config={c.STATE / 'kube-proxy.yaml'}"],
            capture_output=True,
            timeout=60,
        )
    for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
        stop(name)
    _unmount_ours()
    network_down()
    _remove_cgroups()
    if before is not None:
        for key, value in before.sysctls.items():
            if value is not None and read_sysctl(key) != value:
                with contextlib.suppress(OSError):
                    write_sysctl(key, value)
        for path, existed in before.paths.items():
            if not existed and os.path.lexists(path):
                _unmount_below(path)
                shutil.rmtree(path, ignore_errors=True)
        for ns in Path("/run/netns").glob("cni-*") if Path("/run/netns").is_dir() else []:
            if ns.name not in before.netns:
                subprocess.run(["umount", "-l", str(ns)], capture_output=True)
                ns.unlink(missing_ok=True)
    shutil.rmtree(c.STATE, ignore_errors=True)
    c.KUBECONFIG.unlink(missing_ok=True)
    left = leftovers(before) if before is not None else {}
    if before is not None:
        (c.HOME / "host-leftovers.json").write_text(json.dumps(left, indent=1) + "\n")
        if not left:
            c.SNAPSHOT.unlink()
    if left:
        say("cluster-down left these behind:\n" + json.dumps(left, indent=1))
        if check:
            raise RuntimeError("the machine is not as it was before cluster-up (see above)")
    else:
        say("cluster down: every process, interface, route, rule and mount it added is gone")
    return left


def _unmount_below(path: str) -> None:
    for line in reversed(Path("/proc/self/mountinfo").read_text().splitlines()):
        point = line.split()[4]
        if point == path or point.startswith(path.rstrip("/") + "/"):
            subprocess.run(["umount", "-l", point], capture_output=True)


def status() -> dict[str, Any]:
    """Which components run (pid), and the node's Ready condition when the API answers."""
    out: dict[str, Any] = {n: pid_of(n) for n in COMPONENTS}
    if out.get("kube-apiserver"):
        with contextlib.suppress(Exception):
            out["nodes"] = kubectl("get", "nodes", "-o", "wide", timeout=10)
    return out
