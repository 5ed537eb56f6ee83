"""The loop every background service runs (publisher, recovery-scanner, webhook-delivery):
a :class:`Service` (``run_once() -> counts``, ``next_wait``, ``idle``) and
:class:`ServiceLoop`, which repeats its passes with jittered pauses and stops cleanly on TERM.

The loop finishes the pass in hand when TERM or INT arrives and then returns (a pause ends at
once: ``idle`` returns when the stop event is set), so the process exits 0 within one pass.
"""

from __future__ import annotations

import logging
import random
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Protocol

from exportcore.db import DATABASE_UNAVAILABLE

log = logging.getLogger(__name__)


class Service(Protocol):
    """A unit of background work run repeatedly by :class:`ServiceLoop`."""

    name: str

    def run_once(self) -> dict[str, int]:
        """Do one bounded pass; return counts of what was done (for logs and metrics)."""
        ...

    def idle(self, timeout: float, stop: threading.Event) -> None:
        """Wait up to ``timeout`` seconds for more work (return early on a wake-up or stop)."""
        ...

    def next_wait(self, counts: dict[str, int], interval: float) -> float:
        """Seconds to idle after a pass that produced ``counts`` (0 = run again at once)."""
        ...


class ServiceLoop:
    """Runs ``service.run_once`` until stopped.

    ``interval`` is the nominal pause between passes in seconds; each pause is multiplied by a
    random factor in ``[1 - jitter, 1 + jitter]`` so replicas do not run in lockstep.
    ``stop_event`` (optional) is shared with other loops of the process. An
    exception in a pass is logged and followed by an exponential pause capped at
    ``max_error_pause`` seconds; it never ends the loop. A database that does not answer
    (``exportcore.db.DATABASE_UNAVAILABLE``: a restart, a failover) is retried after one
    interval, so the loop resumes within about one interval of the new primary. A pass that
    did something is logged at the service's ``pass_log_level`` (INFO unless the service
    says otherwise).
    """

    def __init__(
        self,
        service: Service,
        *,
        interval: float,
        jitter: float = 0.2,
        max_error_pause: float = 30.0,
        on_pass: Callable[[dict[str, int], float], None] | None = None,
        stop_event: threading.Event | None = None,
    ) -> None:
        self.service = service
        self.interval = interval
        self.jitter = jitter
        self.max_error_pause = max_error_pause
        self.on_pass = on_pass
        # shared by the loops of one process (the recovery-scanner's and its bulk runner's):
        # one TERM stops them all
        self.stop_event = stop_event or threading.Event()
        self._rng = random.Random()
        # a service whose passes are per job (the publisher) logs them at DEBUG
        self.pass_log_level: int = getattr(service, "pass_log_level", logging.INFO)

    def stop(self, *_: object) -> None:
        """Ask the loop to finish the current pass and return."""
        self.stop_event.set()

    def install_signal_handlers(self) -> None:
        """Route SIGTERM and SIGINT to :meth:`stop` (main thread only)."""

        def handler(signum: int, frame: FrameType | None) -> None:
            log.info("stop requested", extra={"signal": signal.Signals(signum).name})
            self.stop()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def jittered(self, seconds: float) -> float:
        """``seconds`` scaled by a random factor in ``[1 - jitter, 1 + jitter]``."""
        return max(0.0, seconds * self._rng.uniform(1 - self.jitter, 1 + self.jitter))

    def run(self, max_passes: int | None = None) -> int:
        """Loop until stopped (or ``max_passes`` passes); returns the number of passes."""
        from exportcore import liveness  # HEARTBEAT_FILE, touched after each pass

        passes = 0
        errors = unavailable = 0
        while not self.stop_event.is_set():
            started = time.monotonic()
            try:
                counts = self.service.run_once()
            except DATABASE_UNAVAILABLE as exc:
                # A restart or a failover, not a bug: no traceback, and no growing pause
                # (it kept the publisher idle for 25 s after a new primary was up). Each
                # attempt already waits up to DB_CONNECT_TIMEOUT for a connection.
                unavailable += 1
                log.warning(
                    "database unavailable; retrying",
                    extra={
                        "service": self.service.name,
                        "error": type(exc).__name__,
                        "attempt": unavailable,
                    },
                )
                self.stop_event.wait(self.jittered(min(self.interval, self.max_error_pause)))
                continue
            except Exception:
                errors += 1
                pause = min(self.max_error_pause, self.interval * 2 ** min(errors, 10))
                log.exception(
                    "pass failed; retrying", extra={"service": self.service.name, "pause": pause}
                )
                self.stop_event.wait(self.jittered(pause))
                continue
            errors = unavailable = 0
            passes += 1
            liveness.touch_configured()
            elapsed = time.monotonic() - started
            if self.on_pass is not None:
                self.on_pass(counts, elapsed)
            if any(counts.values()) and log.isEnabledFor(self.pass_log_level):
                log.log(
                    self.pass_log_level,
                    "pass done",
                    extra={"service": self.service.name, "counts": counts, "seconds": elapsed},
                )
            if max_passes is not None and passes >= max_passes:
                break
            wait = self.service.next_wait(counts, self.interval)
            if wait > 0 and not self.stop_event.is_set():
                self.service.idle(self.jittered(wait), self.stop_event)
        log.info("stopped", extra={"service": self.service.name, "passes": passes})
        return passes
