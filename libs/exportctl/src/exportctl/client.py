"""API client commands: submit, list, status, events, watch, cancel, download (``API_URL`` +
``API_KEY``)."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, BinaryIO
from urllib.parse import urlencode

import httpx
import typer
from rich.live import Live
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn
from rich.table import Column, Table

from exportctl.api import (
    DEFAULT_API_URL,
    ApiKey,
    ApiUrl,
    api_client,
    call,
    check_answer,
    get_and_print,
)
from exportctl.common import (
    AsJson,
    add_row,
    app,
    err,
    fail,
    id_column,
    key_value_table,
    out,
    print_json,
    print_page,
    print_value,
    safe,
    when,
    write_beside,
)

TERMINAL = ("succeeded", "failed", "cancelled")
STATUSES = ("queued", "running", *TERMINAL)
EVENTS_EVERY = 2.0
"""Seconds between two reads of a running export's history in ``watch`` (its progress)."""


def _get(api_url: str, api_key: str, path: str) -> dict[str, Any]:
    """``GET path``: one object of the API (an export)."""
    result: dict[str, Any] = call(api_url, api_key, "GET", path)
    return result


def _status_table(job: dict[str, Any]) -> Table:
    keys = (
        "id",
        "status",
        "format",
        "queue",
        "note_count",
        "attempts",
        "created_at",
        "started_at",
        "finished_at",
    )
    table = key_value_table((key, job.get(key)) for key in keys)
    if job.get("error"):
        add_row(table, "error", f"{job['error']['code']}: {job['error'].get('detail') or ''}")
    if job.get("result"):
        r = job["result"]
        add_row(table, "result", f"{r['rows']} notes, {r['bytes']} bytes, sha256 {r['sha256']}")
    return table


@app.command()
def submit(
    note_id: Annotated[list[int] | None, typer.Option("--note-id", "-n", help="repeatable")] = None,
    all_notes: Annotated[bool, typer.Option("--all", help="export every note")] = False,
    fmt: Annotated[
        str, typer.Option("--format", "-f", help="json | ndjson | markdown_zip")
    ] = "json",
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """Submit an export. Prints ONE line on stdout, the job id (``ID=$(exportctl submit
    --all)``); the human message goes to stderr. The API answered 202 after committing it."""
    if bool(note_id) == all_notes:
        raise fail("give --note-id (one or more) or --all", 2)
    body: dict[str, Any] = {"format": fmt}
    body.update({"all": True} if all_notes else {"note_ids": note_id})
    job = call(api_url, api_key, "POST", "/v1/exports", body)
    err.print(
        f"accepted [bold]{safe(job['id'])}[/] ({safe(job['queue'])}, "
        f"{safe(job['note_count'])} notes)"
    )
    print_value(job["id"])


@app.command()
def status(
    job_id: str,
    as_json: Annotated[bool, typer.Option("--json", help="print the raw JSON")] = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """Show an export's status."""
    get_and_print(api_url, api_key, f"/v1/exports/{job_id}", as_json, _status_table)


@app.command("list")
def list_(
    status: Annotated[
        str | None, typer.Option(help=f"only exports in this state: {' | '.join(STATUSES)}")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="exports to show")] = 50,
    cursor: Annotated[
        str | None, typer.Option(help="the next page: the cursor the previous page printed")
    ] = None,
    as_json: AsJson = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """The tenant's exports, newest first (``GET /v1/exports``). When more remain, the
    ``--cursor`` of the next page is printed on stderr."""
    if status is not None and status not in STATUSES:
        raise fail(f"--status is one of {', '.join(STATUSES)}", 2)
    params = {"status": status, "limit": limit, "cursor": cursor}
    query = urlencode({k: v for k, v in params.items() if v is not None})
    page = _get(api_url, api_key, f"/v1/exports?{query}")
    print_page(page["items"], as_json, exports_table, "--cursor", page["next_cursor"] or None)


def exports_table(rows: list[dict[str, Any]]) -> Table:
    """Exports (``/v1/exports`` items) as a table; ids are never cut."""
    table = Table(
        id_column("id"),
        "status",
        "format",
        "notes",
        "attempts",
        "created (UTC)",
        "finished (UTC)",
        id_column("replay of"),
    )
    for j in rows:
        state = j["status"] + (" (cancel requested)" if j.get("cancel_requested") else "")
        add_row(
            table,
            j["id"],
            state,
            j["format"],
            j["note_count"],
            f"{j['attempts']}/{j['max_attempts']}",
            when(j["created_at"]),
            when(j["finished_at"]),
            j.get("replay_of"),
        )
    return table


@app.command()
def events(
    job_id: str,
    as_json: AsJson = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """An export's history, oldest first (``GET /v1/exports/{id}/events``): every transition,
    claim, lease renewal (with its progress), retry and outcome."""
    get_and_print(api_url, api_key, f"/v1/exports/{job_id}/events", as_json, events_table)


def events_table(rows: list[dict[str, Any]]) -> Table:
    """History rows (``/v1/exports/{id}/events``) as a table; ``detail`` as ``key=value``."""
    # the detail gives way (folded) before the kind or the transition is cut
    table = Table(
        "#",
        Column("at (UTC)", no_wrap=True),
        Column("kind", no_wrap=True),
        Column("transition", no_wrap=True),
        "attempt",
        Column("detail", overflow="fold"),
    )
    for e in rows:
        transition = f"{e['from_status'] or ''} → {e['to_status']}" if e["to_status"] else ""
        detail = " ".join(f"{k}={v}" for k, v in sorted((e["detail"] or {}).items()))
        add_row(table, e["id"], when(e["at"]), e["kind"], transition, e["attempt"], detail)
    return table


@app.command()
def cancel(
    job_id: str,
    as_json: Annotated[bool, typer.Option("--json", help="print the export as JSON")] = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """Cancel an export (``POST /v1/exports/{id}/cancel``). A queued export is cancelled at
    once; a running one stops at its next chunk boundary (``exportctl watch ID`` follows it).
    A finished export cannot be cancelled (exit 1, HTTP 409)."""
    job = call(api_url, api_key, "POST", f"/v1/exports/{job_id}/cancel")
    if as_json:
        print_json(job)
    elif job["status"] == "cancelled":
        err.print(f"cancelled {safe(job['id'])}")
    else:
        err.print(
            f"cancel requested: {safe(job['id'])} is {safe(job['status'])} and stops at its "
            "next chunk boundary"
        )


@dataclass(frozen=True)
class JobProgress:
    """How far a running export is: ``done`` of ``total`` notes, at ``rate`` notes per
    second since its attempt was claimed, ``eta`` seconds left (None while unknown)."""

    done: int
    total: int
    rate: float | None
    eta: float | None


def _at(value: str) -> datetime:
    return datetime.fromisoformat(value)


def progress_of(job: dict[str, Any], history: list[dict[str, Any]]) -> JobProgress | None:
    """The progress of ``job``'s current attempt, from its history (``/events``): the worker
    records the notes rendered at each lease renewal (``detail.progress``), so it advances
    once per renewal; the rate is measured from the attempt's ``claimed`` event (server
    clock). None unless the job is running."""
    if job["status"] != "running":
        return None
    total = int(job["note_count"])
    started: datetime | None = None
    latest: tuple[datetime, int] | None = None
    for e in history:
        if e.get("attempt") != job["attempts"]:
            continue
        if e["kind"] == "claimed":
            started, latest = _at(e["at"]), None
        rows = (e.get("detail") or {}).get("progress")
        if isinstance(rows, int):
            latest = (_at(e["at"]), rows)
    if latest is None:
        return JobProgress(0, total, None, None)
    at, done = latest
    if started is None or done <= 0 or at <= started:
        return JobProgress(done, total, None, None)
    rate = done / (at - started).total_seconds()
    return JobProgress(done, total, rate, max(total - done, 0) / rate)


def _seconds(value: float) -> str:
    if value < 120:
        return f"{value:.0f} s"
    if value < 7200:
        return f"{value / 60:.0f} min"
    return f"{value / 3600:.1f} h"


def watch_table(job: dict[str, Any], history: list[dict[str, Any]], now: datetime) -> Table:
    """What ``watch`` shows: the status table, then while running the progress (notes done
    of total, rate, ETA) and while queued for a retry the next attempt's time and the
    attempts left (``attempts``, ``max_attempts``, ``next_attempt_at`` of the API)."""
    table = _status_table(job)
    progress = progress_of(job, history)
    if progress is not None:
        shown = f"{progress.done} of {progress.total} notes"
        if progress.total:
            shown += f" ({100 * progress.done // progress.total}%)"
        if progress.rate is not None and progress.eta is not None:
            shown += f", {progress.rate:.1f} notes/s, ETA {_seconds(progress.eta)}"
        add_row(table, "progress", shown)
    attempts, most = int(job["attempts"]), int(job["max_attempts"])
    if job["status"] == "queued" and attempts > 0:
        wait = max((_at(job["next_attempt_at"]) - now).total_seconds(), 0.0)
        add_row(
            table,
            "retry",
            f"attempt {attempts + 1} of {most} at {when(job['next_attempt_at'])} "
            f"(in {_seconds(wait)}); {most - attempts} attempt(s) left",
        )
    return table


@app.command()
def watch(
    job_id: str,
    interval: Annotated[float, typer.Option(help="seconds between polls")] = 0.5,
    timeout: Annotated[float, typer.Option(help="give up after this many seconds")] = 600.0,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """Follow an export live until it reaches a terminal state (exit 1 unless succeeded):
    its status, while running its progress (notes done of total, rate, ETA; updated at each
    lease renewal), and while queued for a retry when the next attempt starts and how many
    attempts are left."""
    deadline = time.monotonic() + timeout
    job = _get(api_url, api_key, f"/v1/exports/{job_id}")
    history: list[dict[str, Any]] = []
    read_at = -EVENTS_EVERY

    def refresh() -> Table:
        nonlocal history, read_at
        if job["status"] == "running" and time.monotonic() - read_at >= EVENTS_EVERY:
            history = call(api_url, api_key, "GET", f"/v1/exports/{job_id}/events")
            read_at = time.monotonic()
        return watch_table(job, history, datetime.now(UTC))

    with Live(refresh(), console=out, refresh_per_second=4) as live:
        while job["status"] not in TERMINAL:
            if time.monotonic() > deadline:
                raise fail(f"still {job['status']} after {timeout:.0f} s")
            time.sleep(interval)
            job = _get(api_url, api_key, f"/v1/exports/{job_id}")
            live.update(refresh())
    if job["status"] != "succeeded":
        raise typer.Exit(1)


@app.command()
def download(
    job_id: str,
    output: Annotated[
        str | None,
        typer.Option(
            "--output",
            "-o",
            help="file to write, or an existing folder (ending in /) to write into",
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="overwrite an existing file")] = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """Download a succeeded export and verify its SHA-256 against the ETag.

    The file is named here, never by the server or the storage host: ``export-<id>.<ext>``
    (the extension of the export's format) in the current folder, or ``-o FILE``, or
    ``-o DIR/`` for that name inside an existing folder. An existing file is never
    overwritten without ``--force``. When the API answers 307 (``DOWNLOAD_MODE=redirect``),
    the file is fetched from the presigned URL without the API key (https only, unless the
    API itself is plain http on loopback), and checked against the ETag of the 307 answer.
    """
    target = download_target(job_id, output, _extension(api_url, api_key, job_id))
    if target.exists() and not force:
        raise fail(f"{target} exists; pass --force to overwrite it, or -o another path", 2)
    try:
        with write_beside(target, replace=force) as fh:
            expected, digest = _fetch(api_url, api_key, job_id, fh)
            if expected and expected != digest:
                raise fail(f"checksum mismatch: got {digest}, expected {expected}")
    except httpx.TransportError as exc:
        raise fail(f"cannot reach the API or the storage ({type(exc).__name__})") from None
    except FileExistsError:
        raise fail(f"{target} appeared meanwhile; pass --force to overwrite it", 2) from None
    err.print(f"[green]saved {safe(target)}[/] (sha256 {safe(digest)})")


def _fetch(api_url: str, api_key: str, job_id: str, fh: BinaryIO) -> tuple[str, str]:
    """Stream the export's file into ``fh``: ``(the ETag's sha256 or "", the sha256 of what
    was written)``. Follows a 307 to a presigned URL without the API key."""
    with (
        api_client(api_url, api_key) as c,
        c.stream("GET", f"/v1/exports/{job_id}/download") as r,
    ):
        if r.status_code >= 400:
            r.read()
            check_answer(r)
        expected = r.headers.get("etag", "").strip('"')
        if r.status_code != 307:
            return expected, _save(r, fh)
        location = r.headers.get("location", "")
        if not location:
            raise fail("HTTP 307 without a Location")
        check_presigned(api_url, location)
        # A fresh client: the presigned URL carries its own authorisation, and the API key
        # must never be sent to the storage host.
        with (
            httpx.Client(timeout=httpx.Timeout(30.0, connect=5.0)) as plain,
            plain.stream("GET", location) as stored,
        ):
            if stored.status_code != 200:
                raise fail(f"the storage answered HTTP {stored.status_code}")
            return expected, _save(stored, fh)


EXTENSIONS = {"json": "json", "ndjson": "ndjson", "markdown_zip": "zip"}
"""The local file extension of each export format."""


def _extension(api_url: str, api_key: str, job_id: str) -> str:
    job = _get(api_url, api_key, f"/v1/exports/{job_id}")
    return EXTENSIONS.get(str(job.get("format")), "bin")


def download_target(job_id: str, output: str | Path | None, extension: str) -> Path:
    """Where ``download`` writes: ``export-<id>.<ext>`` in the current folder, ``output``, or
    that name inside ``output`` when it is a folder (or ends in ``/``). Raises a CLI error
    for a folder that does not exist."""
    name = f"export-{Path(job_id).name}.{extension}"
    if output is None:
        return Path(name)
    folder_meant = str(output).endswith("/")
    output = Path(output)
    if folder_meant or output.is_dir():
        if not output.is_dir():
            raise fail(f"the folder {output} does not exist; create it first", 2)
        return output / name
    if not output.parent.is_dir():
        raise fail(f"the folder {output.parent} does not exist; create it first", 2)
    return output


def check_presigned(api_url: str, location: str) -> None:
    """Refuse a presigned URL that is not https, unless the API itself is plain http on a
    loopback address (a local stack with a local S3 server): a presigned URL is a bearer
    credential for the file, and plain http would send it and the file in clear text."""
    target = httpx.URL(location)
    api = httpx.URL(api_url)
    if target.scheme == "https":
        return
    loopback = api.host in ("127.0.0.1", "localhost", "::1") or api.host.startswith("127.")
    if target.scheme == "http" and api.scheme == "http" and loopback:
        return
    raise fail(
        f"refusing the {target.scheme} download URL from {target.host}: presigned "
        "URLs must be https (only a plain-http API on loopback may use plain http)"
    )


def _save(r: httpx.Response, fh: BinaryIO) -> str:
    """Stream ``r`` into ``fh`` with a progress bar on stderr; returns the sha256 hex."""
    total = int(r.headers.get("content-length", "0")) or None
    sha = hashlib.sha256()
    with Progress(
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=err,
        transient=True,
    ) as progress:
        task = progress.add_task("download", total=total)
        for chunk in r.iter_bytes():
            fh.write(chunk)
            sha.update(chunk)
            progress.advance(task, len(chunk))
    return sha.hexdigest()
