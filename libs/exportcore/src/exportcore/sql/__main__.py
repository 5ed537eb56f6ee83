"""``python -m exportcore.sql NAME …`` (``make sql-show NAME=…``): print statements expanded.

A NAME is a statement (``job_claim_many``), ``file.statement`` (``jobs.job_claim_many``), or
a file (``jobs``: all of its statements). Each is printed as ``-- name: <file>.<statement>``
followed by the SQL that :func:`exportcore.sql.q` returns, fragments expanded. Exits 2 with
a message on stderr for a NAME that matches nothing.
"""

from __future__ import annotations

import sys

from exportcore.sql import _load, aggregates


def show(name: str) -> list[str]:
    """The ``-- name:`` headed, expanded statements ``name`` stands for (see the module
    docstring); empty when it matches nothing."""
    files = aggregates()
    if name in files:
        return [f"-- name: {name}.{s}\n{sql};" for s, sql in _load(name).items()]
    aggregate, _, statement = name.rpartition(".")
    wanted = [aggregate] if aggregate else files
    return [
        f"-- name: {a}.{statement}\n{_load(a)[statement]};"
        for a in wanted
        if a in files and statement in _load(a)
    ]


def main(argv: list[str]) -> int:
    """Print the statements of every NAME of ``argv``; 0, or 2 if one matched nothing."""
    if not argv:
        print("usage: python -m exportcore.sql NAME [NAME …]", file=sys.stderr)
        return 2
    for name in argv:
        found = show(name)
        if not found:
            print(f"no SQL statement or file named {name!r}", file=sys.stderr)
            return 2
        print("\n\n".join(found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
