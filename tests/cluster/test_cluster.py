"""The chart and the image on a real kubelet, in order: every ci values file
checked by the API server, the whole stack installed with its hooks and --wait, helm test,
the smoke test through a Service, the public surface, the drills, and finally
``cluster-down`` leaving the machine as it was.

The tests share one cluster and one release and run in file order; each later step needs
the earlier ones (a failed install fails what follows with that reason).
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest
import yaml

from devtools.cluster import config as c
from devtools.cluster.deploy import (
    CHART,
    NAMESPACE,
    RELEASE,
    api_pods_logs,
    helm_template,
    server_dry_run,
)
from devtools.stack import ROOT

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1800)]
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
# Every process of the chart's components map, by its Kubernetes name (recoveryScanner ->
# recovery-scanner, as the chart's componentName helper does).
COMPONENTS = tuple(
    "".join(f"-{ch.lower()}" if ch.isupper() else ch for ch in key)
    for key in yaml.safe_load((CHART / "values.yaml").read_text())["components"]
)


def test_the_cluster_runs_on_this_machine_only(cluster) -> None:
    from devtools.cluster.kube import kubectl

    node = json.loads(kubectl("get", "node", c.NODE_NAME, "-o", "json"))
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == c.NODE_IP
    assert node["status"]["nodeInfo"]["kubeletVersion"] == c.KUBE_VERSION
    routes = subprocess.run(
        ["ip", "route", "show", "dev", c.BRIDGE], capture_output=True, text=True
    ).stdout
    assert c.SERVICE_CIDR in routes and c.POD_CIDR in routes
    assert Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() == _before(
        "net.ipv4.ip_forward"
    )
    # CoreDNS answers for the cluster and for nothing else: no upstream, no query leaves.
    assert (
        "forward"
        not in (c.MANIFESTS_DIR / "coredns.yaml").read_text().split("Corefile")[1].split("---")[0]
    )


def _in_api(*command: str) -> str:
    """``command`` run in the api Deployment's container (kubectl exec); returns its stdout."""
    from devtools.cluster.kube import kubectl

    return kubectl("-n", NAMESPACE, "exec", f"deploy/{RELEASE}-api", "--", *command)


def _before(key: str) -> str:
    snap = json.loads(c.SNAPSHOT.read_text())
    return str(snap["sysctls"][key])


@pytest.mark.parametrize("values", CI_VALUES, ids=[p.name for p in CI_VALUES])
def test_the_api_server_accepts_every_ci_values_file(cluster, values: Path) -> None:
    """helm template | kubectl create --dry-run=server: every object (hooks and tests
    included) validated and admitted by the real API server, CRDs included."""
    from devtools.cluster.deploy import apply_crds

    if not cluster.shared.get("crds"):
        apply_crds(print)
        cluster.shared["crds"] = True
    rendered = helm_template(values, cluster.tag)
    kinds = {d["kind"] for d in yaml.safe_load_all(rendered) if d}
    result = server_dry_run(rendered, namespace=f"ci-{values.stem.removesuffix('-values')}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Deployment" in kinds and "ConfigMap" in kinds


def test_the_api_server_rejects_what_the_schema_lets_through(cluster) -> None:
    """An invalid CIDR passes values.schema.json and helm's own checks; only the server
    refuses it — which is why the ci files are checked here."""
    rendered = helm_template(
        CHART / "ci" / "production-values.yaml",
        cluster.tag,
        ["--set", "networkPolicy.egress.database.to[0].ipBlock.cidr=10.20.0.0/33"],
    )
    result = server_dry_run(rendered, namespace="ci-invalid")
    assert result.returncode != 0 and "cidr" in result.stderr.lower(), result.stderr[-2000:]


def test_the_walkthrough_manifests_are_accepted_by_the_api_server(cluster) -> None:
    """k8s/dev-deps.yaml, k8s/minio.yaml and k8s/gateway.yaml (with Envoy Gateway's own
    EnvoyProxy CRD from its Go module) as the kind and minikube walkthroughs apply them."""
    from devtools.cluster.build import crds_dir
    from devtools.cluster.kube import kubectl
    from devtools.cluster.node import wait_until

    eg = crds_dir(
        "github.com/envoyproxy/gateway", "v1.9.1", "charts/gateway-helm/charts/crds/crds/generated"
    )
    kubectl("apply", "--server-side", "-f", str(eg / "gateway.envoyproxy.io_envoyproxies.yaml"))
    wait_until(
        "the EnvoyProxy CRD to be served",
        lambda: bool(kubectl("wait", "--for=condition=Established", "--timeout=10s",
                             "crd/envoyproxies.gateway.envoyproxy.io", timeout=20)),
        90,
    )  # fmt: skip
    for manifest, ns in (
        ("dev-deps.yaml", "ci-walkthrough"),
        ("minio.yaml", "ci-walkthrough"),
        ("gateway.yaml", "envoy-gateway-system"),
    ):
        result = server_dry_run((ROOT / "k8s" / manifest).read_text(), namespace=ns)
        assert result.returncode == 0, f"{manifest}: {result.stderr[-2000:]}"


def test_the_whole_stack_installs_with_hooks_and_wait(cluster) -> None:
    """PostgreSQL, Redis and S3 as pods; helm install with the migration hook and --wait:
    every Deployment Ready through its real probes; helm test passes."""
    from devtools.cluster.deploy import deploy
    from devtools.cluster.kube import kubectl

    took = deploy(print, cluster.tag)
    cluster.record("deploy", {k: v for k, v in took.items() if k != "helm_test_output"})
    deployments = json.loads(
        kubectl(
            "-n",
            NAMESPACE,
            "get",
            "deployments",
            "-l",
            f"app.kubernetes.io/instance={RELEASE}",
            "-o",
            "json",
        )
    )["items"]
    names = {d["metadata"]["labels"]["app.kubernetes.io/component"] for d in deployments}
    assert names == set(COMPONENTS)
    for d in deployments:
        assert d["status"].get("readyReplicas") == d["spec"]["replicas"], d["metadata"]["name"]
    assert took["helm_test_phase"] == "Succeeded", took["helm_test_output"]
    cluster.shared["deployed"] = True


def _deployed(cluster) -> None:
    if not cluster.shared.get("deployed"):
        pytest.fail(
            "the stack is not installed (test_the_whole_stack_installs_with_hooks_and_wait failed)"
        )


def test_the_migration_hook_ran_before_the_processes(cluster) -> None:
    """The pre-install hook migrated the database to head (its Job is deleted on success)."""
    _deployed(cluster)
    from devtools.cluster.kube import kubectl

    out = _in_api("python", "-c",
                  "from alembic.config import Config; from alembic.script import ScriptDirectory; "
                  "print(ScriptDirectory.from_config(Config('alembic.ini')).get_current_head())")  # fmt: skip
    head = out.strip()
    version = kubectl(
        "-n",
        NAMESPACE,
        "exec",
        "statefulset/postgresql",
        "--",
        "psql",
        "-U",
        "exports",
        "-d",
        "exports",
        "-tAc",
        "SELECT version_num FROM alembic_version",
    )
    assert version.strip() == head


def test_smoke_with_the_presigned_redirect(cluster) -> None:
    """k8s/smoke.sh (the walkthrough's script) through the Gateway's address (Traefik, the
    chart's HTTPRoute) when the platform runs (unless CLUSTER_PLATFORM=0), else through the api
    Service; then the same by hand: 202, status, a 307 to the S3 Service, the file's sha256
    equal to the ETag."""
    _deployed(cluster)
    from devtools.cluster.deploy import service_url, smoke
    from devtools.cluster.platform import gateway_url

    through_gateway = c.platform_enabled()
    if through_gateway:
        _needs("traefik")
    t = time.monotonic()
    result = smoke(print)
    cluster.record("smoke_steps", {"url": result["url"], "steps": result["step_started_at"]})
    assert any("matches the ETag" in line for line in result["steps"]), result
    if through_gateway:
        assert result["url"] == gateway_url() and c.GATEWAY_SERVICE_IP in result["url"]
    else:
        assert result["url"] == service_url()
    api = result["url"]
    tenant = f"smoke-py-{int(time.time())}"
    _in_api("exportctl", "tenant", "create", tenant)
    key = _in_api("exportctl", "apikey", "create", tenant, "--quiet").strip()
    _in_api("sh", "-c",
            f'd=$(mktemp -d) && printf "# One\\n\\nbody\\n" > $d/one.md && exportctl notes import $d --tenant {tenant}')  # fmt: skip
    auth = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=api, timeout=20) as http:
        r = http.post("/v1/exports", json={"all": True, "format": "json"}, headers=auth)
        assert r.status_code == 202, r.text
        job = r.json()["id"]
        status = ""
        for _ in range(120):
            status = http.get(f"/v1/exports/{job}", headers=auth).json()["status"]
            if status in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(1)
        assert status == "succeeded"
        d = http.get(f"/v1/exports/{job}/download", headers=auth)
    assert d.status_code == 307, d.text
    location = urlparse(d.headers["location"])
    assert location.hostname == c.S3_SERVICE_IP and "X-Amz-Signature" in location.query
    body = httpx.get(d.headers["location"], timeout=20)  # no Authorization to the store
    assert body.status_code == 200
    assert hashlib.sha256(body.content).hexdigest() == d.headers["etag"].strip('"')
    cluster.record("smoke", time.monotonic() - t)


def test_the_public_surface_is_the_api_only(cluster) -> None:
    """The api Service answers /metrics with 404; every process (the api too) serves
    /metrics on its metrics port on the pod address; the HTTPRoute and the Ingress route
    only /v1 and the health checks."""
    _deployed(cluster)
    from devtools.cluster.deploy import service_url
    from devtools.cluster.kube import kubectl

    assert httpx.get(service_url() + "/metrics", timeout=10).status_code == 404
    assert httpx.get(service_url() + "/healthz", timeout=10).status_code == 200
    pods = json.loads(
        kubectl(
            "-n",
            NAMESPACE,
            "get",
            "pods",
            "-l",
            f"app.kubernetes.io/instance={RELEASE}",
            "-o",
            "json",
        )
    )["items"]
    served = {}
    for p in pods:
        comp = p["metadata"]["labels"].get("app.kubernetes.io/component")
        if (
            comp in served
            or p["status"].get("phase") != "Running"
            or comp in (None, "test", "migrations")
        ):
            continue
        r = httpx.get(f"http://{p['status']['podIP']}:9100/metrics", timeout=10)
        served[comp] = r.status_code == 200 and "# TYPE" in r.text
    assert served == dict.fromkeys(COMPONENTS, True)
    route = json.loads(kubectl("-n", NAMESPACE, "get", "httproute", RELEASE, "-o", "json"))
    paths = {m["path"]["value"] for rule in route["spec"]["rules"] for m in rule["matches"]}
    ingress = json.loads(kubectl("-n", NAMESPACE, "get", "ingress", RELEASE, "-o", "json"))
    ipaths = {p["path"] for rule in ingress["spec"]["rules"] for p in rule["http"]["paths"]}
    assert paths == ipaths == {"/v1", "/healthz", "/readyz"}


def test_the_image_starts_cleanly_on_a_read_only_root_filesystem(cluster) -> None:
    """No process logs an error about a path it cannot write (gunicorn's control socket
    under $HOME was one, found by running the pods here)."""
    _deployed(cluster)
    logs = api_pods_logs()
    assert "Control server error" not in logs and "Read-only file system" not in logs, logs[-2000:]


def _needs(*parts: str) -> None:
    """Skip when the platform is left out (``CLUSTER_PLATFORM=0``);
    when it runs, fail (never skip) when a part was left out for want of its image."""
    from devtools.cluster.platform import missing_parts

    if not c.platform_enabled():
        pytest.skip("the platform around the pods is left out (CLUSTER_PLATFORM=0)")

    missing = {p: imgs for p, imgs in missing_parts().items() if p in parts}
    if missing:
        pytest.fail(f"the platform parts {missing} were not built (make cluster-build)")


def _drill(cluster, name: str) -> dict[str, Any]:
    _deployed(cluster)
    from devtools.cluster.drills import run_drills

    (result,) = run_drills(print, [name], out=c.EVIDENCE / "tests")
    cluster.record(f"drill_{name}", result["seconds"])
    evidence = json.loads(Path(result["evidence"]).read_text())
    failed = [ch for ch in evidence["checks"] if not ch["ok"]]
    assert result["verdict"] == "passed", (
        f"{result['reason']}\nfailed checks: {failed}\n{evidence.get('error') or ''}"
    )
    return evidence


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("bulk_pod_delete_warm", id="bulk_pod_delete_is_a_warm_shutdown"),
        pytest.param(
            "bulk_pod_grace_exhausted",
            id="bulk_pod_whose_grace_runs_out_recovers_through_its_lease",
        ),
        pytest.param("rollout_restart_all", id="rollout_restart_of_every_deployment_under_submits"),
        pytest.param("api_pod_delete_under_load", id="api_pod_deleted_under_load"),
        pytest.param("scale_fast_worker_under_load", id="fast_worker_scaled_under_load"),
    ],
)
def test_drill(cluster, name: str) -> None:
    _drill(cluster, name)


def test_the_gateway_routes_only_what_exposure_allows_and_serves_https(cluster) -> None:
    """Through the Gateway: /metrics, /docs and /console answer 404 while exposure.* is
    off; with exposure.console on, behind the HTTPS listener (a certificate made for the
    test), the console signs in and its session cookie is Secure."""
    _deployed(cluster)
    _needs("traefik")
    from devtools.cluster.deploy import install
    from devtools.cluster.platform import GATEWAY_CA, gateway_url

    http, https = gateway_url(), gateway_url(https=True)
    for path in ("/metrics", "/docs", "/openapi.json", "/console/login"):
        for base in (http, https):
            r = httpx.get(base + path, timeout=10, verify=str(GATEWAY_CA))
            assert r.status_code == 404, (base + path, r.status_code, r.text[:200])
    assert httpx.get(https + "/healthz", timeout=10, verify=str(GATEWAY_CA)).status_code == 200
    t = time.monotonic()
    install(cluster.tag, ["--reuse-values", "--set", "exposure.console=true"])

    def routed() -> bool:
        r = httpx.get(https + "/console/login", timeout=10, verify=str(GATEWAY_CA))
        return r.status_code == 200

    from devtools.waiting import wait_for

    wait_for(routed, 60, "the console route through the Gateway", interval=0.5)
    cluster.record("console_route_seconds", time.monotonic() - t)
    assert httpx.get(https + "/docs", timeout=10, verify=str(GATEWAY_CA)).status_code == 404
    key = _in_api("exportctl", "operator-key", "create", "--label", "gateway-test", "--quiet")
    with httpx.Client(base_url=https, verify=str(GATEWAY_CA), timeout=20) as client:
        page = client.get("/console/login")
        token = re.search(r'name="login_token" value="([^"]+)"', page.text)
        assert token, page.text[:500]
        r = client.post(
            "/console/login",
            data={"key": key.strip(), "login_token": token.group(1), "next": "/console/"},
            headers={"Origin": https},
        )
        assert r.status_code == 303, r.text[:500]
        session = [v for v in r.headers.get_list("set-cookie") if v.startswith("nex_console=")]
        assert session and "secure" in session[0].lower(), r.headers.get_list("set-cookie")
        assert "httponly" in session[0].lower() and "samesite=strict" in session[0].lower()
        assert client.get("/console/").status_code == 200


def _console_sign_in(client: httpx.Client, key: str) -> httpx.Response:
    page = client.get("/console/login")
    token = re.search(r'name="login_token" value="([^"]+)"', page.text)
    assert token, (page.status_code, page.text[:300])
    return client.post(
        "/console/login",
        data={"key": key, "login_token": token.group(1), "next": "/console/"},
    )


def test_a_throttled_client_does_not_lock_the_others_out_through_the_gateway(cluster) -> None:
    """Through Traefik, a client whose wrong keys are throttled (429) does not lock out
    another client: the api trusts Traefik's pods (trustedProxies, FORWARDED_ALLOW_IPS), so
    each client has its own sign-in bucket. This machine plays the load
    balancer in front of the Gateway: Traefik keeps the X-Forwarded-For it sends
    (devtools/cluster/platform.py) and the two clients differ by it."""
    _deployed(cluster)
    _needs("traefik")
    from devtools.cluster.deploy import install
    from devtools.cluster.platform import gateway_url
    from devtools.waiting import wait_for

    http = gateway_url()
    if httpx.get(http + "/console/login", timeout=10).status_code != 200:
        install(cluster.tag, ["--reuse-values", "--set", "exposure.console=true"])
        wait_for(
            lambda: httpx.get(http + "/console/login", timeout=10).status_code == 200,
            60,
            "the console route through the Gateway",
            interval=0.5,
        )
    key = _in_api("exportctl", "operator-key", "create", "--label", "throttle-test", "--quiet")
    wrong = "nex_op_00000000_" + "w" * 43
    guesser, operator = "203.0.113.66", "198.51.100.77"
    with httpx.Client(base_url=http, timeout=20, headers={"X-Forwarded-For": guesser}) as attacker:
        answers = []
        for _ in range(40):  # CONSOLE_SIGN_IN_BURST (10) and a few more
            answers.append(_console_sign_in(attacker, wrong).status_code)
            if answers[-1] == 429:
                break
        assert answers[-1] == 429 and set(answers[:-1]) == {401}, answers
        assert _console_sign_in(attacker, key.strip()).status_code == 429
    with httpx.Client(base_url=http, timeout=20, headers={"X-Forwarded-For": operator}) as client:
        r = _console_sign_in(client, key.strip())
        assert r.status_code == 303, (r.status_code, r.text[:300])
        assert client.get("/console/").status_code == 200
    # the api saw the clients, not Traefik's address
    logs = api_pods_logs()
    assert guesser in logs and "console sign-in throttled" in logs
    cluster.record("sign_in_attempts_until_throttled", float(len(answers)))


def test_keda_scales_fast_worker_on_the_backlog(cluster) -> None:
    """The drill turns on fast-worker's ScaledObject (trigger postgresql), its pods at the
    chart's CPU limit; three tenants, 500 small and 20 bulk exports, 1 -> at least 3
    replicas within 60 s and back."""
    _deployed(cluster)
    _needs("keda")
    evidence = _drill(cluster, "keda_scales_on_backlog")
    cluster.record("keda_replica_seconds", evidence["observations"]["seconds"])


def test_the_outbox_stuck_alert_fires_and_resolves(cluster) -> None:
    _needs("monitoring")
    evidence = _drill(cluster, "outbox_stuck_alert")
    cluster.record("outbox_alert_seconds", evidence["observations"]["seconds"])


def test_the_recovery_slo_shows_a_killed_workers_recovery(cluster) -> None:
    _needs("monitoring")
    evidence = _drill(cluster, "recovery_slo_after_kill")
    recovered = [j["job_id"] for j in evidence["jobs"] if j["role"] == "job"]
    cluster.shared["recovered_job"] = recovered[0] if recovered else None
    cluster.record("recovery_slo", evidence["observations"].get("prometheus", {}))


def test_one_trace_per_export_in_jaeger(cluster) -> None:
    """Exports submitted through the Gateway, small ones (which a worker's claim may take
    beside another job's message) and a bulk one: each has exactly one trace in Jaeger,
    across the api, publisher (unless a claim took it) and worker pods, its spans carrying
    job_id, message_id and lease_token, its render, write and finish spans children of its
    claim span; the export the recovery drill recovered has the redispatch (or lease expiry)
    and a second claim in its one trace. How many a claim took is recorded."""
    _deployed(cluster)
    _needs("jaeger", "traefik")
    from devtools.cluster.platform import jaeger_url
    from devtools.cluster.platform_drills import check_export_trace

    jaeger = jaeger_url()
    small, big = _gateway_tenant("trace-small", 3), _gateway_tenant("trace-bulk", 40)
    ids = [small.submit_ok({"all": True, "format": "json"}) for _ in range(6)]
    ids.append(big.submit_ok({"all": True, "format": "ndjson"}))
    for job, api in zip(ids, [small] * 6 + [big], strict=True):
        assert api.wait_terminal(job, 180)["status"] == "succeeded"
    problems = {}
    taken = 0
    for job in ids:
        found = check_export_trace(jaeger, job)
        if found["problems"]:
            problems[job] = found
        taken += found["taken_by_claim"]
        cluster.shared.setdefault("trace_example", found)
    cluster.record("trace_taken_by_claim", {"exports": len(ids), "taken_by_claim": taken})
    recovered = cluster.shared.get("recovered_job")
    if recovered:
        found = check_export_trace(jaeger, recovered, recovered=True)
        cluster.record("recovered_trace", {k: v for k, v in found.items() if k != "spans"})
        if found["problems"]:
            problems[recovered] = found
    example = cluster.shared["trace_example"]
    cluster.record("trace_example", example)
    assert not problems, json.dumps(problems, indent=1)[:6000]


def _gateway_tenant(label: str, notes: int) -> Any:
    """A new tenant with ``notes`` notes (made in the api pod) and its key, as an ApiClient
    on the Gateway's address."""
    from devtools.api_client import ApiClient
    from devtools.cluster.platform import gateway_url

    tenant = f"{label}-{int(time.time())}"
    _in_api("exportctl", "tenant", "create", tenant)
    key = _in_api("exportctl", "apikey", "create", tenant, "--quiet").strip()
    _in_api("sh", "-c",
            f'd=$(mktemp -d) && for i in $(seq 1 {notes}); do printf "# Note $i\\n\\nbody $i\\n"'
            f' > $d/n$i.md; done && exportctl notes import $d --tenant {tenant}')  # fmt: skip
    return ApiClient(gateway_url(), key)


def test_every_dashboard_panel_query_returns_data(cluster) -> None:
    """Each expr of the chart's dashboards (files/dashboards), run on the test cluster's
    Prometheus after the drills (and a retry, a dead letter and a refused submit made on
    purpose: ``dashboard_panels_answer``), answers at least one sample; every component is
    a target that is up."""
    _deployed(cluster)
    _needs("monitoring")
    from devtools.cluster.platform_drills import Prometheus

    up = Prometheus().targets_up()
    assert all(up.values()) and len(up) >= len(COMPONENTS), up
    evidence = _drill(cluster, "dashboard_panels_answer")
    cluster.record("dashboards", {**evidence["observations"]["dashboards"], "targets_up": up})


def test_cluster_down_leaves_the_machine_as_it_was(cluster) -> None:
    """Every process, interface, route, iptables rule, mount, cgroup, network namespace,
    kernel setting and host path the cluster added is gone."""
    from devtools.cluster.node import down

    t = time.monotonic()
    left = down(print, check=False)
    cluster.record("cluster_down", time.monotonic() - t)
    assert left == {}, json.dumps(left, indent=1)
