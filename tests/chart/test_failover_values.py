"""The chart's production path with failover (ci/ha-values.yaml, docs/kubernetes.md): a
transaction pooler with the direct URL beside it, a Sentinel broker, a CA for TLS to Redis,
KEDA through the Sentinels; and the values that cannot work, refused when rendering."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart.conftest import CHART, by_kind, pod_specs, render, render_error

pytestmark = pytest.mark.chart

URLS = {"database.url": "postgresql://u:p@db:5432/x", "broker.url": "redis://exports:pw@r:6379/0"}


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_every_process_and_the_migration_get_the_pooler_and_sentinel_settings() -> None:
    objs = render([CHART / "ci" / "ha-values.yaml"])
    # every Deployment and the migration Job (not the helm test Pod: it only calls /readyz)
    specs = [(o, spec) for o, spec in pod_specs(objs) if o["kind"] != "Pod"]
    assert {o["kind"] for o, _ in specs} == {"Deployment", "Job"}
    for _, spec in specs:
        env = _env(spec["containers"][0])
        assert env["DATABASE_POOLER"] == "transaction"
        ref = env["DATABASE_DIRECT_URL"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == ("notes-exports-connections", "database-direct-url")
        if "CELERY_BROKER_URL" in env:  # the migration hook needs no broker
            assert env["BROKER_SENTINEL_MASTER"] == "exports"
            assert env["BROKER_SENTINEL_PASSWORD"]["secretKeyRef"]["key"] == "sentinel-password"
    [scaled] = by_kind(objs, "ScaledObject")
    [trigger] = scaled["spec"]["triggers"]
    assert trigger["type"] == "redis-sentinel"
    assert trigger["metadata"]["sentinelMaster"] == "exports"
    assert trigger["metadata"]["addresses"].count(":26379") == 3


def test_a_ca_for_a_tls_broker_is_mounted_and_named() -> None:
    objs = render(
        sets={**URLS, "broker.url": "rediss://exports:pw@r:6380/0", "broker.tls.caSecret": "ca"}
    )
    for _, spec in pod_specs(objs):
        container = spec["containers"][0]
        if "CELERY_BROKER_URL" not in _env(container):
            continue
        assert _env(container)["BROKER_TLS_CA_FILE"] == "/etc/notes-exports/broker-ca/ca.crt"
        assert {
            "name": "broker-ca",
            "mountPath": "/etc/notes-exports/broker-ca",
            "readOnly": True,
        } in container["volumeMounts"]
        assert any(v.get("secret", {}).get("secretName") == "ca" for v in spec["volumes"])


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            {"database.pooler": "transaction"},
            "database.pooler transaction needs database.directUrl",
        ),
        ({"broker.url": "sentinel://s0:26379/0;sentinel://s1:26379"}, "broker.sentinel.master"),
        (
            {"config.DATABASE_DIRECT_URL": "postgresql://x"},
            "config.DATABASE_DIRECT_URL is a secret",
        ),
        ({"config.BROKER_SENTINEL_PASSWORD": "x"}, "config.BROKER_SENTINEL_PASSWORD is a secret"),
        ({"database.pooler": "session"}, "/database/pooler"),
    ],
)
def test_values_that_cannot_work_are_refused(sets: dict[str, str], message: str) -> None:
    err = render_error(sets={**URLS, **sets})
    assert message in err, err
