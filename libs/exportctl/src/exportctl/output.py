"""How a command prints its data: ``--output json|jsonl|table`` (docs/cli.md, "Output").

- ``table`` (the default of list commands): a table for people on stdout, sized to the
  terminal (:func:`exportctl.tables.fit`); an empty list prints nothing on stdout and says
  so on stderr.
- ``json``: the API's (or the database's) rows as one JSON document on stdout — an array
  for a list (every page with ``--all``), an object for one thing — and nothing else.
- ``jsonl``: one JSON object per line (JSON Lines), a list's rows streamed as they arrive
  (with ``--all``, page after page), for ``jq -c``, ``while read`` and log shippers.

Commands whose natural output is one value (``submit``: the id; ``apikey create``: the key)
print that value alone by default, and the whole object with ``--output json``.
``--json`` stays as the short form of ``--output json``. The default mode can be set per
profile (``output = "json"`` in the config file) or with ``EXPORTCTL_OUTPUT``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from enum import StrEnum
from typing import Annotated, Any, TypeVar

import typer
from psycopg_pool import ConnectionPool
from rich.console import RenderableType

from exportcore.db import Conn, Row
from exportctl.common import err, full_page_last_id, more, out, print_json


class Output(StrEnum):
    """The output modes."""

    json = "json"
    jsonl = "jsonl"
    table = "table"


OutputOpt = Annotated[
    Output | None,
    typer.Option(
        "--output",
        case_sensitive=False,
        help="json | jsonl | table (default: table, or the profile's output)",
        show_default=False,
    ),
]
"""The ``--output`` option of every command that prints data."""

AsJson = Annotated[
    bool, typer.Option("--json", help="the same as --output json", show_default=False)
]


def mode(output: Output | None, as_json: bool = False, default: Output | None = None) -> Output:
    """The mode asked for: ``--json``, else ``--output``, else ``EXPORTCTL_OUTPUT`` or the
    profile's ``output``, else ``default`` (table)."""
    if as_json:
        return Output.json
    if output is not None:
        return output
    configured = os.environ.get("EXPORTCTL_OUTPUT") or _profile_output()
    if configured:
        try:
            return Output(configured.lower())
        except ValueError:
            err.print(f"[yellow]warning:[/] ignoring output {configured!r}: json, jsonl or table")
    return default or Output.table


def explicit(output: Output | None, as_json: bool = False) -> Output | None:
    """The mode asked for on this command line only (``--json``, ``--output``), or None: the
    commands that print one value (an id, a key) by default keep doing so whatever a profile
    or ``EXPORTCTL_OUTPUT`` says, so ``ID=$(exportctl submit …)`` never changes meaning."""
    if as_json:
        return Output.json
    return output


def _profile_output() -> str | None:
    from exportctl.profiles import active

    return active().output


def json_line(value: Any) -> None:
    """One JSON object on one line of stdout (JSON Lines)."""
    print(json.dumps(value, default=str, separators=(",", ":")), flush=True)


def emit_rows(
    rows: list[Any],
    how: Output,
    table: Callable[[list[Any]], RenderableType],
    *,
    empty: str,
) -> None:
    """Print a list: JSON array, JSON Lines, or ``table(rows)`` (``empty`` on stderr when
    there are none)."""
    if how is Output.json:
        print_json(rows)
    elif how is Output.jsonl:
        for row in rows:
            json_line(row)
    elif not rows:
        err.print(empty)
    else:
        out.print(table(rows))


def emit_pages(
    pages: Iterable[list[Any]],
    how: Output,
    table: Callable[[list[Any]], RenderableType],
    *,
    empty: str,
) -> None:
    """Print every page of a list (``--all``): JSON Lines stream page by page; JSON and
    table print once the last page arrived (one array, one table)."""
    if how is Output.jsonl:
        for page in pages:
            for row in page:
                json_line(row)
        return
    rows = [row for page in pages for row in page]
    emit_rows(rows, how, table, empty=empty)


def emit_object(
    value: Any,
    how: Output | None,
    table: Callable[[Any], RenderableType] | None = None,
    *,
    default: Callable[[Any], None] | None = None,
) -> None:
    """Print one object: JSON (indented), one JSON line, ``table(value)``; or, when no mode
    was asked for and ``default`` is given, ``default(value)`` (e.g. the id alone)."""
    if how is Output.json:
        print_json(value)
    elif how is Output.jsonl:
        json_line(value)
    elif how is None and default is not None:
        default(value)
    elif table is not None:
        out.print(table(value))
    else:
        print_json(value)


def emit_new_key(
    key: str, row: dict[str, Any], summary: str, *, quiet: bool, how: Output | None
) -> None:
    """Show a key made just now, the only time it can be seen (``apikey create``,
    ``operator-key create``): unless ``quiet``, ``summary`` (rich markup; its values already
    made safe) and "store it now" on stderr; then ``key`` alone on stdout, or with ``how``
    (``--output``) the key's ``row`` with ``key`` added."""
    if not quiet:
        err.print(summary)
        err.print("store it now; it cannot be shown again:")
    emit_object({**row, "key": key}, how, default=lambda _: print(key))


AllPages = Annotated[
    bool, typer.Option("--all", help="every page, not just one (JSON Lines stream them)")
]
"""The ``--all`` option of every paged list."""

Cursor = TypeVar("Cursor")


def emit_paged(
    page_at: Callable[[Cursor | None], tuple[list[Any], Cursor | None]],
    start: Cursor | None,
    all_pages: bool,
    how: Output,
    table: Callable[[list[Any]], RenderableType],
    *,
    next_option: str,
    empty: str,
) -> None:
    """Print a paged list: the page at ``start`` (``page_at(cursor)`` gives its rows and the
    next page's cursor, None on the last), or with ``all_pages`` every page from there. When
    one page was printed and more remain, how to ask for the next one is printed on stderr
    (``more: --cursor C``)."""
    last: list[Cursor | None] = [None]

    def pages() -> Iterator[list[Any]]:
        cursor = start
        while True:
            rows, following = page_at(cursor)
            last[0] = following
            yield rows
            if not all_pages or following is None:
                return
            cursor = following

    emit_pages(pages(), how, table, empty=empty)
    if last[0] is not None and not all_pages:
        more(next_option, last[0])


def emit_keyset_pages(
    pool: ConnectionPool[Conn],
    fetch: Callable[[Conn, Any], Sequence[Row]],
    limit: int,
    after: Any,
    all_pages: bool,
    how: Output,
    table: Callable[[list[Any]], RenderableType],
    *,
    empty: str,
) -> None:
    """Print a list the database gives by keyset, the commands' ``--after`` (``fetch(conn,
    after)``: at most ``limit`` rows with an ``id`` after ``after``, None for the first
    page) through :func:`emit_paged`: a connection of ``pool`` per page, and a next page
    while a page is full (:func:`exportctl.common.full_page_last_id`; ``more: --after ID``
    on stderr when one page was printed)."""

    def page_at(start: Any) -> tuple[list[Any], Any]:
        with pool.connection() as conn:
            rows = list(fetch(conn, start))
        return rows, full_page_last_id(rows, limit)

    emit_paged(page_at, after, all_pages, how, table, next_option="--after", empty=empty)
