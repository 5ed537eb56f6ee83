"""``exportctl webhook …``: signed completion webhooks through the API (``API_URL`` +
``API_KEY``), mirroring ``/v1/webhooks`` (docs/webhooks.md); and the deployment's keys that
encrypt the signing secrets at rest (``new-secret-key``, ``reencrypt-secrets``: the
database and ``WEBHOOK_SECRET_KEYS``, not the API)."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from rich.table import Table

from exportcore.webhooks import encryption, secret_keys
from exportctl.api import DEFAULT_API_URL, ApiKey, ApiUrl, call, emit_api_pages
from exportctl.common import (
    app,
    db_pool,
    err,
    fail,
    key_value_table,
    load_settings,
    print_value,
    safe,
    when,
)
from exportctl.exits import EXIT_ERROR, EXIT_TIMEOUT, EXIT_USAGE
from exportctl.output import (
    AllPages,
    AsJson,
    OutputOpt,
    emit_object,
    emit_rows,
    explicit,
    mode,
)
from exportctl.tables import Col, fit

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
    """Endpoints (``/v1/webhooks``), fitted to the terminal: the id, the state and the URL
    (folded) always."""
    return fit(
        [
            Col("id", lambda w: w["id"]),
            Col("state", _state),
            Col("url", lambda w: w["url"], fold=True),
            Col("last success (UTC)", lambda w: when(w["last_success_at"]), priority=1),
            Col("events", lambda w: ", ".join(w["events"]), priority=2, fold=True),
            Col("secret", lambda w: w["secret_hint"], priority=3),
        ],
        rows,
    )


@webhook_app.command("create")
def create(
    url: Annotated[str, typer.Argument(help="https:// URL the messages are POSTed to")],
    event: Events = None,
    description: Annotated[str, typer.Option(help="a label")] = "",
    output: OutputOpt = None,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """Register an endpoint; prints its id, then its signing secret (shown only this once),
    one per line on stdout (``--output json``: the endpoint with its secret); the message
    on stderr."""
    body: dict[str, Any] = {"url": url, "description": description}
    if event:
        body["events"] = event
    w = call(api_url, api_key, "POST", "/v1/webhooks", body)
    err.print(
        f"webhook [bold]{safe(w['id'])}[/] → {safe(w['url'])} ({safe(', '.join(w['events']))})"
    )
    err.print("stdout: its id, then its signing secret (store it now, it is not shown again)")

    def lines(w: dict[str, Any]) -> None:
        print_value(w["id"])
        print_value(w["secret"])

    emit_object(w, explicit(output), default=lines)


@webhook_app.command("list")
def list_(
    output: OutputOpt = None,
    as_json: AsJson = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """The caller's endpoints and their state."""
    rows = call(api_url, api_key, "GET", "/v1/webhooks")
    emit_rows(rows, mode(output, as_json), _table, empty="no webhooks")


@webhook_app.command("show")
def show(
    endpoint_id: str,
    output: OutputOpt = None,
    as_json: AsJson = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """One endpoint: health, circuit, disable reason, pending messages."""
    w = call(api_url, api_key, "GET", f"/v1/webhooks/{endpoint_id}")
    emit_object(w, mode(output, as_json), endpoint_table)


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
        raise fail("give --url, --event or --description", EXIT_USAGE)
    call(api_url, api_key, "PATCH", f"/v1/webhooks/{endpoint_id}", body)
    err.print(f"webhook {safe(endpoint_id)} updated")


@webhook_app.command("enable")
def enable(endpoint_id: str, api_url: ApiUrl = DEFAULT_API_URL, api_key: ApiKey = "") -> None:
    """Resume deliveries (clears a disable and the failure record; waiting messages go out)."""
    call(api_url, api_key, "PATCH", f"/v1/webhooks/{endpoint_id}", {"enabled": True})
    err.print(f"webhook {safe(endpoint_id)} enabled")


@webhook_app.command("disable")
def disable(endpoint_id: str, api_url: ApiUrl = DEFAULT_API_URL, api_key: ApiKey = "") -> None:
    """Stop deliveries; messages wait until the endpoint is enabled again."""
    call(api_url, api_key, "PATCH", f"/v1/webhooks/{endpoint_id}", {"enabled": False})
    err.print(f"webhook {safe(endpoint_id)} disabled")


@webhook_app.command("delete")
def delete(endpoint_id: str, api_url: ApiUrl = DEFAULT_API_URL, api_key: ApiKey = "") -> None:
    """Delete the endpoint with its pending messages and its attempts."""
    call(api_url, api_key, "DELETE", f"/v1/webhooks/{endpoint_id}")
    err.print(f"webhook {safe(endpoint_id)} deleted")


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
    output: OutputOpt = None,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """A new signing secret, printed once on stdout (``--output json``: with when the old
    one stops); both sign until the overlap ends."""
    body = {} if overlap is None else {"overlap_seconds": overlap}
    r = call(api_url, api_key, "POST", f"/v1/webhooks/{endpoint_id}/rotate-secret", body)
    until = r["previous_secret_expires_at"]
    err.print(
        f"the old secret signs until {safe(until)} (UTC)" if until else "the old secret is retired"
    )
    emit_object(r, explicit(output), default=lambda r: print_value(r["secret"]))


def _attempts_table(items: list[dict[str, Any]]) -> Table:
    """Delivery attempts, fitted to the terminal: the attempt id (what ``redeliver`` takes),
    when, the outcome and the status code always."""
    return fit(
        [
            Col("attempt", lambda a: a["id"], justify="right"),
            Col("at (UTC)", lambda a: when(a["started_at"])),
            Col("outcome", lambda a: a["outcome"] + (" (redelivery)" if a["redelivery"] else "")),
            Col("status", lambda a: a["status_code"] or "", justify="right"),
            Col("event", lambda a: a["event_type"], priority=1),
            Col(
                "ms",
                lambda a: f"{a['latency_ms']:.0f}" if a["latency_ms"] is not None else "",
                priority=2,
                justify="right",
            ),
            Col("message", lambda a: a["message_status"], priority=3),
            Col("error", lambda a: a["error"], priority=4, fold=True),
            Col("webhook-id", lambda a: a["webhook_id"], priority=5),
        ],
        items,
    )


@webhook_app.command("test")
def test(
    endpoint_id: str,
    wait: Annotated[
        float, typer.Option(min=0, help="seconds to wait for the attempt (0: do not wait)")
    ] = 10.0,
    output: OutputOpt = None,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """Send a signed webhook.test message and show its first attempt (exit 1 unless it
    was delivered)."""
    queued = call(api_url, api_key, "POST", f"/v1/webhooks/{endpoint_id}/test")
    err.print(f"queued {safe(queued['webhook_id'])}")
    deadline = time.monotonic() + wait
    while wait and time.monotonic() < deadline:
        page = call(api_url, api_key, "GET", f"/v1/webhooks/{endpoint_id}/deliveries?limit=20")
        mine = [a for a in page["items"] if a["webhook_id"] == queued["webhook_id"]]
        if mine:
            emit_object(mine[-1], mode(output), lambda a: _attempts_table([a]))
            if mine[-1]["outcome"] != "delivered":
                raise typer.Exit(EXIT_ERROR)
            return
        time.sleep(0.5)
    if wait:
        raise fail(
            f"no attempt within {wait:g} s; is the webhook-delivery process running?",
            EXIT_TIMEOUT,
        )


@webhook_app.command("deliveries")
def deliveries(
    endpoint_id: str,
    limit: Annotated[int, typer.Option(min=1, max=500)] = 20,
    cursor: Annotated[
        int | None, typer.Option(min=1, help="the next page: the cursor the previous page printed")
    ] = None,
    all_pages: AllPages = False,
    output: OutputOpt = None,
    as_json: AsJson = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """Delivery attempts, newest first (status code, latency, error, message state). When
    older attempts remain, the ``--cursor`` of the next page is printed on stderr;
    ``--all`` fetches every page."""
    emit_api_pages(
        api_url,
        api_key,
        f"/v1/webhooks/{endpoint_id}/attempts",
        {"limit": limit},
        cursor,
        all_pages,
        mode(output, as_json),
        _attempts_table,
        empty="no delivery attempts yet",
    )


@webhook_app.command("redeliver")
def redeliver(
    endpoint_id: str,
    attempt_id: Annotated[int, typer.Argument(min=1, help="an attempt id from `deliveries`")],
    output: OutputOpt = None,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """Send the attempt's message again, with the same webhook-id."""
    r = call(
        api_url, api_key, "POST", f"/v1/webhooks/{endpoint_id}/deliveries/{attempt_id}/redeliver"
    )
    err.print(f"{safe(r['webhook_id'])} queued again")
    emit_object(r, explicit(output), default=lambda _: None)


@webhook_app.command("recover")
def recover(
    endpoint_id: str,
    since: Annotated[str, typer.Option(help="messages written at or after (RFC 3339)")],
    output: OutputOpt = None,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """Send again every message that failed for good since SINCE (same webhook-ids)."""
    r = call(api_url, api_key, "POST", f"/v1/webhooks/{endpoint_id}/recover", {"since": since})
    err.print(f"{r['recovered']} failed message(s) since {safe(r['since'])} queued again")
    emit_object(r, explicit(output), default=lambda _: None)


def _event_types_table(rows: list[dict[str, Any]]) -> Table:
    return fit(
        [
            Col("event", lambda e: e["name"]),
            Col("subscribable", lambda e: "yes" if e["subscribable"] else "no (test)"),
            Col("what", lambda e: e["description"], priority=1, fold=True),
        ],
        rows,
    )


@webhook_app.command("event-types")
def event_types(
    output: OutputOpt = None,
    as_json: AsJson = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
) -> None:
    """The event types a message can carry; ``--output json`` with each one's JSON Schema."""
    rows = call(api_url, api_key, "GET", "/v1/webhooks/event-types")
    emit_rows(rows, mode(output, as_json), _event_types_table, empty="no event types")


# --- the deployment's keys for the secrets at rest (database, not the API) ----------------


@webhook_app.command("new-secret-key")
def new_secret_key(output: OutputOpt = None) -> None:
    """Print a new key for WEBHOOK_SECRET_KEYS (a Fernet key) on stdout, its key id on
    stderr (``--output json``: one object with both on stdout). Nothing is stored."""
    key = encryption.new_key()
    kid = encryption.key_id(key.encode("ascii"))

    def say(_: Any) -> None:
        print(key)
        err.print(f"key id {kid}: put it first in WEBHOOK_SECRET_KEYS to encrypt with it")

    emit_object({"key": key, "key_id": kid}, explicit(output), default=say)


def _census_text(census: dict[str, int], current: str) -> str:
    if not census:
        return "no webhook signing secret is stored"
    return "; ".join(
        f"key id {kid}{' (current)' if kid == current else ''}: {n} secret(s)"
        for kid, n in census.items()
    )


@webhook_app.command("reencrypt-secrets")
def reencrypt_secrets(output: OutputOpt = None) -> None:
    """Re-encrypt every stored signing secret with the first key of WEBHOOK_SECRET_KEYS
    (database: DATABASE_URL; run where the processes' keys are set) and drop the previous
    secrets whose overlap has ended. Afterwards every secret is under the current key and
    the older keys can be removed from WEBHOOK_SECRET_KEYS. Safe beside the running
    processes, and to run again. Prints the secrets per key id (``--output json``: the
    counts). Exit 2: no or a malformed WEBHOOK_SECRET_KEYS; 1: a secret under a key not
    held (nothing of its batch changed)."""
    settings = load_settings()
    box = settings.webhook_secret_box()
    if box is None:
        raise fail(
            "WEBHOOK_SECRET_KEYS is not set: give it the keys of the deployment, the new "
            'one first (docs/webhooks.md "Encryption at rest")',
            EXIT_USAGE,
        )
    with db_pool() as pool:
        try:
            done = secret_keys.reencrypt(pool, box)
        except encryption.SecretUndecryptable as exc:
            raise fail(exc.detail, EXIT_ERROR) from None
    left = {k: n for k, n in done.census.items() if k != box.current_key_id}
    result = {
        "current_key_id": box.current_key_id,
        "reencrypted": done.secrets,
        "expired_dropped": done.expired,
        "secrets_by_key_id": done.census,
        "done": not left,
    }

    def say(_: Any) -> None:
        err.print(
            f"{done.secrets} secret(s) re-encrypted with key id {box.current_key_id}, "
            f"{done.expired} expired previous secret(s) dropped"
        )
        err.print(_census_text(done.census, box.current_key_id))
        if left:
            err.print("some secrets were busy and are still under an older key: run it again")
        else:
            err.print("every stored secret is under the current key: older keys can be removed")

    emit_object(result, explicit(output), default=say)
    if left:
        raise typer.Exit(EXIT_ERROR)
