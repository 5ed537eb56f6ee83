"""``exportctl submit | list | status | events | watch | cancel | download``: a tenant's
exports through the API (``API_URL`` + ``API_KEY``). The commands sit at the top level of
``exportctl`` (``exports_app`` is added without a name)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, BinaryIO
from uuid import UUID

import httpx
import typer
from rich.live import Live
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn
from rich.table import Table

from exportcore import encryption
from exportcore.domain import ExportFormat, count_of
from exportctl.api import (
    DEFAULT_API_URL,
    ApiKey,
    ApiUrl,
    api_client,
    call,
    check_answer,
    emit_api_pages,
)
from exportctl.common import (
    add_row,
    app,
    completes,
    err,
    fail,
    key_value_table,
    out,
    print_json,
    print_value,
    safe,
    when,
    write_beside,
)
from exportctl.encrypted import (
    ENVELOPE_SUFFIX,
    ciphertext_problems,
    decrypted,
    envelope_binds,
    identities_from,
)
from exportctl.exits import EXIT_CANCELLED, EXIT_FAILED, EXIT_TIMEOUT, EXIT_USAGE
from exportctl.output import (
    AllPages,
    AsJson,
    Output,
    OutputOpt,
    emit_object,
    emit_rows,
    explicit,
    json_line,
    mode,
)
from exportctl.tables import Col, fit, short_id
from exportctl.verify import SHOWN_PROBLEMS, load, problems, trusted_keys

exports_app = typer.Typer(help="A tenant's exports (API_URL + API_KEY).")
app.add_typer(exports_app)

TERMINAL = ("succeeded", "failed", "cancelled")
STATUSES = ("queued", "running", *TERMINAL)
FORMATS = tuple(f.value for f in ExportFormat)
"""The export formats (``--format``): json, ndjson, markdown_zip."""

Format = Annotated[
    str,
    typer.Option(
        "--format",
        "-f",
        help="json | ndjson | markdown_zip",
        autocompletion=completes(*FORMATS),
    ),
]
"""The ``--format`` option of ``submit`` and ``schedule create`` (checked by
:func:`check_format`)."""

JobId = Annotated[str, typer.Argument(help="the export's id (a UUID)", show_default=False)]
"""The export id argument of ``status``, ``events``, ``watch``, ``cancel``, ``download``."""


def check_format(fmt: str, option: str = "--format") -> str:
    """``fmt`` when it is an export format; else the CLI error (usage, exit 2) naming the
    formats, before any request is sent."""
    if fmt not in FORMATS:
        raise fail(f"{option} is one of {', '.join(FORMATS)}, not {fmt!r}", EXIT_USAGE)
    return fmt


def check_export_id(job_id: str) -> str:
    """``job_id`` when it is a UUID (what every export id is); else the CLI error (usage,
    exit 2) saying so, before any request is sent."""
    try:
        UUID(job_id)
    except ValueError:
        raise fail(f"{job_id!r} is not an export id (a UUID)", EXIT_USAGE) from None
    return job_id


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
    if job.get("base"):
        add_row(table, "base", f"{job['base']['id']} (manifest {job['base']['manifest_sha256']})")
    if job.get("checkpoint"):
        c = job["checkpoint"]
        add_row(
            table,
            "checkpoint",
            f"{count_of(c['notes'], 'note')}, {count_of(c['bytes'], 'byte')} durable; resumes "
            f"{c['resumes']}, "
            f"notes carried over {c['notes_carried_over']}",
        )
    if job.get("dispatch_paused"):
        add_row(table, "dispatch", "paused by an operator: it waits, and runs once resumed")
    if job.get("tags") or job.get("metadata"):
        add_row(table, "labels", labels_text(job))
    if job.get("error"):
        add_row(table, "error", f"{job['error']['code']}: {job['error'].get('detail') or ''}")
    if job.get("result"):
        r = job["result"]
        add_row(
            table,
            "result",
            f"{count_of(r['rows'], 'note')}, {count_of(r['bytes'], 'byte')}, sha256 {r['sha256']}",
        )
    return table


TagOpt = Annotated[
    list[str] | None,
    typer.Option("--tag", help="a tag (repeatable): letters, digits, _ . : - (docs/api.md)"),
]
MetaOpt = Annotated[
    list[str] | None,
    typer.Option("--meta", metavar="KEY=VALUE", help="a metadata pair (repeatable)"),
]


def meta_pairs(pairs: list[str] | None) -> dict[str, str]:
    """``--meta KEY=VALUE`` options as a metadata object (the value may hold ``=``; a key
    given twice keeps its last value). Exits with a usage error naming the option when one
    has no ``=`` or an empty key; the API checks the bounds (docs/api.md)."""
    out: dict[str, str] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise fail(f"--meta takes KEY=VALUE, not {pair!r}", EXIT_USAGE)
        out[key] = value
    return out


def labels_text(job: dict[str, Any]) -> str:
    """An export's tags and metadata on one line (``#a #b k=v``), empty when it has none."""
    tags = [f"#{t}" for t in job.get("tags") or ()]
    meta = [f"{k}={v}" for k, v in sorted((job.get("metadata") or {}).items())]
    return " ".join(tags + meta)


@exports_app.command()
def submit(
    note_id: Annotated[list[int] | None, typer.Option("--note-id", "-n", help="repeatable")] = None,
    all_notes: Annotated[bool, typer.Option("--all", help="export every note")] = False,
    fmt: Format = "json",
    since: Annotated[
        str | None, typer.Option("--since", help="with --all: a delta since this export id")
    ] = None,
    tag: TagOpt = None,
    meta: MetaOpt = None,
    recipient: Annotated[
        list[str] | None,
        typer.Option(
            "--recipient",
            "-r",
            help="encrypt to this age public key (age1…); repeatable",
        ),
    ] = None,
    output: OutputOpt = None,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """Submit an export. Prints ONE line on stdout, the job id (``ID=$(exportctl submit
    --all)``), or with ``--output`` the export; the human message goes to stderr. The API
    answered 202 after committing it. ``--since ID`` makes a delta of what changed since
    export ID (docs/api.md); ``--tag`` and ``--meta KEY=VALUE`` label it. ``--recipient
    age1…`` encrypts the export to that age key (beside the tenant's own): only its identity
    reads it (``download --identity``)."""
    if bool(note_id) == all_notes:
        raise fail("give --note-id (one or more) or --all", EXIT_USAGE)
    if since and not all_notes:
        raise fail("--since needs --all (a delta covers every note)", EXIT_USAGE)
    check_format(fmt)
    body: dict[str, Any] = {"format": fmt}
    body.update({"all": True} if all_notes else {"note_ids": note_id})
    if since:
        body["since"] = since
    if tag:
        body["tags"] = tag
    if meta:
        body["metadata"] = meta_pairs(meta)
    if recipient:
        try:
            body["recipients"] = list(encryption.parse_recipients(recipient))
        except ValueError as exc:
            raise fail(f"--recipient: {exc}", EXIT_USAGE) from None
    job = call(api_url, api_key, "POST", "/v1/exports", body)
    err.print(
        f"accepted [bold]{safe(job['id'])}[/] ({safe(job['queue'])}, "
        f"{safe(count_of(job['note_count'], 'note'))})"
    )
    emit_object(job, explicit(output), _status_table, default=lambda j: print_value(j["id"]))


@exports_app.command()
def status(
    job_id: JobId,
    output: OutputOpt = None,
    as_json: AsJson = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """Show an export's status."""
    check_export_id(job_id)
    job = _get(api_url, api_key, f"/v1/exports/{job_id}")
    emit_object(job, mode(output, as_json), _status_table)


@exports_app.command("list")
def list_(
    status: Annotated[
        str | None,
        typer.Option(
            help=f"only exports in this state: {' | '.join(STATUSES)}",
            autocompletion=completes(*STATUSES),
        ),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="exports to show")] = 50,
    cursor: Annotated[
        str | None, typer.Option(help="the next page: the cursor the previous page printed")
    ] = None,
    all_pages: AllPages = False,
    tag: Annotated[
        list[str] | None,
        typer.Option("--tag", help="only exports with this tag (repeatable: with every one)"),
    ] = None,
    meta: Annotated[
        list[str] | None,
        typer.Option(
            "--meta", metavar="KEY=VALUE", help="only exports with this metadata (repeatable)"
        ),
    ] = None,
    output: OutputOpt = None,
    as_json: AsJson = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """The tenant's exports, newest first (``GET /v1/exports``). When more remain, the
    ``--cursor`` of the next page is printed on stderr; ``--all`` fetches every page.
    ``--tag`` and ``--meta KEY=VALUE`` keep the exports that carry every one given."""
    if status is not None and status not in STATUSES:
        raise fail(f"--status is one of {', '.join(STATUSES)}, not {status!r}", EXIT_USAGE)
    query: dict[str, object] = {"status": status, "limit": limit, "tag": tag or None}
    query.update({f"metadata[{k}]": v for k, v in meta_pairs(meta).items()})

    emit_api_pages(
        api_url,
        api_key,
        "/v1/exports",
        query,
        cursor,
        all_pages,
        mode(output, as_json),
        exports_table,
        empty="no exports"
        + (f" {status}" if status else "")
        + (" matching" if tag or meta else ""),
    )


def exports_table(rows: list[dict[str, Any]]) -> Table:
    """Exports (``/v1/exports`` items), fitted to the terminal: the whole id (what the other
    commands take) and the status always; the rest gives way on a narrow terminal."""
    return fit(
        [
            Col("id", lambda j: j["id"]),
            Col(
                "status",
                lambda j: j["status"] + (" (cancelling)" if j.get("cancel_requested") else ""),
            ),
            Col("notes", lambda j: j["note_count"], priority=2, justify="right"),
            Col("created (UTC)", lambda j: when(j["created_at"]), priority=1),
            Col("format", lambda j: j["format"], priority=3),
            Col("attempts", lambda j: f"{j['attempts']}/{j['max_attempts']}", priority=4),
            Col("finished (UTC)", lambda j: when(j["finished_at"]), priority=5),
            Col("replay of", lambda j: short_id(j.get("replay_of")), priority=6),
            Col("labels", labels_text, priority=7),
        ],
        rows,
    )


@exports_app.command()
def events(
    job_id: JobId,
    output: OutputOpt = None,
    as_json: AsJson = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """An export's history, oldest first (``GET /v1/exports/{id}/events``): every transition,
    claim, lease renewal (with its progress), retry and outcome."""
    check_export_id(job_id)
    rows = call(api_url, api_key, "GET", f"/v1/exports/{job_id}/events")
    emit_rows(rows, mode(output, as_json), events_table, empty="no history")


def events_table(rows: list[dict[str, Any]]) -> Table:
    """History rows (``/v1/exports/{id}/events``) fitted to the terminal; ``detail`` as
    ``key=value``, folded onto more lines but never narrower than 24 characters (the event's
    number and then its attempt give way first). When every event is of one day (UTC), the
    day is named once, under the header, and each row shows its time."""
    stamps = [when(e["at"]) for e in rows]
    days = {stamp[:10] for stamp in stamps}
    one_day = len(days) == 1 and all(_STAMP.fullmatch(stamp) for stamp in stamps)
    at_header = f"at (UTC)\n{days.pop()}" if one_day else "at (UTC)"

    def at(e: dict[str, Any]) -> str:
        stamp = when(e["at"])
        return stamp[11:] if one_day else stamp

    def transition(e: dict[str, Any]) -> str:
        if not e["to_status"]:
            return ""
        return (
            f"{e['from_status']} → {e['to_status']}" if e["from_status"] else f"→ {e['to_status']}"
        )

    def detail(e: dict[str, Any]) -> str:
        return " ".join(f"{k}={v}" for k, v in sorted((e["detail"] or {}).items()))

    return fit(
        [
            Col("#", lambda e: e["id"], priority=2, justify="right"),
            Col(at_header, at),
            Col("kind", lambda e: e["kind"]),
            Col("transition", transition, fold=True, fold_width=9),
            Col("attempt", lambda e: e["attempt"], priority=1, justify="right"),
            Col("detail", detail, fold=True, fold_width=24),
        ],
        rows,
    )


_STAMP = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}")


@exports_app.command()
def cancel(
    job_id: JobId,
    output: OutputOpt = None,
    as_json: AsJson = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """Cancel an export (``POST /v1/exports/{id}/cancel``). A queued export is cancelled at
    once; a running one stops at its next chunk boundary (``exportctl watch ID`` follows it).
    A finished export cannot be cancelled (exit 1, HTTP 409)."""
    check_export_id(job_id)
    job = call(api_url, api_key, "POST", f"/v1/exports/{job_id}/cancel")
    if job["status"] == "cancelled":
        err.print(f"cancelled {safe(job['id'])}")
    else:
        err.print(
            f"cancel requested: {safe(job['id'])} is {safe(job['status'])} and stops at its "
            "next chunk boundary"
        )
    emit_object(job, explicit(output, as_json), _status_table, default=lambda _: None)


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
        shown = f"{progress.done} of {count_of(progress.total, 'note')}"
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
            f"(in {_seconds(wait)}); {count_of(most - attempts, 'attempt')} left",
        )
    return table


@exports_app.command()
def watch(
    job_id: JobId,
    interval: Annotated[float, typer.Option(help="seconds between polls")] = 0.5,
    timeout: Annotated[float, typer.Option(help="give up after this many seconds")] = 600.0,
    output: OutputOpt = None,
    as_json: AsJson = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """Follow an export live until it reaches a terminal state: exit 0 when it succeeded, 3
    when it failed, 4 when it was cancelled, 8 on ``--timeout``. Shows its status, while
    running its progress (notes done of total, rate, ETA; updated at each lease renewal), and
    while queued for a retry when the next attempt starts and how many attempts are left.
    ``--output jsonl`` prints the export instead, one JSON line each time it changes;
    ``--output json`` prints it once, as it ended (or as it was at the timeout)."""
    check_export_id(job_id)
    deadline = time.monotonic() + timeout
    job = _get(api_url, api_key, f"/v1/exports/{job_id}")
    how = explicit(output, as_json)
    if how in (Output.json, Output.jsonl):
        job, timed_out = _watch_data(api_url, api_key, job, interval, deadline, how)
    else:
        job, timed_out = _watch_live(api_url, api_key, job, interval, deadline)
    if timed_out:
        raise fail(f"still {job['status']} after {timeout:.0f} s", EXIT_TIMEOUT)
    if job["status"] == "failed":
        raise typer.Exit(EXIT_FAILED)
    if job["status"] == "cancelled":
        raise typer.Exit(EXIT_CANCELLED)


def _watch_data(
    api_url: str,
    api_key: str,
    job: dict[str, Any],
    interval: float,
    deadline: float,
    how: Output,
) -> tuple[dict[str, Any], bool]:
    """``watch --output json|jsonl``: no live view. JSON Lines: the export at once, then one
    line each time it changes (its status, attempts, progress); JSON: the export once, as
    it ended or as it was at ``deadline``. Returns the last export and whether the deadline
    passed first."""
    path = f"/v1/exports/{job['id']}"
    if how is Output.jsonl:
        json_line(job)
    timed_out = False
    while job["status"] not in TERMINAL:
        if time.monotonic() > deadline:
            timed_out = True
            break
        time.sleep(interval)
        now = _get(api_url, api_key, path)
        if how is Output.jsonl and now != job:
            json_line(now)
        job = now
    if how is Output.json:
        print_json(job)
    return job, timed_out


def _watch_live(
    api_url: str, api_key: str, job: dict[str, Any], interval: float, deadline: float
) -> tuple[dict[str, Any], bool]:
    """``watch`` for people: the live table (:func:`watch_table`) until the export ends or
    ``deadline`` passes. Returns the last export and whether the deadline passed first."""
    job_id = job["id"]
    history: list[dict[str, Any]] = []
    read_at = -EVENTS_EVERY

    def refresh() -> Table:
        nonlocal history, read_at
        if job["status"] == "running" and time.monotonic() - read_at >= EVENTS_EVERY:
            history = call(api_url, api_key, "GET", f"/v1/exports/{job_id}/events")
            read_at = time.monotonic()
        return watch_table(job, history, datetime.now(UTC))

    timed_out = False
    with Live(refresh(), console=out, refresh_per_second=4) as live:
        while job["status"] not in TERMINAL:
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(interval)
            job = _get(api_url, api_key, f"/v1/exports/{job_id}")
            live.update(refresh())
    out.line()  # the live table's last line ends, so the shell's prompt starts on its own
    return job, timed_out


@exports_app.command()
def download(
    job_id: JobId,
    output: Annotated[
        str | None,
        typer.Option(
            "--output",
            "-o",
            help="file to write, or an existing folder (ending in /) to write into",
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="overwrite an existing file")] = False,
    identity: Annotated[
        Path | None,
        typer.Option(
            "--identity",
            "-i",
            help="an encrypted export: decrypt with this age identity file and verify",
        ),
    ] = None,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """Download a succeeded export and verify its SHA-256 against the ETag.

    An encrypted export (docs/cli.md "Encrypted exports"): without ``--identity`` the age
    file is saved as ``export-<id>.<ext>.age`` with its signed envelope beside it
    (``.envelope.json``, for ``exportctl verify``); with ``--identity FILE`` it is
    decrypted, checked against the envelope and its signed manifest (the API's manifest
    keys), and only then written as ``export-<id>.<ext>``.

    The file is named here, never by the server or the storage host: ``export-<id>.<ext>``
    (the extension of the export's format) in the current folder, or ``-o FILE``, or
    ``-o DIR/`` for that name inside an existing folder. An existing file is never
    overwritten without ``--force``. When the API answers 307 (``DOWNLOAD_MODE=redirect``),
    the file is fetched from the presigned URL without the API key (https only, unless the
    API itself is plain http on loopback), and checked against the ETag of the 307 answer.
    """
    check_export_id(job_id)
    job = _get(api_url, api_key, f"/v1/exports/{job_id}")
    extension = EXTENSIONS.get(str(job.get("format")), "bin")
    encrypted = bool((job.get("result") or {}).get("encrypted"))
    if identity is not None and not encrypted:
        raise fail(f"export {job_id} is not encrypted: download it without --identity", EXIT_USAGE)
    if encrypted and identity is not None:
        target = download_target(job_id, output, extension)
        if target.exists() and not force:
            raise fail(
                f"{target} exists; pass --force to overwrite it, or -o another path", EXIT_USAGE
            )
        _download_decrypted(api_url, api_key, job_id, target, identity, force)
        return
    if encrypted:
        extension += "." + encryption.EXTENSION
    target = download_target(job_id, output, extension)
    if target.exists() and not force:
        raise fail(f"{target} exists; pass --force to overwrite it, or -o another path", EXIT_USAGE)
    try:
        with write_beside(target, replace=force) as fh:
            expected, digest = _fetch(api_url, api_key, job_id, fh)
            if expected and expected != digest:
                raise fail(f"checksum mismatch: got {digest}, expected {expected}")
    except httpx.TransportError as exc:
        raise fail(f"cannot reach the API or the storage ({type(exc).__name__})") from None
    except FileExistsError:
        raise fail(f"{target} appeared meanwhile; pass --force to overwrite it", 2) from None
    if encrypted:
        envelope = Path(f"{target}{ENVELOPE_SUFFIX}")
        doc = call(api_url, api_key, "GET", f"/v1/exports/{job_id}/envelope")
        with write_beside(envelope, replace=True) as fh:
            fh.write(json.dumps(doc, indent=2).encode("utf-8") + b"\n")
        err.print(
            f"[green]saved {safe(target)}[/] (age-encrypted, sha256 {safe(digest)}) and its "
            f"envelope {safe(envelope)}; decrypt with --identity, check with exportctl verify"
        )
        return
    err.print(f"[green]saved {safe(target)}[/] (sha256 {safe(digest)})")


def _download_decrypted(
    api_url: str, api_key: str, job_id: str, target: Path, identity: Path, force: bool
) -> None:
    """``download --identity``: fetch the age file into a temporary file beside
    ``target``, check it against its signed envelope, decrypt it, check the plaintext
    against its signed manifest and the envelope, and only then write ``target``. Every
    failure is a CLI error (exit 1) that writes nothing."""
    identities = identities_from(identity)
    doc = call(api_url, api_key, "GET", f"/v1/exports/{job_id}/envelope")
    keys = trusted_keys(api_url, None, None)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".age")
    cipher = Path(name)
    try:
        with os.fdopen(fd, "wb") as fh:
            try:
                expected, digest = _fetch(api_url, api_key, job_id, fh)
            except httpx.TransportError as exc:
                raise fail(f"cannot reach the API or the storage ({type(exc).__name__})") from None
        if expected and expected != digest:
            raise fail(f"checksum mismatch: got {digest}, expected {expected}")
        found = ciphertext_problems(cipher, doc, keys)
        if found:
            raise fail(f"export {job_id} does not verify: " + "; ".join(found))
        with decrypted(cipher, identities) as plain:
            art = load(plain)
            found = problems(art, keys) + envelope_binds(doc["envelope"], art.manifest)
            if found:
                raise fail(
                    f"export {job_id} decrypted but does not verify: "
                    + "; ".join(found[:SHOWN_PROBLEMS])
                )
            try:
                with write_beside(target, replace=force) as out_fh, open(plain, "rb") as src:
                    shutil.copyfileobj(src, out_fh, 1 << 20)
            except FileExistsError:
                raise fail(
                    f"{target} appeared meanwhile; pass --force to overwrite it", 2
                ) from None
    finally:
        cipher.unlink(missing_ok=True)
    m = art.manifest
    err.print(
        f"[green]saved {safe(target)}[/] (decrypted; verified: export "
        f"{safe(m.get('export_id'))}, {safe(count_of(m.get('notes'), 'note'))}, "
        f"ciphertext sha256 {safe(digest)})"
    )


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
