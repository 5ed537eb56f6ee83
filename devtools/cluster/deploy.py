"""The whole stack on the test cluster, installed the way a user installs it.

``deploy()``: the images imported, the CRDs of the chart's optional objects (Gateway API,
prometheus-operator, KEDA) applied from their Go modules, the laptop PostgreSQL and Redis
of ``k8s/dev-deps.yaml`` (images built from Debian packages in place of Docker Hub's, the
claim of its StatefulSet bound to a hostPath volume as kind's local-path provisioner would),
the moto S3 store and its bucket, then ``helm upgrade --install`` WITH its hooks (the
migration Job) and ``--wait``, then ``helm test``.

``deploy()`` also installs the platform around the pods first (``platform.deploy_platform``:
Traefik as the Gateway controller, KEDA, Jaeger, prometheus-operator and Prometheus) and,
after the install, the read-only role of KEDA's postgresql trigger.

``smoke()``: ``k8s/smoke.sh`` — the walkthrough's own script: a tenant, a key and notes
made inside the api pod, then submit, poll and download with curl from this machine through
the Gateway's address (Traefik, the chart's HTTPRoute), the presigned redirect followed to
the S3 Service.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from devtools.cluster import config as c
from devtools.cluster.build import app_image_tag, build_images, crd_files
from devtools.cluster.diagnose import report
from devtools.cluster.kube import kubectl
from devtools.cluster.node import import_images, is_up, wait_until
from devtools.cluster.platform import deploy_platform
from devtools.stack import ROOT

Say = Callable[[str], None]
NAMESPACE = os.environ.get("K8S_NAMESPACE", "notes-exports")
RELEASE = os.environ.get("RELEASE", "notes-exports")
CHART = ROOT / "charts" / "notes-exports"
VALUES = ROOT / "devtools" / "cluster" / "values.yaml"
HELM = Path(os.environ.get("HELM", ROOT / ".tools" / "bin" / "helm"))
BUCKET = "notes-exports"
# test only: the password devtools/cluster/values.yaml's keda.postgresql.url carries
KEDA_READER_PASSWORD = "keda-test-only"


def helm(*args: str, timeout: float = 900) -> str:
    """The project's pinned helm on the test cluster; returns stdout (raises on failure)."""
    if not HELM.is_file():
        raise RuntimeError(f"{HELM} is missing: run `make helm`")
    proc = subprocess.run(
        [str(HELM), "--kubeconfig", str(c.KUBECONFIG), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"helm {' '.join(args[:3])} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc.stdout


def fullname() -> str:
    """The chart's resource prefix for RELEASE."""
    return RELEASE if "notes-exports" in RELEASE else f"{RELEASE}-notes-exports"


def apply_crds(say: Say) -> None:
    """Apply the CRDs (server-side, as their projects document) and wait until served."""
    for f in crd_files():
        kubectl("apply", "--server-side", "--force-conflicts", "-f", str(f))
    # A CRD just applied may not have a status yet (`kubectl wait` errors then): retry.
    wait_until(
        "the CRDs to be served",
        lambda: bool(
            kubectl(
                "wait", "--for=condition=Established", "--timeout=20s", "crd", "--all", timeout=40
            )
        ),
        150,
    )


def dev_deps_manifest() -> str:
    """k8s/dev-deps.yaml with this machine's images (built from Debian packages, never
    pulled) in place of the Docker Hub ones; nothing else changed."""
    docs = [d for d in yaml.safe_load_all((ROOT / "k8s" / "dev-deps.yaml").read_text()) if d]
    images = {"postgresql": c.POSTGRES_IMAGE, "redis": c.REDIS_IMAGE}
    for d in docs:
        if d["kind"] in ("StatefulSet", "Deployment"):
            for ctr in d["spec"]["template"]["spec"]["containers"]:
                ctr["image"] = images[ctr["name"]]
                ctr["imagePullPolicy"] = "Never"
    return yaml.safe_dump_all(docs)


def dev_redis_password() -> str:
    """The password of the dev Redis's ACL user ``exports``: the Secret ``redis`` of
    k8s/dev-deps.yaml (a fixed test password, as the walkthrough's)."""
    docs = yaml.safe_load_all((ROOT / "k8s" / "dev-deps.yaml").read_text())
    secret = next(
        d for d in docs if d and d["kind"] == "Secret" and d["metadata"]["name"] == "redis"
    )
    return str(secret["stringData"]["REDIS_PASSWORD"])


def postgres_volume() -> str:
    """The PersistentVolume the dev PostgreSQL's claim binds to: a hostPath folder under
    .cluster (owned by its uid 999), reserved for that claim."""
    path = c.STATE / "pv" / "postgresql"
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, 999, 999)
    os.chmod(path, 0o700)
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"{NAMESPACE}-data-postgresql-0"},
        "spec": {
            "capacity": {"storage": "2Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "",
            "claimRef": {"namespace": NAMESPACE, "name": "data-postgresql-0"},
            "hostPath": {"path": str(path), "type": "Directory"},
        },
    }
    return yaml.safe_dump(pv)


def s3_manifest() -> str:
    """The moto S3 store with its fixed Service address."""
    text = (c.MANIFESTS_DIR / "s3.yaml").read_text()
    return text.replace("@S3_SERVICE_IP@", c.S3_SERVICE_IP).replace("@MOTO_IMAGE@", c.MOTO_IMAGE)


@contextlib.contextmanager
def explained(selector: str | None = None) -> Iterator[None]:
    """A RuntimeError raised inside (a rollout or ``helm --wait`` that timed out) is raised
    again with ``diagnose.report`` of the namespace's pods matching ``selector`` appended."""
    try:
        yield
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}\n{report(NAMESPACE, selector)}") from exc


def deploy_dependencies(say: Say) -> None:
    """Namespace, PostgreSQL and Redis (k8s/dev-deps.yaml), the S3 store and its bucket."""
    kubectl("create", "namespace", NAMESPACE, check=False)
    kubectl("apply", "-f", "-", input=postgres_volume())
    kubectl("-n", NAMESPACE, "apply", "-f", "-", input=dev_deps_manifest())
    kubectl("-n", NAMESPACE, "apply", "-f", "-", input=s3_manifest())
    for what in ("statefulset/postgresql", "deployment/redis", "deployment/s3"):
        with explained(f"app.kubernetes.io/name={what.split('/')[1]}"):
            kubectl("-n", NAMESPACE, "rollout", "status", what, "--timeout=300s", timeout=320)
    from devtools.s3 import create_bucket

    # A Ready pod is not yet a routed Service: until kube-proxy has written the new
    # endpoint into its rules, the Service address refuses connections (seen in a CI
    # rehearsal right after the rollout). Retry the bucket until the address answers.
    def bucket_created() -> bool:
        create_bucket(f"http://{c.S3_SERVICE_IP}:9000", BUCKET)
        return True

    wait_until("the S3 Service (its bucket created through it)", bucket_created, 60)


def _clear_interrupted_release() -> None:
    """A release left pending by an interrupted run (helm refuses any operation on it) is
    uninstalled first: this is the throwaway test cluster."""
    proc = subprocess.run(
        [
            str(HELM),
            "--kubeconfig",
            str(c.KUBECONFIG),
            "status",
            RELEASE,
            "-n",
            NAMESPACE,
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode == 0 and json.loads(proc.stdout)["info"]["status"].startswith("pending-"):
        helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "5m")


def install(tag: str, extra: list[str] | None = None, *, wait_timeout: str = "10m") -> str:
    """``helm upgrade --install`` of the chart with its hooks and ``--wait``. Without the
    platform (``CLUSTER_PLATFORM=0``) tracing is off: no trace store runs to send to."""
    _clear_interrupted_release()
    without_platform = [] if c.platform_enabled() else ["--set", "tracing.enabled=false"]
    return helm(
        "upgrade", "--install", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(VALUES),
        "--set-string", f"image.tag={tag}", "--wait", "--timeout", wait_timeout,
        *without_platform, *(extra or []),
    )  # fmt: skip


def deploy(say: Say = print, tag: str | None = None) -> dict[str, Any]:
    """Everything up to a passing ``helm test``; returns the seconds of each step."""
    if not is_up():
        raise RuntimeError("the cluster is not running: make cluster-up")
    took: dict[str, Any] = {}
    t0 = time.monotonic()
    tag = tag or app_image_tag()
    took["images_built"] = build_images(say, tag)
    took["images"] = round(time.monotonic() - t0, 1)
    t = time.monotonic()
    took["import"] = round(import_images(say, tag), 1)
    t = time.monotonic()
    apply_crds(say)
    took["crds"] = round(time.monotonic() - t, 1)
    t = time.monotonic()
    say(f"dependencies in namespace {NAMESPACE}")
    deploy_dependencies(say)
    took["dependencies"] = round(time.monotonic() - t, 1)
    t = time.monotonic()
    say("the platform: Traefik + Gateway, KEDA, Jaeger, prometheus-operator + Prometheus")
    took["platform_steps"] = deploy_platform(say)
    took["platform"] = round(time.monotonic() - t, 1)
    t = time.monotonic()
    say(f"helm upgrade --install {RELEASE} (hooks, --wait), image {c.APP_IMAGE_REPO}:{tag}")
    with explained(f"app.kubernetes.io/instance={RELEASE}"):
        install(tag)
    took["helm_install"] = round(time.monotonic() - t, 1)
    t = time.monotonic()
    create_keda_reader()
    took["keda_reader_role"] = round(time.monotonic() - t, 1)
    t = time.monotonic()
    say("helm test")
    out = helm("test", RELEASE, "-n", NAMESPACE, "--logs")  # exits non-zero when a test fails
    took["helm_test_phase"] = "Succeeded" if "Phase:          Succeeded" in out else "unknown"
    took["helm_test_output"] = out[-600:]
    took["helm_test"] = round(time.monotonic() - t, 1)
    took["total"] = round(time.monotonic() - t0, 1)
    return took


def create_keda_reader() -> None:
    """The read-only role of KEDA's postgresql trigger, made by psql in the PostgreSQL pod
    from the chart's ``files/keda/reader-role.sql`` (as its README says), once the migration
    hook created the table; the password is the one devtools/cluster/values.yaml names."""
    sql = (CHART / "files" / "keda" / "reader-role.sql").read_text()
    exists = kubectl(
        "-n", NAMESPACE, "exec", "statefulset/postgresql", "--", "psql", "-U", "exports",
        "-d", "exports", "-tAc", "SELECT 1 FROM pg_roles WHERE rolname = 'notes_exports_keda'",
    )  # fmt: skip
    if exists.strip() == "1":
        return
    kubectl(
        "-n", NAMESPACE, "exec", "-i", "statefulset/postgresql", "--", "psql", "-U", "exports",
        "-d", "exports", "-v", "ON_ERROR_STOP=1", "-v", f"password={KEDA_READER_PASSWORD}",
        input=sql,
    )  # fmt: skip


def service_url(name: str | None = None, port_name: str = "http") -> str:
    """http://<ClusterIP>:<port> of a Service (reached from this machine through kube-proxy)."""
    svc = name or f"{fullname()}-api"
    out = kubectl("-n", NAMESPACE, "get", "service", svc, "-o", "json")
    spec = json.loads(out)["spec"]
    port = next(p["port"] for p in spec["ports"] if p["name"] == port_name)
    return f"http://{spec['clusterIP']}:{port}"


def smoke(say: Say = print) -> dict[str, Any]:
    """k8s/smoke.sh through the Gateway's address (Traefik) when the Gateway is
    Programmed, else through the api Service; returns what it printed, the URL, the seconds
    of each of its steps and its time."""
    from devtools.cluster.platform import gateway_programmed, gateway_url

    t0 = time.monotonic()
    url = gateway_url() if c.platform_enabled() and gateway_programmed() else service_url()
    tenant = f"smoke-{int(time.time())}"
    say(f"k8s/smoke.sh {url} (tenant {tenant})")
    proc = subprocess.Popen(
        ["bash", str(ROOT / "k8s" / "smoke.sh"), url, NAMESPACE, RELEASE, "notes-exports"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "KUBECONFIG": str(c.KUBECONFIG), "SMOKE_TENANT": tenant},
    )
    assert proc.stderr is not None
    lines, steps, err = [], [], []
    for line in proc.stderr:  # each step's line as it comes: when that step began
        err.append(line)
        if "[smoke]" in line:
            text = line.split("[smoke]", 1)[1].replace("\x1b[0m", "").strip()
            lines.append(line.rstrip())
            steps.append((text[:80], round(time.monotonic() - t0, 2)))
    if proc.wait(timeout=600) != 0:
        raise RuntimeError(f"k8s/smoke.sh failed:\n{''.join(err)[-3000:]}")
    return {"seconds": round(time.monotonic() - t0, 1), "url": url, "steps": lines,
            "step_started_at": steps}  # fmt: skip


def helm_template(values: Path, tag: str, extra: list[str] | None = None) -> str:
    """The chart rendered for the cluster's Kubernetes version with one values file (hooks
    and test pods included)."""
    return helm(
        "template", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(values),
        "--kube-version", c.KUBE_VERSION.lstrip("v"), "--set-string", f"image.tag={tag}",
        *(extra or []),
    )  # fmt: skip


def server_dry_run(manifest: str, namespace: str) -> subprocess.CompletedProcess[str]:
    """``kubectl create --dry-run=server`` of a manifest in ``namespace`` (created first):
    validated and admitted by the API server, nothing stored."""
    kubectl("create", "namespace", namespace, check=False)
    return subprocess.run(
        ["kubectl", "--kubeconfig", str(c.KUBECONFIG), "create", "--dry-run=server", "-n",
         namespace, "-f", "-"],
        input=manifest,
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip


def api_pods_logs() -> str:
    """The logs of every pod of the release (the current containers)."""
    return kubectl(
        "-n", NAMESPACE, "logs", "-l", f"app.kubernetes.io/instance={RELEASE}",
        "--all-containers", "--tail=-1", "--max-log-requests=20",
    )  # fmt: skip
