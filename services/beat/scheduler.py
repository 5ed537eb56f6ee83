"""Beat's scheduler with a liveness heartbeat: HEARTBEAT_FILE advances after every tick of
beat's loop that ran without error, so a beat that hangs fails its liveness probe."""

from __future__ import annotations

from typing import Any

from celery.beat import PersistentScheduler

from exportcore.liveness import touch_configured


class LivenessScheduler(PersistentScheduler):
    """``PersistentScheduler`` that touches the heartbeat after each loop iteration."""

    def tick(self, *args: Any, **kwargs: Any) -> float:
        interval: float = super().tick(*args, **kwargs)
        touch_configured()
        return interval
