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


PAGES = [ROOT / n for n in ("README.md", "CONTRIBUTING.md", "CHANGELOG.md", "SECURITY.md")]
PAGES += sorted((ROOT / "docs").glob("*.md"))
CODE_BLOCK = re.compile(r"```.*?```", re.S)


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown page (lower case, punctuation dropped)."""
    headings = re.findall(r"^#+ (.*)$", CODE_BLOCK.sub("", page.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_relative_link_of_the_pages_resolves() -> None:
    broken = []
    for page in PAGES:
        for link in re.findall(r"\]\(([^)\s]+)\)", CODE_BLOCK.sub("", page.read_text())):
            if re.match(r"[a-z]+:", link):
                continue  # https:, mailto:
            path, _, anchor = link.partition("#")
            target = page.parent / path if path else page
            if not target.exists() or (
                anchor and target.suffix == ".md" and anchor not in anchors(target)
            ):
                broken.append(f"{page.relative_to(ROOT)}: {link}")
    assert broken == []


def test_the_readme_is_a_front_door() -> None:
    assert len(README.splitlines()) <= 300


def exportctl_commands() -> list[tuple[str, ...]]:
    """Every command path of ``exportctl`` (``("list",)``, ``("tenant", "list")``, …)."""
    import typer

    from exportctl.main import app

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
