"""Import a folder of Markdown / plain-text notes (an Obsidian-style vault) for one tenant.

Rules:
- candidates are ``*.md``, ``*.markdown`` and ``*.txt`` files; hidden files and folders
  (``.git``, ``.obsidian``) are not walked; other files are counted as ignored;
- a candidate that is binary (a NUL byte), not UTF-8, or larger than ``max_bytes`` is
  skipped and reported with its path and the reason;
- YAML front matter (between ``---`` lines at the top) is removed from the content;
  ``pinned: true`` in it pins the note; ``title:`` in it names the note;
- otherwise the title is the first Markdown heading, else the file name without extension;
- ``updated_at`` is the file's modification time (UTC);
- importing is idempotent per (tenant, path relative to the folder): re-importing an
  unchanged file changes nothing, a changed file updates its note.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from psycopg_pool import ConnectionPool

from exportcore.db import Conn, transaction
from exportcore.store import notes as note_store

NOTE_SUFFIXES = frozenset({".md", ".markdown", ".txt"})
DEFAULT_MAX_BYTES = 1 << 20  # 1 MiB
_ATX = re.compile(r"^ {0,3}#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)
_SETEXT = re.compile(r"^ {0,3}(\S[^\n]*?)[ \t]*\r?\n {0,3}(?:=+|-+)[ \t]*$", re.MULTILINE)
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

    Front matter that is not a YAML mapping is left in the body and reported as a warning.
    """
    m = _FRONT.match(text)
    if not m:
        return None, text, None
    try:
        data = yaml.safe_load(m.group(1) or "")
    except yaml.YAMLError:
        return None, text, "front matter is not valid YAML; imported as plain text"
    if data is None:
        data = {}
    if not isinstance(data, dict):
        return None, text, "front matter is not a YAML mapping; imported as plain text"
    return data, text[m.end() :].lstrip("\r\n"), None


def title_of(body: str, front: dict[str, Any] | None, path: Path) -> str:
    """Front matter ``title``, else the first Markdown heading (ATX ``# Title`` or setext
    ``Title`` underlined with ``===`` / ``---``), else the file stem."""
    if front and isinstance(front.get("title"), str) and front["title"].strip():
        return str(front["title"]).strip()[:500]
    if path.suffix.lower() != ".txt":
        found = [m for m in (_ATX.search(body), _SETEXT.search(body)) if m]
        if found:
            first = min(found, key=lambda m: m.start())
            return first.group(1).strip()[:500]
    return path.stem[:500] or path.name


def parse_note_file(
    path: Path, root: Path, max_bytes: int = DEFAULT_MAX_BYTES
) -> tuple[ParsedNote, str | None]:
    """Read one candidate file: ``(note, warning or None)``.

    Raises ``SkipFile`` with the reason when the file cannot be a note.
    """
    st = path.stat()
    if st.st_size > max_bytes:
        raise SkipFile(f"larger than {max_bytes} bytes ({st.st_size})")
    raw = path.read_bytes()
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
        source_path=path.relative_to(root).as_posix(),
        title=title_of(body, front, path),
        content=body,
        pinned=pinned,
        updated_at=datetime.fromtimestamp(st.st_mtime, tz=UTC),
    )
    return note, warning


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
) -> ImportReport:
    """Import every note file under ``root`` for ``tenant_id``; returns the report.

    ``on_progress(done, total)`` is called after each file. Each batch of ``batch_size``
    files is one transaction. Raises NotADirectoryError when ``root`` is not a folder.
    """
    root = root.resolve()
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is not a folder")
    files, ignored = walk_candidates(root)
    report = ImportReport(ignored=ignored)
    batch: list[ParsedNote] = []

    def flush() -> None:
        if not batch:
            return
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
                    report.inserted += 1
                else:
                    report.updated += 1
        batch.clear()

    for index, path in enumerate(files, start=1):
        rel = path.relative_to(root).as_posix()
        try:
            note, warning = parse_note_file(path, root, max_bytes)
            batch.append(note)
            if warning:
                report.warnings.append((rel, warning))
        except SkipFile as exc:
            report.skipped.append((rel, str(exc)))
        except OSError as exc:
            report.skipped.append((rel, f"unreadable: {exc.strerror or exc}"))
        if len(batch) >= batch_size:
            flush()
        if on_progress:
            on_progress(index, len(files))
    flush()
    return report
