"""The keys that encrypt webhook signing secrets at rest (docs/webhooks.md "Encryption at
rest") reach every process and the migrations Job only from an existing Secret: never
through the ConfigMap or env overrides."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart.conftest import CHART, by_kind, render, render_error

DEFAULT = CHART / "ci" / "default-values.yaml"
URLS = {"database.url": "postgresql://u:p@db:5432/x", "broker.url": "redis://r:6379/0"}
REF = {"secretKeyRef": {"name": "notes-exports-webhook-keys", "key": "WEBHOOK_SECRET_KEYS"}}


def env_of(workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    (c,) = workload["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e for e in c.get("env", [])}


def test_every_process_and_the_migrations_read_the_keys_from_the_secret() -> None:
    objs = render([DEFAULT], sets={"webhookSecrets.existingSecret": "notes-exports-webhook-keys"})
    workloads = by_kind(objs, "Deployment") + by_kind(objs, "Job")
    assert any(j["metadata"]["name"].endswith("-migrate") for j in by_kind(objs, "Job"))
    for w in workloads:
        assert env_of(w)["WEBHOOK_SECRET_KEYS"]["valueFrom"] == REF, w["metadata"]["name"]
    for cm in by_kind(objs, "ConfigMap"):
        assert "WEBHOOK_SECRET_KEYS" not in cm.get("data", {})


def test_without_a_secret_no_process_gets_a_key() -> None:
    objs = render([DEFAULT])
    for w in by_kind(objs, "Deployment") + by_kind(objs, "Job"):
        assert "WEBHOOK_SECRET_KEYS" not in env_of(w)


@pytest.mark.parametrize(
    "key", ["config.WEBHOOK_SECRET_KEYS", "components.webhookDelivery.env.WEBHOOK_SECRET_KEYS"]
)
def test_the_keys_are_refused_as_a_plain_value(key: str) -> None:
    err = render_error(sets={**URLS, key: "x"})
    assert "WEBHOOK_SECRET_KEYS" in err, err
