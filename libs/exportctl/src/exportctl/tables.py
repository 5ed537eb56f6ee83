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
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
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
    """The rows as a table no wider than ``width``, or than the console it is printed on:
    columns dropped from the highest priority down while the table is too wide; what still
    does not fit folds. The returned table is laid out for ``width`` (else the width of
    stdout's console) and lays itself out again when printed on a console of another width
    (:class:`Fitted`)."""
    cells = [[cell(c.value(r)) for c in columns] for r in rows]
    return Fitted(columns, cells, width)


class Fitted(Table):
    """A table of :func:`fit`: a plain rich ``Table`` laid out for one width, which, printed
    on a console of another width without a width of its own, prints the layout of that
    width instead (so a table made before the console it goes to is known still fits)."""

    def __init__(self, columns: Sequence[Col], cells: list[list[str]], width: int | None) -> None:
        super().__init__(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        self._spec = (columns, cells)
        self._fixed = width
        self._laid_for = width or out.width
        _lay_out(self, columns, cells, self._laid_for)

    def _for(self, max_width: int) -> Table:
        if self._fixed is not None or max_width == self._laid_for:
            return self
        other = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        _lay_out(other, *self._spec, max_width)
        return other

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        table = self._for(options.max_width)
        if table is self:
            yield from super().__rich_console__(console, options)
        else:
            yield table

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        table = self._for(options.max_width)
        if table is self:
            return super().__rich_measure__(console, options)
        return Measurement.get(console, options, table)


def _lay_out(table: Table, columns: Sequence[Col], cells: list[list[str]], limit: int) -> None:
    """Add to ``table`` the columns of ``columns`` that fit in ``limit`` characters, and the
    rows of ``cells`` (the cell texts, one list per row, a text per column)."""
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
