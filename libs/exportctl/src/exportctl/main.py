"""``exportctl``: database administration (migrate, tenants, keys, notes import and list)
and an API client (submit, list, status, events, watch, cancel, download; schedules,
webhooks, dead letters). The reference: docs/cli.md.

API commands read ``API_URL`` and ``API_KEY`` (``source .dev/env`` sets both); database
commands read ``DATABASE_URL`` like every other process.
"""

from __future__ import annotations

from exportctl import (  # verify, restore and manifest-key
    admin,
    broker,
    client,
    health,
    ops,
    restore,
    schedules,
    verify,
    webhooks,
)
from exportctl.common import app

__all__ = [
    "admin",
    "app",
    "broker",
    "client",
    "health",
    "ops",
    "restore",
    "schedules",
    "verify",
    "webhooks",
]

if __name__ == "__main__":
    app()
