"""The chart's commands with the s3 backend, against a real S3 server.

``ci/s3-values.yaml`` is rendered with the test PostgreSQL and Redis and with its object
store pointed at the harness's moto server (``s3_server``: moto in server mode, a real HTTP
S3 endpoint, nothing patched). The S3 credentials reach the processes exactly as rendered:
``secretKeyRef`` to the existing Secret ``notes-exports-s3``, which the operator creates (here:
added to the rendered objects with moto's credentials). The api, the publisher, the
recovery-scanner and the fast worker run with that environment: their probes pass, an export
is uploaded under the rendered ``ARTIFACT_URL``, the api redirects its download to a URL
presigned for ``S3_PRESIGN_ENDPOINT_URL``, the scanner's orphan cleanup deletes a planted
orphan object, and ``k8s/smoke.sh`` (with a kubectl stand-in that runs its ``exec`` commands
here) completes end to end.
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import httpx
import pytest

from devtools.s3 import ACCESS_KEY, SECRET_KEY, MotoServer
from devtools.stack import ROOT, Servers
from tests.chart.commands import (
    PREFIX,
    Deployment,
    check_clean_stop,
    check_every_probe,
    launch,
    wait_probe,
)
from tests.chart.conftest import CHART, NAMESPACE, RELEASE, render

pytestmark = [pytest.mark.chart, pytest.mark.e2e]

COMPONENTS = ("api", "publisher", "recoveryScanner", "fastWorker")
S3_SECRET = "notes-exports-s3"
KUBECTL_SHIM = """#!/usr/bin/env bash
# kubectl stand-in for k8s/smoke.sh: `kubectl -n NS [--context C] exec deploy/NAME -- CMD...`
# runs CMD here, in the environment it was started with (the rendered api container's).
while [ $# -gt 0 ]; do
  case "$1" in
    -n|--context) shift 2 ;;
    exec) shift ;;
    deploy/*) echo "$1" >>"$KUBECTL_SHIM_LOG"; shift ;;
    --) shift; exec "$@" ;;
    *) echo "kubectl stand-in: unexpected argument $1" >&2; exit 2 ;;
  esac
done
exit 2
"""


def existing_secret(name: str, data: dict[str, str]) -> dict[str, Any]:
    """The Secret an operator creates before installing (the chart only references it)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "type": "Opaque",
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


@pytest.fixture(scope="module")
def s3_deployment(
    servers: Servers,
    template_db: str,
    notes_dir: Path,
    s3_server: MotoServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Deployment, str, str, Path]]:
    import redis

    db = f"chart_s3_{uuid4().hex[:12]}"
    database_url = servers.create_database(db, template=template_db)
    broker_url = servers.redis_url(0)
    redis.Redis.from_url(broker_url).flushdb()
    bucket = s3_server.create_bucket(f"chart-{uuid4().hex[:12]}")
    # Clients reach the store under another name than the pods: presigned URLs must carry it.
    presign_endpoint = s3_server.endpoint_url.replace("127.0.0.1", "localhost")
    objs = render(
        [CHART / "ci" / "s3-values.yaml"],
        {
            "database.url": database_url,
            "broker.url": broker_url,
            "broker.allowNoPassword": True,  # the test servers' Redis has no password
            "artifacts.s3.bucket": bucket,
            "artifacts.s3.endpointUrl": s3_server.endpoint_url,
            "artifacts.s3.presignEndpointUrl": presign_endpoint,
            "artifacts.s3.region": "us-east-1",
            # The scanner's first hygiene pass deletes the orphan planted below at once.
            "config.ORPHAN_GRACE_SECONDS": "0",
        },
    )
    # An artifact no job publishes (a crashed worker's output, say), for orphan cleanup.
    orphan = f"prod/artifacts/orphan-tenant/{uuid4()}/{uuid4()}.json"
    s3_server.client().put_object(Bucket=bucket, Key=orphan, Body=b"{}")
    objs.append(
        existing_secret(S3_SECRET, {"access-key-id": ACCESS_KEY, "secret-access-key": SECRET_KEY})
    )
    base = tmp_path_factory.mktemp("chart-run-s3")
    try:
        with launch(
            objs, COMPONENTS, base=base, database_url=database_url, notes_dir=notes_dir
        ) as dep:
            yield dep, bucket, orphan, base
    finally:
        servers.drop_database(db)


def test_the_rendered_environment_is_the_s3_backend(s3_deployment) -> None:
    dep, bucket, _, _ = s3_deployment
    for comp in dep.components.values():
        env = comp.env
        assert env["ARTIFACT_URL"] == f"s3://{bucket}/prod/artifacts"
        assert "ARTIFACT_DIR" not in env
        # Resolved from the existing Secret through secretKeyRef, as the kubelet would.
        assert (env["S3_ACCESS_KEY_ID"], env["S3_SECRET_ACCESS_KEY"]) == (ACCESS_KEY, SECRET_KEY)
        refs = {
            e["name"]: e["valueFrom"]["secretKeyRef"]
            for e in comp.container["env"]
            if e["name"].startswith("S3_")
        }
        assert {r["name"] for r in refs.values()} == {S3_SECRET}, refs


@pytest.mark.parametrize("key", COMPONENTS)
def test_every_probe_passes_with_the_s3_backend(s3_deployment, key: str) -> None:
    dep: Deployment = s3_deployment[0]
    check_every_probe(dep.components[key])


def wait_succeeded(client: httpx.Client, job_id: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = client.get(f"/v1/exports/{job_id}").json()
        if body["status"] in ("succeeded", "failed", "cancelled"):
            assert body["status"] == "succeeded", body
            return body
        time.sleep(0.3)
    raise AssertionError(f"export {job_id} did not finish in {timeout}s")


def test_an_export_is_uploaded_to_the_bucket_and_downloaded_by_redirect(
    s3_deployment, s3_server: MotoServer
) -> None:
    dep, bucket, _, base = s3_deployment
    headers = {"Authorization": f"Bearer {dep.api_key}"}
    with httpx.Client(base_url=dep.api_url(), headers=headers, timeout=10) as client:
        r = client.post("/v1/exports", json={"note_ids": dep.note_ids[:5], "format": "json"})
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        final = wait_succeeded(client, job_id)
        sha = final["result"]["sha256"]

        # The object is in the bucket under the rendered prefix, keyed by tenant and job.
        listing = s3_server.client().list_objects_v2(Bucket=bucket, Prefix="prod/artifacts/")
        keys = [o["Key"] for o in listing.get("Contents", [])]
        assert [k for k in keys if f"/{job_id}/" in k] == [
            k for k in keys if k.startswith(f"prod/artifacts/{dep.tenant}/{job_id}/")
        ]
        assert any(f"/{job_id}/" in k for k in keys), keys
        # No local artifact folder exists: nothing was written beside the bucket.
        assert not (base / "artifacts").exists()

        # DOWNLOAD_MODE=redirect: 307 to a URL presigned for S3_PRESIGN_ENDPOINT_URL.
        r = client.get(f"/v1/exports/{job_id}/download")
        assert r.status_code == 307, r.text
        assert r.headers["etag"] == f'"{sha}"'
        location = r.headers["location"]
        presign = dep.components["api"].env["S3_PRESIGN_ENDPOINT_URL"]
        assert location.startswith(f"{presign}/{bucket}/prod/artifacts/"), location
    data = httpx.get(location, timeout=10)  # no API key: the URL carries its authorisation
    assert data.status_code == 200, data.text
    assert hashlib.sha256(data.content).hexdigest() == sha


def test_the_smoke_script_passes_against_the_s3_deployment(s3_deployment, tmp_path: Path) -> None:
    dep: Deployment = s3_deployment[0]
    shim_dir = tmp_path / "bin"
    shim_dir.mkdir()
    shim = shim_dir / "kubectl"
    shim.write_text(KUBECTL_SHIM)
    shim.chmod(0o755)
    env = dict(dep.components["api"].env)
    env["PATH"] = f"{shim_dir}{os.pathsep}{env['PATH']}"
    env["KUBECTL_SHIM_LOG"] = str(tmp_path / "kubectl.log")
    proc = subprocess.run(
        ["bash", str(ROOT / "k8s" / "smoke.sh"), dep.api_url(), NAMESPACE, RELEASE],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "matches the ETag" in proc.stderr, proc.stderr
    # smoke.sh addressed the api Deployment under its rendered name.
    targets = set((tmp_path / "kubectl.log").read_text().split())
    assert targets == {f"deploy/{PREFIX}-api"}


def test_the_recovery_scanner_cleans_orphans_in_the_bucket(
    s3_deployment, s3_server: MotoServer
) -> None:
    dep, bucket, orphan, _ = s3_deployment
    scanner = dep.components["recoveryScanner"]
    # A fresh heartbeat follows a whole pass, and the first pass includes hygiene.
    wait_probe(scanner, "livenessProbe", budget=60)
    log = scanner.process.log_text()
    assert "hygiene failed" not in log, log[-4000:]
    assert "orphan artifact deleted" in log, log[-4000:]
    listing = s3_server.client().list_objects_v2(Bucket=bucket, Prefix=orphan)
    assert listing.get("KeyCount", 0) == 0, listing


@pytest.mark.parametrize("key", COMPONENTS)
def test_components_stop_cleanly_within_their_grace_period(s3_deployment, key: str) -> None:
    dep: Deployment = s3_deployment[0]
    check_clean_stop(dep.components[key])
