"""Code, comments and docstrings say why, not which tracker entry asked for it: a tracker's
number means nothing to a reader of the code (and nothing once the tracker moves), so the
reason is written out where the code is, or the page that documents it is named."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODE_DIRS = ("libs", "services", "devtools", "bench", "tests", "migrations", "scripts")
SUFFIXES = {".py", ".sql", ".sh", ".html"}
# the word issue (or issues) and a number, the word after an opening parenthesis, or a hash
# and a number; not a standard's own numbering (UAX, PKCS), an HTML entity or a colour
TRACKER_NUMBER = re.compile(r"\b[Ii]ssues? #?\d+|\([Ii]ssue\b|(?<!UAX )(?<![\w#&/])#\d+\b")


def test_code_names_no_tracker_numbers() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for folder in CODE_DIRS
        for path in sorted((ROOT / folder).rglob("*"))
        if path.suffix in SUFFIXES and path.is_file()
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if TRACKER_NUMBER.search(line)
    ]
    assert found == []
