"""exportctl writes a downloaded file through a new temporary file of its own beside the
target (exportctl.common.write_beside): nothing planted in the folder is opened or followed,
the target appears only whole and checked, and an existing file is never overwritten
without --force, not even one that appeared while the download ran."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from exportctl.common import write_beside


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".part"))


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file a planted link points at; it must never change."""
    path = tmp_path / "victim"
    path.write_text("precious")
    return path


def test_a_link_planted_at_the_old_part_name_is_neither_followed_nor_touched(
    tmp_path: Path, victim: Path
) -> None:
    folder = tmp_path / "downloads"
    folder.mkdir()
    target = folder / "export-1.json"
    planted = folder / "export-1.json.part"
    planted.symlink_to(victim)
    with write_beside(target, replace=False) as fh:
        fh.write(b'{"notes": []}')
    assert victim.read_text() == "precious"
    assert planted.is_symlink() and os.readlink(planted) == str(victim)
    assert target.read_bytes() == b'{"notes": []}' and not target.is_symlink()
    assert stat.S_IMODE(target.stat().st_mode) == 0o600  # an export is private
    assert leftovers(folder) == ["export-1.json.part"]  # only the planted link


def test_a_link_at_the_target_itself_is_replaced_with_force_never_followed(
    tmp_path: Path, victim: Path
) -> None:
    target = tmp_path / "export-1.json"
    target.symlink_to(victim)
    with write_beside(target, replace=True) as fh:
        fh.write(b"new")
    assert victim.read_text() == "precious"
    assert not target.is_symlink() and target.read_bytes() == b"new"


def test_a_file_that_appears_meanwhile_is_not_overwritten_without_force(
    tmp_path: Path,
) -> None:
    target = tmp_path / "export-1.json"
    with pytest.raises(FileExistsError), write_beside(target, replace=False) as fh:
        fh.write(b"ours")
        target.write_text("theirs")  # created while the download ran
    assert target.read_text() == "theirs"
    assert leftovers(tmp_path) == []


def test_a_failed_download_leaves_no_file_behind(tmp_path: Path) -> None:
    target = tmp_path / "export-1.json"
    with pytest.raises(RuntimeError), write_beside(target, replace=True) as fh:
        fh.write(b"half")
        raise RuntimeError("checksum mismatch")
    assert not target.exists() and leftovers(tmp_path) == []
