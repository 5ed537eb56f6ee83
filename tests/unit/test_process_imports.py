"""The seven processes never load the command line: ``exportctl`` is a package of its own
(libs/exportctl) and typer and rich are its dependencies, not the shared library's. Each
Procfile process's entry modules are imported in a fresh interpreter, as its command would,
and that interpreter's ``sys.modules`` is read back."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from devtools.stack import DEFAULT_PROCESSES, ROOT, read_procfile

PROCESSES = read_procfile()
# What only the command line needs (pygments comes with rich).
CLI_ONLY = ("exportctl", "typer", "rich", "pygments")

PROBE = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
"""


def entry_modules(command: str) -> list[str]:
    """The modules a Procfile command imports before it runs: ``python -m X`` -> ``X`` and
    ``X.__main__`` (runpy imports the package, then runs its ``__main__``; imported under its
    own name here, so it defines everything and starts nothing); ``celery -A X`` -> ``X``;
    ``gunicorn -c path/conf.py X:app`` -> the config file as a module and ``X``."""
    words = shlex.split(command)
    words = words[words.index("exec") + 1 :]
    program, args = words[0], words[1:]
    if program == "python":
        module = args[args.index("-m") + 1]
        return [module, f"{module}.__main__"]
    if program == "celery":
        return [args[args.index("-A") + 1]]
    if program == "gunicorn":
        config = args[args.index("-c") + 1].removesuffix(".py").replace("/", ".")
        app = next(a for a in args if ":" in a).split(":")[0]
        return [config, app]
    raise AssertionError(f"unknown program {program!r} in the Procfile: {command}")


def top_level_modules(*modules: str) -> set[str]:
    """Top-level names in ``sys.modules`` of a new interpreter after importing ``modules``."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *modules],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout.splitlines()[-1]))


def test_the_check_covers_every_process_the_stack_starts() -> None:
    assert set(PROCESSES) == set(DEFAULT_PROCESSES) and len(PROCESSES) == 7


@pytest.mark.parametrize("process", sorted(PROCESSES))
def test_a_process_loads_neither_exportctl_nor_typer_nor_rich(process: str) -> None:
    modules = entry_modules(PROCESSES[process])
    loaded = top_level_modules(*modules)
    assert "exportcore" in loaded and "services" in loaded, (modules, sorted(loaded))
    assert not loaded & set(CLI_ONLY), f"{process} ({', '.join(modules)}) loads the CLI's"


def test_the_probe_sees_a_cli_import() -> None:
    """The check itself: the same probe on the command line finds what it looks for."""
    assert set(CLI_ONLY) - {"pygments"} <= top_level_modules("exportctl.main")


def test_no_module_of_the_library_or_the_processes_imports_the_cli() -> None:
    """Every module of exportcore and services (lazy imports of a code path the entry modules
    do not take at start included). httpx 0.28 imports its own CLI (rich) whenever rich is
    installed (encode/httpx#3547); the one process that uses httpx turns that off
    (services/webhook_delivery/__init__.py), and so does this probe."""
    code = (
        "import sys; sys.modules['httpx._main'] = None\n"
        "import pkgutil, exportcore, services\n"
        "names = [m.name for p in (exportcore, services) "
        "for m in pkgutil.walk_packages(p.__path__, p.__name__ + '.')]\n"
        "sys.argv[1:] = names\n" + PROBE
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr
    loaded = set(json.loads(proc.stdout.splitlines()[-1]))
    assert {"exportcore", "services", "httpx", "celery", "fastapi"} <= loaded
    assert not loaded & set(CLI_ONLY), sorted(loaded & set(CLI_ONLY))
