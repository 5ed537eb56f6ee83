"""The API side of the CLI: the ``--api-url`` / ``--api-key`` options of every API command,
one request with its errors turned into CLI messages, and "request, then print the answer"
(:func:`emit_api_pages`: a cursor-paged list).

Every command that talks to the API (``submit``, ``list``, ``schedule …``, ``webhook …``,
``dead-letters …``) goes through :func:`call` (or :func:`call_with_status`), so a problem
answer (RFC 9457 problem+json) and an unreachable API read the same everywhere.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Annotated, Any
from urllib.parse import urlencode

import httpx
import typer
from rich.console import RenderableType

from exportctl import profiles
from exportctl.common import fail
from exportctl.exits import (
    EXIT_TIMEOUT,
    EXIT_UNAUTHORISED,
    EXIT_UNAVAILABLE,
    exit_for_status,
)
from exportctl.output import Output, emit_paged

DEFAULT_API_URL = "http://127.0.0.1:8000"
"""The API of the local stack (``make dev``); ``API_URL`` or ``--api-url`` for another."""


def _from_profile(field: str) -> Callable[[typer.Context, Any, str], str]:
    """An option callback: a value neither given on the command line nor in the environment
    comes from the active profile's ``field`` (docs/cli.md, "Profiles"), else the option's
    default. The environment and the command line win over the profile."""

    def resolve(ctx: typer.Context, param: Any, value: str) -> str:
        source = ctx.get_parameter_source(param.name) if param.name else None
        # typer carries its own click: compare the source by name
        if source is not None and source.name in ("DEFAULT", "DEFAULT_MAP"):
            chosen = getattr(profiles.active(), field)
            if field == "operator_key":
                chosen = chosen or profiles.active().api_key
            return str(chosen) if chosen else value
        return value

    return resolve


ApiUrl = Annotated[
    str,
    typer.Option(
        envvar="API_URL",
        help="API base URL (env API_URL, else the profile's api_url)",
        callback=_from_profile("api_url"),
    ),
]
"""The ``--api-url`` option of every API command (default: the profile's, else
:data:`DEFAULT_API_URL`)."""

ApiKey = Annotated[
    str,
    typer.Option(
        envvar="API_KEY",
        help="API key (env API_KEY, else the profile's api_key)",
        show_default=False,
        callback=_from_profile("api_key"),
    ),
]
"""The ``--api-key`` option of the tenant commands (default: the profile's; ``""``:
:func:`api_client` asks for one)."""


OperatorKey = Annotated[
    str,
    typer.Option(
        "--api-key",
        envvar=["OPERATOR_KEY", "API_KEY"],
        help="an operator key (env OPERATOR_KEY, else API_KEY, else the profile's operator_key)",
        show_default=False,
        callback=_from_profile("operator_key"),
    ),
]
"""The ``--api-key`` option of the operator commands (``/v1/admin``)."""


def need_operator_key(api_key: str) -> None:
    """Raise the CLI error (not authorised) when no operator key was given."""
    if not api_key:
        raise fail(
            "no operator key: set OPERATOR_KEY (made with `exportctl operator-key create "
            "--label NAME`), or pass --api-key",
            EXIT_UNAUTHORISED,
        )


def api_client(api_url: str, api_key: str) -> httpx.Client:
    """An HTTP client for the API at ``api_url`` sending ``api_key`` as a Bearer token
    (timeouts: 30 s, 5 s to connect). Raises the CLI error (not authorised) when ``api_key``
    is empty."""
    if not api_key:
        env_file = f"{os.environ.get('DEV_HOME') or '.dev'}/env"
        raise fail(
            f"no API key: set API_KEY, pass --api-key or add api_key to a profile (for the "
            f"local stack: `source {env_file}`)",
            EXIT_UNAUTHORISED,
        )
    return httpx.Client(
        base_url=api_url.rstrip("/"),
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=httpx.Timeout(30.0, connect=5.0),
    )


def check_answer(resp: httpx.Response) -> Any:
    """The decoded JSON of an API answer; for a status >= 400 the CLI error (exit 1)
    ``HTTP <status>: <detail>`` with the problem's extension members (RFC 9457 section 3.2:
    ``retry_after``, ``unknown_note_ids``…) as JSON, or the first 200 characters of a
    non-JSON body; its exit code says the cause (:func:`exportctl.exits.exit_for_status`).
    A 422's ``errors`` are left out when its ``detail`` says them in words already."""
    if resp.status_code >= 400:
        try:
            problem = resp.json()
            detail = problem.get("detail") or problem.get("title")
            said = ("type", "title", "status", "detail", "instance")
            extra = {
                k: v
                for k, v in problem.items()
                if k not in said and not (k == "errors" and problem.get("detail"))
            }
        except ValueError:
            detail, extra = resp.text[:200], {}
        msg = f"HTTP {resp.status_code}: {detail}"
        if extra:
            msg += f" {json.dumps(extra)[:500]}"
        raise fail(msg, exit_for_status(resp.status_code))
    return resp.json()


def call_with_status(
    api_url: str, api_key: str, method: str, path: str, body: Any = None
) -> tuple[int, Any]:
    """One API request: ``(HTTP status, decoded JSON answer)`` (None for 204), for a command
    whose message depends on the status (202 new, 200 existing). A problem answer or an
    unreachable API raises the CLI error (:func:`check_answer`; exit 1)."""
    try:
        with api_client(api_url, api_key) as c:
            resp = c.request(method, path, json=body)
            if resp.status_code == 204:
                return resp.status_code, None
            return resp.status_code, check_answer(resp)
    except httpx.TimeoutException as exc:
        raise fail(
            f"the API at {api_url} did not answer in time ({type(exc).__name__})", EXIT_TIMEOUT
        ) from None
    except httpx.TransportError as exc:
        raise fail(
            f"cannot reach the API at {api_url} ({type(exc).__name__})", EXIT_UNAVAILABLE
        ) from None


def call(api_url: str, api_key: str, method: str, path: str, body: Any = None) -> Any:
    """One API request; the decoded JSON answer (None for 204), or a clear CLI error."""
    return call_with_status(api_url, api_key, method, path, body)[1]


def emit_api_pages(
    api_url: str,
    api_key: str,
    path: str,
    query: Mapping[str, object],
    cursor: object | None,
    all_pages: bool,
    how: Output,
    table: Callable[[list[Any]], RenderableType],
    *,
    empty: str,
) -> None:
    """Print a cursor-paged list of the API (``GET path`` answering ``{"items": [...],
    "next_cursor": C}``, C null on the last page) through :func:`exportctl.output.emit_paged`:
    the page at ``cursor`` (None: the first), or with ``all_pages`` every page from there;
    when one page was printed and more remain, ``more: --cursor C`` on stderr. ``query``'s
    None values are left out, a list value is the parameter repeated, and ``cursor=C`` is
    added after the others. Errors as
    :func:`call`: a problem answer exits with its status's code
    (:func:`exportctl.exits.exit_for_status`), an unreachable API with 7, no answer in time
    with 8."""

    def page_at(start: object | None) -> tuple[list[Any], object | None]:
        params = {k: v for k, v in query.items() if v is not None}
        if start is not None:
            params["cursor"] = start
        page = call(api_url, api_key, "GET", f"{path}?{urlencode(params, doseq=True)}")
        return page["items"], page["next_cursor"] or None

    emit_paged(page_at, cursor, all_pages, how, table, next_option="--cursor", empty=empty)
