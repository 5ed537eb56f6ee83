"""The steady load under a measurement: library submits at a fixed rate from a background
thread (the recovery scenario kills a worker under it; the webhooks scenario times delivery
and an outage under it)."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from bench.env import TENANT
from exportcore.domain import ExportRequest
from exportcore.settings import Settings
from exportcore.submit import submit_export


class SteadySubmits:
    """Submits ``request`` for ``tenant_id`` through :func:`exportcore.submit.submit_export`
    at ``rate`` per second until :meth:`stop`, from one daemon thread.

    Open loop: the i-th submit is due ``i / rate`` seconds after :meth:`start`, so a slow
    submit is followed by the ones that fell due meanwhile rather than lowering the rate. A
    submit that raises (a refusal, the database restarting under a drill) is skipped: the
    scenarios read what happened from the database, not from the feeder.

    Used as a context manager it starts on entry and stops on exit (so it can be handed to
    a :class:`contextlib.ExitStack` next to the stack and the pool it uses).
    """

    def __init__(
        self,
        pool: Any,
        settings: Settings,
        request: ExportRequest,
        rate: float,
        tenant_id: str = TENANT,
    ) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be > 0 submits/s, got {rate}")
        self.pool, self.settings, self.request = pool, settings, request
        self.rate, self.tenant_id = rate, tenant_id
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> SteadySubmits:
        """Start the thread; returns self. Raises RuntimeError when already started."""
        if self._thread is not None:
            raise RuntimeError("SteadySubmits.start() called twice")
        self._thread = threading.Thread(target=self._run, name="bench-feeder", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop submitting and wait up to ``timeout`` seconds for the thread to end (the
        submit in flight completes). Idempotent; a no-op before :meth:`start`."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        i, start = 0, time.perf_counter()
        while not self._stop.is_set():
            delay = start + i / self.rate - time.perf_counter()
            if delay > 0:
                self._stop.wait(delay)
            with contextlib.suppress(Exception):
                submit_export(
                    self.pool, self.settings, tenant_id=self.tenant_id, request=self.request
                )
            i += 1

    def __enter__(self) -> SteadySubmits:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
