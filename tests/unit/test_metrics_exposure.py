"""Metrics are served on their own port, bound where the deployment says, never through the
public api; gunicorn opens no control socket (the chart's read-only root
filesystem, found on the test cluster)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx
import pytest
from gunicorn.config import Config

from devtools.stack import ROOT, free_port, read_procfile
from exportcore import metrics
from exportcore.settings import Settings

BASE = {"DATABASE_URL": "postgresql://u:p@db/x", "CELERY_BROKER_URL": "redis://r:6379/0"}


def test_metrics_bind_loopback_unless_the_deployment_says_otherwise(monkeypatch) -> None:
    for k, v in BASE.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("METRICS_BIND_ADDRESS", raising=False)
    assert str(Settings().metrics_bind_address) == "127.0.0.1"
    monkeypatch.setenv("METRICS_BIND_ADDRESS", "0.0.0.0")
    assert str(Settings().metrics_bind_address) == "0.0.0.0"
    monkeypatch.setenv("METRICS_BIND_ADDRESS", "not-an-address")
    with pytest.raises(ValueError, match=r"METRICS_BIND_ADDRESS|metrics_bind_address"):
        Settings()


def _listening_addresses(port: int) -> set[str]:
    """Local addresses of the TCP sockets listening on ``port`` (from /proc/net/tcp)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, p = local.split(":")
        if int(p, 16) == port and state == "0A":
            found.add(socket.inet_ntoa(bytes.fromhex(addr)[::-1]))
    return found


def test_serve_binds_the_given_address_only() -> None:
    port = free_port()
    metrics.serve(port, "127.0.0.1")
    deadline = time.monotonic() + 5
    while not _listening_addresses(port) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _listening_addresses(port) == {"127.0.0.1"}
    r = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    assert r.status_code == 200 and "exports_" in r.text


def test_every_procfile_process_has_its_own_metrics_port_the_api_too() -> None:
    for name, command in read_procfile().items():
        assert "METRICS_PORT=" in command, name


def test_the_api_app_has_no_metrics_route() -> None:
    from services.api.app import create_app

    paths = set(create_app().openapi()["paths"])
    assert "/healthz" in paths and "/readyz" in paths
    assert "/metrics" not in paths


def test_gunicorn_opens_no_control_socket() -> None:
    """gunicorn 25.1+ creates $HOME/.gunicorn/gunicorn.ctl by default; under the chart's
    readOnlyRootFilesystem that fails (logged on every start in the test cluster)."""
    cfg = Config()
    for key, value in _conf_settings(ROOT / "services" / "api" / "gunicorn_conf.py").items():
        if key in cfg.settings:
            cfg.set(key, value)
    assert cfg.control_socket_disable is True


def _conf_settings(path: Path) -> dict[str, object]:
    namespace: dict[str, object] = {"__file__": str(path), "__name__": "gunicorn_conf"}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return {k: v for k, v in namespace.items() if not k.startswith("__")}
