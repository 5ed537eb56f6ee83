"""``exportctl``: database administration (migrate, tenants, keys, notes import and list)
and an API client (submit, list, status, events, watch, cancel, download; schedules,
webhooks, dead letters). The reference: docs/cli.md.

One module per command group, named after it (``exportctl tenant …`` is
:mod:`exportctl.tenants`, ``exportctl webhook …`` :mod:`exportctl.webhooks`); each declares
its own typer sub-app and adds it to the root app of :mod:`exportctl.common`. Importing them
here is what registers them.

API commands read ``API_URL`` and ``API_KEY`` (``source .dev/env`` sets both); database
commands read ``DATABASE_URL`` like every other process.
"""

from __future__ import annotations

from exportctl import (
    api_keys,
    audit,
    broker,
    bulk,
    dead_letters,
    exports,
    healthcheck,
    migrate,
    notes,
    operator_keys,
    profiles,
    queues,
    restore,
    schedules,
    tenants,
    verify,
    webhooks,
    workers,
)
from exportctl.common import app

__all__ = [
    "api_keys",
    "app",
    "audit",
    "broker",
    "bulk",
    "dead_letters",
    "exports",
    "healthcheck",
    "migrate",
    "notes",
    "operator_keys",
    "profiles",
    "queues",
    "restore",
    "schedules",
    "tenants",
    "verify",
    "webhooks",
    "workers",
]

if __name__ == "__main__":
    app()
