"""Named SQL statements, one file per table (docs/architecture.md, "SQL by table").

Each statement starts with ``-- name: <transition>``; lines after it up to the next
``-- name:`` form the statement. Transitions are guarded by state and lease token and
return the row they changed, so "no row" always means "refused".
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import LiteralString

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


def parse(text: str) -> dict[str, str]:
    """Split a ``.sql`` file into ``{name: statement}``; raises ValueError on a duplicate name."""
    parts = _NAME.split(text)
    out: dict[str, str] = {}
    for i in range(1, len(parts), 2):
        name, body = parts[i], parts[i + 1].strip()
        if name in out:
            raise ValueError(f"duplicate SQL statement name {name!r}")
        out[name] = body.rstrip(";").strip()
    return out


@cache
def _load(aggregate: str) -> dict[str, str]:
    text = resources.files(__package__).joinpath(f"{aggregate}.sql").read_text("utf-8")
    return parse(text)


def q(aggregate: str, name: str) -> LiteralString:
    """The statement ``name`` from ``<aggregate>.sql``; raises KeyError if it does not exist."""
    return _load(aggregate)[name]
