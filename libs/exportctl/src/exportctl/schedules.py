"""``exportctl schedule …``: periodic exports through the API (``API_URL`` + ``API_KEY``)."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlencode

import typer
from rich.table import Table

from exportcore.domain import count_of
from exportcore.schedules.rules import MAX_JITTER_SECONDS, OVERLAP_POLICIES
from exportctl.api import DEFAULT_API_URL, ApiKey, ApiUrl, call
from exportctl.common import (
    add_row,
    app,
    completes,
    err,
    fail,
    full_page_last_id,
    print_value,
    safe,
    when,
)
from exportctl.exits import EXIT_ERROR, EXIT_UNAVAILABLE, EXIT_USAGE
from exportctl.exports import Format, MetaOpt, TagOpt, check_format, meta_pairs
from exportctl.output import (
    AllPages,
    AsJson,
    OutputOpt,
    emit_object,
    emit_paged,
    emit_rows,
    explicit,
    mode,
)
from exportctl.tables import Col, fit

schedule_app = typer.Typer(
    help="Periodic exports (one export per scheduled slot).", no_args_is_help=True
)
app.add_typer(schedule_app, name="schedule")

OVERLAP_HELP = (
    "while an earlier export still runs: skip (the slot is skipped: overlap) | buffer_one "
    "(the latest due slot waits for it) | allow_all | cancel_other (cancel it, run the slot)"
)
JITTER_HELP = (
    f"seconds (0-{MAX_JITTER_SECONDS}): each slot fires a fixed delay after its instant, "
    "derived from the schedule's id within this bound"
)


def _rule(r: dict[str, Any]) -> str:
    """The rule in words when the API gives them (``rule_description``, cron-descriptor),
    then as written."""
    written = f"{r['cron']} ({r['timezone']})" if r["cron"] else f"every {r['interval_seconds']} s"
    described = r.get("rule_description")
    return f"{described}: {r['cron']}" if described and r["cron"] else written


def _table(rows: list[dict[str, Any]]) -> Table:
    """Schedules (``/v1/schedules``), fitted to the terminal: the id, the name, the rule (in
    words) and the state always (the name and the rule fold onto more lines)."""

    def selection(r: dict[str, Any]) -> str:
        if r["selection"].get("all"):
            return "all"
        return count_of(len(r["selection"]["note_ids"]), "note")

    return fit(
        [
            Col("id", lambda r: r["id"]),
            Col("name", lambda r: r["name"], fold=True, fold_width=10),
            Col("rule", _rule, fold=True, fold_width=10),
            Col("enabled", _state, fold=True, fold_width=7),
            Col("next due (UTC)", lambda r: when(r["next_due_at"]), priority=1),
            Col("selection", selection, priority=3),
            Col("format", lambda r: r["format"], priority=4),
            Col("catch-up", lambda r: f"{r['catch_up']} (max {r['max_catch_up']})", priority=5),
            Col("overlap", lambda r: r.get("overlap", ""), priority=6),
            Col("jitter", _jitter, priority=7),
        ],
        rows,
    )


def _jitter(r: dict[str, Any]) -> str:
    """``+17 s (of 300)``: the schedule's delay after each instant within its bound."""
    if not r.get("jitter"):
        return "none"
    return f"+{r['jitter_offset']} s (of {r['jitter']})"


def _state(r: dict[str, Any]) -> str:
    """``yes``; ``paused (reason: detail)``; or ``yes, retry at …`` while backing off."""
    if not r["enabled"]:
        reason = r.get("paused_reason") or "requested"
        detail = r.get("paused_detail") or ""
        return f"paused ({reason}{': ' + detail if detail else ''})"
    refusal = r.get("last_refusal")
    if refusal and r.get("retry_at"):
        return f"yes; refused ({refusal['code']}), retry at {r['retry_at']}"
    return "yes"


@schedule_app.command("create")
def create(
    cron: Annotated[
        str | None, typer.Option(help="cron expression, e.g. '0 2 * * *', or @daily, @hourly…")
    ] = None,
    timezone: Annotated[
        str | None, typer.Option(help="IANA zone for --cron, e.g. Europe/Berlin")
    ] = None,
    every: Annotated[
        int | None, typer.Option(min=1, help="instead of --cron: every N seconds")
    ] = None,
    note_id: Annotated[list[int] | None, typer.Option("--note-id", "-n", help="repeatable")] = None,
    all_notes: Annotated[bool, typer.Option("--all", help="every note")] = False,
    fmt: Format = "json",
    catch_up: Annotated[
        str,
        typer.Option(
            help="skip (latest missed only) | all", autocompletion=completes("skip", "all")
        ),
    ] = "skip",
    max_catch_up: Annotated[int, typer.Option(min=1, max=1000, help="with --catch-up all")] = 10,
    overlap: Annotated[
        str, typer.Option(help=OVERLAP_HELP, autocompletion=completes(*OVERLAP_POLICIES))
    ] = "skip",
    jitter: Annotated[int, typer.Option(min=0, max=MAX_JITTER_SECONDS, help=JITTER_HELP)] = 0,
    full_every: Annotated[
        int | None,
        typer.Option(
            min=1, max=366, help="incremental (--all): a full export every N slots, deltas between"
        ),
    ] = None,
    name: Annotated[str, typer.Option(help="a label")] = "",
    tag: TagOpt = None,
    meta: MetaOpt = None,
    output: OutputOpt = None,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """Create a schedule; prints its id on stdout (``--output json``: the schedule), the
    message on stderr. ``--tag`` and ``--meta KEY=VALUE`` (repeatable) label every export
    it creates."""
    if (cron is None) == (every is None):
        raise fail("give --cron (with --timezone) or --every SECONDS", EXIT_USAGE)
    if bool(note_id) == all_notes:
        raise fail("give --note-id (one or more) or --all", EXIT_USAGE)
    check_format(fmt)
    body: dict[str, Any] = {
        "name": name,
        "format": fmt,
        "catch_up": catch_up,
        "max_catch_up": max_catch_up,
        "overlap": overlap,
        "jitter": jitter,
    }
    body.update({"cron": cron, "timezone": timezone} if cron else {"interval_seconds": every})
    body.update({"all": True} if all_notes else {"note_ids": note_id})
    if full_every is not None:
        body["full_every"] = full_every
    if tag:
        body["tags"] = tag
    if meta:
        body["metadata"] = meta_pairs(meta)
    row = call(api_url, api_key, "POST", "/v1/schedules", body)
    err.print(f"schedule [bold]{safe(row['id'])}[/], first run at {safe(row['next_due_at'])} (UTC)")
    emit_object(row, explicit(output), default=lambda r: print_value(r["id"]))


@schedule_app.command("list")
def list_(
    output: OutputOpt = None,
    as_json: AsJson = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """The caller's schedules, their rules in words."""
    rows = call(api_url, api_key, "GET", "/v1/schedules")
    emit_rows(rows, mode(output, as_json), _table, empty="no schedules")


@schedule_app.command("pause")
def pause(schedule_id: str, api_url: ApiUrl = DEFAULT_API_URL, api_key: ApiKey = "") -> None:
    """Stop creating exports; the cursor waits where it is."""
    call(api_url, api_key, "PATCH", f"/v1/schedules/{schedule_id}", {"enabled": False})
    err.print(f"schedule {safe(schedule_id)} paused")


@schedule_app.command("resume")
def resume(schedule_id: str, api_url: ApiUrl = DEFAULT_API_URL, api_key: ApiKey = "") -> None:
    """Resume; slots missed while paused follow the schedule's catch-up policy."""
    row = call(api_url, api_key, "PATCH", f"/v1/schedules/{schedule_id}", {"enabled": True})
    err.print(f"schedule {safe(schedule_id)} resumed; next slot {safe(row['next_due_at'])} (UTC)")


@schedule_app.command("set-overlap")
def set_overlap(
    schedule_id: str,
    policy: Annotated[
        str, typer.Argument(help=OVERLAP_HELP, autocompletion=completes(*OVERLAP_POLICIES))
    ],
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """What a slot does while an earlier export of the schedule is still running."""
    call(api_url, api_key, "PATCH", f"/v1/schedules/{schedule_id}", {"overlap": policy})
    err.print(f"schedule {safe(schedule_id)}: overlap {safe(policy)}")


@schedule_app.command("set-jitter")
def set_jitter(
    schedule_id: str,
    seconds: Annotated[int, typer.Argument(min=0, max=MAX_JITTER_SECONDS, help=JITTER_HELP)],
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """The bound of the schedule's jitter; prints the delay its slots now fire with."""
    row = call(api_url, api_key, "PATCH", f"/v1/schedules/{schedule_id}", {"jitter": seconds})
    err.print(
        f"schedule {safe(schedule_id)}: jitter {safe(row['jitter'])} s; its slots fire "
        f"{safe(row['jitter_offset'])} s after their instants"
    )


@schedule_app.command("delete")
def delete(schedule_id: str, api_url: ApiUrl = DEFAULT_API_URL, api_key: ApiKey = "") -> None:
    """Delete the schedule (its exports stay)."""
    call(api_url, api_key, "DELETE", f"/v1/schedules/{schedule_id}")
    err.print(f"schedule {safe(schedule_id)} deleted")


@schedule_app.command("runs")
def runs(
    schedule_id: str,
    limit: Annotated[int, typer.Option(min=1, max=500, help="slots per page")] = 20,
    before: Annotated[
        str | None,
        typer.Option(help="slots scheduled before this instant (RFC 3339): the next page"),
    ] = None,
    all_pages: AllPages = False,
    output: OutputOpt = None,
    as_json: AsJson = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """The schedule's slots, newest first, with their exports (``GET
    /v1/schedules/{id}/runs``, paged by ``before``). When more remain, the ``--before`` of
    the next page (the last slot's instant) is printed on stderr; ``--all`` reads every
    page."""

    def page_at(start: str | None) -> tuple[list[Any], str | None]:
        query = urlencode({"limit": limit} | ({"before": start} if start else {}))
        rows = call(api_url, api_key, "GET", f"/v1/schedules/{schedule_id}/runs?{query}")
        last = full_page_last_id(rows, limit, key="scheduled_at")
        return rows, None if last is None else str(last)

    emit_paged(
        page_at,
        before,
        all_pages,
        mode(output, as_json),
        runs_table,
        next_option="--before",
        empty="no slot has run yet",
    )


def _outcome(r: dict[str, Any]) -> str:
    """A slot's outcome with its reason when it has one (``skipped: overlap``)."""
    return f"{r['outcome']}: {r['reason']}" if r.get("reason") else str(r["outcome"])


def runs_table(rows: list[dict[str, Any]]) -> Table:
    """A schedule's slots (``/v1/schedules/{id}/runs`` items); a skipped one with its reason
    (``skipped: overlap``, ``skipped: catch_up``)."""
    return fit(
        [
            Col("scheduled at (UTC)", lambda r: when(r["scheduled_at"])),
            Col("outcome", _outcome),
            Col("export", lambda r: r["job_id"]),
            Col("status", lambda r: r["job_status"], priority=1),
            Col("detail", lambda r: r["detail"], priority=2, fold=True),
        ],
        rows,
    )


@schedule_app.command("run")
def run(
    schedule_id: str,
    output: OutputOpt = None,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """Run the schedule once now (same admission as its slots); prints the export's id
    (``--output json``: the run)."""
    row = call(api_url, api_key, "POST", f"/v1/schedules/{schedule_id}/runs")
    export = row["export"]
    err.print(f"run of schedule {safe(schedule_id)} accepted: export [bold]{safe(export['id'])}[/]")
    emit_object(row, explicit(output), default=lambda r: print_value(r["export"]["id"]))


@schedule_app.command("preview")
def preview(
    schedule_id: Annotated[
        str | None, typer.Argument(help="a saved schedule (or give a rule instead)")
    ] = None,
    cron: Annotated[str | None, typer.Option(help="a rule not saved yet: cron")] = None,
    timezone: Annotated[str | None, typer.Option(help="IANA zone for --cron")] = None,
    every: Annotated[int | None, typer.Option(min=1, help="a rule not saved yet: seconds")] = None,
    count: Annotated[int, typer.Option("--count", "-n", min=1, max=100)] = 5,
    output: OutputOpt = None,
    as_json: AsJson = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """The next slots of a schedule, or of a rule before saving it, in its own zone."""
    rule_given = cron is not None or every is not None
    if (schedule_id is None) == (not rule_given):
        raise fail("give a schedule id, or a rule (--cron with --timezone, or --every)", EXIT_USAGE)
    if schedule_id is not None:
        row = call(api_url, api_key, "GET", f"/v1/schedules/{schedule_id}/preview?count={count}")
    else:
        body: dict[str, Any] = {"count": count}
        body.update({"cron": cron, "timezone": timezone} if cron else {"interval_seconds": every})
        row = call(api_url, api_key, "POST", "/v1/schedule-preview", body)
    emit_object(row, mode(output, as_json), preview_table)


def preview_table(preview: dict[str, Any]) -> Table:
    """The next slots of a rule (``/v1/schedules/{id}/preview``): UTC and the zone's time,
    and, for a schedule with jitter, when each fires (its instant + the offset)."""
    offset = preview.get("jitter_offset") or 0
    zone = safe(preview["timezone"])
    if offset:
        table = Table("UTC", f"local ({zone})", "fires (UTC)", f"fires ({zone})")
        for slot in preview["slots"]:
            add_row(table, slot["at"], slot["local"], slot["fires_at"], slot["fires_local"])
    else:
        table = Table("UTC", f"local ({zone})")
        for slot in preview["slots"]:
            add_row(table, slot["at"], slot["local"])
    caption = preview.get("rule_description") or ""
    if offset:
        caption += f"; jitter {preview['jitter']} s: fires {offset} s after each slot"
    if caption:
        table.caption = safe(caption.lstrip("; "))
    return table


@schedule_app.command("backfill")
def backfill(
    schedule_id: str,
    start: Annotated[
        str,
        typer.Option(
            "--from", help="first instant of the range (RFC 3339, e.g. 2026-12-01T00:00:00Z)"
        ),
    ],
    end: Annotated[str, typer.Option("--to", help="last instant of the range (not after now)")],
    admin: Annotated[
        bool,
        typer.Option("--admin", help="any tenant's schedule, with an operator key (/v1/admin)"),
    ] = False,
    output: OutputOpt = None,
    as_json: AsJson = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """Create the exports of the schedule's slots from --from to --to (at most 100 slots,
    all in the past), one per slot, never two: a slot that
    already has its export is listed ``exists``. Repeating it is harmless. Exits 7 when
    admission refused a slot (try again later: those slots are tried again), 1 when the
    selection cannot be exported."""
    path = f"/v1/{'admin/' if admin else ''}schedules/{schedule_id}/backfill"
    report = call(api_url, api_key, "POST", path, {"from": start, "to": end})
    emit_rows(report["slots"], mode(output, as_json), backfill_table, empty="no slot in the range")
    err.print(
        f"backfill of schedule {safe(schedule_id)}: {report['created']} created, "
        f"{report['existing']} existed already, {report['refused']} refused, "
        f"{report['invalid']} invalid"
    )
    if report["invalid"]:
        raise typer.Exit(EXIT_ERROR)
    if report["refused"]:
        raise typer.Exit(EXIT_UNAVAILABLE)


def backfill_table(rows: list[dict[str, Any]]) -> Table:
    """A backfill's report (``POST /v1/schedules/{id}/backfill`` ``slots``): each slot, what
    happened to it and its export, or why it was refused."""
    return fit(
        [
            Col("scheduled at (UTC)", lambda r: when(r["scheduled_at"])),
            Col(
                "outcome",
                lambda r: f"{r['outcome']}: {r['code']}" if r.get("code") else r["outcome"],
            ),
            Col("export", lambda r: r["job_id"] or ""),
            Col("status", lambda r: r["job_status"] or "", priority=1),
            Col("detail", lambda r: r["detail"], priority=2, fold=True),
        ],
        rows,
    )
