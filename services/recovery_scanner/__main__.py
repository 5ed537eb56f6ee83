"""The recovery-scanner process: expired leases, lost dispatches, cancels, deadlines, dead
letters, orphan artifacts and retention, until TERM.

Run: ``python -m services.recovery_scanner``.
"""

from __future__ import annotations

from exportcore.artifacts import open_store
from exportcore.db import make_pool
from exportcore.logs import setup_logging
from exportcore.recovery import RecoveryScanner
from exportcore.service import ServiceLoop
from exportcore.settings import get_settings


def main() -> int:
    """Run the scanner loop; returns 0 after a clean stop."""
    settings = get_settings()
    setup_logging("recovery-scanner", settings.log_level)
    pool = make_pool(settings, "exports-recovery-scanner", min_size=1, max_size=2)
    scanner = RecoveryScanner(settings, pool, open_store(settings))
    loop = ServiceLoop(scanner, interval=settings.scanner_interval_seconds)
    loop.install_signal_handlers()
    try:
        loop.run()
    finally:
        pool.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
