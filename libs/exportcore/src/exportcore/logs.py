"""Structured JSON logs: one JSON object per line on stderr, with the job ids passed in
``extra`` (``job_id``, ``message_id``, ``lease_token``, ``attempt``, ...) and the current
``trace_id`` / ``span_id``.

Never log note content, API keys or connection strings: :class:`RedactingFilter` masks
anything that looks like a URL with credentials or an API key as a last line of defence.
"""

from __future__ import annotations

import logging
import re
import sys

from pythonjsonlogger.json import JsonFormatter

from exportcore.telemetry import TraceIdFilter

_SECRETS = [
    (
        re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)[^\s/@:]*(:[^\s/@]*)?@", re.IGNORECASE),
        r"\g<scheme>***@",
    ),
    (re.compile(r"\bnex_[A-Za-z0-9_-]{8,}"), "nex_***"),
]


def redact(text: str) -> str:
    """Mask URL credentials (``scheme://user:pass@``) and API keys (``nex_…``) in ``text``."""
    for pattern, repl in _SECRETS:
        text = pattern.sub(repl, text)
    return text


class RedactingFilter(logging.Filter):
    """Applies :func:`redact` to the rendered message, the exception text and string
    ``extra`` values."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.args:
            try:
                record.msg = record.getMessage()
                record.args = None
            except (TypeError, ValueError):
                pass  # leave it to the handler, which reports formatting errors itself
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        for key, value in list(record.__dict__.items()):
            if isinstance(value, str) and key not in ("msg", "name", "levelname", "pathname"):
                record.__dict__[key] = redact(value)
        return True


def setup_logging(service: str, level: str = "INFO") -> None:
    """Send JSON lines to stderr for this process; idempotent."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_exports_json", False):
            return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter(
            "{asctime}{levelname}{name}{message}",
            style="{",
            rename_fields={"asctime": "ts", "levelname": "level", "name": "logger"},
            static_fields={"service": service},
        )
    )
    handler.addFilter(RedactingFilter())
    handler.addFilter(TraceIdFilter())
    handler._exports_json = True  # type: ignore[attr-defined]
    root.handlers = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpcore", "kombu", "celery.worker.strategy", "celery.app.trace"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
