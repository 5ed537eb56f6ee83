"""The beat process: Celery beat emitting the schedule tick; exactly one replica.

Run: ``celery -A services.beat.app beat``. Beat keeps no state that matters: its schedule file
(BEAT_SCHEDULE_FILE) is disposable, because every schedule's cursor lives in PostgreSQL and a
slot can only ever produce one job. A tick message expires after two intervals, so ticks
emitted while no worker runs do not pile up.
"""

from __future__ import annotations

from typing import Any

from celery.signals import beat_init

from exportcore.broker import TICK_TASK, make_celery
from exportcore.domain import FAST_QUEUE
from exportcore.logs import govern_celery_logging
from exportcore.observability import start_process
from exportcore.settings import get_settings

settings = get_settings()
govern_celery_logging("beat", settings.log_level, settings.log_format)  # LOG_LEVEL only
app = make_celery(settings, main="notes_exports_beat")
app.conf.beat_schedule = {
    "schedules-tick": {
        "task": TICK_TASK,
        "schedule": settings.scheduler_tick_seconds,
        "options": {"queue": FAST_QUEUE, "expires": max(1.0, 2 * settings.scheduler_tick_seconds)},
    }
}
app.conf.beat_schedule_filename = str(settings.beat_schedule_file)
app.conf.beat_scheduler = "services.beat.scheduler:LivenessScheduler"
app.conf.beat_max_loop_interval = max(1.0, settings.scheduler_tick_seconds)


@beat_init.connect
def _start(**_: Any) -> None:
    """Logs, tracing and /metrics (METRICS_PORT) of the beat process."""
    start_process("beat", settings)
