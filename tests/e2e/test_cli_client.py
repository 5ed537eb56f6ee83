"""exportctl against the real api (a running stack): submit prints one line on stdout,
download names the file locally, never writes through a planted link, never overwrites
without --force, writes into -o DIR/, and
a missing folder is a clear error; list / events / cancel / watch and the --json of list
commands; the terminal-safety and presigned-URL rules as units."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import UUID

import pytest
from rich.console import Console

from exportcore import faults
from exportctl.common import safe
from exportctl.exports import check_presigned, download_target
from tests.e2e.conftest import E2E, failpoint_stack
from tests.support import wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def backend() -> str:
    return "file"


def run(
    e: E2E, cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    # a pipe gets every column unless COLUMNS says otherwise: set it, whatever the caller's
    # environment holds, so each table is checked at the width the test names
    env = {
        **e.stack.env,
        "API_URL": e.stack.api_url,
        "API_KEY": e.api.api_key,
        "COLUMNS": "250",
        **(env or {}),
    }
    exe = Path(sys.executable).parent / "exportctl"
    return subprocess.run(
        [str(exe), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_submit_prints_only_the_id_and_download_names_the_file_locally(
    e2e: E2E, tmp_path: Path
) -> None:
    submitted = run(e2e, tmp_path, "submit", "--all", "--format", "json")
    assert submitted.returncode == 0, submitted.stderr
    lines = submitted.stdout.splitlines()
    assert len(lines) == 1 and str(UUID(lines[0])) == lines[0]  # ID=$(exportctl submit ...)
    assert "accepted" in submitted.stderr
    job = lines[0]
    wait_for(lambda: e2e.db.job(job)["status"] == "succeeded", 60, "the export")

    # A link planted where the download used to write its partial file is never followed.
    victim = tmp_path / "out" / "victim"
    victim.parent.mkdir()
    victim.write_text("precious")
    (tmp_path / f"export-{job}.json.part").symlink_to(victim)
    got = run(e2e, tmp_path, "download", job)
    assert got.returncode == 0, got.stderr
    assert (tmp_path / f"export-{job}.json").read_bytes()
    assert victim.read_text() == "precious"
    # never overwritten without --force: a clear message, no traceback
    again = run(e2e, tmp_path, "download", job)
    assert again.returncode == 2 and "exists; pass --force" in again.stderr
    assert "Traceback" not in again.stderr
    assert run(e2e, tmp_path, "download", job, "--force").returncode == 0
    # -o DIR/ writes into the folder; a missing folder is a clear error
    assert run(e2e, tmp_path, "download", job, "-o", "out/").returncode == 0
    assert (tmp_path / "out" / f"export-{job}.json").exists()
    missing = run(e2e, tmp_path, "download", job, "-o", "nowhere/")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    assert "Traceback" not in missing.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["out", f"export-{job}.json", f"export-{job}.json.part"]  # the planted link, untouched
    )
    assert victim.read_text() == "precious"


def test_list_events_cancel_and_watch_of_the_tenants_exports(e2e: E2E, tmp_path: Path) -> None:
    ids = [run(e2e, tmp_path, "submit", "-n", str(n)).stdout.strip() for n in e2e.note_ids(2)]
    for job in ids:
        wait_for(lambda job=job: e2e.db.job(job)["status"] == "succeeded", 60, "the exports")

    listed = run(e2e, tmp_path, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)  # stdout holds the JSON and nothing else
    assert {r["id"] for r in rows} >= set(ids) and all(r["status"] for r in rows)
    newest = run(e2e, tmp_path, "list", "--status", "succeeded", "--limit", "1", "--json")
    assert [r["id"] for r in json.loads(newest.stdout)] == [ids[-1]]
    cursor = newest.stderr.split("more: --cursor", 1)[1].split()[0]
    older = run(e2e, tmp_path, "list", "--status", "succeeded", "--limit", "1", "--cursor", cursor)
    assert older.returncode == 0 and ids[-2] in older.stdout and ids[-1] not in older.stdout
    table = run(e2e, tmp_path, "list", env={"COLUMNS": "80"})  # ids stay whole when narrow
    assert all(job in table.stdout for job in ids), table.stdout
    bad = run(e2e, tmp_path, "list", "--status", "done")
    assert bad.returncode == 2 and "queued, running, succeeded" in bad.stderr

    history = run(e2e, tmp_path, "events", ids[0], "--json")
    assert history.returncode == 0, history.stderr
    kinds = [e["kind"] for e in json.loads(history.stdout)]
    assert kinds[0] == "submitted" and "claimed" in kinds and kinds[-1] == "succeeded", kinds
    shown = run(e2e, tmp_path, "events", ids[0])
    assert "claimed" in shown.stdout and "queued → running" in shown.stdout
    assert "lease_token" not in history.stdout and "result_ref" not in history.stdout

    finished = run(e2e, tmp_path, "cancel", ids[0])
    assert finished.returncode == 1 and "HTTP 409" in finished.stderr
    assert "Traceback" not in finished.stderr and finished.stdout == ""
    watched = run(e2e, tmp_path, "watch", ids[0])
    assert watched.returncode == 0 and "succeeded" in watched.stdout and "1 note," in watched.stdout
    ghost = run(e2e, tmp_path, "events", "00000000-0000-4000-8000-000000000000")
    assert ghost.returncode == 5 and "HTTP 404" in ghost.stderr


@pytest.fixture(scope="module")
def stalling(
    servers, template_db: str, notes_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[E2E, Path]]:
    """A stack whose processes share a failpoints file (to stall an export mid-run)."""
    with failpoint_stack(
        servers, template_db, notes_dir, tmp_path_factory.mktemp("cli-faults")
    ) as pair:
        yield pair


def test_watch_shows_a_running_exports_progress_and_cancel_stops_it(
    stalling: tuple[E2E, Path], tmp_path: Path
) -> None:
    e, fault_file = stalling
    # the export stalls in its first chunk for 20 s: seen running, then cancelled there
    faults.arm(fault_file, "render.chunk", "sleep:20", times=1)
    job = run(e, tmp_path, "submit", *(f"-n{n}" for n in e.note_ids(3))).stdout.strip()
    wait_for(
        lambda: (
            faults.remaining(fault_file, "render.chunk") == 0
            and e.db.job(job)["status"] == "running"
        ),
        120,  # a worker still starting on a loaded machine picks it up late
        "the export running (stalled in a chunk)",
    )
    watching = run(e, tmp_path, "watch", job, "--timeout", "2")
    assert watching.returncode == 8 and "still running after 2 s" in watching.stderr
    assert "progress" in watching.stdout and "of 3 notes" in watching.stdout, watching.stdout

    cancelled = run(e, tmp_path, "cancel", job)
    assert cancelled.returncode == 0, cancelled.stderr
    assert "cancel requested" in cancelled.stderr and "next chunk boundary" in cancelled.stderr
    followed = run(e, tmp_path, "watch", job, "--timeout", "60")
    assert followed.returncode == 4 and "cancelled" in followed.stdout, followed.stderr
    kinds = [x["kind"] for x in json.loads(run(e, tmp_path, "events", job, "--json").stdout)]
    assert "cancel_requested" in kinds and kinds[-1] == "cancelled", kinds
    again = run(e, tmp_path, "cancel", job)
    assert again.returncode == 1 and "HTTP 409" in again.stderr


def test_schedule_and_webhook_lists_as_json_and_names_as_text(e2e: E2E, tmp_path: Path) -> None:
    evil = "[bold]x[/][blink]y"  # the API refuses control characters in names (422)
    created = run(e2e, tmp_path, "schedule", "create", "--every", "3600", "--all", "--name", evil)
    assert created.returncode == 0, created.stderr
    assert created.stdout.count("\n") == 1  # S=$(exportctl schedule create …): the id alone
    schedule_id = created.stdout.strip()
    rows = json.loads(run(e2e, tmp_path, "schedule", "list", "--json").stdout)
    assert [r["name"] for r in rows if r["id"] == schedule_id] == [evil]
    assert [r["overlap"] for r in rows if r["id"] == schedule_id] == ["skip"]  # the default
    assert run(e2e, tmp_path, "schedule", "set-overlap", schedule_id, "buffer_one").returncode == 0
    rows = json.loads(run(e2e, tmp_path, "schedule", "list", "--json").stdout)
    assert [r["overlap"] for r in rows if r["id"] == schedule_id] == ["buffer_one"]
    wrong = run(e2e, tmp_path, "schedule", "set-overlap", schedule_id, "buffer_all")
    assert wrong.returncode == 1 and "overlap" in wrong.stderr and "Traceback" not in wrong.stderr
    table = run(e2e, tmp_path, "schedule", "list", env={"COLUMNS": "250"}).stdout
    assert evil in table and chr(27) + "[5m" not in table and chr(27) + "[1mx" not in table
    runs = run(e2e, tmp_path, "schedule", "runs", schedule_id, "--json")
    assert runs.returncode == 0 and isinstance(json.loads(runs.stdout), list)
    preview = json.loads(run(e2e, tmp_path, "schedule", "preview", schedule_id, "--json").stdout)
    assert len(preview["slots"]) == 5
    assert run(e2e, tmp_path, "schedule", "delete", schedule_id).returncode == 0
    hooks = run(e2e, tmp_path, "webhook", "list", "--json")
    assert hooks.returncode == 0 and isinstance(json.loads(hooks.stdout), list)


def test_schedule_jitter_preview_and_backfill_from_the_cli(e2e: E2E, tmp_path: Path) -> None:
    created = run(
        e2e,
        tmp_path,
        "schedule",
        "create",
        "--every",
        "60",
        "--all",
        "--jitter",
        "45",
        "--overlap",
        "cancel_other",
    )
    assert created.returncode == 0, created.stderr
    schedule_id = created.stdout.strip()
    preview = json.loads(run(e2e, tmp_path, "schedule", "preview", schedule_id, "--json").stdout)
    offset = preview["jitter_offset"]
    assert preview["jitter"] == 45 and 0 <= offset <= 45
    for slot in preview["slots"]:
        fires = datetime.fromisoformat(slot["fires_at"]) - datetime.fromisoformat(slot["at"])
        assert fires == timedelta(seconds=offset)
    table = run(e2e, tmp_path, "schedule", "preview", schedule_id).stdout
    assert ("fires (UTC)" in table) == (offset > 0)
    quiet = run(e2e, tmp_path, "schedule", "set-jitter", schedule_id, "0")
    assert quiet.returncode == 0 and "fire 0 s after" in quiet.stderr
    rows = json.loads(run(e2e, tmp_path, "schedule", "list", "--json").stdout)
    mine = [r for r in rows if r["id"] == schedule_id]
    assert (mine[0]["jitter"], mine[0]["overlap"]) == (0, "cancel_other")
    now = datetime.now(UTC)
    window = (
        "--from",
        (now - timedelta(minutes=5)).isoformat(),
        "--to",
        (now - timedelta(minutes=2)).isoformat(),
    )
    first = run(e2e, tmp_path, "schedule", "backfill", schedule_id, *window, "--json")
    assert first.returncode == 0, first.stderr
    slots = json.loads(first.stdout)
    assert len(slots) == 3 and {s["outcome"] for s in slots} == {"created"}
    assert "3 created, 0 existed already" in first.stderr
    again = run(e2e, tmp_path, "schedule", "backfill", schedule_id, *window)
    assert again.returncode == 0 and "0 created, 3 existed already" in again.stderr
    assert again.stdout.count("exists") == 3
    wide = run(
        e2e,
        tmp_path,
        "schedule",
        "backfill",
        schedule_id,
        "--from",
        (now - timedelta(hours=5)).isoformat(),
        "--to",
        window[3],
    )
    assert wide.returncode == 1 and "at most 100" in wide.stderr
    assert "Traceback" not in wide.stderr
    assert run(e2e, tmp_path, "schedule", "delete", schedule_id).returncode == 0


def test_download_targets_come_from_the_id_never_from_the_server(tmp_path: Path) -> None:
    assert download_target("abc", None, "zip") == Path("export-abc.zip")
    assert download_target("../../.bashrc", None, "json") == Path("export-.bashrc.json")
    assert download_target("abc", tmp_path, "json") == tmp_path / "export-abc.json"
    assert download_target("abc", tmp_path / "x.json", "json") == tmp_path / "x.json"


@pytest.mark.parametrize(
    ("api", "location", "allowed"),
    [
        ("https://api.example", "https://bucket.s3.example/x?sig=1", True),
        ("https://api.example", "http://bucket.s3.example/x?sig=1", False),
        ("http://api.example", "http://bucket.s3.example/x?sig=1", False),
        ("http://127.0.0.1:8000", "http://127.0.0.1:59000/x?sig=1", True),
        ("http://localhost:8000", "http://localhost:59000/x", True),
        ("http://127.0.0.1:8000", "ftp://127.0.0.1/x", False),
    ],
)
def test_presigned_urls_must_be_https_unless_the_api_is_plain_http_on_loopback(
    api: str, location: str, allowed: bool
) -> None:
    import typer

    if allowed:
        check_presigned(api, location)
    else:
        with pytest.raises(typer.Exit):
            check_presigned(api, location)


def test_names_and_titles_print_as_text_never_as_markup_or_escape_sequences() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=200, highlight=False)
    console.print(f"saved {safe('evil[blink]x[/blink]' + chr(27) + '[31mred' + chr(7))}")
    shown = buffer.getvalue()
    assert "[blink]x[/blink]" in shown and "\\x1b[31mred\\x07" in shown
    assert "\x1b[5m" not in shown  # no blink attribute was emitted
    assert "\x1b[31m" not in shown and "\x07" not in shown
    highlighted = io.StringIO()  # exportctl's consoles highlight: still no blink, no red
    Console(file=highlighted, force_terminal=True).print(safe("[blink]x" + chr(27) + "[31m"))
    assert "\x1b[5m" not in highlighted.getvalue() and "\x1b[31m" not in highlighted.getvalue()
