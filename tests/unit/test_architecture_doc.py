"""docs/architecture.md stays true to the SQL: every statement it cites exists in the file it
names, every writing ``job_*`` statement of jobs.sql has its place in the state machine, and
the repository cites its own architecture page, not the design file that lived outside it."""

from __future__ import annotations

import os
import re
from pathlib import Path

from devtools.stack import read_procfile
from exportcore.sql import parse

ROOT = Path(__file__).resolve().parents[2]
SQL = ROOT / "libs" / "exportcore" / "src" / "exportcore" / "sql"
DOC = (ROOT / "docs" / "architecture.md").read_text()
PROCESSES = set(read_procfile())  # the seven processes
# A table row citing a statement: | from | to | `process`, … | `statement` | `file.sql` | what |
ROW = re.compile(r"^\|[^|]*\|[^|]*\|([^|]*)\|\s*`([a-z_0-9]+)`\s*\|\s*`([a-z_]+\.sql)`\s*\|", re.M)
# Anywhere in the text: `statement` (`file.sql`)
INLINE = re.compile(r"`([a-z_0-9]+)` \(`([a-z_]+\.sql)`")
WRITE = re.compile(r"\b(INSERT\s+INTO|UPDATE|DELETE\s+FROM)\b", re.I)
LOCK = re.compile(r"\bFOR\s+UPDATE\b", re.I)


def writes(sql: str) -> bool:
    """Whether a statement writes (INSERT, UPDATE, DELETE); a row lock, FOR UPDATE, does not."""
    return bool(WRITE.search(LOCK.sub("", re.sub(r"--[^\n]*", "", sql))))


def statements(file: str) -> dict[str, str]:
    return parse((SQL / file).read_text())


def section(title: str) -> str:
    return DOC.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_every_cited_statement_exists_in_the_named_file() -> None:
    cited = [(m.group(2), m.group(3)) for m in ROW.finditer(DOC)]
    cited += [(m.group(1), m.group(2)) for m in INLINE.finditer(DOC)]
    assert len(cited) > 30
    missing = [(name, file) for name, file in cited if name not in statements(file)]
    assert missing == []


def test_the_state_machine_names_a_real_process_for_every_transition() -> None:
    rows = list(ROW.finditer(section("State machine")))
    assert len(rows) >= 15
    for row in rows:
        named = set(re.findall(r"`([a-z-]+)`", row.group(1)))
        assert named and named <= PROCESSES, row.group(0)


def test_every_writing_job_statement_is_in_the_state_machine() -> None:
    table = {m.group(2) for m in ROW.finditer(section("State machine")) if m.group(3) == "jobs.sql"}
    writing = {
        name
        for name, body in statements("jobs.sql").items()
        if name.startswith("job_") and writes(body)
    }
    assert {"job_submit", "job_claim_many", "job_finish_if_leased_many"} <= writing
    assert sorted(writing - table) == []


def test_the_writes_pattern_tells_a_lock_from_a_write() -> None:
    assert writes("UPDATE export_jobs SET status = 'running'")
    assert writes("WITH a AS (DELETE FROM export_outbox RETURNING id) SELECT * FROM a")
    assert writes("SELECT 1 -- a comment\nFROM x;\nINSERT INTO y VALUES (1)")
    assert not writes("SELECT id FROM export_jobs FOR UPDATE SKIP LOCKED")
    assert not writes("SELECT id FROM export_jobs j FOR  UPDATE OF j")
    assert not writes("SELECT 1 -- then UPDATE the row")


def test_the_invariants_have_stable_numbered_names() -> None:
    names = re.findall(r"^### (INV-(\d+) [a-z-]+)$", section("Invariants"), re.M)
    assert [int(n) for _, n in names] == list(range(1, len(names) + 1))
    assert len(names) >= 13


def ignored_dirs() -> set[str]:
    lines = (ROOT / ".gitignore").read_text().splitlines()
    return {".git"} | {line.strip("/") for line in lines if line.endswith("/") and "*" not in line}


def test_nothing_cites_the_design_file_outside_the_repository() -> None:
    design = "DESIGN" + ".md"  # spelt in two parts so that this file does not cite it
    skip = ignored_dirs()
    citing = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in skip and not d.endswith(".egg-info")]
        for name in files:
            path = Path(folder) / name
            try:
                text = path.read_text("utf-8")
            except (UnicodeDecodeError, OSError):
                continue  # binary files (images, archives) cite nothing
            if design in text:
                citing.append(str(path.relative_to(ROOT)))
    assert citing == []
