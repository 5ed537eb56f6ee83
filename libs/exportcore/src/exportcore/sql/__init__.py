"""Named SQL statements, one file per table (docs/architecture.md, "SQL by table").

Each statement starts with ``-- name: <transition>``; lines after it up to the next
``-- name:`` (or ``-- fragment:``) form the statement. Transitions are guarded by state and
lease token and return the row they changed, so "no row" always means "refused".

A piece of SQL that several statements share is written once as ``-- fragment: <name>``
(its leading comment lines say what it is and which aliases it expects; its lines are
indented relative to its first) and included where it is used as ``{{name}}``, or
``{{file.name}}`` for a fragment of another file (the way sqlc's ``sqlc.embed`` writes a
table's columns once). Fragments are expanded when a file is loaded, so :func:`q` returns
plain SQL and a fragment is never a statement of its own.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import LiteralString

_SECTION = re.compile(r"^--\s*(name|fragment):\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
_INCLUDE = re.compile(r"\{\{\s*(?:([a-z_][a-z0-9_]*)\.)?([a-z_][a-z0-9_]*)\s*\}\}")
_COMMENT_LINE = re.compile(r"^\s*--.*\n?", re.MULTILINE)


def _sections(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """``({statement name: body}, {fragment name: body})`` of a file, unexpanded; a
    fragment's body loses its full-line comments. Raises ValueError on a repeated name."""
    parts = _SECTION.split(text)
    statements: dict[str, str] = {}
    fragments: dict[str, str] = {}
    for i in range(1, len(parts), 3):
        kind, name, body = parts[i], parts[i + 1], parts[i + 2].strip()
        if name in statements or name in fragments:
            raise ValueError(f"duplicate SQL statement name {name!r}")
        if kind == "fragment":
            fragments[name] = _COMMENT_LINE.sub("", body).strip().rstrip(";").strip()
        else:
            statements[name] = body.rstrip(";").strip()
    return statements, fragments


@cache
def _file_fragments(aggregate: str) -> dict[str, str]:
    return _sections(_read(aggregate))[1]


def _expand(body: str, local: dict[str, str], seen: tuple[str, ...] = ()) -> str:
    def include(m: re.Match[str]) -> str:
        aggregate, name = m.group(1), m.group(2)
        fragments = local if aggregate is None else _file_fragments(aggregate)
        key = f"{aggregate}.{name}" if aggregate else name
        if name not in fragments:
            raise ValueError(f"unknown SQL fragment {{{{{key}}}}}")
        if key in seen:
            raise ValueError(f"SQL fragment {key!r} includes itself: {' -> '.join(seen)}")
        text = _expand(fragments[name], fragments, (*seen, key))
        # continuation lines keep the indentation of the line the include stands on
        line = body[body.rfind("\n", 0, m.start()) + 1 :]
        indent = line[: len(line) - len(line.lstrip(" "))]
        return text.replace("\n", "\n" + indent)

    return _INCLUDE.sub(include, body)


def parse(text: str) -> dict[str, str]:
    """Split a ``.sql`` file into ``{name: statement}`` with its fragments expanded.

    Raises ValueError on a repeated name, an unknown fragment or a fragment that includes
    itself; an included file of another name that does not exist raises FileNotFoundError.
    """
    statements, fragments = _sections(text)
    return {name: _expand(body, fragments) for name, body in statements.items()}


def _read(aggregate: str) -> str:
    return resources.files(__package__).joinpath(f"{aggregate}.sql").read_text("utf-8")


@cache
def _load(aggregate: str) -> dict[str, str]:
    return parse(_read(aggregate))


def q(aggregate: str, name: str) -> LiteralString:
    """The statement ``name`` from ``<aggregate>.sql``, fragments expanded; raises KeyError
    if it does not exist (a fragment's name included)."""
    return _load(aggregate)[name]
