"""Reading a vault of Markdown / text notes (no database: parsing and walking only)."""

from __future__ import annotations

import inspect
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from hypothesis import assume, given

from exportcore.render import NoteRecord
from exportcore.render.markdown_zip import note_markdown
from exportctl import importer
from exportctl.importer import (
    FRONT_MATTER_MAX_CHARS,
    SkipFile,
    parse_note_file,
    split_front_matter,
    title_of,
    walk_candidates,
)
from tests.unit.helpers import note_records

MD = Path("vault/some-note.md")

# --- split_front_matter -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "front", "body"),
    [
        ("---\ntitle: Hi\npinned: true\n---\nBody\n", {"title": "Hi", "pinned": True}, "Body\n"),
        ("---\ntitle: Hi\n...\n\n\nBody", {"title": "Hi"}, "Body"),
        ("---\r\ntags: [a, b]\r\n---\r\n\r\nBody\r\n", {"tags": ["a", "b"]}, "Body\r\n"),
        ("---  \nx: 1\n---\t\n", {"x": 1}, ""),
        ("---\n# only a comment\n---\nBody", {}, "Body"),
    ],
    ids=["dashes", "dots-and-blank-lines", "crlf", "trailing-blanks", "empty-mapping"],
)
def test_front_matter_mapping_is_removed_from_the_body(
    text: str, front: dict[str, object], body: str
) -> None:
    assert split_front_matter(text) == (front, body, None)


@pytest.mark.parametrize(
    "text",
    [
        "# Title\n\nno front matter\n",
        "intro\n---\ntitle: not front matter\n---\n",
        "---\ntitle: never closed\n\nBody\n",
        "",
    ],
)
def test_text_without_front_matter_is_unchanged(text: str) -> None:
    assert split_front_matter(text) == (None, text, None)


def test_invalid_yaml_front_matter_is_kept_in_the_body_with_a_warning() -> None:
    text = "---\ntitle: [unclosed\n---\nBody\n"
    front, body, warning = split_front_matter(text)
    assert front is None
    assert body == text
    assert warning is not None and "not valid YAML" in warning


@pytest.mark.parametrize("yaml_text", ["- a\n- b", "just a sentence", "42"])
def test_front_matter_that_is_not_a_mapping_is_kept_with_a_warning(yaml_text: str) -> None:
    text = f"---\n{yaml_text}\n---\nBody\n"
    front, body, warning = split_front_matter(text)
    assert (front, body) == (None, text)
    assert warning is not None and "not a YAML mapping" in warning


@pytest.mark.parametrize(
    ("yaml_text", "why"),
    [
        ("x: " + "[" * 3000 + "]" * 3000, "not valid YAML"),  # libyaml's nesting limit
        ("when: 2024-13-45", "cannot be read (ValueError)"),  # a timestamp that is no date
        ("x: " + "y" * FRONT_MATTER_MAX_CHARS, f"longer than {FRONT_MATTER_MAX_CHARS}"),
    ],
    ids=["nested-brackets", "impossible-date", "too-long"],
)
def test_front_matter_the_parser_cannot_read_is_a_warning_never_an_error(
    yaml_text: str, why: str
) -> None:
    text = f"---\n{yaml_text}\n---\nBody\n"
    front, body, warning = split_front_matter(text)
    assert (front, body) == (None, text)
    assert warning is not None and why in warning and "imported as plain text" in warning


def test_the_pure_python_parsers_recursion_error_is_a_warning_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without libyaml, nested brackets end in RecursionError (the review's crafted note);
    a low recursion limit makes 400 levels enough, in milliseconds instead of seconds."""
    monkeypatch.setattr(importer, "YAML_LOADER", yaml.SafeLoader)
    text = "---\nx: " + "[" * 400 + "]" * 400 + "\n---\nBody\n"
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack()) + 150)
    try:
        front, body, warning = split_front_matter(text)
    finally:
        sys.setrecursionlimit(limit)
    assert (front, body) == (None, text)
    assert warning == "front matter cannot be read (RecursionError); imported as plain text"


def test_empty_front_matter_block_is_removed() -> None:
    assert split_front_matter("---\n---\n# Real title\n") == ({}, "# Real title\n", None)


# --- title_of ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "front", "path", "title"),
    [
        ("# Heading\n", {"title": "  From front  "}, MD, "From front"),
        ("# Heading\n", {"title": "   "}, MD, "Heading"),
        ("# Heading\n", {"title": 2024}, MD, "Heading"),
        ("text\n\n## Second level ##\n", None, MD, "Second level"),
        ("   ### indented up to three   \n", None, MD, "indented up to three"),
        ("    # four spaces is code\n", None, MD, "some-note"),
        ("#hashtag, not a heading\n", None, MD, "some-note"),
        ("Setext One\n==========\n", None, MD, "Setext One"),
        ("Setext Two\n---\nmore\n", None, MD, "Setext Two"),
        ("Setext first\n===\n\n# ATX later\n", None, MD, "Setext first"),
        ("# ATX first\n\nSetext later\n===\n", None, MD, "ATX first"),
        ("# Heading\r\nbody\r\n", None, MD, "Heading"),
        ("```sh\n# install\n```\n\n# Install guide\n", None, MD, "Install guide"),
        ("```sh\n# install\n```\n", None, MD, "some-note"),
        ("no heading at all\n", None, Path("dir/plain name.markdown"), "plain name"),
        ("# Ignored in text files\n", None, Path("notes/todo.txt"), "todo"),
        ("# Ignored in text files\n", None, Path("notes/TODO.TXT"), "TODO"),
        (
            "# Ignored\n",
            {"title": "Front wins in .txt too"},
            Path("a.txt"),
            "Front wins in .txt too",
        ),
    ],
)
def test_title_of(body: str, front: dict[str, object] | None, path: Path, title: str) -> None:
    assert title_of(body, front, path) == title


def test_titles_are_capped_at_500_characters() -> None:
    assert title_of("# " + "x" * 800 + "\n", None, MD) == "x" * 500
    assert title_of("", {"title": "y" * 800}, MD) == "y" * 500


# --- parse_note_file ----------------------------------------------------------------------


def write(root: Path, rel: str, data: bytes | str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.write_bytes(data)
    return path


def test_parse_note_file_reads_front_matter_title_and_pin(tmp_path: Path) -> None:
    path = write(tmp_path, "sub/dir/n.md", "---\ntitle: Plan\npinned: true\n---\n\n# Ignored\nx\n")
    note, warning = parse_note_file(path, tmp_path)
    assert warning is None
    assert note.source_path == "sub/dir/n.md"
    assert note.title == "Plan"
    assert note.pinned is True
    assert note.content == "# Ignored\nx\n"


@pytest.mark.parametrize("value", ["false", "'true'", "1", "[true]"])
def test_only_a_yaml_true_pins(tmp_path: Path, value: str) -> None:
    path = write(tmp_path, "n.md", f"---\npinned: {value}\n---\nx\n")
    assert parse_note_file(path, tmp_path)[0].pinned is False


def test_unpinned_without_front_matter(tmp_path: Path) -> None:
    note, _ = parse_note_file(write(tmp_path, "n.md", "# T\n"), tmp_path)
    assert (note.pinned, note.title, note.content) == (False, "T", "# T\n")


def test_invalid_front_matter_warns_and_keeps_the_text(tmp_path: Path) -> None:
    text = "---\n: : :\n  - [\n---\nBody\n"
    note, warning = parse_note_file(write(tmp_path, "n.md", text), tmp_path)
    assert warning is not None
    assert note.content == text
    assert note.pinned is False


def test_binary_file_is_skipped(tmp_path: Path) -> None:
    path = write(tmp_path, "n.md", b"# looks like text\x00\x01\x02")
    with pytest.raises(SkipFile, match="binary"):
        parse_note_file(path, tmp_path)


def test_invalid_utf8_is_skipped_with_the_offset(tmp_path: Path) -> None:
    path = write(tmp_path, "n.md", b"caf\xe9 au lait")
    with pytest.raises(SkipFile, match="UTF-8") as info:
        parse_note_file(path, tmp_path)
    assert "offset 3" in str(info.value)


def test_oversize_file_is_skipped(tmp_path: Path) -> None:
    path = write(tmp_path, "n.md", "x" * 11)
    with pytest.raises(SkipFile, match=r"larger than 10 bytes \(11\)"):
        parse_note_file(path, tmp_path, max_bytes=10)
    note, _ = parse_note_file(path, tmp_path, max_bytes=11)
    assert note.content == "x" * 11


def test_byte_order_mark_is_stripped(tmp_path: Path) -> None:
    path = write(tmp_path, "n.md", "\ufeff---\ntitle: With BOM\n---\nbody\n")
    note, warning = parse_note_file(path, tmp_path)
    assert warning is None
    assert note.title == "With BOM"
    assert note.content == "body\n"


def test_updated_at_is_the_mtime_in_utc(tmp_path: Path) -> None:
    path = write(tmp_path, "n.txt", "hello")
    os.utime(path, (1_000_000_000, 1_700_000_000.25))
    note, _ = parse_note_file(path, tmp_path)
    assert note.updated_at == datetime(2023, 11, 14, 22, 13, 20, 250000, tzinfo=UTC)
    assert note.updated_at.utcoffset() is not None and not note.updated_at.utcoffset()
    assert note.title == "n"


# --- an exported note reads back --------------------------------------------------------------


@given(note=note_records())
def test_markdown_export_imports_back(note: NoteRecord) -> None:
    assume(note.title.strip())
    front, body, warning = split_front_matter(note_markdown(note).decode("utf-8"))
    assert warning is None
    assert front is not None
    assert title_of(body, front, MD) == note.title.strip()[:500]
    assert (front.get("pinned") is True) is note.pinned
    exported = note.content if note.content.endswith("\n") else note.content + "\n"
    assert body == exported.lstrip("\r\n")


# --- walk_candidates -----------------------------------------------------------------------


def test_walk_skips_hidden_entries_and_counts_other_files(tmp_path: Path) -> None:
    for rel in [
        "a.md",
        "b.markdown",
        "C.TXT",
        "image.png",
        "data.json",
        "Makefile",
        ".hidden.md",
        ".git/config",
        ".git/notes.md",
        ".obsidian/workspace.md",
        "sub/d.md",
        "sub/.secret.md",
        "sub/deeper/e.txt",
        "sub/.trash/f.md",
    ]:
        write(tmp_path, rel, "x")
    candidates, ignored = walk_candidates(tmp_path)
    rels = [p.relative_to(tmp_path).as_posix() for p in candidates]
    assert sorted(rels) == ["C.TXT", "a.md", "b.markdown", "sub/d.md", "sub/deeper/e.txt"]
    assert ignored == 3  # image.png, data.json, Makefile
    assert walk_candidates(tmp_path) == (candidates, ignored)


def test_walk_ignores_symlinks(tmp_path: Path) -> None:
    target = write(tmp_path / "outside", "real.md", "x")
    vault = tmp_path / "vault"
    vault.mkdir()
    (vault / "link.md").symlink_to(target)
    (vault / "linked-dir").symlink_to(target.parent, target_is_directory=True)
    candidates, ignored = walk_candidates(vault)
    assert candidates == []
    assert ignored == 1  # the file link; a directory link is neither followed nor counted


def test_walk_of_an_empty_folder(tmp_path: Path) -> None:
    assert walk_candidates(tmp_path) == ([], 0)
