"""What exportctl says when a user gets something wrong, or when there is one of a thing:
an id that is not a UUID and a format that does not exist are usage errors said before any
request (``status abc``, ``submit --format csv``); a 422 reads as its words, not as a dump
of the problem's ``errors``; one note is "1 note"."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from exportctl import api, exports
from exportctl.main import app


def invoke(tmp_path: Path, *args: str) -> Any:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("API_URL", "API_KEY", "OPERATOR_KEY", "EXPORTCTL_PROFILE", "EXPORTCTL_CONFIG")
    }
    env |= {"XDG_CONFIG_HOME": str(tmp_path), "COLUMNS": "200", "API_KEY": "nex_x"}
    # an API that cannot be reached: a usage error must come before any request
    env |= {"API_URL": "http://127.0.0.1:9"}
    return CliRunner().invoke(app, list(args), env=env)


@pytest.mark.parametrize("command", ["status", "events", "watch", "cancel", "download"])
def test_an_export_id_that_is_not_a_uuid_is_a_usage_error(tmp_path: Path, command: str) -> None:
    r = invoke(tmp_path, command, "abc")
    assert r.exit_code == 2, r.output
    assert "'abc' is not an export id (a UUID)" in r.output
    assert "Input should" not in r.output and "cannot reach" not in r.output


@pytest.mark.parametrize(
    "args",
    [
        ("submit", "--all", "--format", "csv"),
        ("schedule", "create", "--every", "3600", "--all", "--format", "csv"),
        ("replay", "01a23bb0-3183-727a-b007-42b699d0dfe2", "--format", "csv"),
    ],
    ids=lambda a: a[0],
)
def test_an_unknown_format_is_a_usage_error(tmp_path: Path, args: tuple[str, ...]) -> None:
    r = invoke(tmp_path, *args)
    assert r.exit_code == 2, r.output
    assert "--format is one of json, ndjson, markdown_zip, not 'csv'" in r.output


def test_a_422_reads_as_its_words(monkeypatch: pytest.MonkeyPatch) -> None:
    shown = Console(file=io.StringIO(), record=True, width=400)
    monkeypatch.setattr("exportctl.common.err", shown)
    answer = httpx.Response(
        422,
        json={
            "type": "tag:notes-exports,2026:problem/invalid_request",
            "title": "Invalid request",
            "status": 422,
            "detail": "format must be one of json, ndjson or markdown_zip, not 'csv'",
            "errors": [{"loc": ["body", "format"], "msg": "…", "type": "literal_error"}],
        },
    )
    with pytest.raises(typer.Exit) as raised:
        api.check_answer(answer)
    assert raised.value.exit_code == 1
    text = shown.export_text()
    assert "HTTP 422: format must be one of json, ndjson or markdown_zip, not 'csv'" in text
    assert "literal_error" not in text and "errors" not in text
    unknown = httpx.Response(
        422,
        json={
            "type": "tag:notes-exports,2026:problem/unknown_notes",
            "title": "Unknown note ids",
            "status": 422,
            "detail": "1 note id does not exist for this tenant",
            "unknown_note_ids": [9],
            "unknown_note_count": 1,
            "unknown_note_ids_truncated": False,
        },
    )
    with pytest.raises(typer.Exit):
        api.check_answer(unknown)
    assert '"unknown_note_ids": [9]' in shown.export_text()  # other members still shown


JOB = {
    "id": "01a23bb0-3183-727a-b007-42b699d0dfe2",
    "status": "succeeded",
    "format": "json",
    "queue": "exports.fast",
    "note_count": 1,
    "attempts": 1,
    "max_attempts": 3,
    "created_at": "2026-01-02T03:04:05+00:00",
    "started_at": None,
    "finished_at": None,
    "result": {"rows": 1, "bytes": 1, "sha256": "ab"},
    "checkpoint": {"notes": 1, "bytes": 2, "resumes": 0, "notes_carried_over": 0},
}


def test_one_note_is_one_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    console = Console(file=io.StringIO(), record=True, width=200)
    console.print(exports._status_table(JOB))
    text = console.export_text()
    assert "1 note, 1 byte, sha256 ab" in text and "1 note, 2 bytes durable" in text
    assert "1 notes" not in text
    said = Console(file=io.StringIO(), record=True, width=200)
    monkeypatch.setattr(exports, "err", said)
    monkeypatch.setattr(exports, "call", lambda *a, **k: JOB)
    r = CliRunner().invoke(app, ["submit", "--note-id", "7", "--api-key", "k"])
    assert r.exit_code == 0, r.output
    assert f"accepted {JOB['id']} (exports.fast, 1 note)" in said.export_text()
