"""Named SQL statements: the parser, every shipped file, and the store wrappers' parameters."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from importlib import resources
from typing import Any
from uuid import uuid4

import pytest

from exportcore import sql
from exportcore.sql import parse, q
from exportcore.store import (
    admission,
    broker,
    dead_letters,
    jobs,
    notes,
    operator_keys,
    outbox,
    recovery,
    schedules,
    tenants,
)

PLACEHOLDER = re.compile(r"%\(([^)]*)\)s")


def shipped_files() -> dict[str, str]:
    """``{aggregate: text}`` of every ``.sql`` file shipped in the package."""
    root = resources.files(sql)
    return {
        p.name.removesuffix(".sql"): p.read_text("utf-8")
        for p in root.iterdir()
        if p.name.endswith(".sql")
    }


def placeholders(statement: str) -> set[str]:
    return set(PLACEHOLDER.findall(statement))


# --- parse ------------------------------------------------------------------------------


def test_parse_splits_named_blocks_and_ignores_the_preamble() -> None:
    text = (
        "-- file header, not a statement\n"
        "\n"
        "-- name: first\n"
        "SELECT 1;\n"
        "\n"
        "-- name: second\n"
        "-- a comment that belongs to the statement\n"
        "SELECT 2\n"
        "FROM t;\n"
    )
    assert parse(text) == {
        "first": "SELECT 1",
        "second": "-- a comment that belongs to the statement\nSELECT 2\nFROM t",
    }


def test_parse_strips_trailing_semicolons_and_whitespace_but_keeps_inner_ones() -> None:
    text = "-- name: a\nSELECT ';' AS s ;  \n\n-- name: b\nSELECT 2;;\n"
    assert parse(text) == {"a": "SELECT ';' AS s", "b": "SELECT 2"}


def test_parse_accepts_spacing_variants_of_the_name_marker() -> None:
    text = "--name:a\nSELECT 1;\n--   name:   b_2   \nSELECT 2;\n"
    assert parse(text) == {"a": "SELECT 1", "b_2": "SELECT 2"}


def test_parse_rejects_a_duplicate_name() -> None:
    text = "-- name: same\nSELECT 1;\n-- name: other\nSELECT 2;\n-- name: same\nSELECT 3;\n"
    with pytest.raises(ValueError, match="'same'"):
        parse(text)


def test_parse_of_text_without_names_is_empty() -> None:
    assert parse("SELECT 1;\n-- just a comment\n") == {}


def test_q_returns_the_parsed_statement_and_raises_keyerror_for_unknown_names() -> None:
    assert q("jobs", "job_get") == parse(shipped_files()["jobs"])["job_get"]
    with pytest.raises(KeyError):
        q("jobs", "no_such_statement")


# --- shipped files ----------------------------------------------------------------------


def test_every_aggregate_is_shipped() -> None:
    expected = {
        "jobs",
        "notes",
        "outbox",
        "tenants",
        "recovery",
        "dead_letters",
        "admission",
        "metrics",
        "schedules",
        "operator_keys",
        "broker",
    }
    assert set(shipped_files()) == expected


@pytest.mark.parametrize("aggregate", sorted(shipped_files()))
def test_every_shipped_statement_loads_and_is_well_formed(aggregate: str) -> None:
    text = shipped_files()[aggregate]
    statements = parse(text)
    # Every marker line was recognised (a typo such as "-- Name:" would silently merge two
    # statements into one).
    assert len(statements) == len(re.findall(r"^--\s*name:", text, re.MULTILINE | re.I))
    assert statements
    for name, statement in statements.items():
        assert q(aggregate, name) == statement
        assert statement.strip() == statement
        assert not statement.endswith(";")
        code = "\n".join(line for line in statement.splitlines() if not line.startswith("--"))
        assert code.strip(), f"{aggregate}.{name} has no SQL"
        for param in placeholders(statement):
            assert param.isidentifier(), f"{aggregate}.{name}: bad placeholder {param!r}"
        # psycopg rejects any other use of '%': only %(name)s placeholders (or %%).
        leftover = PLACEHOLDER.sub("", statement).replace("%%", "")
        assert "%" not in leftover, f"{aggregate}.{name} has a stray '%'"


# --- store wrappers pass exactly the statement's placeholders ----------------------------


class RecordingConn:
    """Stands in for a psycopg connection: records the statement and its parameters."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any] | None]] = []

    def execute(self, statement: str, params: dict[str, Any] | None = None) -> RecordingConn:
        self.calls.append((statement, params))
        return self

    def fetchone(self) -> dict[str, Any]:
        return {"ids": [], "n": 0, "seconds": None, "past": False}

    def fetchall(self) -> list[dict[str, Any]]:
        return []

    def __iter__(self) -> Any:
        return iter(())

    rowcount = 0


U = uuid4()
NOW = datetime(2024, 1, 1, tzinfo=UTC)

STORE_CALLS: list[tuple[str, str, Any, dict[str, Any]]] = [
    (
        "jobs",
        "job_submit",
        jobs.job_submit,
        dict(
            job_id=U,
            message_id=U,
            tenant_id="t",
            queue="exports.fast",
            fmt="json",
            payload={},
            note_count=1,
            request_hash="h",
            max_attempts=3,
            deadline_seconds=60.0,
        ),
    ),
    (
        "jobs",
        "job_snapshot_notes",
        jobs.job_snapshot_notes,
        dict(job_id=U, tenant_id="t", note_ids=[1]),
    ),
    (
        "jobs",
        "job_snapshot_all_notes",
        jobs.job_snapshot_notes,
        dict(job_id=U, tenant_id="t", note_ids=None),
    ),
    ("jobs", "job_claim", jobs.job_claim, dict(job_id=U, message_id=None, lease_seconds=30.0)),
    ("jobs", "job_claim_refusal", jobs.job_claim_refusal, dict(job_id=U)),
    (
        "jobs",
        "job_renew_lease",
        jobs.job_renew_lease,
        dict(job_id=U, lease_token=U, lease_seconds=30.0, progress=0),
    ),
    (
        "jobs",
        "job_finish_if_leased",
        jobs.job_finish_if_leased,
        dict(job_id=U, lease_token=U, result_ref="r", sha256="s", nbytes=1, rows=1, etag="e"),
    ),
    ("jobs", "job_get", jobs.job_get, dict(job_id=U)),
    ("jobs", "job_get_for_tenant", jobs.job_get, dict(job_id=U, tenant_id="t")),
    (
        "jobs",
        "job_items_chunk",
        jobs.job_items_chunk,
        dict(job_id=U, after=0, limit=10, max_bytes=1024),
    ),
    ("jobs", "job_events", jobs.job_events, dict(job_id=U)),
    (
        "jobs",
        "job_fail_if_leased",
        jobs.job_fail_if_leased,
        dict(job_id=U, lease_token=U, error_code="e", error_detail="d"),
    ),
    (
        "jobs",
        "job_requeue_if_leased",
        jobs.job_requeue_if_leased,
        dict(
            job_id=U,
            lease_token=U,
            message_id=U,
            delay_seconds=1.0,
            margin_seconds=1.0,
            error_code="e",
            error_detail="d",
        ),
    ),
    ("jobs", "job_cancel_if_leased", jobs.job_cancel_if_leased, dict(job_id=U, lease_token=U)),
    ("jobs", "job_request_cancel", jobs.job_request_cancel, dict(job_id=U, tenant_id="t")),
    (
        "jobs",
        "job_replay",
        jobs.job_replay,
        dict(original_id=U, job_id=U, message_id=U, max_attempts=3, deadline_seconds=60.0),
    ),
    ("jobs", "job_past_deadline", jobs.job_past_deadline, dict(job_id=U)),
    ("jobs", "job_lock_for_replay", jobs.job_lock_for_replay, dict(job_id=U)),
    ("jobs", "job_latest_replay", jobs.job_latest_replay, dict(job_id=U)),
    (
        "jobs",
        "job_list_for_tenant",
        jobs.job_list_for_tenant,
        dict(tenant_id="t", limit=10, status=None, before=(NOW, U)),
    ),
    (
        "admission",
        "admission_admit",
        admission.admission_admit,
        dict(tenant_id="t", capacity=1, default_quota=1),
    ),
    ("admission", "admission_usage", admission.admission_usage, dict(default_quota=1)),
    (
        "admission",
        "idempotency_reserve",
        admission.idempotency_reserve,
        dict(tenant_id="t", key="k", request_hash="h", job_id=U, retention_seconds=1.0),
    ),
    ("admission", "idempotency_get", admission.idempotency_get, dict(tenant_id="t", key="k")),
    ("admission", "idempotency_prune", admission.idempotency_prune, dict(limit=10)),
    (
        "schedules",
        "schedule_insert",
        schedules.schedule_insert,
        dict(
            schedule_id=U,
            tenant_id="t",
            name="n",
            cron=None,
            timezone=None,
            interval_seconds=60,
            payload={},
            format="json",
            next_due_at=NOW,
            catch_up="skip",
            max_catch_up=1,
            enabled=True,
        ),
    ),
    (
        "schedules",
        "schedule_get_for_tenant",
        schedules.schedule_get_for_tenant,
        dict(schedule_id=U, tenant_id="t"),
    ),
    (
        "schedules",
        "schedule_lock_for_tenant",
        schedules.schedule_lock_for_tenant,
        dict(schedule_id=U, tenant_id="t"),
    ),
    (
        "schedules",
        "schedule_list_for_tenant",
        schedules.schedule_list_for_tenant,
        dict(tenant_id="t", limit=1),
    ),
    (
        "schedules",
        "schedule_update",
        schedules.schedule_update,
        dict(
            schedule_id=U,
            tenant_id="t",
            name="n",
            cron=None,
            timezone=None,
            interval_seconds=60,
            payload={},
            format="json",
            next_due_at=NOW,
            catch_up="skip",
            max_catch_up=1,
            enabled=True,
        ),
    ),
    (
        "schedules",
        "schedule_delete",
        schedules.schedule_delete,
        dict(schedule_id=U, tenant_id="t"),
    ),
    ("schedules", "schedule_due_ids", schedules.schedule_due_ids, dict(now=NOW, limit=1)),
    (
        "schedules",
        "schedule_lock_due",
        schedules.schedule_lock_due,
        dict(schedule_id=U, now=NOW),
    ),
    (
        "schedules",
        "slot_claim",
        schedules.slot_claim,
        dict(schedule_id=U, scheduled_at=NOW, outcome="created", job_id=U),
    ),
    (
        "schedules",
        "schedule_advance",
        schedules.schedule_advance,
        dict(schedule_id=U, next_due_at=NOW, last_refusal=None),
    ),
    (
        "schedules",
        "schedule_runs",
        schedules.schedule_runs,
        dict(schedule_id=U, limit=1, before=None),
    ),
    ("tenants", "tenant_set_quota", tenants.tenant_set_quota, dict(tenant_id="t", quota=1)),
    ("tenants", "apikey_revoke", tenants.apikey_revoke, dict(key="k")),
    ("tenants", "apikey_list", tenants.apikey_list, dict(tenant_id=None)),
    ("recovery", "scan_expired_leases", recovery.scan_expired_leases, dict(limit=10)),
    ("recovery", "scan_cancel_queued", recovery.scan_cancel_queued, dict(limit=10)),
    ("recovery", "scan_fail_queued", recovery.scan_fail_queued, dict(limit=10)),
    (
        "recovery",
        "scan_redispatch_lost",
        recovery.scan_redispatch_lost,
        dict(threshold_seconds=60.0, max_factor=16, limit=10),
    ),
    (
        "recovery",
        "prune_terminal_jobs",
        recovery.prune_terminal_jobs,
        dict(retention_days=30.0, limit=10),
    ),
    (
        "recovery",
        "prune_sent_outbox",
        recovery.prune_sent_outbox,
        dict(retention_seconds=60.0, limit=10),
    ),
    ("recovery", "artifact_owners", recovery.artifact_owners, dict(job_ids=[U])),
    (
        "dead_letters",
        "dead_letters_page",
        dead_letters.dead_letters_page,
        dict(limit=10, before=None, reason=None, state="open", tenant_id=None),
    ),
    ("dead_letters", "dead_letter_get", dead_letters.dead_letter_get, dict(dead_letter_id=1)),
    (
        "dead_letters",
        "dead_letter_resolve",
        dead_letters.dead_letter_resolve,
        dict(dead_letter_id=1, actor="a", note=None),
    ),
    (
        "dead_letters",
        "dead_letter_mark_replayed",
        dead_letters.dead_letter_mark_replayed,
        dict(job_id=U, replay_job_id=U, actor="a"),
    ),
    (
        "dead_letters",
        "dead_letters_open_for_reason",
        dead_letters.dead_letters_open_for_reason,
        dict(reason="r", limit=1, after=0, tenant_id=None),
    ),
    (
        "operator_keys",
        "operator_key_insert",
        operator_keys.operator_key_insert,
        dict(key_id=U, key_hash=b"h", prefix="nex_op_x", label="l"),
    ),
    (
        "operator_keys",
        "operator_key_lookup",
        operator_keys.operator_key_lookup,
        dict(key_hash=b"h"),
    ),
    ("operator_keys", "operator_key_list", operator_keys.operator_key_list, {}),
    ("operator_keys", "operator_key_revoke", operator_keys.operator_key_revoke, dict(key="k")),
    ("broker", "broker_jobs_by_id", broker.broker_jobs_by_id, dict(job_ids=[U])),
    ("broker", "broker_sent_ages", broker.broker_sent_ages, dict(message_ids=[U])),
    (
        "broker",
        "broker_queued_without_pending_event",
        broker.broker_queued_without_pending_event,
        dict(grace_seconds=5.0, limit=10),
    ),
    (
        "notes",
        "note_upsert_by_path",
        notes.note_upsert_by_path,
        dict(
            tenant_id="t", source_path="a.md", title="a", content="", pinned=False, updated_at=NOW
        ),
    ),
    ("notes", "notes_existing_ids", notes.notes_existing_ids, dict(tenant_id="t", note_ids=[1])),
    ("notes", "notes_count", notes.notes_count, dict(tenant_id="t")),
    (
        "outbox",
        "outbox_claim_due",
        outbox.outbox_claim_due,
        dict(claim_token=U, limit=10, claim_seconds=30.0),
    ),
    ("outbox", "outbox_mark_sent", outbox.outbox_mark_sent, dict(ids=[U], claim_token=U)),
    (
        "outbox",
        "outbox_release",
        outbox.outbox_release,
        dict(event_id=U, claim_token=U, retry_seconds=1.0, error="boom"),
    ),
    ("outbox", "outbox_next_due_in", outbox.outbox_next_due_in, {}),
    ("tenants", "tenant_upsert", tenants.tenant_upsert, dict(tenant_id="t", name="T")),
    ("tenants", "tenant_get", tenants.tenant_get, dict(tenant_id="t")),
    (
        "tenants",
        "apikey_insert",
        tenants.apikey_insert,
        dict(key_id=U, tenant_id="t", key_hash=b"h", prefix="nex_x", scopes=["admin"], label=""),
    ),
    ("tenants", "apikey_lookup", tenants.apikey_lookup, dict(key_hash=b"h")),
]


METRICS_STATEMENTS = {
    ("metrics", name)
    for name in (
        "metrics_jobs_by_status",
        "metrics_oldest_queued",
        "metrics_outbox",
        "metrics_expired_leases",
        "metrics_dead_letters",
    )
}


def test_store_table_covers_every_shipped_statement() -> None:
    shipped = {(agg, name) for agg, text in shipped_files().items() for name in parse(text)}
    assert {(agg, name) for agg, name, _, _ in STORE_CALLS} | METRICS_STATEMENTS == shipped


def test_metrics_snapshot_runs_each_gauge_statement_once_under_a_timeout() -> None:
    from exportcore.settings import Settings
    from exportcore.store.metrics import metrics_snapshot

    conn = RecordingConn()
    snapshot = metrics_snapshot(conn, Settings(), timeout_ms=1500)  # type: ignore[arg-type]
    statements = [stmt for stmt, _ in conn.calls]
    assert conn.calls[0] == ("SELECT set_config('statement_timeout', %s, true)", ("1500",))
    for _, name in METRICS_STATEMENTS:
        assert statements.count(q("metrics", name)) == 1
    assert statements.count(q("admission", "admission_usage")) == 1
    assert snapshot["outbox_unpublished"] == 0 and snapshot["expired_leases"] == 0


@pytest.mark.parametrize(
    ("aggregate", "name", "func", "kwargs"), STORE_CALLS, ids=[c[1] for c in STORE_CALLS]
)
def test_store_wrapper_passes_exactly_the_statement_placeholders(
    aggregate: str, name: str, func: Any, kwargs: dict[str, Any]
) -> None:
    conn = RecordingConn()
    func(conn, **kwargs)
    [(statement, params)] = conn.calls
    assert statement == q(aggregate, name)
    assert set(params or {}) == placeholders(statement)
