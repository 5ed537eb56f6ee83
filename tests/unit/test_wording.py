"""Words people read: a job's status said of the job ("has already succeeded", never "is
already succeeded"), counts in the right number ("1 note"), and one word for a bulk action's
status filter on the audit page (its target and its Filter line read the same)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from exportcore.bulk import BulkFilter
from exportcore.domain import status_words
from services.api.console.audit import filter_words
from services.api.console.render import TEMPLATES


@pytest.mark.parametrize(
    ("status", "said", "already"),
    [
        ("queued", "is queued", "is already queued"),
        ("running", "is running", "is already running"),
        ("succeeded", "has succeeded", "has already succeeded"),
        ("failed", "has failed", "has already failed"),
        ("cancelled", "was cancelled", "was already cancelled"),
    ],
)
def test_a_status_is_said_of_the_job(status: str, said: str, already: str) -> None:
    assert status_words(status) == said
    assert status_words(status, already=True) == already


def test_console_counts_and_statuses_read_right() -> None:
    env = TEMPLATES.env
    text = env.from_string(
        '{{ 1|count_of("note") }}, {{ 2|count_of("note") }}, {{ 1|count_of("byte") }}, '
        '{{ 3|count_of("batch", "batches") }}; this job {{ "succeeded"|status_words(already=True) }}'
    ).render()
    assert text == "1 note, 2 notes, 1 byte, 3 batches; this job has already succeeded"


def test_the_console_templates_use_the_words() -> None:
    # the job pages and confirmations say a status and a count through the filters above
    loader = TEMPLATES.env.loader
    assert loader is not None
    for name in ("cancel_confirm.html", "replay_confirm.html", "_job_live.html"):
        source = loader.get_source(TEMPLATES.env, name)[0]
        assert "is {{ job.status }}" not in source, name
        assert "}} notes" not in source, name


def test_a_bulk_filter_is_named_alike_in_the_audit_list_and_entry() -> None:
    filt = BulkFilter(
        status="queued", tenant_id="acme", created_from=datetime(2026, 1, 1, tzinfo=UTC)
    )
    assert filt.describe() == "status queued, tenant acme, created from 2026-01-01T00:00:00+00:00"
    assert "state" not in filt.describe()
    # the entry page's Filter line is the audit target's words, from the stored filter
    assert filter_words(filt.as_json()) == filt.describe()
    assert filter_words(None) is None
    assert filter_words({"created_from": "not a date"}) is None
