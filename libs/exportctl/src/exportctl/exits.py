"""The exit codes of ``exportctl``, by cause (docs/cli.md, "Exit codes"): a script tells an
export that failed from one that was cancelled, a missing export from a refused key, and a
server that is down (retry later) from a mistake in the command."""

from __future__ import annotations

EXIT_OK = 0
EXIT_ERROR = 1
"""Anything else: the server refused the request (409 conflict, 422 invalid…), a checksum
mismatch, an unexpected answer."""
EXIT_USAGE = 2
"""The command line itself: an unknown option, a missing argument, values that contradict
each other, an invalid configuration (click uses 2 for its own usage errors too)."""
EXIT_FAILED = 3
"""The export (``watch``, ``submit --wait``) ended ``failed``."""
EXIT_CANCELLED = 4
"""The export ended ``cancelled``."""
EXIT_NOT_FOUND = 5
"""No such export, schedule, webhook, tenant, key or dead letter (HTTP 404)."""
EXIT_UNAUTHORISED = 6
"""No key, an unknown or revoked key (401), or one that may not do this (403: a tenant key
on the admin API, a viewer's change)."""
EXIT_UNAVAILABLE = 7
"""The server or the database cannot be reached, answers 5xx, or refuses for now (429 rate
limit or quota, 503 capacity): try again later."""
EXIT_TIMEOUT = 8
"""A wait ran out (``watch --timeout``, a request that got no answer in time)."""

EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_ERROR: "the request was refused or went wrong (409, 422, a checksum mismatch)",
    EXIT_USAGE: "usage: bad options or arguments, invalid configuration",
    EXIT_FAILED: "the export failed",
    EXIT_CANCELLED: "the export was cancelled",
    EXIT_NOT_FOUND: "not found (404)",
    EXIT_UNAUTHORISED: "not authorised (no key, 401, 403)",
    EXIT_UNAVAILABLE: "server unavailable: unreachable, 5xx, 429 or 503 (retry later)",
    EXIT_TIMEOUT: "timed out",
}
"""Every exit code with its cause, as docs/cli.md lists them (tests/unit/test_docs.py)."""


def exit_for_status(status: int) -> int:
    """The exit code of a refused HTTP request: 404 → not found, 401/403 → not authorised,
    429/5xx → unavailable, else the generic error."""
    if status == 404:
        return EXIT_NOT_FOUND
    if status in (401, 403):
        return EXIT_UNAUTHORISED
    if status == 429 or status >= 500:
        return EXIT_UNAVAILABLE
    return EXIT_ERROR
