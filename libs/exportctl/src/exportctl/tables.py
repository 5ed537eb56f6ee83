"""Tables that fit the terminal (docs/cli.md, "Output"): each column has a priority, and on
a narrow terminal the least important ones are dropped until the table fits — the id (what
other commands take) and the state stay; ids that only inform (``replay of``) are shortened
to their first 8 and last 4 characters (``0190ab12…5e6f``). An 80-column terminal shows
every list readably; a pipe or a file gets every column."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rich import box
from rich.table import Table

from exportctl.common import cell, out


@dataclass(frozen=True)
class Col:
    """A column: its ``header``, how to read its value from a row, and its ``priority``
    (0: always shown; higher numbers are dropped first on a narrow terminal)."""

    header: str
    value: Callable[[Any], object]
    priority: int = 0
    justify: Literal["left", "right"] = "left"
    fold: bool = False


def short_id(value: object) -> str:
    """A UUID as its first 8 and last 4 characters (``0190ab12…5e6f``): UUIDv7 ids begin
    with their creation time, so the end is what tells two of one second apart."""
    text = "" if value is None else str(value)
    return f"{text[:8]}…{text[-4:]}" if len(text) == 36 else text


def _width(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


def fit(columns: Sequence[Col], rows: Sequence[Any], width: int | None = None) -> Table:
    """The rows as a table no wider than ``width`` (the console's): columns dropped from
    the highest priority down while the table is too wide; what still does not fit folds."""
    limit = width or out.width
    cells = [[cell(c.value(r)) for c in columns] for r in rows]
    natural = [
        max([_width(c.header)] + [_width(row[i]) for row in cells]) for i, c in enumerate(columns)
    ]
    kept = list(range(len(columns)))

    def total(indexes: list[int]) -> int:
        # SIMPLE_HEAD without edges: one padding on each side and a separator between columns
        return sum(natural[i] for i in indexes) + 3 * max(len(indexes) - 1, 0)

    while total(kept) > limit:
        droppable = [i for i in kept if columns[i].priority > 0]
        if not droppable:
            break
        worst = max(droppable, key=lambda i: (columns[i].priority, i))
        kept.remove(worst)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for i in kept:
        c = columns[i]
        table.add_column(
            c.header,
            justify=c.justify,
            no_wrap=not c.fold,
            overflow="fold",
            min_width=None if c.fold else natural[i],
        )
    for row in cells:
        table.add_row(*(row[i] for i in kept))
    return table
