"""exportctl's tables and messages print server, database and file-system strings as text:
rich markup (``[bold]x[/]``) is shown, never applied, and control characters (an ESC
sequence, a bell) are shown as ``\\xNN``, never sent to the terminal (an
export's titles and error details are other people's text)."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import pytest
import typer
from rich.console import Console, RenderableType
from rich.table import Table

from exportcore.broker_inspect import BrokerReport, Message, QueueReport
from exportctl import (
    api_keys,
    broker,
    common,
    dead_letters,
    exports,
    notes,
    operator_keys,
    output,
    queues,
    schedules,
    tenants,
    webhooks,
)

EVIL = "[bold]x[/]\x1b[31mred\x07"
SHOWN = ("[bold]x[/]", "\\x1b[31mred\\x07")
WHEN = datetime(2026, 1, 2, 3, 4, tzinfo=UTC)
JOB = UUID("00000000-0000-4000-8000-000000000001")


def rendered(renderable: RenderableType) -> tuple[str, str]:
    """``(plain text, raw terminal output)`` of ``renderable`` on a wide colour terminal
    that highlights like exportctl's consoles."""
    raw = io.StringIO()
    console = Console(file=raw, record=True, force_terminal=True, width=400)
    console.print(renderable)
    return console.export_text(), raw.getvalue()


def assert_literal(renderable: RenderableType, times: int = 1) -> None:
    text, raw = rendered(renderable)
    for shown in SHOWN:
        assert text.count(shown) >= times, (shown, text)
    # neither the markup nor the smuggled sequence reached the terminal
    assert "\x1b[31m" not in raw and "\x07" not in raw
    assert "x[/]" in raw  # the closing tag is text, not a style change


def job(**extra: Any) -> dict[str, Any]:
    return {
        "id": EVIL,
        "status": EVIL,
        "format": EVIL,
        "queue": EVIL,
        "note_count": 1,
        "attempts": 1,
        "max_attempts": 3,
        "cancel_requested": True,
        "replay_of": EVIL,
        "created_at": EVIL,
        "started_at": None,
        "finished_at": None,
        "error": {"code": EVIL, "detail": EVIL},
        "result": {"rows": 1, "bytes": 2, "sha256": EVIL},
        **extra,
    }


def dead_letter() -> dict[str, Any]:
    return {
        "id": 1,
        "job_id": EVIL,
        "tenant_id": EVIL,
        "reason": EVIL,
        "state": "resolved",
        "resolved_by": EVIL,
        "created_at": WHEN,
        "replayed_by": EVIL,
        "replay_status": EVIL,
        "detail": EVIL,
    }


def key_row() -> dict[str, Any]:
    return {
        "id": EVIL,
        "tenant_id": EVIL,
        "prefix": EVIL,
        "scopes": [EVIL],
        "label": EVIL,
        "created_at": WHEN,
        "revoked_at": WHEN,
    }


def schedule() -> dict[str, Any]:
    return {
        "id": EVIL,
        "name": EVIL,
        "cron": EVIL,
        "timezone": EVIL,
        "interval_seconds": None,
        "selection": {"all": True},
        "format": EVIL,
        "catch_up": EVIL,
        "max_catch_up": 3,
        "enabled": False,
        "paused_reason": EVIL,
        "paused_detail": EVIL,
        "next_due_at": EVIL,
    }


def endpoint() -> dict[str, Any]:
    return {
        "id": EVIL,
        "url": EVIL,
        "description": EVIL,
        "events": [EVIL],
        "enabled": False,
        "disabled_reason": EVIL,
        "secret_hint": EVIL,
        "last_success_at": EVIL,
        "last_error": EVIL,
    }


def attempt() -> dict[str, Any]:
    return {
        "id": 1,
        "started_at": EVIL,
        "event_type": EVIL,
        "outcome": EVIL,
        "redelivery": True,
        "status_code": 500,
        "latency_ms": 1.5,
        "message_status": EVIL,
        "webhook_id": EVIL,
        "error": EVIL,
    }


TABLES: dict[str, Callable[[], RenderableType]] = {
    "status": lambda: exports._status_table(job()),
    "exports": lambda: exports.exports_table([job()]),
    "events": lambda: exports.events_table(
        [
            {
                "id": 1,
                "at": EVIL,
                "kind": EVIL,
                "from_status": EVIL,
                "to_status": EVIL,
                "attempt": 1,
                "detail": {"error_code": EVIL},
            }
        ]
    ),
    "dead letters": lambda: dead_letters._dead_letter_table([dead_letter()]),
    "operator keys": lambda: operator_keys.operator_key_table([key_row()]),
    "api keys": lambda: api_keys.apikey_table([key_row()]),
    "tenants": lambda: tenants.tenant_table(
        [
            {
                "id": EVIL,
                "name": EVIL,
                "quota": 3,
                "max_active_jobs": None,
                "queued": 0,
                "running": 0,
                "refused_last_hour": 0,
                "schedules": 0,
                "created_at": WHEN,
            }
        ]
    ),
    "notes": lambda: notes.notes_table(
        [
            {
                "id": 1,
                "title": EVIL,
                "source_path": EVIL,
                "bytes": 3,
                "pinned": True,
                "updated_at": WHEN,
            }
        ]
    ),
    "skipped files": lambda: notes.skipped_table([(EVIL, EVIL)]),
    "schedules": lambda: schedules._table([schedule()]),
    "schedule runs": lambda: schedules.runs_table(
        [
            {
                "scheduled_at": EVIL,
                "outcome": EVIL,
                "job_id": EVIL,
                "job_status": EVIL,
                "detail": EVIL,
            }
        ]
    ),
    "schedule preview": lambda: schedules.preview_table(
        {"timezone": EVIL, "slots": [{"at": EVIL, "local": EVIL}]}
    ),
    "queue status": lambda: queues.status_table(
        queues.status_rows(
            [
                {
                    "queue": "exports.bulk",
                    "tenant": EVIL,
                    "reason": EVIL,
                    "paused_by": EVIL,
                    "paused_at": WHEN,
                    "paused_seconds": 3725.0,
                    "waiting": 4,
                }
            ]
        )
    ),
    "webhooks": lambda: webhooks._table([endpoint()]),
    "webhook": lambda: webhooks.endpoint_table(endpoint()),
    "webhook attempts": lambda: webhooks._attempts_table([attempt()]),
}


@pytest.mark.parametrize("name", sorted(TABLES))
def test_every_table_of_server_rows_prints_values_as_text(name: str) -> None:
    assert_literal(TABLES[name]())


class Captured:
    """exportctl's stdout and stderr consoles, both writing to one recorded terminal."""

    def __init__(self) -> None:
        self.raw = io.StringIO()
        self.console = Console(file=self.raw, record=True, force_terminal=True, width=400)

    def check(self, times: int = 1) -> str:
        """The plain text shown; asserts the values were shown ``times`` times as text and
        that neither their markup nor their control characters reached the terminal."""
        text, raw = self.console.export_text(), self.raw.getvalue()
        for shown in SHOWN:
            assert text.count(shown) >= times, (shown, text)
        assert "\x1b[31m" not in raw and "\x07" not in raw
        return text


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Iterator[Captured]:
    got = Captured()
    for module in (common, broker):
        monkeypatch.setattr(module, "out", got.console)
    monkeypatch.setattr(common, "err", got.console)
    yield got


def test_broker_report_prints_queue_names_and_states_as_text(captured: Captured) -> None:
    message = Message(queue=EVIL, state="ready", raw=b"", job_id=JOB, age=1.0, job_status=EVIL)
    report = BrokerReport(
        queues={EVIL: QueueReport(queue=EVIL, ready=1)},
        stale=[message],
        lost=[{"id": JOB, "queue": EVIL, "dispatch_count": 1, "waiting": 2.0}],
    )
    broker._print(report, show=10)
    captured.check(times=4)


def test_errors_quote_the_server_and_the_user_as_text(captured: Captured) -> None:
    assert isinstance(common.fail(f"HTTP 409: {EVIL}"), typer.Exit)
    assert "error: HTTP 409: [bold]x[/]" in captured.check()


def test_cells_are_empty_for_none_and_text_otherwise() -> None:
    assert common.cell(None) == ""
    assert common.cell(0) == "0"
    assert common.cell("[b]") == "\\[b]"


def test_values_printed_alone_on_stdout_never_carry_a_terminal_sequence(
    capsys: pytest.CaptureFixture[str],
) -> None:
    common.print_value("0190-id" + EVIL)
    common.print_value(JOB)
    assert capsys.readouterr().out == f"0190-id[bold]x[/]\\x1b[31mred\\x07\n{JOB}\n"


def test_a_page_tells_how_to_ask_for_the_next_only_when_one_follows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shown, told = Captured(), Captured()
    monkeypatch.setattr(common, "out", shown.console)
    monkeypatch.setattr(output, "out", shown.console)
    monkeypatch.setattr(common, "err", told.console)
    rows = [{"id": 1, "title": EVIL}, {"id": 2, "title": "b"}]

    def titles(rows: list[dict[str, Any]]) -> Table:
        table = Table("title")
        for r in rows:
            common.add_row(table, r["title"])
        return table

    pages = {None: (rows, None), "first": (rows, EVIL)}
    output.emit_paged(
        lambda c: pages[c],
        None,
        False,
        output.Output.table,
        titles,
        next_option="--after",
        empty="none",
    )
    assert "more:" not in told.console.export_text(clear=False)
    output.emit_paged(
        lambda c: pages[c],
        "first",
        False,
        output.Output.table,
        titles,
        next_option="--after",
        empty="none",
    )
    assert shown.check(times=1)
    assert told.check().strip() == "more: --after [bold]x[/]\\x1b[31mred\\x07"


def test_the_database_commands_page_on_after_the_last_id_of_a_full_page() -> None:
    rows = [{"id": "a"}, {"id": "b"}]
    assert common.full_page_last_id(rows, limit=2) == "b"
    assert common.full_page_last_id(rows, limit=3) is None
    assert common.full_page_last_id([], limit=1) is None
    # a schedule's runs page on the last slot's instant (the API's ``before``)
    slots = [{"scheduled_at": "2026-12-02T00:00:00Z"}, {"scheduled_at": "2026-12-01T00:00:00Z"}]
    assert common.full_page_last_id(slots, limit=2, key="scheduled_at") == slots[1]["scheduled_at"]


BIDI = "report\u202etxt.exe"  # shows as "reportexe.txt" where the override is obeyed


def test_bidi_overrides_and_zero_width_characters_print_escaped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert common.safe(BIDI) == "report\\u202etxt.exe"
    assert common.safe("a\u200bb\u2066c\u061c") == "a\\u200bb\\u2066c\\u061c"
    table = Table("name")
    common.add_row(table, BIDI)
    text, raw = rendered(table)
    assert "report\\u202etxt.exe" in text and "\u202e" not in raw
    common.print_value(BIDI)
    assert capsys.readouterr().out == "report\\u202etxt.exe\n"


def test_the_cli_escapes_exactly_what_the_console_removes() -> None:
    """One definition (exportcore.display) for both: every character the console strips from
    what it shows is one exportctl prints escaped, and no other (newline and tab aside, which
    the console keeps in error details and exportctl escapes), over the blocks that hold
    control and formatting characters."""
    from services.api.console.timeline import sanitise_detail

    # C0, Latin-1 with C1, Arabic (U+061C), General Punctuation (U+200B-206F), and more
    blocks = [range(0x300), range(0x600, 0x700), range(0x2000, 0x2100), range(0xFE00, 0xFF00)]
    for code in [*(c for block in blocks for c in block), 0x10FFFF]:
        char = chr(code)
        if char in "\n\t[\\":  # newline, tab: kept by the console; [ and \\: rich markup
            continue
        assert (common.safe(char) != char) == (sanitise_detail(char) == ""), hex(code)


def test_a_skipped_run_shows_its_reason() -> None:
    rows = [
        {
            "scheduled_at": WHEN,
            "outcome": "skipped",
            "reason": "overlap",
            "job_id": None,
            "job_status": None,
            "detail": "overlap (skip): the export … was still running",
        },
        {
            "scheduled_at": WHEN,
            "outcome": "created",
            "reason": None,
            "job_id": JOB,
            "job_status": "queued",
            "detail": "",
        },
    ]
    text, _ = rendered(schedules.runs_table(rows))
    assert "skipped: overlap" in text and "created:" not in text


def test_output_that_is_not_a_terminal_never_wraps(monkeypatch: pytest.MonkeyPatch) -> None:
    long = "error: checksum mismatch: got " + "ab" * 32 + ", expected " + "cd" * 32
    for stream in ("stdout", "stderr"):
        pipe = io.StringIO()  # not a terminal
        monkeypatch.setattr(f"sys.{stream}", pipe)
        monkeypatch.delenv("COLUMNS", raising=False)
        common._console(stderr=stream == "stderr").print(long)
        assert pipe.getvalue() == long + "\n"
    monkeypatch.setenv("COLUMNS", "40")  # still honoured when set
    assert common._console(stderr=False).width == 40


def test_queue_status_lists_every_queue_and_each_pause_after_its_queue() -> None:
    rows = queues.status_rows(
        [
            {"queue": "exports.fast", "tenant": "acme", "reason": "r", "paused_by": "a",
             "paused_at": WHEN, "paused_seconds": 59.0, "waiting": 2},
            {"queue": "exports.bulk", "tenant": None, "reason": "r", "paused_by": "a",
             "paused_at": WHEN, "paused_seconds": 3725.0, "waiting": 0},
        ]
    )  # fmt: skip
    assert [(r["queue"], r["tenant"], r["paused"]) for r in rows] == [
        ("exports.fast", None, False),
        ("exports.fast", "acme", True),
        ("exports.bulk", None, True),
    ]
    out, _ = rendered(queues.status_table(rows))
    assert "flowing" in out and "PAUSED" in out and "1h 02m" in out and "59s" in out
