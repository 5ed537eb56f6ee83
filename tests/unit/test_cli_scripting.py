"""``exportctl`` scripts: every command that prints data takes ``--output json|jsonl|table``,
exit codes differ by cause (and docs/cli.md lists them), tables fit 80 columns, paged lists
take ``--all``, profiles come from an XDG config file and the environment still wins."""

from __future__ import annotations

import io
import json
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from exportctl import (
    api_keys,
    audit,
    dead_letters,
    exits,
    exports,
    notes,
    operator_keys,
    output,
    profiles,
    schedules,
    tenants,
    webhooks,
    workers,
)
from exportctl.main import app

ROOT = Path(__file__).resolve().parents[2]
WHEN = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
NO_DATA = {
    # commands that change something and print only a message (stderr), or a file
    "migrate",
    "healthcheck",
    "download",
    "tenant create",
    "tenant set-quota",
    "tenant set-rate",
    "tenant set-in-flight",
    "tenant set-recipients",
    "apikey revoke",
    "operator-key revoke",
    "operator-key set-role",
    "schedule pause",
    "schedule resume",
    "schedule set-overlap",
    "schedule set-jitter",
    "schedule delete",
    "webhook update",
    "webhook enable",
    "webhook disable",
    "webhook delete",
}


def commands() -> dict[str, Any]:
    def walk(command: Any, path: tuple[str, ...]) -> dict[str, Any]:
        if hasattr(command, "commands"):
            out: dict[str, Any] = {}
            for name, sub in command.commands.items():
                out |= walk(sub, (*path, name))
            return out
        return {" ".join(path): command}

    return walk(typer.main.get_command(app), ())


def test_every_command_that_prints_data_takes_output_modes() -> None:
    missing, extra = [], []
    for name, command in commands().items():
        options = {o for p in command.params for o in getattr(p, "opts", [])}
        if name in NO_DATA:
            if "--output" in options and name != "download":
                extra.append(name)
            continue
        if "--output" not in options:
            missing.append(name)
    assert missing == [] and extra == []
    assert len(commands()) - len(NO_DATA) >= 30


def test_paged_lists_take_all() -> None:
    paged = {
        "list",
        "tenant list",
        "notes list",
        "dead-letters list",
        "webhook deliveries",
        "audit list",
        "schedule runs",
    }
    for name in paged:
        command = commands()[name]
        assert "--all" in {o for p in command.params for o in p.opts}, name


def test_exit_codes_differ_by_cause_and_docs_list_each() -> None:
    assert exits.exit_for_status(404) == 5
    assert exits.exit_for_status(401) == exits.exit_for_status(403) == 6
    assert exits.exit_for_status(429) == exits.exit_for_status(503) == 7
    assert exits.exit_for_status(500) == 7
    assert exits.exit_for_status(409) == exits.exit_for_status(422) == 1
    causes = {
        exits.EXIT_FAILED,
        exits.EXIT_CANCELLED,
        exits.EXIT_NOT_FOUND,
        exits.EXIT_UNAUTHORISED,
        exits.EXIT_UNAVAILABLE,
        exits.EXIT_TIMEOUT,
        exits.EXIT_USAGE,
    }
    assert len(causes) == 7 and 0 not in causes and 1 not in causes
    doc = (ROOT / "docs" / "cli.md").read_text()
    table = doc[doc.index("## Exit codes") :].split("\n## ")[0]
    documented = {int(m) for m in re.findall(r"^\| (\d) \|", table, re.M)}
    assert documented == set(exits.EXIT_CODES)


J1 = "01a23bb0-3183-727a-b007-42b699d0dfe2"
J2 = "01a23bb0-3183-727a-b007-9c0f5e2a11aa"


def rows() -> dict[str, tuple[Any, list[dict[str, Any]]]]:
    job = {
        "id": J1,
        "status": "succeeded",
        "format": "markdown_zip",
        "note_count": 1234,
        "attempts": 1,
        "max_attempts": 3,
        "created_at": WHEN.isoformat(),
        "finished_at": WHEN.isoformat(),
        "replay_of": J2,
        "cancel_requested": False,
    }
    dead = {
        "id": 123456,
        "job_id": J1,
        "tenant_id": "acme-corporation",
        "reason": "storage_misconfigured",
        "state": "replayed",
        "created_at": WHEN,
        "replayed_by": J2,
        "replay_status": "succeeded",
        "detail": "OSError(EIO) while writing the artifact",
    }
    key = {
        "id": J1,
        "tenant_id": "acme-corporation",
        "prefix": "nex_1a2b3c4d",
        "scopes": ["exports:read", "exports:write"],
        "label": "nightly sync job",
        "created_at": WHEN,
        "revoked_at": None,
    }
    op = {
        "id": J1,
        "prefix": "nex_op_1a2b3c4d",
        "label": "alice",
        "role": "viewer",
        "created_at": WHEN,
        "revoked_at": None,
    }
    tenant = {
        "id": "acme-corporation",
        "name": "Acme Corporation",
        "quota": 1000,
        "max_active_jobs": None,
        "queued": 12,
        "running": 3,
        "refused_last_hour": 0,
        "schedules": 2,
        "created_at": WHEN,
    }
    note = {
        "id": 98765,
        "title": "Meeting notes: the quarterly planning of 2026",
        "source_path": "work/planning/2026-q4.md",
        "bytes": 12345,
        "pinned": True,
        "updated_at": WHEN,
    }
    schedule = {
        "id": J1,
        "name": "nightly",
        "cron": "0 2 * * *",
        "timezone": "Europe/Berlin",
        "rule_description": "At 02:00",
        "interval_seconds": None,
        "selection": {"all": True},
        "format": "json",
        "catch_up": "skip",
        "max_catch_up": 10,
        "enabled": True,
        "next_due_at": WHEN.isoformat(),
    }
    hook = {
        "id": J1,
        "url": "https://hooks.example.com/notes/exports/finished",
        "events": ["export.succeeded", "export.failed"],
        "enabled": True,
        "last_success_at": WHEN.isoformat(),
        "secret_hint": "whsec_ab12…",
    }
    attempt = {
        "id": 4242,
        "started_at": WHEN.isoformat(),
        "event_type": "export.succeeded",
        "outcome": "http_error",
        "redelivery": True,
        "status_code": 503,
        "latency_ms": 123.4,
        "message_status": "pending",
        "webhook_id": "msg_" + "a" * 32,
        "error": "HTTP 503 Service Unavailable",
    }
    entry = {
        "id": 77,
        "at": WHEN.isoformat(),
        "actor": "nex_op_1a2b3c4d (alice)",
        "action": "bulk_replay",
        "target_kind": "filter",
        "target_id": "reason x",
        "job_id": None,
        "count": 10000,
        "outcome": "done",
        "tenant_id": "acme",
    }
    worker = {
        "name": "fast@exports-fast-worker-7d9c5b8f6-x2x9q",
        "host": "exports-fast-worker-7d9c5b8f6-x2x9q",
        "answered": True,
        "queues": ["exports.fast"],
        "jobs_in_hand": 3,
        "heartbeat_at": WHEN.isoformat(),
        "heartbeat_age_seconds": 1.5,
        "liveness_file": True,
    }
    silent = worker | {"name": "bulk@gone", "host": "gone", "answered": False, "queues": []}
    return {
        "exports": (exports.exports_table, [job] * 10),
        "dead letters": (dead_letters._dead_letter_table, [dead] * 3),
        "api keys": (api_keys.apikey_table, [key] * 3),
        "operator keys": (operator_keys.operator_key_table, [op] * 3),
        "tenants": (tenants.tenant_table, [tenant] * 3),
        "notes": (notes.notes_table, [note] * 3),
        "schedules": (schedules._table, [schedule] * 3),
        "webhooks": (webhooks._table, [hook] * 3),
        "attempts": (webhooks._attempts_table, [attempt] * 3),
        "audit": (audit.audit_table, [entry] * 3),
        "workers": (workers.workers_table, [worker, worker, silent]),
    }


@pytest.mark.parametrize("name", sorted(rows()))
@pytest.mark.parametrize("width", [80, 100])
def test_every_list_fits_the_terminal_and_keeps_its_ids_whole(
    name: str, width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    table_of, data = rows()[name]
    console = Console(file=io.StringIO(), width=width, record=True, color_system=None)
    monkeypatch.setattr("exportctl.tables.out", console)
    console.print(table_of(data))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= width, text
    # no column was squashed to nothing: each header that is shown is readable whole
    header = text.splitlines()[0]
    assert "┃┃" not in header and "  " in header
    if name in ("exports", "dead letters"):
        assert J1 in text  # the id other commands take, whole
    if name == "exports":
        assert "succeeded" in text and "…" not in text.splitlines()[2].split()[1]


def test_an_empty_list_says_so_on_stderr_and_prints_nothing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    err = Console(file=io.StringIO(), record=True)
    monkeypatch.setattr(output, "err", err)
    output.emit_rows([], output.Output.table, exports.exports_table, empty="no exports")
    assert capsys.readouterr().out == "" and "no exports" in err.export_text()
    output.emit_rows([], output.Output.json, exports.exports_table, empty="x")
    assert capsys.readouterr().out.strip() == "[]"


def test_json_lines_stream_every_page(capsys: pytest.CaptureFixture[str]) -> None:
    pages = {None: ([{"id": 1}, {"id": 2}], "c"), "c": ([{"id": 3}], None)}
    output.emit_paged(
        lambda c: pages[c],
        None,
        True,
        output.Output.jsonl,
        exports.exports_table,
        next_option="--cursor",
        empty="none",
    )
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [
        {"id": 1},
        {"id": 2},
        {"id": 3},
    ]


def write_config(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "exportctl" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


CONFIG = """
default = "local"
[profiles.local]
api_url = "http://127.0.0.1:9/local"
api_key = "nex_local_key"
[profiles.prod]
api_url = "http://127.0.0.1:9/prod"
operator_key = "nex_op_prod"
output = "json"
"""


def invoke(tmp_path: Path, *args: str, **env: str) -> Any:
    base = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "API_URL",
            "API_KEY",
            "OPERATOR_KEY",
            "EXPORTCTL_PROFILE",
            "EXPORTCTL_OUTPUT",
            "EXPORTCTL_CONFIG",
        )
    }
    base |= {"XDG_CONFIG_HOME": str(tmp_path), "COLUMNS": "200", **env}
    return CliRunner().invoke(app, list(args), env=base)


def test_profiles_come_from_the_xdg_config_file_and_the_environment_wins(tmp_path: Path) -> None:
    write_config(tmp_path, CONFIG)
    job = str(UUID(int=5))
    local = invoke(tmp_path, "status", job)  # the default profile: its URL and its key
    assert local.exit_code == 7 and "127.0.0.1:9/local" in local.output
    prod = invoke(tmp_path, "--profile", "prod", "dead-letters", "list")
    assert prod.exit_code == 7 and "127.0.0.1:9/prod" in prod.output
    keyless = invoke(tmp_path, "--profile", "prod", "status", job)  # prod has no tenant key
    assert keyless.exit_code == 6 and "API_KEY" in keyless.output
    env = invoke(
        tmp_path,
        "--profile",
        "prod",
        "status",
        job,
        API_URL="http://127.0.0.1:9/env",
        API_KEY="nex_env",
    )
    assert env.exit_code == 7 and "127.0.0.1:9/env" in env.output
    flag = invoke(
        tmp_path,
        "status",
        job,
        "--api-url",
        "http://127.0.0.1:9/flag",
        API_URL="http://127.0.0.1:9/env",
    )
    assert "127.0.0.1:9/flag" in flag.output
    chosen = invoke(tmp_path, "status", job, EXPORTCTL_PROFILE="prod", API_KEY="k")
    assert "127.0.0.1:9/prod" in chosen.output
    profiles.use(profiles.Profile())


def test_a_bad_config_or_profile_is_a_usage_error(tmp_path: Path) -> None:
    write_config(tmp_path, CONFIG)
    unknown = invoke(tmp_path, "--profile", "nope", "status", "x")
    assert unknown.exit_code == 2 and "no profile 'nope'" in unknown.output
    write_config(tmp_path, '[profiles.a]\napi_url = "x"\npassword = "y"\n')
    field = invoke(tmp_path, "--profile", "a", "status", "x")
    assert field.exit_code == 2 and "unknown password" in field.output
    write_config(tmp_path, "[profiles\n")
    broken = invoke(tmp_path, "status", "x")
    assert broken.exit_code == 2 and "cannot read" in broken.output
    write_config(tmp_path, CONFIG, mode=0o644)
    readable = invoke(tmp_path, "status", str(UUID(int=5)))
    assert "readable by others" in readable.output
    profiles.use(profiles.Profile())


def test_the_missing_key_hint_names_the_dev_home(tmp_path: Path) -> None:
    r = invoke(tmp_path, "status", str(UUID(int=5)), DEV_HOME="/tmp/dev-other")
    assert r.exit_code == 6 and "source /tmp/dev-other/env" in r.output
