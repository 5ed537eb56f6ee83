"""A consumer bootstep that advances the worker's liveness file (``HEARTBEAT_FILE``).

The file is touched by a timer of the worker's own event loop, and only while the task
consumer is actually consuming at least one queue. So it stops when:

- the event loop hangs (the timer never fires);
- the consumer was cancelled (``celery control cancel_consumer``, as the preStop hook does) or
  lost its broker connection (the consumer blueprint stops this step with the Tasks step);
- the process is gone.

``python -m exportcore.liveness --max-age N`` is the probe that reads it. A
worker that is busy with tasks still consumes (prefetch is only paused), so it stays live.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from celery import bootsteps
from celery.worker.consumer.tasks import Tasks

from exportcore.liveness import touch
from exportcore.settings import get_settings

log = logging.getLogger(__name__)

TOUCH_INTERVAL = 2.0
"""Seconds between touches of the liveness file; probes allow a max age of many intervals."""


def consuming(consumer: Any) -> bool:
    """True when the worker's task consumer is subscribed to at least one queue."""
    task_consumer = getattr(consumer, "task_consumer", None)
    if task_consumer is None:
        return False
    return any(task_consumer.consuming_from(queue) for queue in task_consumer.queues)


class LivenessBootstep(bootsteps.StartStopStep):
    """Touches ``HEARTBEAT_FILE`` every :data:`TOUCH_INTERVAL` seconds while consuming."""

    requires = (Tasks,)
    label = "Liveness file"

    def __init__(self, c: Any, **kwargs: Any) -> None:
        self.path: Path | None = get_settings().heartbeat_file
        self.interval = TOUCH_INTERVAL
        self.tref: Any = None
        super().__init__(c, **kwargs)

    def include_if(self, c: Any) -> bool:
        """Only when a heartbeat file is configured."""
        return self.path is not None

    def start(self, c: Any) -> None:
        """Schedule :meth:`touch` on the consumer's (event loop) timer."""
        self.tref = c.timer.call_repeatedly(self.interval, self.touch, (c,), priority=10)

    def stop(self, c: Any) -> None:
        """Cancel the timer: no touch while the consumer is stopped or restarting."""
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None

    shutdown = stop

    def touch(self, c: Any) -> None:
        """One touch of the liveness file, if the consumer is consuming; never raises into
        the event loop."""
        if self.path is None or not consuming(c):
            return
        try:
            touch(self.path)
        except OSError as exc:
            log.warning("heartbeat not written", extra={"path": str(self.path), "error": repr(exc)})


def install(app: Any) -> None:
    """Register the step with ``app``'s consumer blueprint (idempotent)."""
    if LivenessBootstep not in app.steps["consumer"]:
        app.steps["consumer"].add(LivenessBootstep)
