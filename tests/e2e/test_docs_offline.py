"""/docs works offline: a real browser (Debian chromium, headless) opens the api's front
page, is redirected to /docs, renders Swagger UI (the operations appear), and the page
requests nothing from any host but the api (Chromium's net log). Every host name resolves
to nothing (--host-resolver-rules), so no request could leave the machine anyway."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from devtools.stack import ROOT, free_port
from tests.support import wait_for

pytestmark = pytest.mark.e2e

CHROMIUM = shutil.which("chromium")
QUIET = [  # Chromium's own background traffic (updates, sync, accounts), not the page's
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--disable-features=Translate,OptimizationHints,MediaRouter,SpellCheck",
]


@pytest.fixture
def api(database_url: str, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "DATABASE_URL": database_url, "ARTIFACT_DIR": str(tmp_path / "a")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "services.api.app:app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _up(url) or proc.poll() is not None, 60, "the api")
        assert proc.poll() is None
        yield url
    finally:
        proc.terminate()
        proc.wait(20)


def _up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is missing: make browser")
def test_the_docs_render_without_any_host_but_the_api(api: str, tmp_path: Path) -> None:
    netlog = tmp_path / "net.json"
    dom = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", *QUIET,
         "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
         f"--user-data-dir={tmp_path / 'profile'}", f"--log-net-log={netlog}",
         "--virtual-time-budget=10000", "--dump-dom", f"{api}/"],
        capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    # Swagger UI ran (its script came from the api) and rendered the operations.
    assert 'class="swagger-ui' in dom and 'data-path="/v1/exports"' in dom, dom[:2000]
    page_site = f"http://{urlsplit(api).hostname}"
    requested = set()
    for event in json.loads(netlog.read_text())["events"]:
        params = event.get("params") or {}
        if "url" in params and str(params.get("network_isolation_key", "")).startswith(page_site):
            requested.add(params["url"])
    assert f"{api}/docs" in requested and f"{api}/openapi.json" in requested
    assert any("/swagger-ui-bundle.js" in url for url in requested)
    foreign = sorted(url for url in requested if not url.startswith(f"{api}/"))
    assert foreign == [], foreign


def test_the_front_page_redirects_to_the_docs_and_the_assets_are_served(api: str) -> None:
    front = httpx.get(f"{api}/", follow_redirects=False, timeout=10)
    assert front.status_code == 307 and front.headers["location"] == "docs"
    html = httpx.get(f"{api}/docs", timeout=10).text
    assert "//cdn" not in html and "https://" not in html
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css"):
        r = httpx.get(f"{api}/static-offline-docs/{asset}", timeout=10)
        assert r.status_code == 200 and len(r.content) > 100_000
    assert "https://" not in httpx.get(f"{api}/redoc", timeout=10).text
