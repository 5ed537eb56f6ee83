"""``exportctl webhook …``: signed completion webhooks through the API (``API_URL`` +
``API_KEY``), mirroring ``/v1/webhooks`` (docs/webhooks.md)."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from rich.table import Table

from exportctl.api import DEFAULT_API_URL, ApiKey, ApiUrl, call, get_and_print
from exportctl.common import (
    AsJson,
    add_row,
    app,
    err,
    fail,
    id_column,
    key_value_table,
    out,
    print_page,
    print_value,
    safe,
)

webhook_app = typer.Typer(
    help="Webhook endpoints: signed notifications when exports finish (Standard Webhooks).",
    no_args_is_help=True,
)
app.add_typer(webhook_app, name="webhook")

Events = Annotated[
    list[str] | None,
    typer.Option(
        "--event",
        "-e",
        help="export.succeeded | export.failed | export.cancelled | schedule.paused (repeatable; "
        "default all)",
    ),
]


def _state(w: dict[str, Any]) -> str:
    if not w["enabled"]:
        return "disabled"
    if w.get("circuit_open_until"):
        return "circuit open"
    return "failing" if w.get("failing_since") else "ok"


def _table(rows: list[dict[str, Any]]) -> Table:
    table = Table(id_column("id"), "url", "events", "state", "last success (UTC)", "secret")
    for w in rows:
        add_row(
            table,
            w["id"],
            w["url"],
            ", ".join(w["events"]),
            _state(w),
            w["last_success_at"],
            w["secret_hint"],
        )
    return table


@webhook_app.command("create")
def create(
    url: Annotated[str, typer.Argument(help="https:// URL the messages are POSTed to")],
    event: Events = None,
    description: Annotated[str, typer.Option(help="a label")] = "",
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """Register an endpoint; prints its id and its signing secret (shown only this once)."""
    body: dict[str, Any] = {"url": url, "description": description}
    if event:
        body["events"] = event
    w = call(api_url, api_key, "POST", "/v1/webhooks", body)
    out.print(
        f"webhook [bold]{safe(w['id'])}[/] → {safe(w['url'])} ({safe(', '.join(w['events']))})"
    )
    err.print("signing secret (store it now, it is not shown again):")
    print_value(w["id"])
    print_value(w["secret"])


@webhook_app.command("list")
def list_(
    as_json: AsJson = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """The caller's endpoints and their state."""
    get_and_print(api_url, api_key, "/v1/webhooks", as_json, _table)


@webhook_app.command("show")
def show(endpoint_id: str, api_url: ApiUrl = DEFAULT_API_URL, api_key: ApiKey = "") -> None:
    """One endpoint: health, circuit, disable reason, pending messages."""
    out.print(endpoint_table(call(api_url, api_key, "GET", f"/v1/webhooks/{endpoint_id}")))


def endpoint_table(w: dict[str, Any]) -> Table:
    """One endpoint (``/v1/webhooks/{id}``) as key / value lines."""
    keys = (
        "id",
        "url",
        "description",
        "events",
        "enabled",
        "disabled_reason",
        "secret_hint",
        "previous_secret_expires_at",
        "pending_messages",
        "consecutive_failures",
        "failing_since",
        "circuit_open_until",
        "last_success_at",
        "last_failure_at",
        "last_error",
    )
    return key_value_table((key, _shown(w.get(key))) for key in keys)


def _shown(value: object) -> str:
    """A field of an endpoint as text: a list (its events) comma-separated."""
    return ", ".join(value) if isinstance(value, list) else str(value)


@webhook_app.command("update")
def update(
    endpoint_id: str,
    url: Annotated[str | None, typer.Option(help="a new URL")] = None,
    event: Events = None,
    description: Annotated[str | None, typer.Option(help="a new label")] = None,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """Change the URL, the events or the label."""
    body: dict[str, Any] = {}
    if url is not None:
        body["url"] = url
    if event:
        body["events"] = event
    if description is not None:
        body["description"] = description
    if not body:
        raise fail("give --url, --event or --description", 2)
    call(api_url, api_key, "PATCH", f"/v1/webhooks/{endpoint_id}", body)
    out.print(f"webhook {safe(endpoint_id)} updated")


@webhook_app.command("enable")
def enable(endpoint_id: str, api_url: ApiUrl = DEFAULT_API_URL, api_key: ApiKey = "") -> None:
    """Resume deliveries (clears a disable and the failure record; waiting messages go out)."""
    call(api_url, api_key, "PATCH", f"/v1/webhooks/{endpoint_id}", {"enabled": True})
    out.print(f"webhook {safe(endpoint_id)} enabled")


@webhook_app.command("disable")
def disable(endpoint_id: str, api_url: ApiUrl = DEFAULT_API_URL, api_key: ApiKey = "") -> None:
    """Stop deliveries; messages wait until the endpoint is enabled again."""
    call(api_url, api_key, "PATCH", f"/v1/webhooks/{endpoint_id}", {"enabled": False})
    out.print(f"webhook {safe(endpoint_id)} disabled")


@webhook_app.command("delete")
def delete(endpoint_id: str, api_url: ApiUrl = DEFAULT_API_URL, api_key: ApiKey = "") -> None:
    """Delete the endpoint with its pending messages and its attempts."""
    call(api_url, api_key, "DELETE", f"/v1/webhooks/{endpoint_id}")
    out.print(f"webhook {safe(endpoint_id)} deleted")


@webhook_app.command("rotate-secret")
def rotate_secret(
    endpoint_id: str,
    overlap: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=604_800,
            help="seconds the old secret keeps signing beside the new one (0: retire it now; "
            "default WEBHOOK_SECRET_OVERLAP_SECONDS of the server)",
        ),
    ] = None,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """A new signing secret, printed once; both sign until the overlap ends."""
    body = {} if overlap is None else {"overlap_seconds": overlap}
    r = call(api_url, api_key, "POST", f"/v1/webhooks/{endpoint_id}/rotate-secret", body)
    until = r["previous_secret_expires_at"]
    err.print(
        f"the old secret signs until {safe(until)} (UTC)" if until else "the old secret is retired"
    )
    print_value(r["secret"])


def _attempts_table(items: list[dict[str, Any]]) -> Table:
    table = Table(
        "attempt",
        "at (UTC)",
        "event",
        "outcome",
        "status",
        "ms",
        "message",
        id_column("webhook-id"),
        "error",
    )
    for a in items:
        add_row(
            table,
            a["id"],
            a["started_at"],
            a["event_type"],
            a["outcome"] + (" (redelivery)" if a["redelivery"] else ""),
            a["status_code"] or "",
            f"{a['latency_ms']:.0f}" if a["latency_ms"] is not None else "",
            a["message_status"],
            a["webhook_id"],
            a["error"],
        )
    return table


@webhook_app.command("test")
def test(
    endpoint_id: str,
    wait: Annotated[
        float, typer.Option(min=0, help="seconds to wait for the attempt (0: do not wait)")
    ] = 10.0,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """Send a signed webhook.test message and show its first attempt."""
    queued = call(api_url, api_key, "POST", f"/v1/webhooks/{endpoint_id}/test")
    out.print(f"queued {safe(queued['webhook_id'])}")
    deadline = time.monotonic() + wait
    while wait and time.monotonic() < deadline:
        page = call(api_url, api_key, "GET", f"/v1/webhooks/{endpoint_id}/deliveries?limit=20")
        mine = [a for a in page["items"] if a["webhook_id"] == queued["webhook_id"]]
        if mine:
            out.print(_attempts_table(mine[-1:]))
            if mine[-1]["outcome"] != "delivered":
                raise typer.Exit(1)
            return
        time.sleep(0.5)
    if wait:
        raise fail(f"no attempt within {wait:g} s; is the webhook-delivery process running?")


@webhook_app.command("deliveries")
def deliveries(
    endpoint_id: str,
    limit: Annotated[int, typer.Option(min=1, max=500)] = 20,
    cursor: Annotated[
        int | None, typer.Option(min=1, help="the next page: the cursor the previous page printed")
    ] = None,
    as_json: AsJson = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """Delivery attempts, newest first (status code, latency, error, message state). When
    older attempts remain, the ``--cursor`` of the next page is printed on stderr."""
    query = f"limit={limit}" + (f"&cursor={cursor}" if cursor is not None else "")
    page = call(api_url, api_key, "GET", f"/v1/webhooks/{endpoint_id}/deliveries?{query}")
    print_page(page["items"], as_json, _attempts_table, "--cursor", page["next_cursor"])


@webhook_app.command("redeliver")
def redeliver(
    endpoint_id: str,
    attempt_id: Annotated[int, typer.Argument(min=1, help="an attempt id from `deliveries`")],
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """Send the attempt's message again, with the same webhook-id."""
    r = call(
        api_url, api_key, "POST", f"/v1/webhooks/{endpoint_id}/deliveries/{attempt_id}/redeliver"
    )
    out.print(f"{safe(r['webhook_id'])} queued again")
