"""A loop of a drill or a soak on a daemon thread of its own (the chaos loop, the failover
loop, the job watcher): started once, stopped once, the stop waiting for the round in hand."""

from __future__ import annotations

import threading
from typing import Self


class BackgroundLoop:
    """Runs :meth:`_run` on a daemon thread named ``name`` from :meth:`start` until
    :meth:`stop`; ``_run`` returns soon after ``_stop`` is set (it waits on it between
    rounds), and :meth:`stop` waits at most ``join_timeout`` seconds for it."""

    name = "background"
    join_timeout = 300.0

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def start(self) -> Self:
        """Start the loop; returns the loop."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ask the loop to stop and wait for the round in hand to end."""
        self._stop.set()
        self._thread.join(timeout=self.join_timeout)

    def _run(self) -> None:
        raise NotImplementedError
