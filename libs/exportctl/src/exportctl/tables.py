"""Tables that fit the terminal (docs/cli.md, "Output"): each column has a priority, and on
a narrow terminal the least important ones are dropped until the table fits — the id (what
other commands take) and the state stay; a column of free text (a name, a detail) folds
onto more lines, down to its ``fold_width``, rather than being cut or squeezed; ids that
only inform (``replay of``) are shortened to their first 8 and last 4 characters
(``0190ab12…5e6f``). An 80-column terminal shows every list readably; a pipe or a file gets
every column."""

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
    (0: always shown; higher numbers are dropped first on a narrow terminal). A ``fold``
    column wraps its text onto more lines when the terminal is narrow, down to
    ``fold_width`` characters (never narrower than that, nor than its header): the table
    drops columns before squeezing it further."""

    header: str
    value: Callable[[Any], object]
    priority: int = 0
    justify: Literal["left", "right"] = "left"
    fold: bool = False
    fold_width: int = 12


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
    # the narrowest each column may be: its natural width, or a folding column's fold width
    least = [
        min(natural[i], max(c.fold_width, _width(c.header))) if c.fold else natural[i]
        for i, c in enumerate(columns)
    ]
    kept = list(range(len(columns)))

    def total(indexes: list[int]) -> int:
        # SIMPLE_HEAD without edges: one padding on each side and a separator between columns
        return sum(least[i] for i in indexes) + 3 * max(len(indexes) - 1, 0)

    while total(kept) > limit:
        droppable = [i for i in kept if columns[i].priority > 0]
        if not droppable:
            break
        worst = max(droppable, key=lambda i: (columns[i].priority, i))
        kept.remove(worst)
    # still too wide with only the columns that always show: the folding ones may go
    # narrower than their fold width (rich shares out what is left) rather than be cut off
    squeezed = total(kept) > limit
    widths = _share(limit - total(kept), kept, least, natural, columns)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for i in kept:
        c = columns[i]
        table.add_column(
            c.header,
            justify=c.justify,
            no_wrap=not c.fold,
            overflow="fold",
            min_width=None if c.fold else natural[i],
            width=widths[i] if c.fold and not squeezed else None,
        )
    for row in cells:
        table.add_row(*(row[i] for i in kept))
    return table


def _share(
    spare: int, kept: list[int], least: list[int], natural: list[int], columns: Sequence[Col]
) -> list[int]:
    """The width of each column: ``least``, and for the folding columns among ``kept`` the
    ``spare`` characters shared out evenly (none beyond a column's ``natural`` width). rich
    would take room from the widest folding column first, below its fold width."""
    widths = list(least)
    growing = [i for i in kept if columns[i].fold and natural[i] > least[i]]
    while spare > 0 and growing:
        share = max(spare // len(growing), 1)
        for i in list(growing):
            grow = min(share, natural[i] - widths[i], spare)
            widths[i] += grow
            spare -= grow
            if widths[i] >= natural[i]:
                growing.remove(i)
            if spare == 0:
                break
    return widths
