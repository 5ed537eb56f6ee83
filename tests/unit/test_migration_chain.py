"""The Alembic revisions form one line whose ids match their file names.

Two branches that each add "the next" migration and are merged by renaming a file (but not
its ``revision``) leave two heads; every ``alembic upgrade head`` then fails with "Multiple
head revisions". This reads the revision scripts (no database) and fails at the file that is
out of line, so a bad merge is caught by the unit suite before any integration test runs.
"""

from __future__ import annotations

import re
from pathlib import Path

from alembic.config import Config
from alembic.script import ScriptDirectory

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = ROOT / "migrations" / "versions"


def _scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(Config(str(ROOT / "alembic.ini")))


def test_every_revision_id_is_its_file_number_and_names_the_one_before() -> None:
    files = sorted(p for p in VERSIONS.glob("[0-9][0-9][0-9][0-9]_*.py"))
    assert files, "no migrations found"
    previous: str | None = None
    for path in files:
        number = path.name[:4]
        text = path.read_text(encoding="utf-8")
        revision = re.search(r'^revision\s*=\s*"([^"]+)"', text, re.M)
        down = re.search(r'^down_revision\s*=\s*(None|"([^"]+)")', text, re.M)
        assert revision and revision.group(1) == number, f"{path.name}: revision must be {number!r}"
        assert down is not None, f"{path.name}: no down_revision"
        assert down.group(2) == previous, (
            f"{path.name}: down_revision must be {previous!r}, is {down.group(2)!r}"
        )
        doc = re.search(r"^Revision ID: (\S+)$", text, re.M)
        if doc is not None:
            assert doc.group(1) == number, f"{path.name}: docstring says Revision ID {doc.group(1)}"
        previous = number


def test_alembic_sees_a_single_head() -> None:
    heads = _scripts().get_heads()
    assert len(heads) == 1, f"several heads: {heads}"
    files = sorted(p.name[:4] for p in VERSIONS.glob("[0-9][0-9][0-9][0-9]_*.py"))
    assert heads[0] == files[-1]
