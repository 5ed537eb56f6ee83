"""``exportctl`` on an 80-column terminal, as a newcomer meets it: the tables that used to
lose what they are about (``broker inspect``'s queue names, ``events``' detail, ``schedule
list``'s name, ``audit list``'s target) keep it readable; ``--help`` shows no raw markup and
no value type on a flag, lists ``submit`` and the other export commands first; and the shell
completion of the fixed values docs/cli.md promises (``--status``, ``--role``, ``--format``,
``--output``) answers, through the console script, as bash and zsh call it."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import typer
from rich.console import Console

from exportcore.broker_inspect import BrokerReport, Message, QueueReport
from exportcore.domain import count_of
from exportctl import audit, broker, exports, schedules
from exportctl import tables as exportctl_tables
from exportctl.common import HELP_PANELS, first_sentence
from exportctl.main import app

J1 = "01a23bb0-3183-727a-b007-42b699d0dfe2"
WIDTH = 80


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> Console:
    """An 80-column console standing in for exportctl's stdout."""
    console = Console(file=io.StringIO(), width=WIDTH, record=True, color_system=None)
    monkeypatch.setattr("exportctl.tables.out", console)
    monkeypatch.setattr(broker, "out", console)
    return console


def shown(console: Console) -> str:
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= WIDTH, text
    return text


def test_broker_inspect_names_each_queue_whole(terminal: Console) -> None:
    job = UUID(J1)
    report = BrokerReport(
        queues={
            "exports.fast": QueueReport("exports.fast", 3, 1, 12.5, 300.0, 3, 1, 0, 0, 2),
            "exports.bulk": QueueReport("exports.bulk", 120, 4, 7300.0, 65.0, 100, 0, 1, 0, 0),
        },
        stale=[Message("exports.fast", "unacked", b"", job_id=job, age=65.0, job_status="failed")],
        unknown=[Message("exports.bulk", "ready", b"", job_id=job, age=12.0)],
        lost=[{"id": job, "queue": "exports.fast", "dispatch_count": 2, "waiting": 130.0}],
    )
    broker._print(report, show=10)
    text = shown(terminal)
    queues_table = text.split("\n\n")[0] if "\n\n" in text else text
    assert re.search(r"^exports\.bulk\s+120\s+4\s", queues_table, re.M), text
    assert re.search(r"^exports\.fast\s+3\s+1\s", queues_table, re.M), text
    assert "exports.…" not in text and "…" not in text
    # every count of the queue table, and the job ids other commands take
    for header in ("ready", "unacked", "stale", "unknown", "lost"):
        assert header in text
    assert text.count(J1) == 3


def event(n: int, kind: str, detail: dict[str, Any], at: str = "2026-01-02T03:04:05+00:00") -> Any:
    return {
        "id": n,
        "at": at,
        "kind": kind,
        "from_status": "running",
        "to_status": "queued",
        "attempt": 1,
        "detail": detail,
    }


DETAIL = {
    "error_code": "lease_expired",
    "next_attempt_at": "2026-01-02T03:05:06+00:00",
    "progress": 400,
}


@pytest.mark.parametrize("days", [1, 2], ids=["one day", "two days"])
def test_events_give_the_detail_room_to_read(terminal: Console, days: int) -> None:
    rows = [
        event(101, "lease_expired", DETAIL),
        event(
            102,
            "cancel_requested",
            {"requested_by": "operator nex_op_1a2b3c4d (alice)"},
            at=f"2026-01-0{1 + days}T23:59:59+00:00",
        ),
    ]
    terminal.print(exports.events_table(rows))
    text = shown(terminal)
    # the detail column is at least 24 characters wide: its first words stay whole
    assert "error_code=lease_expired" in text, text
    assert "progress=400" in text and "(alice)" in text
    assert "lease_expired" in text and "cancel_requested" in text  # kinds whole
    if days == 1:
        assert "2026-01-02" in text.splitlines()[1] and "03:04:05" in text  # the day once
    else:
        assert "2026-01-02 03:04:05" in text and "2026-01-03 23:59:59" in text


def test_schedule_list_keeps_the_name(terminal: Console) -> None:
    row = {
        "id": J1,
        "name": "nightly backup of the team notes",
        "cron": "0 2 * * *",
        "timezone": "Europe/Berlin",
        "rule_description": "At 02:00",
        "interval_seconds": None,
        "selection": {"note_ids": [7]},
        "format": "json",
        "catch_up": "skip",
        "max_catch_up": 10,
        "enabled": True,
        "next_due_at": "2026-01-02T01:00:00+00:00",
    }
    terminal.print(schedules._table([row, row | {"name": "weekly"}]))
    text = shown(terminal)
    assert J1 in text and "weekly" in text
    assert "nightly backup" in text and "notes" in text, text  # folded, never dropped
    assert "At 02:00" in text


def test_audit_list_keeps_the_target(terminal: Console) -> None:
    entry = {
        "id": 1234,
        "at": "2026-12-01T10:00:00+00:00",
        "actor": "nex_op_1a2b3c4d (alice)",
        "action": "bulk_replay",
        "target_kind": "filter",
        "target_id": "reason render_error",
        "job_id": None,
        "count": 10000,
        "outcome": "done",
        "tenant_id": "acme",
    }
    on_job = entry | {"action": "cancel", "job_id": J1, "count": None}
    terminal.print(audit.audit_table([entry, on_job]))
    text = shown(terminal)
    assert "target" in text.splitlines()[0]
    assert "filter reason" in text and "render_error" in text, text
    assert "job 01a23bb0…dfe2" in text


def commands(group: Any = None, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command path of exportctl (``()`` the root, ``("schedule", "create")``...)."""
    group = group or root()
    yield path
    for name, sub in getattr(group, "commands", {}).items():
        yield from commands(sub, (*path, name))


@functools.cache
def root() -> Any:
    """exportctl's click command, built once (typer builds it anew on every run)."""
    return typer.main.get_command(app)


def help_of(*path: str) -> str:
    """``exportctl PATH --help`` as an 80-column terminal shows it."""
    shown = io.StringIO()
    with pytest.MonkeyPatch.context() as env, contextlib.redirect_stdout(shown):
        env.setenv("COLUMNS", str(WIDTH))
        env.delenv("TERMINAL_WIDTH", raising=False)
        root().main([*path, "--help"], prog_name="exportctl", standalone_mode=False)
    return shown.getvalue()


RAW = re.compile(r"``|\[/?(bold|red|green|yellow|dim|italic)?\]|\[/\]|<bool>")


def test_help_shows_no_raw_markup_and_no_type_on_flags() -> None:
    paths = list(commands())
    assert len(paths) > 60
    found = {}
    for path in paths:
        text = help_of(*path)
        raw = sorted({m.group(0) for m in RAW.finditer(text)})
        if raw:
            found[" ".join(path) or "exportctl"] = raw
    assert found == {}
    # a flag is listed without a value type; an option with a value keeps its type
    submit = help_of("submit")
    assert re.search(r"--all\s+export every note", submit), submit
    assert re.search(r"--format\s+-f\s+<str>", submit), submit


def test_top_level_help_lists_the_export_commands_first() -> None:
    text = help_of()
    order = [name for _, names in HELP_PANELS for name in names]
    positions = [re.search(rf"^│ {re.escape(name)} ", text, re.M) for name in order]
    assert all(positions), [n for n, p in zip(order, positions, strict=True) if p is None]
    starts = [p.start() for p in positions if p is not None]
    assert starts == sorted(starts)
    assert order[0] == "submit"
    for late in ("replay", "healthcheck", "migrate"):
        assert text.index("│ submit ") < text.index(f"│ {late} ")
    panels = [title for title, _ in HELP_PANELS]
    assert [t for t in re.findall(r"╭─ (.+?) ─", text) if t in panels] == panels
    # every command is in a panel: nothing falls into "Other"
    assert "Other" not in text
    # each command's line in a list is its first sentence, not its whole docstring
    assert "Submit an export." in text and "Prints ONE line" not in text


def test_first_sentence() -> None:
    assert first_sentence("Show an export's\n    status. More.") == "Show an export's status."
    assert first_sentence("Tenants") == "Tenants"


def test_count_of_says_one_note() -> None:
    assert count_of(1, "note") == "1 note"
    assert count_of(0, "note") == "0 notes"
    assert count_of(2, "batch", "batches") == "2 batches"


EXPORTCTL = Path(sys.executable).with_name("exportctl")


CASES: dict[tuple[str, ...], list[str]] = {
    ("list", "--status", ""): ["queued", "running", "succeeded", "failed", "cancelled"],
    ("list", "--status", "r"): ["running"],
    ("operator-key", "create", "--label", "x", "--role", ""): ["viewer", "admin"],
    ("operator-key", "set-role", "nex_op_1a2b3c4d", "v"): ["viewer"],
    ("bulk", "cancel", "--status", ""): ["queued", "running"],
    ("submit", "--format", ""): ["json", "ndjson", "markdown_zip"],
}


def complete_in_bash(cases: list[tuple[str, ...]]) -> list[list[str]]:
    """What bash offers for the last word of each case after ``exportctl``: the script of
    ``exportctl --show-completion bash`` sourced in a real bash, its completion function
    called as bash calls it on TAB (``COMP_WORDS``, ``COMP_CWORD``), ``COMPREPLY`` read.
    One bash for every case (each TAB still runs ``exportctl``)."""
    script = ['source <("$EXPORTCTL" --show-completion bash)']
    for words in cases:
        quoted = " ".join(f"'{w}'" for w in ("exportctl", *words))
        script += [
            f"COMP_WORDS=({quoted}); COMP_CWORD={len(words)}; COMPREPLY=()",
            "_exportctl_completion exportctl",
            'printf "%s\\n" "${COMPREPLY[@]}" "--"',
        ]
    # the function runs its first argument, as bash passes the command's name: on PATH
    path = f"{EXPORTCTL.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "EXPORTCTL": str(EXPORTCTL), "PATH": path}
    result = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    answers = result.stdout.split("--\n")[: len(cases)]
    return [[line for line in answer.splitlines() if line] for answer in answers]


def complete_in_zsh_protocol(*words: str) -> list[str]:
    """What ``exportctl`` answers the zsh script of ``--show-completion zsh``
    (``_EXPORTCTL_COMPLETE=complete_zsh``, the command line in ``_TYPER_COMPLETE_ARGS``):
    the values of its ``_arguments`` spec."""
    env = {
        **os.environ,
        "_EXPORTCTL_COMPLETE": "complete_zsh",
        "_TYPER_COMPLETE_ARGS": " ".join(("exportctl", *words)),
    }
    result = subprocess.run(
        [str(EXPORTCTL)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0 and result.stdout.startswith("_arguments"), result
    return re.findall(r'"([^"]*)"', result.stdout)


needs_script = pytest.mark.skipif(
    not EXPORTCTL.exists(), reason="the console script is not installed (make install)"
)


@needs_script
def test_bash_completes_the_fixed_values() -> None:
    cases = list(CASES)
    assert dict(zip(cases, complete_in_bash(cases), strict=True)) == CASES


@needs_script
def test_zsh_completion_answers_the_same_values() -> None:
    assert complete_in_zsh_protocol("list", "--status", "") == list(exports.STATUSES)
    assert complete_in_zsh_protocol("operator-key", "create", "--role", "a") == ["admin"]


def test_a_fitted_table_lays_itself_out_for_the_console_it_is_printed_on(
    terminal: Console,
) -> None:
    rows = [{"name": "nightly backup of the team notes", "id": J1, "rule": "At 02:00"}]
    columns = [
        exportctl_tables.Col("id", lambda r: r["id"]),
        exportctl_tables.Col("name", lambda r: r["name"], fold=True, fold_width=10),
        exportctl_tables.Col("rule", lambda r: r["rule"], priority=1),
    ]
    table = exportctl_tables.fit(columns, rows)  # laid out for stdout: 80 columns here
    wide = Console(file=io.StringIO(), width=200, record=True, color_system=None)
    wide.print(table)
    assert "nightly backup of the team notes" in wide.export_text()  # one line, not folded
    narrow = Console(file=io.StringIO(), width=50, record=True, color_system=None)
    narrow.print(table)
    text = narrow.export_text()
    assert max(len(line) for line in text.splitlines()) <= 50 and J1 in text
    assert "rule" not in text  # dropped for 50 columns
