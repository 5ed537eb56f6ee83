"""The README (and the topic pages under docs/ it links to) stay true to the code: every
setting and every Procfile process is documented."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from devtools.stack import read_procfile
from exportcore.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DOCS = README + "".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))


def test_every_setting_is_documented_in_the_readme_or_docs() -> None:
    missing = [name.upper() for name in Settings.model_fields if f"`{name.upper()}" not in DOCS]
    assert missing == []


def test_every_procfile_process_is_documented() -> None:
    missing = [name for name in read_procfile() if f"`{name}`" not in DOCS]
    assert missing == []


def test_make_help_lists_the_two_readme_commands() -> None:
    makefile = (ROOT / "Makefile").read_text()
    for target in ("dev", "test"):
        assert f"make {target}" in README
        assert (
            f"\n{target}:" in makefile and "## " in makefile.split(f"\n{target}:")[1].split("\n")[0]
        )


def exportctl_commands() -> list[tuple[str, ...]]:
    """Every command path of ``exportctl`` (``("list",)``, ``("tenant", "list")``, …)."""
    import typer

    from exportcore.cli.main import app

    def walk(command: Any, path: tuple[str, ...]) -> list[tuple[str, ...]]:
        if hasattr(command, "commands"):
            return [p for n, sub in command.commands.items() for p in walk(sub, (*path, n))]
        return [path]

    return walk(typer.main.get_command(app), ())


def test_every_exportctl_command_is_in_the_cli_reference() -> None:
    reference = (ROOT / "docs" / "cli.md").read_text()
    lines = reference.splitlines()
    missing = []
    for path in exportctl_commands():
        if len(path) == 1:
            found = f"`exportctl {path[0]}" in reference
        else:  # `exportctl group a\|b\|name` or `exportctl group a …` / `name …` on one line
            group, name = path
            found = any(
                f"exportctl {group} " in line and re.search(rf"(?<![\w-]){name}(?![\w-])", line)
                for line in lines
            )
        if not found:
            missing.append(" ".join(path))
    assert missing == []
