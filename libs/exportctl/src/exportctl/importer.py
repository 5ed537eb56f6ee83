"""Import a folder of Markdown / plain-text notes (an Obsidian-style vault) for one tenant.

Rules:
- candidates are ``*.md``, ``*.markdown`` and ``*.txt`` files; hidden files and folders
  (``.git``, ``.obsidian``) are not walked; other files are counted as ignored;
- a candidate that is binary (a NUL byte), not UTF-8, or larger than ``max_bytes`` is
  skipped and reported with its path and the reason;
- files are opened relative to the folder, one path component at a time, never following a
  symbolic link (``O_NOFOLLOW`` on every component, ``openat`` style with ``dir_fd``), so a
  file or folder swapped for a link after the walk is skipped, not followed; the opened
  descriptor must be a regular file with one link (``fstat``: a hard link to a file outside
  the folder is skipped), and at most ``max_bytes`` + 1 bytes are read (``/proc`` files
  report a size of 0);
- YAML front matter (between ``---`` lines at the top, at most ``FRONT_MATTER_MAX_CHARS``) is
  removed from the content; ``pinned: true`` in it pins the note; ``title:`` in it names the
  note. Front matter that cannot be read (too long, not YAML, not a mapping, or anything the
  YAML parser raises, such as the pure-Python parser's ``RecursionError`` on thousands of
  nested brackets) is a warning for that file: the note is imported with its text as it is;
- otherwise the title is the first Markdown heading outside code (fenced or indented code
  blocks are code: a note that opens with a fenced block holding ``# install`` is not titled
  "install"), as CommonMark reads the note (markdown-it-py's block parser), else the file name
  without extension. The parser sees at most the first ``TITLE_SCAN_CHARS`` characters of the
  note, each line cut to ``HEADING_SCAN_CHARS``, so a crafted file costs at most a bounded
  parse;
- ``updated_at`` is the file's modification time (UTC);
- importing is idempotent per (tenant, path relative to the folder): re-importing an
  unchanged file changes nothing, a changed file updates its note;
- every transaction that changes notes writes its audit row (:mod:`exportcore.audit`) in
  that transaction: ``notes_import`` per batch that inserted or updated notes (its counts),
  ``notes_delete`` for what ``replace`` deleted (the note ids), all with the import's
  ``import_id``; never a path, a title or content.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any
from uuid import uuid4

import yaml
from psycopg_pool import ConnectionPool

from exportcore import audit
from exportcore.audit import SYSTEM, Actor
from exportcore.db import Conn, transaction
from exportcore.store import notes as note_store

if TYPE_CHECKING:
    from markdown_it import MarkdownIt

NOTE_SUFFIXES = frozenset({".md", ".markdown", ".txt"})
DEFAULT_MAX_BYTES = 1 << 20  # 1 MiB
TITLE_MAX_CHARS = 500
HEADING_SCAN_CHARS = 2048
"""Characters of a line looked at for a heading: a title keeps 500 of them anyway, and no
line costs more than this however long it is."""
TITLE_SCAN_CHARS = 65_536
"""Characters at the start of a note in which its first heading is looked for: a title is
near the top, and the block parser (pure Python, linear in its input) then costs at most
about a second even on a crafted note of 1 MiB."""
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""PyYAML's safe loader on libyaml when the wheel has it (it does on the lock's platforms):
the pure-Python scanner takes seconds on a crafted block (O(depth^2) in nested flow
collections: 5 s for 1,000 ``[``, then ``RecursionError``), libyaml stops at a nesting depth
of 1,000 with a ``ScannerError`` in milliseconds. Both construct with the safe constructor."""
AUDITED_NOTE_IDS_MAX = 1000
"""The most note ids a ``notes_delete`` audit row lists; past it the row says how many more
(``note_ids_more``), its ``count`` being the whole number."""
FRONT_MATTER_MAX_CHARS = 65_536
"""The longest front matter read as YAML; a longer one is imported as plain text, with a
warning (the YAML parser's cost grows with it, and real front matter is a few lines)."""
_FRONT = re.compile(r"\A---[ \t]*\r?\n(?:(.*?)\r?\n)?(?:---|\.\.\.)[ \t]*(?:\r?\n|\Z)", re.DOTALL)


@dataclass(frozen=True)
class ParsedNote:
    """A note read from one file."""

    source_path: str
    title: str
    content: str
    pinned: bool
    updated_at: datetime


@dataclass
class ImportReport:
    """What an import did: counts, and every skipped file with the reason."""

    inserted: int = 0
    updated: int = 0
    unchanged: int = 0
    deleted: int = 0
    ignored: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[tuple[str, str]] = field(default_factory=list)

    @property
    def imported(self) -> int:
        """Notes written (new or changed)."""
        return self.inserted + self.updated


class SkipFile(Exception):
    """A candidate file that cannot be imported; the message is the reason."""


def split_front_matter(text: str) -> tuple[dict[str, Any] | None, str, str | None]:
    """``(front matter or None, body, warning or None)``.

    Front matter that cannot be used is left in the body and reported as a warning, never
    raised: longer than ``FRONT_MATTER_MAX_CHARS``, not valid YAML (libyaml's nesting limit
    included), not a YAML mapping, or any other exception of the YAML parser
    (``RecursionError`` of the pure-Python one on deeply nested flow collections,
    ``ValueError`` on an impossible date): one crafted note must not abort an import of
    many. Parsed with :data:`YAML_LOADER`.
    """
    m = _FRONT.match(text)
    if not m:
        return None, text, None
    block = m.group(1) or ""
    if len(block) > FRONT_MATTER_MAX_CHARS:
        return (
            None,
            text,
            f"front matter is longer than {FRONT_MATTER_MAX_CHARS} characters; "
            "imported as plain text",
        )
    try:
        data = yaml.load(block, Loader=YAML_LOADER)  # a safe loader (YAML_LOADER)
    except yaml.YAMLError:
        return None, text, "front matter is not valid YAML; imported as plain text"
    except Exception as exc:  # the parser's own limits (RecursionError) and constructors
        return (
            None,
            text,
            f"front matter cannot be read ({type(exc).__name__}); imported as plain text",
        )
    if data is None:
        data = {}
    if not isinstance(data, dict):
        return None, text, "front matter is not a YAML mapping; imported as plain text"
    return data, text[m.end() :].lstrip("\r\n"), None


def _lines(body: str) -> Iterator[str]:
    """The lines of ``body`` without their ``\\n`` / ``\\r\\n``, each cut to
    ``HEADING_SCAN_CHARS`` (one pass over the text)."""
    start = 0
    while start <= len(body):
        end = body.find("\n", start)
        if end < 0:
            end = len(body)
        yield body[start : min(end, start + HEADING_SCAN_CHARS)].removesuffix("\r")
        start = end + 1


@cache
def block_parser() -> MarkdownIt:
    """CommonMark's block structure only (headings, code blocks, paragraphs): a heading's text
    stays as written, and inline parsing costs nothing. Built on first use: every other
    command of exportctl starts without loading markdown-it-py."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").disable(["inline", "text_join"])


def first_heading(body: str) -> str | None:
    """The text of the first non-empty top-level heading of ``body`` outside code: ATX
    (``# Title``) or setext (``Title`` underlined with ``===`` or ``---``; the lines of a
    multi-line setext heading joined with spaces), as CommonMark 0.31 reads it (markdown-it-py,
    block rules only), else None. Headings inside fenced or indented code blocks, HTML
    blocks, quotes and lists do not count. Reads at most the first ``TITLE_SCAN_CHARS``
    characters, each line cut to ``HEADING_SCAN_CHARS``."""
    text = "\n".join(_lines(body[:TITLE_SCAN_CHARS]))
    tokens = block_parser().parse(text)
    for index, token in enumerate(tokens):
        if token.type == "heading_open" and token.level == 0:
            content = tokens[index + 1].content
            heading = " ".join(line.strip(" \t") for line in content.splitlines()).strip()
            if heading:
                return heading
    return None


def title_of(body: str, front: dict[str, Any] | None, path: PurePath) -> str:
    """Front matter ``title``, else the first Markdown heading outside code
    (:func:`first_heading`; not for ``.txt`` files), else the file stem; at most 500
    characters."""
    if front and isinstance(front.get("title"), str) and front["title"].strip():
        return str(front["title"]).strip()[:TITLE_MAX_CHARS]
    if path.suffix.lower() != ".txt":
        heading = first_heading(body)
        if heading is not None:
            return heading.strip()[:TITLE_MAX_CHARS]
    return path.stem[:TITLE_MAX_CHARS] or path.name


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


def open_root(root: Path) -> int:
    """A descriptor of the folder ``root`` (the caller's choice: it may be reached through
    links) to open notes relative to; the caller closes it."""
    return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def open_relative(root_fd: int, rel: PurePath) -> int:
    """Open the file ``rel`` under the folder ``root_fd`` one component at a time, never
    following a link (``O_NOFOLLOW`` with ``dir_fd``, the ``openat(2)`` walk); returns the
    file's descriptor. Raises SkipFile for a link, ``..`` or an absolute path, OSError for
    other failures."""
    parts = rel.parts
    if not parts or rel.is_absolute() or any(p in ("", ".", "..") for p in parts):
        raise SkipFile("not a path inside the folder")
    fd = root_fd
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            try:
                nxt = os.open(part, _FILE_FLAGS if last else _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise SkipFile("a symbolic link (links are not followed)") from None
                raise
            if fd != root_fd:
                os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        if fd != root_fd:
            os.close(fd)
        raise


def read_bounded(fd: int, max_bytes: int) -> bytes:
    """At most ``max_bytes`` + 1 bytes from ``fd`` (so a file larger than the limit is
    recognised whatever its ``st_size`` says: ``/proc`` files report 0)."""
    chunks: list[bytes] = []
    left = max_bytes + 1
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_note(
    root_fd: int, rel: PurePath, max_bytes: int = DEFAULT_MAX_BYTES
) -> tuple[ParsedNote, str | None]:
    """Read the candidate ``rel`` (relative to the folder ``root_fd``): ``(note, warning or
    None)``. Raises ``SkipFile`` with the reason when the file cannot be a note (a link, not
    a regular file, more than one hard link, too large, binary, not UTF-8), OSError when it
    cannot be read."""
    fd = open_relative(root_fd, rel)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SkipFile("not a regular file")
        if st.st_nlink != 1:
            raise SkipFile(f"has {st.st_nlink} hard links (only files with one are imported)")
        if st.st_size > max_bytes:
            raise SkipFile(f"larger than {max_bytes} bytes ({st.st_size})")
        raw = read_bounded(fd, max_bytes)
    finally:
        os.close(fd)
    if len(raw) > max_bytes:  # its size said otherwise (a /proc file, or it grew)
        raise SkipFile(f"larger than {max_bytes} bytes (its size says {st.st_size})")
    if b"\x00" in raw:
        raise SkipFile("binary file (contains NUL bytes)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SkipFile(f"not UTF-8 (invalid byte at offset {exc.start})") from None
    text = text.removeprefix("\ufeff")
    front, body, warning = split_front_matter(text)
    pinned = bool(front and front.get("pinned") is True)
    note = ParsedNote(
        source_path=rel.as_posix(),
        title=title_of(body, front, rel),
        content=body,
        pinned=pinned,
        updated_at=datetime.fromtimestamp(st.st_mtime, tz=UTC),
    )
    return note, warning


def parse_note_file(
    path: Path, root: Path, max_bytes: int = DEFAULT_MAX_BYTES
) -> tuple[ParsedNote, str | None]:
    """Read one candidate file ``path`` under the folder ``root`` (see :func:`read_note`):
    ``(note, warning or None)``. Raises ``SkipFile`` with the reason when the file cannot be
    a note."""
    root_fd = open_root(root)
    try:
        return read_note(root_fd, path.relative_to(root), max_bytes)
    finally:
        os.close(root_fd)


def walk_candidates(root: Path) -> tuple[list[Path], int]:
    """``(candidate note files sorted by path, number of other files ignored)``."""
    candidates: list[Path] = []
    ignored = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            path = Path(dirpath) / name
            if path.is_symlink() or not path.is_file():
                ignored += 1
            elif path.suffix.lower() in NOTE_SUFFIXES:
                candidates.append(path)
            else:
                ignored += 1
    return sorted(candidates), ignored


def import_notes(
    pool: ConnectionPool[Conn],
    tenant_id: str,
    root: Path,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    batch_size: int = 200,
    on_progress: Callable[[int, int], None] | None = None,
    replace: bool = False,
    actor: Actor = SYSTEM,
) -> ImportReport:
    """Import every note file under ``root`` for ``tenant_id``; returns the report.

    ``on_progress(done, total)`` is called after each file. Each batch of ``batch_size``
    files is one transaction. With ``replace`` the folder replaces the tenant's imported
    notes: afterwards, every imported note whose file is no longer under ``root`` is
    deleted (a file that is there but skipped keeps its note), each leaving a tombstone for
    the next delta export. Each transaction that changes notes is audited by ``actor``
    (``notes_import`` per batch, ``notes_delete`` for the replace; see the module's rules).
    Raises NotADirectoryError when ``root`` is not a folder.
    """
    root = root.resolve()
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is not a folder")
    files, ignored = walk_candidates(root)
    report = ImportReport(ignored=ignored)
    root_fd = open_root(root)
    batch: list[ParsedNote] = []
    import_id = str(uuid4())
    batches = 0

    def flush() -> None:
        nonlocal batches
        if not batch:
            return
        batches += 1
        inserted = updated = 0
        with transaction(pool) as conn:  # one commit per batch of files
            for note in batch:
                row = note_store.note_upsert_by_path(
                    conn,
                    tenant_id=tenant_id,
                    source_path=note.source_path,
                    title=note.title,
                    content=note.content,
                    pinned=note.pinned,
                    updated_at=note.updated_at,
                )
                if row is None:
                    report.unchanged += 1
                elif row["inserted"]:
                    inserted += 1
                else:
                    updated += 1
            if inserted or updated:
                audit.record(
                    conn,
                    actor,
                    "notes_import",
                    target_kind="tenant",
                    target_id=tenant_id,
                    tenant_id=tenant_id,
                    count=inserted + updated,
                    detail={
                        "import_id": import_id,
                        "batch": batches,
                        "inserted": inserted,
                        "updated": updated,
                    },
                )
        report.inserted += inserted  # counted once committed
        report.updated += updated
        batch.clear()

    try:
        for index, path in enumerate(files, start=1):
            rel = path.relative_to(root)
            try:
                note, warning = read_note(root_fd, rel, max_bytes)
                batch.append(note)
                if warning:
                    report.warnings.append((rel.as_posix(), warning))
            except SkipFile as exc:
                report.skipped.append((rel.as_posix(), str(exc)))
            except OSError as exc:
                report.skipped.append((rel.as_posix(), f"unreadable: {exc.strerror or exc}"))
            if len(batch) >= batch_size:
                flush()
            if on_progress:
                on_progress(index, len(files))
        flush()
    finally:
        os.close(root_fd)
    if replace:
        kept = [p.relative_to(root).as_posix() for p in files]
        with transaction(pool) as conn:
            deleted = note_store.notes_delete_not_in_paths(conn, tenant_id=tenant_id, paths=kept)
            if deleted:
                record_notes_deleted(
                    conn, actor, tenant_id, deleted, detail={"import_id": import_id}
                )
        report.deleted = len(deleted)
    return report


def record_notes_deleted(
    conn: Conn,
    actor: Actor,
    tenant_id: str,
    note_ids: list[int],
    *,
    detail: dict[str, Any] | None = None,
) -> None:
    """The audit row of deleting ``note_ids`` of ``tenant_id`` (``notes_delete``, its
    ``count`` the number deleted), on the deleting transaction's ``conn``: the ids in
    ``detail.note_ids``, sorted, at most ``AUDITED_NOTE_IDS_MAX`` (``note_ids_more`` says
    how many more), with ``detail``'s own keys."""
    ids = sorted(note_ids)
    described: dict[str, Any] = {**(detail or {}), "note_ids": ids[:AUDITED_NOTE_IDS_MAX]}
    if len(ids) > AUDITED_NOTE_IDS_MAX:
        described["note_ids_more"] = len(ids) - AUDITED_NOTE_IDS_MAX
    audit.record(
        conn,
        actor,
        "notes_delete",
        target_kind="tenant",
        target_id=tenant_id,
        tenant_id=tenant_id,
        count=len(ids),
        detail=described,
    )
