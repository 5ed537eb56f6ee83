"""The importer never reads outside its folder and never stalls on a crafted note
(exportctl/importer.py): files are opened relative to the folder without following links,
checked on the opened descriptor, read up to the limit + 1 byte; headings are found by a
block parser that sees a bounded start of the note, each line cut short, in linear time."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path, PurePath
from types import FrameType
from typing import Any

import markdown_it
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exportctl import importer
from exportctl.importer import (
    HEADING_SCAN_CHARS,
    TITLE_SCAN_CHARS,
    SkipFile,
    first_heading,
    parse_note_file,
    read_note,
    title_of,
    walk_candidates,
)

SECRET = "-----BEGIN PRIVATE KEY-----\nnot for export\n"


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """(vault with a.md, b.md and sub/c.md; a private file outside it)."""
    vault, outside = tmp_path / "vault", tmp_path / "outside"
    (vault / "sub").mkdir(parents=True)
    outside.mkdir()
    for rel in ("a.md", "b.md", "sub/c.md"):
        (vault / rel).write_text(f"# {rel}\n")
    (outside / "id_rsa.md").write_text(SECRET)
    (outside / "c.md").write_text(SECRET)
    return vault, outside


def test_a_file_swapped_for_a_link_after_the_walk_is_not_followed(
    layout: tuple[Path, Path],
) -> None:
    vault, outside = layout
    files, _ = walk_candidates(vault)
    assert vault / "b.md" in files
    (vault / "b.md").unlink()
    (vault / "b.md").symlink_to(outside / "id_rsa.md")  # between the walk and the open
    with pytest.raises(SkipFile, match="symbolic link"):
        parse_note_file(vault / "b.md", vault)


def test_a_folder_swapped_for_a_link_after_the_walk_is_not_followed(
    layout: tuple[Path, Path],
) -> None:
    vault, outside = layout
    files, _ = walk_candidates(vault)
    assert vault / "sub" / "c.md" in files
    (vault / "sub" / "c.md").unlink()
    (vault / "sub").rmdir()
    (vault / "sub").symlink_to(outside, target_is_directory=True)  # sub/c.md now outside
    with pytest.raises(SkipFile, match="symbolic link"):
        parse_note_file(vault / "sub" / "c.md", vault)


def test_a_hard_link_to_a_file_outside_is_skipped(layout: tuple[Path, Path]) -> None:
    vault, outside = layout
    os.link(outside / "id_rsa.md", vault / "hard.md")
    files, _ = walk_candidates(vault)
    assert vault / "hard.md" in files  # it looks like any regular file
    with pytest.raises(SkipFile, match="2 hard links"):
        parse_note_file(vault / "hard.md", vault)


def test_a_proc_file_whose_size_says_zero_is_read_only_up_to_the_limit() -> None:
    """/proc/self/status: a regular file with st_size 0 and hundreds of bytes of content."""
    root = os.open("/proc/self", os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert os.stat("status", dir_fd=root).st_size == 0
        with pytest.raises(SkipFile, match=r"larger than 16 bytes \(its size says 0\)"):
            read_note(root, PurePath("status"), max_bytes=16)
    finally:
        os.close(root)


def test_at_most_the_limit_plus_one_byte_is_read(tmp_path: Path) -> None:
    (tmp_path / "big.md").write_bytes(b"x" * 100_000)
    fd = os.open(tmp_path / "big.md", os.O_RDONLY)
    try:
        assert len(importer.read_bounded(fd, 1000)) == 1001
    finally:
        os.close(fd)


@pytest.mark.parametrize("rel", ["../outside/id_rsa.md", "/etc/hostname", "sub/../a.md"])
def test_paths_that_leave_or_dodge_the_folder_are_refused(
    layout: tuple[Path, Path], rel: str
) -> None:
    vault, _ = layout
    root = importer.open_root(vault)
    try:
        with pytest.raises(SkipFile):
            read_note(root, PurePath(rel))
    finally:
        os.close(root)


def test_a_fifo_is_not_a_note_and_does_not_block(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.md")
    with pytest.raises(SkipFile, match="not a regular file"):
        parse_note_file(tmp_path / "pipe.md", tmp_path)


# --- headings: a bounded parse ------------------------------------------------------------

MARKDOWN_IT = Path(markdown_it.__file__).parent


def count_lines_executed(fn: Callable[[], object]) -> int:
    """Python lines executed in exportctl.importer and in markdown-it-py (the block parser,
    pure Python) while ``fn`` runs: a measure of work that does not depend on the machine."""
    count = 0

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal count
        name = frame.f_code.co_filename
        if name == importer.__file__ or name.startswith(str(MARKDOWN_IT)):
            if event == "line":
                count += 1
            return tracer
        return None

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return count


@pytest.mark.parametrize(
    "template",
    [
        "# a{spaces}x",  # the ATX regex backtracked quadratically here
        "# a{spaces}x\nmore text\n",
        "a{spaces}x\n===\n",  # and the setext one here
        "text{spaces}\n{spaces}-x\n",
        "```{spaces}\n# install\n```\n",
    ],
)
def test_a_long_line_costs_what_its_first_scan_chars_cost(template: str) -> None:
    just_over = template.format(spaces=" " * (HEADING_SCAN_CHARS + 10))
    long = template.format(spaces=" " * (TITLE_SCAN_CHARS // 3))  # lines within the start
    first_heading("# warm-up")  # the parser's one-time set-up is not the line's cost
    assert count_lines_executed(lambda: first_heading(long)) == count_lines_executed(
        lambda: first_heading(just_over)
    )


def test_the_parser_sees_at_most_the_first_title_scan_chars(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[int] = []
    monkeypatch.setattr(importer.block_parser(), "parse", lambda text: seen.append(len(text)) or [])
    first_heading("[\n" * 500_000)  # 1 MiB of the slowest input found for the block parser
    assert seen and seen[0] <= TITLE_SCAN_CHARS


def test_a_heading_past_the_scanned_start_does_not_count() -> None:
    body = "text\n" * (TITLE_SCAN_CHARS // 5) + "# Too late\n"
    assert first_heading(body) is None
    assert first_heading("# Early\n" + body) == "Early"


@pytest.mark.parametrize("line", ["[", "x y", "> a", "- a", "```", "<div>", "    code"])
def test_the_work_grows_linearly_with_the_number_of_lines(line: str) -> None:
    few = count_lines_executed(lambda: first_heading(f"{line}\n" * 100))
    many = count_lines_executed(lambda: first_heading(f"{line}\n" * 400))
    assert many <= 4.4 * few, (few, many)


@given(
    st.lists(
        st.text(alphabet=" \t#=-ax\r", max_size=HEADING_SCAN_CHARS * 2),
        max_size=6,
    )
)
def test_only_the_first_scan_chars_of_each_line_count(lines: list[str]) -> None:
    body = "\n".join(lines)
    bounded = "\n".join(line[:HEADING_SCAN_CHARS] for line in lines)
    assert first_heading(body) == first_heading(bounded)
    assert title_of(body, None, PurePath("n.md")) == title_of(bounded, None, PurePath("n.md"))


@pytest.mark.parametrize(
    ("body", "title"),
    [
        ("# C#\n", "C#"),  # a closing sequence needs a space before it
        ("# Title #\n", "Title"),
        ("# Title ###   \n", "Title"),
        ("####### seven\n", None),
        ("#\n", None),
        ("# #\n", None),
        ("  ## two\n", "two"),
        ("para\n  ===  \n", "para"),
        ("\n===\n", None),
        ("    code\n===\n", None),
        ("```sh\n# install\n```\n", None),  # a fenced code block is code
        ("```sh\n# install\napt install x\n```\n\n# Real title\n", "Real title"),
        ("~~~~\n# not this\n```\n# nor this\n~~~~\n## This\n", "This"),
        ("    # indented code\n\nPara\n---\n", "Para"),
        ("<pre>\n# in HTML\n</pre>\n\n# After\n", "After"),
        ("> # quoted\n\n- # listed\n\n# Top\n", "Top"),
        ("#\n\n# Second\n", "Second"),  # an empty heading names nothing
        ("Two lines\nof heading\n===\n", "Two lines of heading"),
    ],
)
def test_headings_follow_commonmark(body: str, title: str | None) -> None:
    assert first_heading(body) == title
