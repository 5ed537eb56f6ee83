"""What `make install` installs: the processes' ``services``, the library ``exportcore`` and
the command line ``exportctl``; never ``devtools`` (the real-stack harness, the drills, the
test cluster) or ``bench``, which run from a checkout (``python -m devtools...`` in the
repository root, pytest with ``pythonpath = ["."]``) and are kept out of the image."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def test_only_the_processes_the_library_and_the_cli_are_installed(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = (
        "import importlib.util, json; "
        "print(json.dumps({n: importlib.util.find_spec(n) is not None for n in "
        "('services', 'exportcore', 'exportctl', 'devtools', 'bench')}))"
    )
    # Outside the checkout: only what the venv has installed can be found.
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {
        "services": True,
        "exportcore": True,
        "exportctl": True,
        "devtools": False,
        "bench": False,
    }
