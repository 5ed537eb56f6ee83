"""kubectl and crictl on the test cluster: the two clients every other module calls.

They live apart from ``node`` (which starts and stops the cluster) so that ``diagnose``,
which ``node`` uses for its preflight, can call them without importing ``node``.
"""

from __future__ import annotations

import subprocess

from devtools.cluster import config as c

CONTAINERD_SOCK = c.STATE / "containerd" / "containerd.sock"


def kubectl(*args: str, check: bool = True, input: str | None = None, timeout: float = 120) -> str:
    """kubectl on the cluster (admin credentials); returns stdout."""
    proc = subprocess.run(
        ["kubectl", "--kubeconfig", str(c.KUBECONFIG), *args],
        capture_output=True,
        text=True,
        input=input,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {proc.stderr.strip()[-2000:]}")
    return proc.stdout


def crictl(*args: str, check: bool = True, timeout: float = 60) -> str:
    """crictl on the cluster's containerd."""
    proc = subprocess.run(
        [
            str(c.BIN / "crictl"),
            "--runtime-endpoint",
            f"unix://{CONTAINERD_SOCK}",
            "--timeout",
            "20s",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"crictl {' '.join(args)}: {proc.stderr.strip()[-2000:]}")
    return proc.stdout
