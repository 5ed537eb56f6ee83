"""The manifest signing key reaches every process only from an existing Secret
(docs/api.md "Manifests", SECURITY.md): never through the ConfigMap or env overrides."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart.conftest import CHART, by_kind, render, render_error

DEFAULT = CHART / "ci" / "default-values.yaml"
URLS = {"database.url": "postgresql://u:p@db:5432/x", "broker.url": "redis://exports:pw@r:6379/0"}


def env_of(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e for e in c.get("env", [])}


def test_every_process_reads_the_key_from_the_secret() -> None:
    objs = render(
        [DEFAULT],
        sets={
            "manifestSigning.existingSecret": "notes-exports-manifest-key",
            "manifestSigning.previousPublicKeys": "cHVibGlj",
        },
    )
    for d in by_kind(objs, "Deployment"):
        env = env_of(d)
        assert env["MANIFEST_SIGNING_KEY"]["valueFrom"] == {
            "secretKeyRef": {"name": "notes-exports-manifest-key", "key": "MANIFEST_SIGNING_KEY"}
        }, d["metadata"]["name"]
        assert env["MANIFEST_PREVIOUS_PUBLIC_KEYS"]["value"] == "cHVibGlj"
    for cm in by_kind(objs, "ConfigMap"):
        assert "MANIFEST_SIGNING_KEY" not in cm.get("data", {})


def test_without_a_secret_manifests_are_unsigned() -> None:
    for d in by_kind(render([DEFAULT]), "Deployment"):
        assert "MANIFEST_SIGNING_KEY" not in env_of(d)


@pytest.mark.parametrize(
    "key", ["config.MANIFEST_SIGNING_KEY", "components.api.env.MANIFEST_SIGNING_KEY"]
)
def test_the_key_is_refused_as_a_plain_value(key: str) -> None:
    err = render_error(sets={**URLS, key: "x"})
    assert "MANIFEST_SIGNING_KEY" in err, err
