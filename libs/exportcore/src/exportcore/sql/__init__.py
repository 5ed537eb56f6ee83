"""Named SQL statements, one file per table (docs/architecture.md, "SQL by table").

Each statement starts with ``-- name: <transition>``; lines after it up to the next
``-- name:`` (or ``-- fragment:``) form the statement. Transitions are guarded by state and
lease token and return the row they changed, so "no row" always means "refused".

A statement reads whole where it is written. The one thing a file writes once and includes
is a column list (the way sqlc's ``sqlc.embed`` writes a table's columns once): a
``-- fragment: <name>`` (its leading comment lines say which columns and which alias they
expect; its lines are indented relative to its first), included as ``{{name}}`` in a
select list or a RETURNING of the same file, never of another. Shared logic that is one
definition is a database object instead (a view or a function of a migration). Fragments
are expanded when a file is loaded, so :func:`q` returns plain SQL and a fragment is never
a statement of its own; ``make sql-show NAME=<statement>`` prints a statement expanded.
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


def _expand(body: str, fragments: dict[str, str], seen: tuple[str, ...] = ()) -> str:
    def include(m: re.Match[str]) -> str:
        aggregate, name = m.group(1), m.group(2)
        if aggregate is not None:
            raise ValueError(
                f"SQL fragment {{{{{aggregate}.{name}}}}} of another file: a fragment is "
                "included in its own file only"
            )
        if name not in fragments:
            raise ValueError(f"unknown SQL fragment {{{{{name}}}}}")
        if name in seen:
            raise ValueError(f"SQL fragment {name!r} includes itself: {' -> '.join(seen)}")
        text = _expand(fragments[name], fragments, (*seen, name))
        # continuation lines keep the indentation of the line the include stands on
        line = body[body.rfind("\n", 0, m.start()) + 1 :]
        indent = line[: len(line) - len(line.lstrip(" "))]
        return text.replace("\n", "\n" + indent)

    return _INCLUDE.sub(include, body)


def parse(text: str) -> dict[str, str]:
    """Split a ``.sql`` file into ``{name: statement}`` with its fragments expanded.

    Raises ValueError on a repeated name, an unknown fragment, a fragment that includes
    itself, or an include of another file's fragment (``{{file.name}}``).
    """
    statements, fragments = _sections(text)
    return {name: _expand(body, fragments) for name, body in statements.items()}


def fragments(text: str) -> dict[str, str]:
    """``{name: text}`` of a ``.sql`` file's fragments, unexpanded and without their
    comment lines (what ``tests/unit/test_sql_layout.py`` checks are column lists)."""
    return _sections(text)[1]


def _read(aggregate: str) -> str:
    return resources.files(__package__).joinpath(f"{aggregate}.sql").read_text("utf-8")


@cache
def _load(aggregate: str) -> dict[str, str]:
    return parse(_read(aggregate))


def q(aggregate: str, name: str) -> LiteralString:
    """The statement ``name`` from ``<aggregate>.sql``, fragments expanded; raises KeyError
    if it does not exist (a fragment's name included)."""
    return _load(aggregate)[name]


def aggregates() -> list[str]:
    """The names of the shipped ``.sql`` files (``jobs``, ``outbox``, …), sorted."""
    root = resources.files(__package__)
    return sorted(p.name.removesuffix(".sql") for p in root.iterdir() if p.name.endswith(".sql"))
