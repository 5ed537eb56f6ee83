"""Shared pieces of the CLI: the root typer app (each command group's module adds its own
sub-app to it), consoles and error handling."""

from __future__ import annotations

import errno
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import psycopg
import typer
from psycopg_pool import ConnectionPool
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table
from typer.core import MarkupMode, TyperGroup, TyperOption

from exportcore.db import Conn, Row, make_pool
from exportcore.display import INVISIBLE_FORMAT_CLASS
from exportcore.settings import Settings

HELP_PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Exports", ("submit", "list", "status", "events", "watch", "cancel", "download")),
    ("Schedules and webhooks", ("schedule", "webhook")),
    (
        "Failed exports and operators",
        ("dead-letters", "replay", "bulk", "queue", "audit", "workers"),
    ),
    ("Export files", ("verify", "restore", "manifest-key")),
    (
        "Setup and administration",
        ("migrate", "tenant", "apikey", "operator-key", "notes", "broker", "healthcheck"),
    ),
)
"""The panels of ``exportctl --help``, in order, with their commands in order: what a
newcomer does first (submit, list, watch) comes first. A command not named here is listed
last, under "Other"."""

_SENTENCE = re.compile(r"(.+?[.!?])(?=\s|$)", re.DOTALL)


def first_sentence(text: str) -> str:
    """The first sentence of a command's help, on one line (its summary in the command
    lists of ``--help``); the whole text when it has no sentence end."""
    flat = " ".join(text.split())
    found = _SENTENCE.match(flat)
    return found.group(1) if found else flat


def _tidy(command: Any, markup_mode: MarkupMode) -> None:
    """One help style for ``command`` and its subcommands: ``markup_mode`` (Markdown: the
    docstrings' ``code`` spans render as code, and a paragraph's line breaks are joined), and
    the first sentence of its help as its summary in command lists."""
    if hasattr(command, "rich_markup_mode"):
        command.rich_markup_mode = markup_mode
    if command.short_help is None and command.help:
        command.short_help = first_sentence(command.help.split("\n\n")[0])
    for sub in getattr(command, "commands", {}).values():
        _tidy(sub, markup_mode)


class TopLevel(TyperGroup):
    """The root command group: its commands in the panels and the order of
    :data:`HELP_PANELS`, and every command's help in one style (:func:`_tidy`). Typer builds
    it once per run, with every module's commands already registered."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        order = [name for _, names in HELP_PANELS for name in names]
        panel = {name: title for title, names in HELP_PANELS for name in names}
        ranked = sorted(
            self.commands.items(),
            key=lambda item: order.index(item[0]) if item[0] in order else len(order),
        )
        self.commands = dict(ranked)
        for name, command in self.commands.items():
            command.rich_help_panel = panel.get(name, "Other")  # type: ignore[attr-defined]
            _tidy(command, self.rich_markup_mode)


_type_of = TyperOption.display_type_rich


def _display_type_rich(self: TyperOption, ctx: typer.Context) -> str | None:
    """The value type shown next to an option in ``--help`` (``<int>``, ``<str>``), and none
    for a flag (``--all``, ``--force``, ``--help``), which takes no value: typer 0.29 would
    show ``<bool>``."""
    return None if self.is_flag else _type_of(self, ctx)


TyperOption.display_type_rich = _display_type_rich  # type: ignore[method-assign,assignment]

app = typer.Typer(
    name="exportctl",
    help="Operate notes-exports: migrate, manage tenants and keys, import notes, run exports.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    cls=TopLevel,
    rich_markup_mode="markdown",
)


def completes(*values: str) -> Callable[[str], list[str]]:
    """The shell completion of an option or argument with fixed values (``--status``,
    ``--role``, ``--format``): the ``values`` that begin with what was typed (typer's
    ``autocompletion``; docs/cli.md, "Shell completion")."""

    def complete(incomplete: str) -> list[str]:
        return [v for v in values if v.startswith(incomplete)]

    return complete


def _console(stderr: bool) -> Console:
    """A console on stdout or stderr. On a terminal, rich sizes it to the terminal; on a
    pipe or a file (``exportctl … | less``, ``2> log``), where rich would assume 80 columns
    and break long lines (an error, a sha256), nothing wraps: ``COLUMNS`` when set, else a
    width no line reaches."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    width = int(os.environ.get("COLUMNS", "0") or 0) or 10_000
    return Console(stderr=stderr, width=width, soft_wrap=True)


out = _console(stderr=False)
err = _console(stderr=True)


def id_column(header: str) -> Column:
    """A table column of UUIDs (36 characters): never cut short with an ellipsis, since users
    copy them into other commands; narrower columns give way first."""
    return Column(header, no_wrap=True, min_width=36, overflow="fold")


def key_column(header: str) -> Column:
    """A table column of key prefixes (``nex_1a2b3c4d``, ``nex_op_1a2b3c4d``: 12-15
    characters): kept whole like ids, since operators revoke keys by their prefix."""
    return Column(header, no_wrap=True, min_width=15, overflow="fold")


# Control characters, and the bidirectional and zero-width formatting characters the
# operator console removes (one definition: exportcore.display).
_CONTROL = re.compile(rf"[\x00-\x1f\x7f-\x9f{INVISIBLE_FORMAT_CLASS}]")


def safe(text: object) -> str:
    """``text`` made inert for a terminal: control characters (ESC sequences, carriage
    returns, bells) shown as ``\\xNN`` escapes, bidirectional overrides and zero-width
    characters (``exportcore.display``: a schedule named ``report\\u202etxt.exe`` would
    show as ``reportexe.txt``) as ``\\uNNNN``, and rich markup (``[blink]``) escaped, so a
    file name or a title prints as the text it is. Use for every value that came from a
    user, a file or the server."""
    return escape(_visible(text))


def _escaped(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def _visible(text: object) -> str:
    return _CONTROL.sub(lambda m: _escaped(m.group()), str(text))


def print_value(value: object) -> None:
    """One value alone on a line of stdout (an id, a secret: what ``ID=$(exportctl …)``
    captures), with control characters shown as ``\\xNN`` (formatting characters as
    ``\\uNNNN``) so a value from the server never sends a terminal sequence or reorders
    text. Plain ``print``: no rich markup is read."""
    print(_visible(value))


def cell(value: object) -> str:
    """A table cell for any value: empty for None, else :func:`safe` of its text."""
    return "" if value is None else safe(value)


def add_row(table: Table, *values: object) -> None:
    """Add a row of :func:`cell` values: every cell prints as its text, never as markup or
    a terminal control sequence (the values come from the server, the database or files)."""
    table.add_row(*(cell(v) for v in values))


def print_json(value: Any) -> None:
    """``value`` as indented JSON on stdout, and nothing else (``--json`` of every list
    command: the API's or the database's rows, for scripts); datetimes, UUIDs and decimals
    as strings."""
    print(json.dumps(value, indent=2, default=str))


def more(option: str, value: object) -> None:
    """Tell (on stderr, never wrapped: it is copied) how to ask for the next page."""
    err.print(f"more: {option} {safe(value)}", soft_wrap=True)


def full_page_last_id(rows: Sequence[Row], limit: int, key: str = "id") -> object | None:
    """Keyset pagination of a list without a cursor of its own (the database commands, a
    schedule's runs): the last row's ``key`` (``id``, or ``scheduled_at``) when the page
    holds ``limit`` rows (another page may follow; the next page starts after it), else
    None."""
    return rows[-1][key] if rows and len(rows) == limit else None


def key_value_table(pairs: Iterable[tuple[str, object]]) -> Table:
    """One object as ``key value`` lines without a header (``status``, ``webhook show``),
    each value a :func:`cell`; callers may add rows."""
    table = Table(show_header=False, box=None)
    for key, value in pairs:
        add_row(table, key, value)
    return table


def when(value: Any) -> str:
    """A timestamp (datetime or ISO 8601 string) to the second, ``YYYY-MM-DD HH:MM:SS``
    (UTC, as the API and the database give it); empty for None."""
    return str(value)[:19].replace("T", " ") if value else ""


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print ``message`` on stderr (made :func:`safe`: it may quote the server or the user, so
    it carries no markup of its own) and return the Exit to raise."""
    err.print(f"[bold red]error:[/] {safe(message)}")
    return typer.Exit(code)


def load_settings() -> Settings:
    """Settings from the environment, or a readable error naming the bad variable."""
    try:
        return Settings()
    except ValidationError as exc:
        names = ", ".join(str(e["loc"][0]).upper() for e in exc.errors())
        raise fail(f"invalid configuration in {names}: {exc.errors()[0]['msg']}", 2) from None


@contextmanager
def db_pool() -> Iterator[ConnectionPool[Conn]]:
    """A small pool for one CLI command; a clear message when the database is unreachable."""
    settings = load_settings()
    try:
        pool = make_pool(settings, "exportctl", min_size=1, max_size=2, open_wait=True)
    except Exception as exc:
        raise fail(
            f"cannot reach the database ({type(exc).__name__}); check DATABASE_URL and that "
            "PostgreSQL is running"
        ) from None
    try:
        yield pool
    except psycopg.errors.UndefinedTable:
        raise fail("the schema is missing; run `exportctl migrate` first") from None
    finally:
        pool.close()


class RevokeStatement(Protocol):
    """A store function that revokes the active key whose id or display prefix is ``key``
    and returns what it revoked (``api_key_revoke``, ``operator_key_revoke``)."""

    def __call__(self, conn: Conn, *, key: str) -> list[Row]: ...


def revoke_key(
    key: str,
    revoke: RevokeStatement,
    list_keys: Callable[[Conn], Sequence[Row]],
    kind: str,
    list_command: str,
    audited: Callable[[Conn, Row], object] | None = None,
) -> Row:
    """Revoke the one active key (of ``kind``: ``key``, ``operator key``) whose id or display
    prefix is ``key`` (database: DATABASE_URL) and return its row; ``audited`` writes the
    revocation's audit row in its transaction. When nothing was revoked, ``list_keys``
    counts the matches for the error to tell the user: several active keys share the prefix
    (revoke by id), or none matches (``list_command`` shows them); exit 1."""
    with db_pool() as pool, pool.connection() as conn, conn.transaction():
        revoked = revoke(conn, key=key)
        if revoked and audited is not None:
            audited(conn, revoked[0])
        listed = [] if revoked else list_keys(conn)
    if revoked:
        return revoked[0]
    matches = [k for k in listed if k["revoked_at"] is None and key in (str(k["id"]), k["prefix"])]
    if len(matches) > 1:
        raise fail(f"{len(matches)} active {kind}s have the prefix {key!r}; revoke by id")
    raise fail(f"no active {kind} {key!r}; `{list_command}` shows them")


@contextmanager
def write_beside(target: Path, *, replace: bool) -> Iterator[BinaryIO]:
    """Write ``target`` through a new file beside it, moved into place only when the block
    ends without an exception.

    The temporary file is created by :func:`tempfile.mkstemp` in ``target``'s folder
    (``O_CREAT | O_EXCL``, a random name, mode 0600): whatever someone planted in the folder
    (a symbolic link named ``<target>.part``, say) is never opened, followed or truncated.
    On success it is flushed, fsynced and moved onto ``target``: with :func:`os.replace` when
    ``replace`` (``--force``: a link at ``target`` itself is replaced, never followed), else
    with :func:`os.link`, which raises ``FileExistsError`` for a ``target`` that appeared
    since the caller checked (on a filesystem without hard links: an existing ``target`` is
    ``FileExistsError``, else ``os.replace``). On any exception (``typer.Exit`` of a checksum
    mismatch included) the temporary file is removed and ``target`` is left as it was.
    """
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        if replace:
            os.replace(tmp, target)
            return
        try:
            os.link(tmp, target)
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV):
                raise
            if target.exists() or target.is_symlink():
                raise FileExistsError(errno.EEXIST, "File exists", str(target)) from None
            os.replace(tmp, target)
            return
        tmp.unlink()
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
