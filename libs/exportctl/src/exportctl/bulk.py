"""``exportctl bulk cancel | replay | status | resume``: act on every export a filter matches,
through the admin API with an admin operator key (docs/operations.md, "Bulk actions").

The count comes first, on stderr, and the confirmation names it (``--yes`` skips the
question; ``--expect N`` refuses unless the count is exactly N, for scripts). The action
then runs on the server in batches; the command follows its progress until it ends (``--no-
wait``: print the bulk action and return)."""

from __future__ import annotations

import inspect
import sys
import time
from typing import Annotated, Any
from uuid import uuid4

import typer
from rich.table import Table

from exportctl.api import DEFAULT_API_URL, ApiUrl, OperatorKey, call, need_operator_key
from exportctl.common import app, completes, err, fail, key_value_table, safe, when
from exportctl.exits import EXIT_ERROR, EXIT_TIMEOUT, EXIT_UNAVAILABLE, EXIT_USAGE
from exportctl.output import AsJson, OutputOpt, emit_object, mode

bulk_app = typer.Typer(
    help="Cancel or replay every export a filter matches (admin API, operator key).",
    no_args_is_help=True,
)
app.add_typer(bulk_app, name="bulk")

Status = Annotated[
    str | None,
    typer.Option(help="a cancel: queued | running", autocompletion=completes("queued", "running")),
]
Reason = Annotated[str | None, typer.Option(help="the error code of the dead letters")]
Queue = Annotated[
    str | None,
    typer.Option(
        help="exports.fast | exports.bulk",
        autocompletion=completes("exports.fast", "exports.bulk"),
    ),
]
Tenant = Annotated[str | None, typer.Option(help="only this tenant's")]
CreatedFrom = Annotated[str | None, typer.Option(help="created at or after (RFC 3339)")]
CreatedTo = Annotated[str | None, typer.Option(help="created before (RFC 3339)")]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="do not ask (the count still prints)")]
Expect = Annotated[
    int | None, typer.Option(min=0, help="refuse unless exactly this many match (scripts)")
]
Wait = Annotated[bool, typer.Option("--wait/--no-wait", help="follow it until it ends")]
Timeout = Annotated[float, typer.Option(min=1, help="give up waiting after this many seconds")]
BulkId = Annotated[int, typer.Argument(help="the bulk action's id")]


def bulk_table(run: dict[str, Any]) -> Table:
    """A bulk action (``/v1/admin/bulk-actions/{id}``) as key / value lines."""
    filt = ", ".join(f"{k} {v}" for k, v in run["filter"].items()) or "every export"
    state = run["state"] + (
        " (interrupted: no runner holds it; a recovery-scanner takes it on)"
        if run["interrupted"]
        else ""
    )
    return key_value_table(
        (
            ("id", run["id"]),
            ("action", run["action"]),
            ("filter", filt),
            ("state", state + (f": {run['stop_reason']}" if run.get("stop_reason") else "")),
            ("progress", f"{run['seen']} of {run['confirmed']} reached"),
            ("acted", run["acted"]),
            ("skipped", run["skipped"]),
            ("batches", run["batches"]),
            ("audit entry", run["audit_id"]),
            ("started (UTC)", when(run["created_at"])),
            ("finished (UTC)", when(run["finished_at"])),
        )
    )


def _run(
    kind: str,
    filt: dict[str, Any],
    yes: bool,
    expect: int | None,
    wait: bool,
    timeout: float,
    output: Any,
    as_json: bool,
    api_url: str,
    api_key: str,
) -> None:
    need_operator_key(api_key)
    body = {"action": kind, "filter": {k: v for k, v in filt.items() if v is not None}}
    seen = call(api_url, api_key, "POST", "/v1/admin/bulk-actions/preview", body)
    count = int(seen["count"])
    verb = "cancel" if kind == "cancel" else "replay"
    err.print(f"{count} export(s) match: {safe(seen['description'])} (as of {when(seen['as_of'])})")
    if expect is not None and count != expect:
        raise fail(f"{count} match, not the {expect} expected: nothing done", EXIT_ERROR)
    if count == 0:
        err.print(f"nothing to {verb}")
        return
    if not yes and expect is None:
        if not sys.stdin.isatty():
            raise fail(f"{verb} {count} export(s)? pass --yes (or --expect {count})", EXIT_USAGE)
        if not typer.confirm(f"{verb.capitalize()} {count} export(s)?", err=True):
            raise typer.Exit(EXIT_ERROR)
    start = body | {
        "as_of": seen["as_of"],
        "confirmed_count": count,
        "request_id": str(uuid4()),
    }
    run = call(api_url, api_key, "POST", "/v1/admin/bulk-actions", start)
    err.print(f"bulk {verb} {run['id']} started (audit entry {run['audit_id']})")
    if wait:
        run = _follow(api_url, api_key, run, timeout)
    emit_object(run, mode(output, as_json), bulk_table)
    _exit_for(run)


def _get(api_url: str, api_key: str, bulk_id: object) -> dict[str, Any]:
    """``GET /v1/admin/bulk-actions/{bulk_id}``: the bulk action as it stands."""
    run: dict[str, Any] = call(api_url, api_key, "GET", f"/v1/admin/bulk-actions/{bulk_id}")
    return run


def _follow(api_url: str, api_key: str, run: dict[str, Any], timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    shown = -1
    # an interrupted run is followed on: a recovery-scanner takes it on by itself once its
    # dead runner's lease ends (docs/operations.md, "Bulk actions")
    while run["state"] == "running":
        if time.monotonic() > deadline:
            if run["interrupted"]:
                raise fail(
                    f"bulk action {run['id']} interrupted for {timeout:.0f} s: no "
                    "recovery-scanner took it on; check that one runs",
                    EXIT_ERROR,
                )
            raise fail(f"bulk action {run['id']} still running after {timeout:.0f} s", EXIT_TIMEOUT)
        if run["seen"] != shown:
            err.print(f"  {run['seen']} of {run['confirmed']} reached, {run['acted']} acted on")
            shown = run["seen"]
        time.sleep(0.5)
        run = _get(api_url, api_key, run["id"])
    return run


def _exit_for(run: dict[str, Any]) -> None:
    if run["state"] == "stopped":
        raise fail(f"stopped: {run.get('stop_reason')}", EXIT_UNAVAILABLE)
    if run["interrupted"]:
        raise fail(
            f"interrupted: no runner holds bulk action {run['id']}; a recovery-scanner takes "
            "it on by itself (check that one runs)",
            EXIT_ERROR,
        )


def _filter_options(
    queue: Queue = None,
    tenant: Tenant = None,
    created_from: CreatedFrom = None,
    created_to: CreatedTo = None,
    yes: Yes = False,
    expect: Expect = None,
    wait: Wait = True,
    timeout: Timeout = 600.0,
    output: OutputOpt = None,
    as_json: AsJson = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: OperatorKey = "",
) -> None:
    """Never called: its signature is the options every bulk action by filter takes after
    its own first one (:func:`_by_filter`)."""


_SHARED_FILTERS = ("queue", "tenant", "created_from", "created_to")


def _by_filter(kind: str, first: str, first_option: object, doc: str) -> None:
    """Add ``exportctl bulk <kind>``: the option ``first`` (its type ``first_option``, an
    ``Annotated[str | None, typer.Option(...)]``, default None), then the options of
    :func:`_filter_options`; it runs :func:`_run` with the filter ``{first, queue, tenant,
    created_from, created_to}``. One definition for ``cancel`` (``--status``) and ``replay``
    (``--reason``), whose options differ only in the first; ``doc`` is its help."""
    shared = inspect.signature(_filter_options, eval_str=True)
    own = inspect.Parameter(
        first, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=first_option
    )

    def command(**given: Any) -> None:
        filt = {name: given.pop(name) for name in (first, *_SHARED_FILTERS)}
        _run(kind, filt, **given)

    command.__doc__ = doc
    # typer reads the options from the signature (inspect.signature honours __signature__)
    command.__dict__["__signature__"] = shared.replace(
        parameters=[own, *shared.parameters.values()]
    )
    bulk_app.command(kind)(command)


_by_filter(
    "cancel",
    "status",
    Status,
    "Cancel every queued or running export the filter matches (count first, then ask).",
)
_by_filter(
    "replay",
    "reason",
    Reason,
    """Replay every failed export with an open dead letter the filter matches (count first,
    then ask); each once, whoever else replays meanwhile.""",
)


@bulk_app.command("status")
def status(
    bulk_id: BulkId,
    output: OutputOpt = None,
    as_json: AsJson = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: OperatorKey = "",
) -> None:
    """A bulk action's progress and state."""
    need_operator_key(api_key)
    run = _get(api_url, api_key, bulk_id)
    emit_object(run, mode(output, as_json), bulk_table)


@bulk_app.command("resume")
def resume(
    bulk_id: BulkId,
    wait: Wait = True,
    timeout: Timeout = 600.0,
    output: OutputOpt = None,
    as_json: AsJson = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: OperatorKey = "",
) -> None:
    """Wake the bulk runners for a bulk action whose runner died (a recovery-scanner takes
    it on from its last committed batch; they also do so by themselves)."""
    need_operator_key(api_key)
    run = call(api_url, api_key, "POST", f"/v1/admin/bulk-actions/{bulk_id}/resume")
    if wait:
        time.sleep(0.2)
        run = _follow(api_url, api_key, _get(api_url, api_key, bulk_id), timeout)
    emit_object(run, mode(output, as_json), bulk_table)
    _exit_for(run)
