"""Redaction of credentials and API keys in log records."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator

import pytest

from exportcore.auth import generate_key
from exportcore.logs import RedactingFilter, setup_logging
from exportcore.redaction import redact


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("postgresql://user:secret@host/db", "postgresql://***@host/db"),
        ("redis://:pw@host", "redis://***@host"),
        ("redis://:pw@host:6379/0", "redis://***@host:6379/0"),
        ("postgresql+psycopg://app:s3cr%40t@db:5432/x", "postgresql+psycopg://***@db:5432/x"),
        ("amqp://user@host/vhost", "amqp://***@host/vhost"),
        (
            "from postgres://a:b@h1/db to redis://:c@h2/0 failed",
            "from postgres://***@h1/db to redis://***@h2/0 failed",
        ),
    ],
)
def test_redact_masks_url_credentials(text: str, expected: str) -> None:
    assert redact(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "postgresql://host:5432/db",
        "https://example.com/path@v2",
        "mail alice@example.com",
        "nex_short",
        "plain message",
    ],
)
def test_redact_leaves_innocent_text_alone(text: str) -> None:
    assert redact(text) == text


def test_redact_runs_no_pattern_on_text_without_a_marker() -> None:
    """Ids, routes and counts (almost every written line) skip the patterns: the same object
    comes back; anything a pattern could match contains one of the markers."""
    plain = "POST /v1/exports 202 01a23bb0-d783-7390-a1be-412dd8484b85"
    assert redact(plain) is plain
    for masked in ("redis://:pw@h/0", "DETAIL:  Key (id)=(7) exists.", "Failing row contains (x)"):
        assert redact(masked) != masked


def test_redact_masks_api_keys() -> None:
    key, prefix = generate_key()
    out = redact(f"authenticated with {key} (prefix {prefix})")
    assert key not in out
    assert key.split("_", 2)[2] not in out
    assert out.startswith("authenticated with nex_*** (")


def make_record(
    msg: str, args: tuple[object, ...] | None = None, **extra: object
) -> logging.LogRecord:
    logger = logging.getLogger("test.logs")
    return logger.makeRecord(
        logger.name, logging.INFO, __file__, 1, msg, args, None, extra=extra or None
    )


DSN = "postgresql://app:hunter2@db.internal:5432/exports"


def test_filter_redacts_the_rendered_message_and_drops_args() -> None:
    record = make_record("connecting to %s as %r", (DSN, "worker"))
    assert RedactingFilter().filter(record) is True
    assert record.args is None
    assert (
        record.getMessage() == "connecting to postgresql://***@db.internal:5432/exports as 'worker'"
    )


def test_filter_redacts_string_extra_fields_only() -> None:
    key, _ = generate_key()
    record = make_record("job claimed", dsn=DSN, api_key=key, attempt=2, ids=[DSN])
    RedactingFilter().filter(record)
    assert record.dsn == "postgresql://***@db.internal:5432/exports"  # type: ignore[attr-defined]
    assert record.api_key == "nex_***"  # type: ignore[attr-defined]
    assert record.attempt == 2  # type: ignore[attr-defined]
    assert record.name == "test.logs"
    assert record.getMessage() == "job claimed"


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A private logger whose handler has the filter, writing plain lines to a buffer."""
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.addFilter(RedactingFilter())
    handler.setFormatter(logging.Formatter("%(message)s %(dsn)s"))
    logger = logging.getLogger(f"test.logs.{id(buf)}")
    logger.propagate = False
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield logger, buf
    logger.removeHandler(handler)


def test_no_secret_reaches_the_handler_output(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, buf = captured
    logger.info("broker %s unreachable", "redis://:pw123@cache:6379/0", extra={"dsn": DSN})
    out = buf.getvalue()
    assert "pw123" not in out and "hunter2" not in out
    assert (
        out
        == "broker redis://***@cache:6379/0 unreachable postgresql://***@db.internal:5432/exports\n"
    )


def test_exception_text_is_redacted(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, buf = captured
    try:
        raise ConnectionError(f"cannot reach {DSN}")
    except ConnectionError:
        logger.exception("export failed", extra={"dsn": "-"})
    assert "hunter2" not in buf.getvalue()


def test_bad_format_args_do_not_raise_in_the_filter() -> None:
    """Formatting errors stay the handler's business (handleError), not the caller's."""
    record = logging.LogRecord("t", logging.INFO, __file__, 1, "%d rows", ("x",), None)
    assert RedactingFilter().filter(record) is True
    assert record.args == ("x",)


@pytest.fixture
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers = []  # start from a bare root, whatever earlier tests installed
    yield
    root.handlers = handlers
    root.setLevel(level)


def test_setup_logging_writes_redacted_json_lines_once(
    restore_root_logger: None, capsys: pytest.CaptureFixture[str]
) -> None:
    setup_logging("publisher", "debug")
    setup_logging("publisher", "debug")
    root = logging.getLogger()
    assert len(root.handlers) == 1
    assert root.level == logging.DEBUG
    assert root.handlers[0].stream is sys.stderr  # type: ignore[attr-defined]
    logging.getLogger("exportcore.test").info("using %s", DSN, extra={"job_id": "j-1"})
    line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert line["service"] == "publisher"
    assert line["logger"] == "exportcore.test"
    assert line["level"] == "INFO"
    assert line["job_id"] == "j-1"
    assert line["message"] == "using postgresql://***@db.internal:5432/exports"
    assert "ts" in line


# --- nested values, PostgreSQL DETAIL lines, the text format -------------------------------


def _record(msg: object, *args: object, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, msg, args or None, None)
    record.__dict__.update(extra)
    return record


def test_nested_extra_values_args_and_exceptions_are_redacted() -> None:
    key, _ = generate_key()
    record = _record(
        "failed with %s",
        {"url": "postgresql://u:pw@h/db"},
        extra_dict={"inner": [f"Bearer {key}", ("redis://:pw@r/0",)]},
        error=ValueError(f"bad key {key}"),
    )
    RedactingFilter().filter(record)
    rendered = json.dumps(record.__dict__, default=str)
    assert key not in rendered and "pw@" not in rendered
    assert "postgresql://***@h/db" in record.msg
    assert record.__dict__["extra_dict"] == {"inner": ["Bearer nex_***", ("redis://***@r/0",)]}


def test_postgres_detail_lines_never_reach_the_log() -> None:
    error = (
        'null value in column "name" of relation "export_schedules" violates not-null constraint\n'
        'DETAIL:  Failing row contains (7c1d, demo, null, {"note_ids": [1, 2]}, secret title).\n'
        'duplicate key value violates unique constraint "k"\nDETAIL:  Key (title)=(my diary) already exists.'
    )
    try:
        raise RuntimeError(error)
    except RuntimeError:
        record = logging.LogRecord(
            "x", logging.ERROR, __file__, 1, "boom: %s", (error,), sys.exc_info()
        )
    RedactingFilter().filter(record)
    for text in (record.msg, record.exc_text or ""):
        assert "secret title" not in text and "my diary" not in text and "note_ids" not in text
        assert "DETAIL: ***" in text
    assert redact("Failing row contains (a, b).") == "Failing row contains ***"
    assert redact("Key (title)=(my diary) already exists.") == "Key (title)=(***)"


def test_text_format_is_one_readable_line_with_the_ids() -> None:
    from exportcore.logs import TextFormatter

    record = _record("job claimed", job_id="j-1", attempt=2)
    record.levelname, record.levelno = "INFO", logging.INFO
    line = TextFormatter().format(record)
    assert "\n" not in line and line.split()[1] == "INFO"
    assert "x: job claimed" in line and "job_id=j-1" in line and "attempt=2" in line


@pytest.mark.parametrize(
    ("setting", "tty", "fmt"),
    [
        ("auto", True, "text"),
        ("auto", False, "json"),
        ("json", True, "json"),
        ("text", False, "text"),
    ],
)
def test_log_format_auto_is_text_on_a_terminal_only(setting: str, tty: bool, fmt: str) -> None:
    from exportcore.logs import resolve_format

    class Stream(io.StringIO):
        def isatty(self) -> bool:
            return tty

    assert resolve_format(setting, Stream()) == fmt


def test_beat_ticks_are_debug_lines() -> None:
    from exportcore.logs import DemoteToDebug

    record = _record("Scheduler: Sending due task schedules-tick (notes_exports.schedules_tick)")
    record.levelname, record.levelno = "INFO", logging.INFO
    assert DemoteToDebug("Scheduler: Sending due task").filter(record) is (
        logging.getLogger().isEnabledFor(logging.DEBUG)
    )
    assert record.levelname == "DEBUG"


# --- LOG_LEVEL governs every process, the Celery ones included -----------------------------


def test_log_level_governs_a_celery_process_whatever_its_command_line_says(
    restore_root_logger: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Celery configures logging itself (``app.log.setup``, run by ``celery worker`` / ``beat``
    and by every prefork child with the command line's ``--loglevel``) unless something
    answers its ``setup_logging`` signal: the workers and beat answer it, so LOG_LEVEL alone
    decides (here WARNING, against an ``--loglevel INFO``)."""
    from celery import signals

    from exportcore.broker import make_celery
    from exportcore.logs import govern_celery_logging, process_handlers
    from exportcore.settings import Settings

    app = make_celery(Settings())
    try:
        govern_celery_logging("worker", "WARNING")
        ours = process_handlers()
        app.log.setup(loglevel=logging.INFO, redirect_stdouts=False)  # celery --loglevel INFO
        root = logging.getLogger()
        assert root.level == logging.WARNING and root.handlers == ours and len(ours) == 1
        logging.getLogger("exportcore.runner").info("batch done")
        logging.getLogger("exportcore.runner").warning("lease lost")
        lines = [json.loads(x) for x in capsys.readouterr().err.strip().splitlines()]
        assert [(x["service"], x["message"]) for x in lines] == [("worker", "lease lost")]
    finally:
        signals.setup_logging.disconnect(dispatch_uid="exports-logging")


def test_no_command_line_sets_a_log_level_of_its_own() -> None:
    """LOG_LEVEL is the one setting: the Procfile (make dev, tests, drills, benchmarks) and the
    chart start Celery without ``--loglevel``."""
    from devtools.stack import ROOT

    for path in ("Procfile", "charts/notes-exports/values.yaml"):
        assert "--loglevel" not in (ROOT / path).read_text("utf-8"), path
