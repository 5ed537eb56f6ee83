"""One set of secret rules for the logs and the console (exportcore.redaction): a secret
masked in a log line is masked in the console's error details too, and the other way round.
Before the two shared one module they kept a table each, and a pattern added to one was
missing from the other; these cases run every kind of secret through both."""

from __future__ import annotations

import logging

import pytest

from exportcore.logs import RedactingFilter
from services.api.console.timeline import sanitise_detail

# (text, the secret it must not show): one of each kind of rule of exportcore.redaction
SECRETS = [
    ("connect postgresql://app:s3cret@db:5432/x failed", "s3cret"),
    ("broker amqp://svc-user@mq/vhost refused", "svc-user"),
    ("key nex_ab12cd34_Zm9vYmFyYmF6cXV4 refused", "Zm9vYmFyYmF6cXV4"),
    ("Authorization: Bearer nex_ab12cd34_Zm9vYmFyYmF6cXV4", "Zm9vYmFyYmF6cXV4"),
    ("Authorization: Bearer eyJhbGciOi.payload.sig", "eyJhbGciOi"),
    ("password=hunter2; user=x", "hunter2"),
    ('secret_access_key: "abc/def"', "abc/def"),
    ("AKIAABCDEFGHIJKLMNOP denied", "AKIAABCDEFGHIJKLMNOP"),
    ("insert failed\nDETAIL:  Failing row contains (7c1d, my diary).", "my diary"),
    ("Failing row contains (7c1d, my diary).", "my diary"),
    ("Key (title)=(my diary) already exists.", "my diary"),
]


def logged(text: str) -> str:
    """``text`` as the log filter leaves a record's message."""
    record = logging.LogRecord("test.redaction", logging.ERROR, __file__, 1, text, None, None)
    RedactingFilter().filter(record)
    return record.getMessage()


@pytest.mark.parametrize(("text", "secret"), SECRETS, ids=range(len(SECRETS)))
def test_the_logs_and_the_console_mask_the_same_secrets(text: str, secret: str) -> None:
    log_line, console = logged(text), sanitise_detail(text)
    assert secret not in log_line and "***" in log_line, log_line
    assert secret not in console and "[redacted]" in console, console


def test_a_key_sent_as_a_bearer_token_keeps_its_prefix_in_both() -> None:
    """The key rule runs before the bearer rule, so the reader still sees a key was sent."""
    text = "refused Bearer nex_ab12cd34_Zm9vYmFyYmF6cXV4"
    assert "Bearer nex_***" in logged(text)
    assert "Bearer nex_[redacted]" in sanitise_detail(text)
