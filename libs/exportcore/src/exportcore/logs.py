"""Logs: one line per record on stderr, in ONE format per process (``LOG_FORMAT``): JSON
objects (containers; ``json``) or human-readable lines (a terminal, ``make dev``; ``text``),
with the job ids passed in ``extra`` (``job_id``, ``message_id``, ``lease_token``,
``attempt``, ...) and the current ``trace_id`` / ``span_id``. ``auto`` (the default) is
``text`` when stderr is a terminal, else ``json``.

Every logger goes through the same handler: gunicorn's error log (``services/api/
gunicorn_conf.py`` installs :class:`GunicornLogger`), uvicorn's loggers (which uvicorn-worker
points at gunicorn's handlers) and Celery's included.

Never log note content, API keys or connection strings: :class:`RedactingFilter` masks
what :mod:`exportcore.redaction` calls a secret (URL credentials, API keys, bearer tokens,
secret ``key=value`` pairs, AWS access key ids) and PostgreSQL's row content (``DETAIL``
lines, ``Failing row contains (...)``, ``Key (...)=(...)``), in the message, its arguments,
the exception and every ``extra`` value, nested ones included, as a last line of defence.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any

from pythonjsonlogger.json import JsonFormatter

from exportcore.redaction import redact
from exportcore.telemetry import TraceIdFilter

_MAX_DEPTH = 8


def redact_value(value: Any, depth: int = 0) -> Any:
    """:func:`redact` applied to every string inside ``value`` (dicts, lists, tuples, sets,
    exceptions' args), to ``_MAX_DEPTH`` levels; other objects are rendered with ``repr``
    and redacted, since a handler would render them anyway."""
    if isinstance(value, str):
        return redact(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    if depth >= _MAX_DEPTH:
        return "***"
    if isinstance(value, dict):
        return {redact_value(k, depth + 1): redact_value(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = [redact_value(v, depth + 1) for v in value]
        return items if isinstance(value, list | set | frozenset) else tuple(items)
    if isinstance(value, BaseException):
        return redact(f"{type(value).__name__}: {value}")
    return redact(repr(value))


_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}
_KEEP = frozenset(
    [
        "name",
        "levelname",
        "levelno",
        "pathname",
        "filename",
        "module",
        "funcName",
        "lineno",
        "created",
        "msecs",
        "relativeCreated",
        "thread",
        "threadName",
        "process",
        "processName",
        "taskName",
        "exc_info",
        "stack_info",
    ]
)


class RedactingFilter(logging.Filter):
    """Applies :func:`redact_value` to the rendered message (arguments included), the
    exception text, the stack and every ``extra`` value, nested values included."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.args:
            try:
                record.msg = record.getMessage()
                record.args = None
            except (TypeError, ValueError):
                record.args = redact_value(record.args)  # the handler reports the mismatch
        if not isinstance(record.msg, str):
            record.msg = redact_value(record.msg)
            record.msg = record.msg if isinstance(record.msg, str) else str(record.msg)
        record.msg = redact(record.msg)
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        for key, value in list(record.__dict__.items()):
            if key not in _KEEP and key not in ("msg", "args", "exc_text"):
                record.__dict__[key] = redact_value(value)
        return True


class TextFormatter(logging.Formatter):
    """``HH:MM:SS.mmm LEVEL    logger: message key=value ...`` (the ``extra`` fields, then
    the trace id), for people reading a terminal; the exception follows on its own lines."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created, UTC).astimezone()
        extras = " ".join(
            f"{key}={_text_value(value)}"
            for key, value in record.__dict__.items()
            if key not in _STANDARD
            and key not in ("service", "span_id")
            and value not in (None, "")
        )
        line = (
            f"{when:%H:%M:%S}.{int(record.msecs):03d} {record.levelname:<7} "
            f"{record.name}: {record.getMessage()}"
        )
        if extras:
            line += f"  {extras}"
        if record.exc_text:
            line += "\n" + record.exc_text
        elif record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _text_value(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if text and " " not in text else repr(text)


def resolve_format(log_format: str, stream: Any = None) -> str:
    """``json`` or ``text`` for ``LOG_FORMAT`` (``auto``: text on a terminal, else json)."""
    fmt = log_format.strip().lower()
    if fmt == "auto":
        stream = stream or sys.stderr
        return "text" if hasattr(stream, "isatty") and stream.isatty() else "json"
    if fmt not in ("json", "text"):
        raise ValueError(f"LOG_FORMAT must be auto, json or text, not {log_format!r}")
    return fmt


class DemoteToDebug(logging.Filter):
    """Turns the records of a chatty logger whose message starts with one of ``prefixes``
    into DEBUG records (Celery beat's "Sending due task" every tick), dropped unless the
    level is DEBUG."""

    def __init__(self, *prefixes: str) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.INFO and str(record.msg).startswith(self.prefixes):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger().isEnabledFor(logging.DEBUG)
        return True


def make_handler(service: str, log_format: str = "auto") -> logging.Handler:
    """The one handler of a process: stderr, :class:`RedactingFilter`, the trace ids, and the
    JSON or text formatter (``LOG_FORMAT``)."""
    handler = logging.StreamHandler(sys.stderr)
    if resolve_format(log_format) == "text":
        handler.setFormatter(TextFormatter())
    else:
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
    return handler


def setup_logging(service: str, level: str = "INFO", log_format: str | None = None) -> None:
    """Send this process's logs to stderr in one format (``LOG_FORMAT``, else ``auto``);
    idempotent."""
    import os

    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_exports_json", False):
            return
    fmt = log_format or os.environ.get("LOG_FORMAT", "auto")
    root.handlers = [make_handler(service, fmt)]
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpcore", "kombu", "celery.worker.strategy", "celery.app.trace"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    beat = logging.getLogger("celery.beat")
    if not any(isinstance(f, DemoteToDebug) for f in beat.filters):
        beat.addFilter(DemoteToDebug("Scheduler: Sending due task"))


def govern_celery_logging(service: str, level: str, log_format: str | None = None) -> None:
    """Make ``LOG_LEVEL`` (``level``) the one setting of a Celery process's log level (the
    workers, beat): set this process's logs up now (:func:`setup_logging`) and answer
    Celery's ``setup_logging`` signal, which Celery sends when it would configure logging
    itself (``celery worker`` / ``celery beat`` and each prefork child). With a receiver
    connected Celery configures nothing: its ``--loglevel`` (default WARNING) no longer
    sets the root level, and no command line passes one. Idempotent."""
    from celery import signals

    def configure(**_: Any) -> None:
        setup_logging(service, level, log_format)

    signals.setup_logging.disconnect(dispatch_uid="exports-logging")
    signals.setup_logging.connect(configure, weak=False, dispatch_uid="exports-logging")
    setup_logging(service, level, log_format)


def process_handlers() -> list[logging.Handler]:
    """The handlers :func:`setup_logging` installed on the root logger (for gunicorn's and
    uvicorn's own loggers, which do not propagate)."""
    return [h for h in logging.getLogger().handlers if getattr(h, "_exports_json", False)]
