"""gunicorn settings for the api (every value overridable from the environment).

Metrics of all workers are aggregated through PROMETHEUS_MULTIPROC_DIR: emptied when the
master starts, each exiting worker marked dead.
"""

import multiprocessing
import os
from typing import Any

from exportcore import metrics

bind = os.environ.get("API_BIND", "0.0.0.0:8000")
workers = int(os.environ.get("API_WORKERS", str(min(4, multiprocessing.cpu_count() * 2))))
worker_class = "uvicorn_worker.UvicornWorker"
graceful_timeout = int(os.environ.get("API_GRACEFUL_TIMEOUT", "20"))
timeout = int(os.environ.get("API_TIMEOUT", "60"))
keepalive = 5
accesslog = None
errorlog = "-"
loglevel = os.environ.get("LOG_LEVEL", "info").lower()


def on_starting(server: Any) -> None:
    metrics.prepare_multiprocess_dir()


def child_exit(server: Any, worker: Any) -> None:
    metrics.mark_dead(worker.pid)
