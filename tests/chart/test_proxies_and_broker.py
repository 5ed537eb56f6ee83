"""The chart's trusted proxies (FORWARDED_ALLOW_IPS of the api), its refusal of a broker
without a password, the walkthrough's authenticated noeviction Redis, and `helm template`
without --kube-version."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.stack import ROOT
from tests.chart.conftest import (
    CHART,
    CI_VALUES,
    RELEASE,
    USER_SETS,
    by_kind,
    helm,
    render,
    render_error,
)

pytestmark = pytest.mark.chart

DB = {"database.url": "postgresql://u:p@db:5432/x"}
URLS = {**DB, "broker.url": "redis://exports:pw@r:6379/0"}
ROUTE = {
    "httpRoute.enabled": True,
    "httpRoute.parentRefs[0].name": "gw",
}


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def _containers(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d["spec"]["template"]["spec"][
            "containers"
        ][0]
        for d in by_kind(objs, "Deployment")
    }


# --- item 5: trusted proxies -------------------------------------------------------------------


def test_the_api_trusts_only_the_listed_proxies() -> None:
    objs = render(sets={**URLS, **ROUTE, "trustedProxies.addresses": "{10.244.0.0/16,fd00::/8}"})
    containers = _containers(objs)
    assert _env(containers["api"])["FORWARDED_ALLOW_IPS"] == "10.244.0.0/16,fd00::/8"
    assert all("FORWARDED_ALLOW_IPS" not in _env(c) for k, c in containers.items() if k != "api")


def test_without_a_route_nothing_but_loopback_is_trusted() -> None:
    api = _containers(render(sets=URLS))["api"]
    assert _env(api)["FORWARDED_ALLOW_IPS"] == "127.0.0.1,::1"


@pytest.mark.parametrize(
    "exposed", [ROUTE, {"ingress.enabled": True}], ids=["httpRoute", "ingress"]
)
def test_a_route_without_trusted_proxies_fails_unless_said(exposed: dict[str, Any]) -> None:
    err = render_error(sets={**URLS, **exposed})
    assert "trustedProxies.addresses is empty" in err and "allowNone" in err
    objs = render(sets={**URLS, **exposed, "trustedProxies.allowNone": True})
    assert _env(_containers(objs)["api"])["FORWARDED_ALLOW_IPS"] == "127.0.0.1,::1"


@pytest.mark.parametrize("everyone", ["0.0.0.0/0", "::/0"])
def test_trusting_every_peer_is_refused(everyone: str) -> None:
    err = render_error(sets={**URLS, "trustedProxies.addresses": "{" + everyone + "}"})
    assert "trusts every peer" in err


@pytest.mark.parametrize("bad", ["*", "proxy.example", "10.0.0.0/33"])
def test_the_schema_takes_addresses_and_ranges_only(bad: str) -> None:
    err = render_error(sets={**URLS, "trustedProxies.addresses": "{" + bad + "}"})
    assert "trustedProxies" in err


# --- item 10: an authenticated broker ------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "redis://r:6379/0",
        "redis://exports@r:6379/0",  # a user without a password
        "redis://exports:@r:6379/0",
        "rediss://r:6380/0",
        "sentinel://s0:26379/0;sentinel://u:p@s1:26379",  # credentials belong to the first
    ],
)
def test_a_broker_url_without_a_password_is_refused_unless_said(url: str) -> None:
    sets: dict[str, Any] = {**DB, "broker.url": url, "broker.sentinel.master": "m"}
    err = render_error(sets=sets)
    assert "broker.url has no password" in err and "broker.allowNoPassword" in err
    assert render(sets={**sets, "broker.allowNoPassword": True})


@pytest.mark.parametrize(
    "url",
    [
        "redis://exports:pw@r:6379/0",
        "redis://:pw@r:6379/0",
        "rediss://exports:p%40ss@r:6380/0",
        "sentinel://u:p@s0:26379/0;sentinel://s1:26379",
    ],
)
def test_a_broker_url_with_a_password_renders(url: str) -> None:
    assert render(sets={**DB, "broker.url": url, "broker.sentinel.master": "m"})


def test_a_rate_limit_redis_without_a_password_is_refused_unless_said() -> None:
    sets: dict[str, Any] = {**URLS, "rateLimitRedis.url": "redis://rl:6379/0"}
    assert "rateLimitRedis.url has no password" in render_error(sets=sets)
    assert render(sets={**sets, "rateLimitRedis.allowNoPassword": True})


def test_an_existing_secret_is_not_second_guessed() -> None:
    objs = render(sets={**DB, "broker.existingSecret": "redis"})
    api = _containers(objs)["api"]
    assert _env(api)["CELERY_BROKER_URL"] == {
        "secretKeyRef": {"name": "redis", "key": "CELERY_BROKER_URL"}
    }


def _dev_redis() -> tuple[dict[str, Any], dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all((ROOT / "k8s" / "dev-deps.yaml").read_text()) if d]
    secret = next(d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == "redis")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    return secret, deployment["spec"]["template"]["spec"]["containers"][0]


def _directives(args: list[str]) -> list[str]:
    """redis-server's command line as redis.conf lines: each --name starts one."""
    lines: list[str] = []
    for a in args:
        if a.startswith("--"):
            lines.append(a[2:])
        else:
            lines[-1] += f" {a}"
    return lines


def _mib(quantity: str) -> int:
    units = {"Mi": 1, "Gi": 1024, "mb": 1, "gb": 1024}
    for unit, factor in units.items():
        if quantity.endswith(unit):
            return int(quantity[: -len(unit)]) * factor
    raise AssertionError(quantity)


def test_the_walkthrough_redis_has_an_acl_user_from_a_secret_and_noeviction() -> None:
    secret, redis_ctr = _dev_redis()
    conf = _directives(redis_ctr["args"])
    assert "maxmemory-policy noeviction" in conf
    maxmemory = next(line.split()[1] for line in conf if line.startswith("maxmemory "))
    assert _mib(maxmemory) < _mib(redis_ctr["resources"]["limits"]["memory"])
    assert "user default off" in conf
    assert "user exports on >$(REDIS_PASSWORD) ~* &* +@all -@admin" in conf
    assert _env(redis_ctr)["REDIS_PASSWORD"] == {
        "secretKeyRef": {"name": "redis", "key": "REDIS_PASSWORD"}
    }
    password = secret["stringData"]["REDIS_PASSWORD"]
    assert secret["stringData"]["CELERY_BROKER_URL"] == f"redis://exports:{password}@redis:6379/0"
    assert password not in (ROOT / "k8s" / "values-kind.yaml").read_text()


@pytest.mark.parametrize(
    "values",
    [ROOT / "k8s" / "values-kind.yaml", ROOT / "devtools" / "cluster" / "values.yaml"],
    ids=["walkthrough", "test-cluster"],
)
def test_the_walkthrough_and_the_test_cluster_use_that_secret(values: Path) -> None:
    v = yaml.safe_load(values.read_text())
    assert v["broker"] == {"existingSecret": "redis", "existingSecretKey": "CELERY_BROKER_URL"}
    assert v["trustedProxies"]["addresses"] == ["10.244.0.0/16"]


# --- item 17: helm template offline, no --kube-version ------------------------------------------


@pytest.mark.parametrize("values", CI_VALUES, ids=[p.name for p in CI_VALUES])
def test_helm_template_needs_no_kube_version(values: Path) -> None:
    args = ["template", RELEASE, str(CHART), "-f", str(values)]
    for k, v in USER_SETS.items():
        args += ["--set-string", f"{k}={v}"]
    proc = helm(*args, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "kind: Deployment" in proc.stdout
