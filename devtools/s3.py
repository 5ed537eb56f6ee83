"""A real S3-compatible server for tests and ``DEV_S3=1 make dev``: moto in server mode.

:class:`MotoServer` runs ``moto_server`` (from the ``moto[server]`` package in this venv) as
its own process on 127.0.0.1, waits until it answers, creates buckets, and gives the
environment variables / settings that point the notes-exports processes at it. It is a
real HTTP server speaking the S3 protocol: the code under test uses its ordinary boto3
client against it, nothing is patched.

Command line (used by ``scripts/dev.sh``)::

    python -m devtools.s3 create-bucket http://127.0.0.1:59000 notes-exports-dev
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from devtools.stack import free_port

REGION = "us-east-1"
ACCESS_KEY = "notes-exports-test"
SECRET_KEY = "notes-exports-test-secret"  # moto accepts any credentials


def s3_client(endpoint_url: str) -> Any:
    """A boto3 S3 client for a local S3-compatible server (path-style, dummy credentials)."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
    )


def create_bucket(endpoint_url: str, bucket: str) -> None:
    """Create ``bucket`` unless it exists."""
    client = s3_client(endpoint_url)
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=bucket)


@dataclass
class MotoServer:
    """``moto_server`` on ``127.0.0.1:port``, its output in ``log_path``."""

    log_path: Path
    port: int = field(default_factory=free_port)
    popen: subprocess.Popen[bytes] | None = None

    @property
    def endpoint_url(self) -> str:
        """The S3 endpoint (``S3_ENDPOINT_URL``)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> MotoServer:
        """Start the server and wait until it answers; raises RuntimeError with its log."""
        exe = Path(sys.executable).parent / "moto_server"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        self.popen = subprocess.Popen(
            [str(exe), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError("moto_server exited:\n" + self.log_text()[-3000:])
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(self.endpoint_url + "/", timeout=1.0).status_code == 200:
                    return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("moto_server did not answer:\n" + self.log_text()[-3000:])

    def stop(self) -> None:
        """Stop the server (TERM, then KILL)."""
        if self.popen is None or self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(5)

    def log_text(self) -> str:
        """What the server wrote so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def client(self) -> Any:
        """A boto3 client on this server."""
        return s3_client(self.endpoint_url)

    def create_bucket(self, bucket: str) -> str:
        """Create ``bucket``; returns its name."""
        create_bucket(self.endpoint_url, bucket)
        return bucket

    def env(self, bucket: str, prefix: str = "") -> dict[str, str]:
        """The environment variables that point notes-exports at ``s3://bucket/prefix``."""
        url = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        return {
            "ARTIFACT_URL": url,
            "S3_ENDPOINT_URL": self.endpoint_url,
            "S3_REGION": REGION,
            "S3_ACCESS_KEY_ID": ACCESS_KEY,
            "S3_SECRET_ACCESS_KEY": SECRET_KEY,
            "S3_ADDRESSING_STYLE": "path",
        }

    def settings_kwargs(self, bucket: str, prefix: str = "") -> dict[str, Any]:
        """The same as keyword arguments of ``Settings``."""
        return {k.lower(): v for k, v in self.env(bucket, prefix).items()}


def main(argv: list[str]) -> int:
    """``create-bucket ENDPOINT BUCKET``."""
    if len(argv) == 3 and argv[0] == "create-bucket":
        create_bucket(argv[1], argv[2])
        return 0
    print("usage: python -m devtools.s3 create-bucket ENDPOINT BUCKET", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
