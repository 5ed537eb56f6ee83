"""The README (and the topic pages under docs/ it links to) stay true to the code: every
setting and every Procfile process is documented."""

from __future__ import annotations

from pathlib import Path

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
