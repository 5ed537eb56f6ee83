"""The ten-line receiver of docs/webhooks.md, run as it is printed, against the real
delivery process: it verifies and prints each event once, and refuses a forged one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

from devtools.stack import ROOT, free_port
from exportcore.settings import Settings
from exportcore.webhooks import endpoints
from exportcore.webhooks.delivery import WebhookDelivery
from tests.integration.test_webhooks import finish, messages, pump
from tests.support import submit, tenant_with_notes, wait_for

DOC = (ROOT / "docs" / "webhooks.md").read_text()


def receiver_code() -> str:
    section = DOC.split("## A receiver that verifies the signature", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, "docs/webhooks.md has no receiver code block"
    return match.group(1)


def test_the_receiver_has_ten_lines_and_the_readme_shows_the_same() -> None:
    code = receiver_code()
    assert len(code.strip().splitlines()) <= 10
    assert code in (ROOT / "README.md").read_text()


def test_the_documented_receiver_verifies_real_deliveries(
    pool, settings: Settings, notes_dir: Path, tmp_path: Path
) -> None:
    s = Settings(
        **{
            **settings.model_dump(),
            "webhook_allow_http": True,
            "webhook_allow_private_networks": True,
        }
    )
    tid, ids = tenant_with_notes(pool, notes_dir)
    port = free_port()
    ep = endpoints.create_endpoint(pool, s, tenant_id=tid, url=f"http://127.0.0.1:{port}/")
    script = tmp_path / "receiver.py"
    script.write_text(receiver_code())
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        env={**os.environ, "WEBHOOK_SECRET": ep["secret"], "PORT": str(port)},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    d = WebhookDelivery(s, pool)
    try:
        wait_for(lambda: _listening(port), 10, "the documented receiver listening")
        job = submit(pool, s, tid, ids[:2])
        finish(pool, s, job["id"])
        pump(d, lambda: [m["status"] for m in messages(pool)] == ["delivered"])
        forged = httpx.post(
            f"http://127.0.0.1:{port}/",
            content=b'{"type":"export.succeeded"}',
            headers={
                "webhook-id": "msg_forged",
                "webhook-timestamp": str(int(time.time())),
                "webhook-signature": "v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
            },
        )
        assert forged.status_code == 401
    finally:
        d.close(timeout=5)
        proc.terminate()
        output, _ = proc.communicate(timeout=10)
    [line] = output.splitlines()
    assert line.startswith("export.succeeded ") and str(job["id"]) in line


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0
