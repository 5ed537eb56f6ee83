"""gunicorn settings for the api (every value overridable from the environment).

Metrics of all workers are aggregated through PROMETHEUS_MULTIPROC_DIR: emptied when the
master starts, each exiting worker marked dead, and served by the master on their own port
(METRICS_PORT on METRICS_BIND_ADDRESS), never on the public api port.

Logs: gunicorn's own error log goes through the process's one handler (format, redaction
filter: exportcore.logs), and so do uvicorn's loggers, which uvicorn-worker points at
gunicorn's handlers. No access log from gunicorn or uvicorn (theirs carry query strings):
the app writes one line per request itself (services/api/access.py).

The client's address (the console's sign-in throttle, the access log) is the TCP peer's,
unless that peer is a trusted proxy: FORWARDED_ALLOW_IPS (comma-separated addresses or CIDR
ranges; default loopback only) lists the proxies whose X-Forwarded-For / X-Forwarded-Proto
uvicorn's ProxyHeadersMiddleware believes, and the client is then the nearest address in
X-Forwarded-For that is not a trusted proxy (what a client writes there itself is never
taken). The chart sets it from trustedProxies.addresses (and refuses "*").

gunicorn's control socket (gunicornc, since 25.1) is off: nothing here manages workers at
run time, and its default place ($HOME/.gunicorn) is on the read-only root filesystem of
the chart's pods.
"""

import logging
import multiprocessing
import os
from typing import Any

from gunicorn.glogging import Logger

from exportcore import metrics
from exportcore.logs import process_handlers, setup_logging
from exportcore.settings import get_settings

setup_logging("api", os.environ.get("LOG_LEVEL", "INFO"))


class GunicornLogger(Logger):  # type: ignore[misc]
    """gunicorn's logger with the process's handler instead of its own formats."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        self.error_log.handlers = process_handlers()
        self.error_log.propagate = False
        self.access_log.handlers = [logging.NullHandler()]
        self.access_log.propagate = False


logger_class = GunicornLogger

bind = os.environ.get("API_BIND", "0.0.0.0:8000")
workers = int(os.environ.get("API_WORKERS", str(min(4, multiprocessing.cpu_count() * 2))))
worker_class = "uvicorn_worker.UvicornWorker"
graceful_timeout = int(os.environ.get("API_GRACEFUL_TIMEOUT", "20"))
timeout = int(os.environ.get("API_TIMEOUT", "60"))
keepalive = 5
accesslog = None
errorlog = "-"
loglevel = os.environ.get("LOG_LEVEL", "info").lower()
control_socket_disable = True
# uvicorn-worker passes it to uvicorn (proxy_headers is on by default there).
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1,::1")


def on_starting(server: Any) -> None:
    metrics.prepare_multiprocess_dir()


def when_ready(server: Any) -> None:
    """In the master, once it listens: /metrics of every worker on the metrics port."""
    settings = get_settings()
    metrics.serve(settings.metrics_port, str(settings.metrics_bind_address))


def child_exit(server: Any, worker: Any) -> None:
    metrics.mark_dead(worker.pid)
