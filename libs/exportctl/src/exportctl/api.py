"""The API side of the CLI: the ``--api-url`` / ``--api-key`` options of every API command,
one request with its errors turned into CLI messages, and "request, then print the answer".

Every command that talks to the API (``submit``, ``list``, ``schedule …``, ``webhook …``,
``dead-letters …``) goes through :func:`call` (or :func:`call_with_status`), so a problem
answer (RFC 9457 problem+json) and an unreachable API read the same everywhere.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any

import httpx
import typer
from rich.console import RenderableType

from exportctl.common import fail, print_rows

DEFAULT_API_URL = "http://127.0.0.1:8000"
"""The API of the local stack (``make dev``); ``API_URL`` or ``--api-url`` for another."""

ApiUrl = Annotated[str, typer.Option(envvar="API_URL", help="API base URL (env API_URL)")]
"""The ``--api-url`` option of every API command (default :data:`DEFAULT_API_URL`)."""

ApiKey = Annotated[
    str, typer.Option(envvar="API_KEY", help="API key (env API_KEY)", show_default=False)
]
"""The ``--api-key`` option of the tenant commands (default ``""``: :func:`api_client` asks
for one)."""


def api_client(api_url: str, api_key: str) -> httpx.Client:
    """An HTTP client for the API at ``api_url`` sending ``api_key`` as a Bearer token
    (timeouts: 30 s, 5 s to connect). Raises the CLI error (exit 2) when ``api_key`` is
    empty."""
    if not api_key:
        raise fail("no API key: set API_KEY (for the local stack: `source .dev/env`)", 2)
    return httpx.Client(
        base_url=api_url.rstrip("/"),
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=httpx.Timeout(30.0, connect=5.0),
    )


def check_answer(resp: httpx.Response) -> Any:
    """The decoded JSON of an API answer; for a status >= 400 the CLI error (exit 1)
    ``HTTP <status>: <detail>`` with the problem's extension members (RFC 9457 section 3.2:
    ``retry_after``, ``errors``…) as JSON, or the first 200 characters of a non-JSON body."""
    if resp.status_code >= 400:
        try:
            problem = resp.json()
            detail = problem.get("detail") or problem.get("title")
            extra = {
                k: v
                for k, v in problem.items()
                if k not in ("type", "title", "status", "detail", "instance")
            }
        except ValueError:
            detail, extra = resp.text[:200], {}
        msg = f"HTTP {resp.status_code}: {detail}"
        if extra:
            msg += f" {json.dumps(extra)[:500]}"
        raise fail(msg)
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
    except httpx.TransportError as exc:
        raise fail(f"cannot reach the API at {api_url} ({type(exc).__name__})") from None


def call(api_url: str, api_key: str, method: str, path: str, body: Any = None) -> Any:
    """One API request; the decoded JSON answer (None for 204), or a clear CLI error."""
    return call_with_status(api_url, api_key, method, path, body)[1]


def get_and_print(
    api_url: str,
    api_key: str,
    path: str,
    as_json: bool,
    table: Callable[[Any], RenderableType],
) -> None:
    """``GET path`` and print the answer as a list command does (:func:`print_rows`): JSON on
    stdout with ``--json``, else ``table(answer)``."""
    print_rows(call(api_url, api_key, "GET", path), as_json, table)
