"""The chart's artifact backends: `file` (a shared volume, unchanged) and `s3` (a bucket).

With ``artifacts.backend: s3`` no pod mounts an artifact volume and no PVC exists, the
ConfigMap carries ``ARTIFACT_URL`` and the ``S3_*`` settings, the credentials reach the
processes only through ``secretKeyRef`` to an existing Secret, and the NetworkPolicy lets
the pods reach the object store. The kind values point at the MinIO of ``k8s/minio.yaml``.
"""

from __future__ import annotations

import base64
import re
from typing import Any

import pytest
import yaml

from devtools.stack import ROOT
from tests.chart.conftest import (
    CHART,
    KUBE_VERSION,
    RELEASE,
    USER_SETS,
    by_kind,
    find,
    helm,
    load_yaml,
    pod_specs,
    render,
    render_error,
)

pytestmark = pytest.mark.chart

PREFIX = f"{RELEASE}-notes-exports"
DEFAULT = CHART / "ci" / "default-values.yaml"
S3_VALUES = CHART / "ci" / "s3-values.yaml"
KIND_VALUES = ROOT / "k8s" / "values-kind.yaml"
S3_KEYS = (
    "ARTIFACT_URL",
    "S3_ENDPOINT_URL",
    "S3_PRESIGN_ENDPOINT_URL",
    "S3_REGION",
    "S3_ADDRESSING_STYLE",
    "S3_MULTIPART_THRESHOLD",
    "S3_MULTIPART_PART_SIZE",
    "S3_CONNECT_TIMEOUT",
    "S3_READ_TIMEOUT",
    "S3_MAX_ATTEMPTS",
    "DOWNLOAD_MODE",
    "PRESIGN_SECONDS",
)
CREDENTIALS = ("S3_ACCESS_KEY_ID", "S3_SECRET_ACCESS_KEY")
URLS = {"database.url": "postgresql://u:p@db:5432/x", "broker.url": "redis://exports:pw@r:6379/0"}


def config(objs: list[dict[str, Any]]) -> dict[str, str]:
    return find(objs, "ConfigMap", PREFIX)["data"]


def common_egress(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return find(objs, "NetworkPolicy", PREFIX)["spec"]["egress"]


def object_store_rule(objs: list[dict[str, Any]]) -> dict[str, Any]:
    """The egress rule that is neither DNS, PostgreSQL, Redis nor the api."""
    others = {53, 5432, 6379, "http"}
    rules = [
        r for r in common_egress(objs) if not {p["port"] for p in r.get("ports", [])} <= others
    ]
    assert len(rules) == 1, rules
    return rules[0]


def ports(rule: dict[str, Any]) -> list[int]:
    assert all(p["protocol"] == "TCP" for p in rule["ports"])
    return sorted(p["port"] for p in rule["ports"])


def credential_env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", []) if e["name"] in CREDENTIALS}


# --- s3 ---------------------------------------------------------------------------------


def test_s3_backend_has_no_artifact_volume_and_no_pvc() -> None:
    objs = render([S3_VALUES])
    assert by_kind(objs, "PersistentVolumeClaim") == []
    for obj, spec in pod_specs(objs):
        assert "artifacts" not in {v["name"] for v in spec.get("volumes", [])}, obj["metadata"]
        for c in spec["containers"]:
            assert all(m["name"] != "artifacts" for m in c.get("volumeMounts", [])), c["name"]


def test_s3_backend_configmap_names_the_bucket_and_every_setting() -> None:
    data = config(render([S3_VALUES]))
    assert "ARTIFACT_DIR" not in data
    assert {k: data[k] for k in S3_KEYS} == {
        "ARTIFACT_URL": "s3://notes-exports/prod/artifacts",
        "S3_ENDPOINT_URL": "https://rgw.storage.svc:8443",
        "S3_PRESIGN_ENDPOINT_URL": "https://s3.example.com",
        "S3_REGION": "eu-west-1",
        "S3_ADDRESSING_STYLE": "path",
        "S3_MULTIPART_THRESHOLD": "16777216",  # an integer, never 1.6777216e+07
        "S3_MULTIPART_PART_SIZE": "16777216",
        "S3_CONNECT_TIMEOUT": "5",
        "S3_READ_TIMEOUT": "120",
        "S3_MAX_ATTEMPTS": "5",
        "DOWNLOAD_MODE": "redirect",
        "PRESIGN_SECONDS": "600",
    }


def test_the_rendered_s3_settings_are_valid_settings() -> None:
    """What the ConfigMap says, exportcore accepts (the same validators as at process start)."""
    from exportcore.artifacts.location import parse_artifact_url
    from exportcore.settings import Settings

    data = config(render([S3_VALUES]))
    settings = Settings(
        **{k.lower(): v for k, v in data.items() if k in S3_KEYS},
        s3_access_key_id="id",
        s3_secret_access_key="secret",
        _env_file=None,
    )
    location = parse_artifact_url(settings.artifact_url)
    assert (location.scheme, location.bucket, location.prefix) == (
        "s3",
        "notes-exports",
        "prod/artifacts",
    )
    assert settings.s3_multipart_part_size == 16 * 1024 * 1024
    assert settings.download_mode == "redirect"


def test_s3_defaults_leave_optional_settings_unset() -> None:
    data = config(render([DEFAULT], {"artifacts.backend": "s3", "artifacts.s3.bucket": "b-1"}))
    assert data["ARTIFACT_URL"] == "s3://b-1"
    for key in ("S3_ENDPOINT_URL", "S3_PRESIGN_ENDPOINT_URL", "S3_REGION"):
        assert key not in data  # empty values fall back to AWS / the default chain
    assert data["S3_MULTIPART_THRESHOLD"] == "8388608"
    assert data["DOWNLOAD_MODE"] == "stream" and data["PRESIGN_SECONDS"] == "300"


def test_s3_credentials_come_only_from_the_existing_secret() -> None:
    objs = render([S3_VALUES])
    for cm in by_kind(objs, "ConfigMap"):
        assert not set(CREDENTIALS) & set(cm.get("data", {})), cm["metadata"]["name"]
    # The chart creates no Secret with S3 credentials: they are the operator's Secret.
    for secret in by_kind(objs, "Secret"):
        assert not set(CREDENTIALS) & set(secret.get("data", {}))
    deployments = by_kind(objs, "Deployment")
    assert len(deployments) == 7  # the seven of docs/architecture.md, Components
    for d in deployments:
        (c,) = d["spec"]["template"]["spec"]["containers"]
        env = credential_env(c)
        assert set(env) == set(CREDENTIALS), d["metadata"]["name"]
        assert env["S3_ACCESS_KEY_ID"]["valueFrom"] == {
            "secretKeyRef": {"name": "notes-exports-s3", "key": "access-key-id"}
        }
        assert env["S3_SECRET_ACCESS_KEY"]["valueFrom"] == {
            "secretKeyRef": {"name": "notes-exports-s3", "key": "secret-access-key"}
        }
    # The migration Job and the helm test Pod never touch the store.
    for obj, spec in pod_specs(objs):
        if obj["kind"] != "Deployment":
            assert not credential_env(spec["containers"][0]), obj["metadata"]["name"]


def test_s3_without_a_secret_uses_the_default_credential_chain() -> None:
    """IRSA / pod identity: no credential variable at all (an empty one would be an error)."""
    objs = render(
        [DEFAULT],
        {
            "artifacts.backend": "s3",
            "artifacts.s3.bucket": "exports-prod",
            "artifacts.s3.region": "eu-central-1",
            "serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn": "arn:aws:iam::1:role/x",
        },
    )
    for d in by_kind(objs, "Deployment"):
        (c,) = d["spec"]["template"]["spec"]["containers"]
        assert credential_env(c) == {}
    assert config(objs)["S3_REGION"] == "eu-central-1"
    # STS (web identity) and AWS S3 are both HTTPS.
    assert ports(object_store_rule(objs)) == [443]


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("", [443]),
        ("https://s3.eu-west-1.amazonaws.com", [443]),
        ("http://minio.storage.svc:9000", [443, 9000]),
        ("http://ceph-rgw.storage.svc", [80, 443]),
        ("https://rgw.example.com:443", [443]),
        ("http://[fd00::10]:7480", [443, 7480]),
    ],
)
def test_object_store_egress_ports_follow_the_endpoint(endpoint: str, expected: list[int]) -> None:
    objs = render(
        [DEFAULT],
        {
            "artifacts.backend": "s3",
            "artifacts.s3.bucket": "exports",
            "artifacts.s3.endpointUrl": endpoint,
        },
    )
    rule = object_store_rule(objs)
    assert ports(rule) == expected and rule["to"] == [{"podSelector": {}}]  # this namespace


def test_object_store_egress_can_be_set_explicitly() -> None:
    objs = render([S3_VALUES], {"networkPolicy.egress.objectStore.ports[0]": 9443})
    rule = object_store_rule(objs)
    assert ports(rule) == [9443]
    assert rule["to"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "storage"}}}
    ]
    default_ports = object_store_rule(render([S3_VALUES]))
    assert ports(default_ports) == [443, 8443]


def test_s3_settings_changes_roll_the_pods() -> None:
    def checksum(objs: list[dict[str, Any]]) -> set[str]:
        return {
            d["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
            for d in by_kind(objs, "Deployment")
        }

    before = checksum(render([S3_VALUES]))
    assert len(before) == 1
    for sets in (
        {"artifacts.s3.bucket": "other-bucket"},
        {"artifacts.downloadMode": "stream"},
        {"artifacts.s3.maxAttempts": 7},
    ):
        assert checksum(render([S3_VALUES], sets)) != before, sets


# --- file: unchanged ----------------------------------------------------------------------


def test_file_backend_is_unchanged_and_ignores_the_s3_values() -> None:
    objs = render([DEFAULT])
    data = config(objs)
    assert data["ARTIFACT_DIR"] == "/var/lib/notes-exports/artifacts"
    assert not set(S3_KEYS) & set(data)
    assert len(by_kind(objs, "PersistentVolumeClaim")) == 1
    egress_ports = {p["port"] for r in common_egress(objs) for p in r.get("ports", [])}
    assert egress_ports == {53, 5432, 6379, "http"}
    for d in by_kind(objs, "Deployment"):
        (c,) = d["spec"]["template"]["spec"]["containers"]
        assert credential_env(c) == {}
    # s3 values have no effect while the backend is file: the same objects, byte for byte.
    with_s3_values = render(
        [DEFAULT],
        {
            "artifacts.s3.bucket": "unused",
            "artifacts.s3.existingSecret": "unused",
            "artifacts.s3.endpointUrl": "http://minio:9000",
            "networkPolicy.egress.objectStore.ports[0]": 9000,
        },
    )
    assert with_s3_values == objs


def test_file_backend_mounts_the_artifacts_where_they_are_read_written_or_cleaned() -> None:
    """api (downloads), workers (writes) and the recovery-scanner (orphan cleanup and
    retention delete files) share the volume; publisher and beat never touch files."""
    objs = render([DEFAULT])
    mounting = set()
    for d in by_kind(objs, "Deployment"):
        (c,) = d["spec"]["template"]["spec"]["containers"]
        if any(m["name"] == "artifacts" for m in c.get("volumeMounts", [])):
            mounting.add(d["metadata"]["labels"]["app.kubernetes.io/component"])
    assert mounting == {"api", "recovery-scanner", "fast-worker", "bulk-worker"}


# --- refused values -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        ({"artifacts.backend": "s3"}, "/artifacts/s3/bucket"),
        ({"artifacts.downloadMode": "redirect"}, "/artifacts/downloadMode"),
        ({"artifacts.backend": "gcs"}, "/artifacts/backend"),
        (
            {"artifacts.backend": "s3", "artifacts.s3.bucket": "Not_A_Bucket"},
            "/artifacts/s3/bucket",
        ),
        ({"artifacts.s3.endpointUrl": "http://key:secret@minio:9000"}, "/artifacts/s3/endpointUrl"),
        ({"artifacts.s3.addressingStyle": "dns"}, "/artifacts/s3/addressingStyle"),
        ({"artifacts.s3.multipartPartSize": "1048576"}, "/artifacts/s3/multipartPartSize"),
        ({"artifacts.presignSeconds": "604801"}, "/artifacts/presignSeconds"),
        ({"artifacts.s3.accessKey": "AKIA"}, "accessKey"),
        ({"artifacts.s3.secretAccessKey": "x"}, "secretAccessKey"),
        ({"config.S3_SECRET_ACCESS_KEY": "x"}, "S3_SECRET_ACCESS_KEY"),
        ({"config.ARTIFACT_URL": "s3://b/p"}, "ARTIFACT_URL"),
        ({"defaults.env.S3_ACCESS_KEY_ID": "x"}, "S3_ACCESS_KEY_ID"),
        ({"components.api.env.AWS_SECRET_ACCESS_KEY": "x"}, "AWS_SECRET_ACCESS_KEY"),
    ],
)
def test_schema_refuses_incomplete_or_plain_secret_s3_values(
    sets: dict[str, str], message: str
) -> None:
    err = render_error(sets={**URLS, **sets})
    assert message in err, err


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            {"artifacts.backend": "s3"},
            "artifacts.s3.bucket is required when artifacts.backend is s3",
        ),
        (
            {"artifacts.downloadMode": "redirect"},
            "artifacts.downloadMode redirect needs artifacts.backend s3",
        ),
        (
            {
                "artifacts.backend": "s3",
                "artifacts.s3.bucket": "b-1",
                "config.S3_SECRET_ACCESS_KEY": "x",
            },
            "config.S3_SECRET_ACCESS_KEY is a secret: use artifacts.s3.existingSecret",
        ),
    ],
)
def test_templates_fail_clearly_even_without_the_schema(sets: dict[str, str], message: str) -> None:
    args = ["template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION]
    args.append("--skip-schema-validation")
    for k, v in {**USER_SETS, **URLS, **sets}.items():
        args += ["--set", f"{k}={v}"]
    proc = helm(*args, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


# --- kind: the in-cluster MinIO ------------------------------------------------------------


def _manifest(name: str) -> dict[tuple[str, str], dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all((ROOT / "k8s" / name).read_text()) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def _makefile_default(var: str) -> str:
    m = re.search(rf"^{var}\s*\?=\s*(\S+)", (ROOT / "Makefile").read_text(), re.M)
    assert m, var
    return m.group(1)


def test_kind_values_use_the_dev_minio_its_secret_and_its_bucket() -> None:
    values = load_yaml(KIND_VALUES)["artifacts"]
    minio = _manifest("minio.yaml")
    namespace = _makefile_default("K8S_NAMESPACE")
    s3 = values["s3"]
    assert values["backend"] == "s3" and values["downloadMode"] == "stream"
    assert s3["addressingStyle"] == "path"
    # The endpoint is the MinIO Service in the namespace `make dev-deps` applies it to.
    service = minio[("Service", "minio")]
    (s3_port,) = [p for p in service["spec"]["ports"] if p["name"] == "s3"]
    assert s3["endpointUrl"] == f"http://minio.{namespace}.svc:{s3_port['port']}"
    # The credentials are keys of the dev Secret that MinIO itself reads.
    secret = minio[("Secret", s3["existingSecret"])]
    assert {s3["accessKeyIdKey"], s3["secretAccessKeyKey"]} <= set(secret["stringData"])
    server = minio[("StatefulSet", "minio")]["spec"]["template"]["spec"]["containers"][0]
    assert server["envFrom"] == [{"secretRef": {"name": s3["existingSecret"]}}]
    assert re.fullmatch(r"quay\.io/minio/minio:RELEASE\.[0-9TZ-]+", server["image"])
    # The Job creates exactly the bucket the chart writes to.
    job = minio[("Job", "minio-create-bucket")]["spec"]["template"]["spec"]["containers"][0]
    assert re.fullmatch(r"quay\.io/minio/mc:RELEASE\.[0-9TZ-]+", job["image"])
    assert job["args"][-1] == f"local/{s3['bucket']}" and "--ignore-existing" in job["args"]
    mc_host = next(e for e in job["env"] if e["name"] == "MC_HOST_local")["value"]
    assert mc_host.endswith(f"@minio:{s3_port['port']}")
    # The rendered chart reaches it: NetworkPolicy matches the pod's port (the container's).
    objs = render([KIND_VALUES])
    container_port = next(p for p in server["ports"] if p["name"] == s3_port["targetPort"])
    assert container_port["containerPort"] in ports(object_store_rule(objs))
    assert config(objs)["ARTIFACT_URL"] == f"s3://{s3['bucket']}/{s3['prefix']}"
    assert by_kind(objs, "PersistentVolumeClaim") == []


def test_kind_redirect_values_presign_for_the_port_forward() -> None:
    objs = render([KIND_VALUES, ROOT / "k8s" / "values-redirect.yaml"])
    data = config(objs)
    assert data["DOWNLOAD_MODE"] == "redirect"
    assert data["S3_PRESIGN_ENDPOINT_URL"] == "http://localhost:9000"
    assert data["S3_ENDPOINT_URL"].startswith("http://minio.")
    # `make minio-forward` forwards exactly that port.
    assert "port-forward svc/minio 9000:9000" in (ROOT / "Makefile").read_text()


def test_kind_values_name_the_secret_keys_never_the_credentials() -> None:
    secret = _manifest("minio.yaml")[("Secret", "minio")]
    values_text = KIND_VALUES.read_text() + (ROOT / "k8s" / "values-redirect.yaml").read_text()
    password = secret["stringData"]["MINIO_ROOT_PASSWORD"]
    assert password not in values_text
    assert base64.b64encode(password.encode()).decode() not in values_text
