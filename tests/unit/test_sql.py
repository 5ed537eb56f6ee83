"""Named SQL statements: the parser, every shipped file, and the store wrappers' parameters."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from importlib import resources
from types import SimpleNamespace
from typing import Any
from uuid import uuid4

import pytest

from exportcore import sql
from exportcore.sql import parse, q
from exportcore.store import (
    admission,
    api_keys,
    broker,
    bulk_actions,
    checkpoints,
    console,
    dead_letters,
    dispatch_pauses,
    envelopes,
    idempotency_keys,
    jobs,
    manifests,
    notes,
    operator_actions,
    operator_keys,
    outbox,
    schedules,
    tenants,
    webhook_endpoints,
    webhook_messages,
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
        "api_keys",
        "notes",
        "outbox",
        "tenants",
        "idempotency_keys",
        "dead_letters",
        "admission",
        "metrics",
        "schedules",
        "webhook_endpoints",
        "checkpoints",
        "manifests",
        "envelopes",
        "webhook_messages",
        "console",
        "console_sessions",
        "operator_keys",
        "broker",
        "operator_actions",
        "bulk_actions",
        "dispatch_pauses",
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

    def execute(
        self, statement: str, params: dict[str, Any] | None = None, prepare: bool | None = None
    ) -> RecordingConn:
        self.calls.append((statement, params))
        return self

    def cursor(self, row_factory: Any = None) -> RecordingConn:
        return self

    def pipeline(self) -> RecordingConn:
        return self

    def transaction(self) -> RecordingConn:
        return self

    def __enter__(self) -> RecordingConn:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def fetchone(self) -> dict[str, Any]:
        return {
            "ids": [],
            "n": 0,
            "seconds": None,
            "past": False,
            "marked": 0,
            "delivered": 0,
            "next_due_in": None,
            "open": 0,
            "refused": 1,
            "paused": False,
            "waiting": 0,
            "prepared": 0,
        }

    def fetchall(self) -> list[dict[str, Any]]:
        return []

    def __iter__(self) -> Any:
        return iter(())

    rowcount = 0


U = uuid4()
NOW = datetime(2024, 1, 1, tzinfo=UTC)

# The columns a schedule's insert and update both write, and a webhook endpoint's (its
# insert adds the secret).
SCHEDULE_FIELDS: dict[str, Any] = dict(
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
    overlap="skip",
    jitter=0,
    enabled=True,
)
ENDPOINT_FIELDS: dict[str, Any] = dict(
    endpoint_id=U,
    tenant_id="t",
    url="https://x.example/",
    description="",
    events=["export.failed"],
    enabled=True,
)

SUBMIT = dict(
    job_id=U,
    message_id=U,
    tenant_id="t",
    fmt="json",
    payload={},
    request_hash="h",
    max_attempts=3,
    deadline_seconds=60.0,
    max_selection=10,
    fast_queue_max_notes=30,
    capacity=10,
    default_quota=10,
)

STORE_CALLS: list[tuple[str, str, Any, dict[str, Any]]] = [
    ("jobs", "job_submit", jobs.job_submit, {**SUBMIT, "note_ids": [1]}),
    ("jobs", "job_submit", jobs.job_submit_committed, {**SUBMIT, "note_ids": [1]}),
    ("jobs", "job_submit", jobs.job_submit, {**SUBMIT, "note_ids": None}),
    (
        "jobs",
        "job_submit_many",
        jobs.job_submit_many,
        dict(
            rows=[jobs.SubmitRow(U, U, "t", "json", {}, (1, 2), "h")],
            max_attempts=3,
            deadline_seconds=60.0,
            max_selection=10,
            fast_queue_max_notes=30,
            capacity=10,
            default_quota=10,
        ),
    ),
    (
        "jobs",
        "job_claim_many",
        jobs.job_claim_many,
        dict(job_ids=[U], message_ids=[None], lease_seconds=30.0),
    ),
    ("jobs", "job_claim_many", jobs.job_claim, dict(job_id=U, message_id=None, lease_seconds=30.0)),
    ("jobs", "job_claim_refusal_many", jobs.job_claim_refusal_many, dict(job_ids=[U])),
    ("jobs", "job_claim_refusal_many", jobs.job_claim_refusal, dict(job_id=U)),
    (
        "jobs",
        "job_items_first_chunk_many",
        jobs.job_items_first_chunk_many,
        dict(job_ids=[U], limit=10, max_bytes=1024),
    ),
    (
        "jobs",
        "job_renew_lease",
        jobs.job_renew_lease,
        dict(job_id=U, lease_token=U, lease_seconds=30.0, progress=0),
    ),
    (
        "jobs",
        "job_finish_if_leased_many",
        jobs.job_finish_if_leased_many,
        dict(finishes=[jobs.Finish(U, U, "r", "s", 1, 1, None)]),
    ),
    (
        "jobs",
        "job_finish_if_leased_many",
        jobs.job_finish_if_leased,
        dict(job_id=U, lease_token=U, result_ref="r", sha256="s", nbytes=1, rows=1, etag="e"),
    ),
    ("jobs", "job_lock_lease_expired", jobs.job_lock_lease_expired, dict(limit=10)),
    ("jobs", "job_get", jobs.job_get, dict(job_id=U)),
    ("jobs", "job_get_for_tenant", jobs.job_get, dict(job_id=U, tenant_id="t")),
    (
        "jobs",
        "job_items_chunk",
        jobs.job_items_chunk,
        dict(job_id=U, after=0, limit=10, max_bytes=1024),
    ),
    ("jobs", "job_events", jobs.job_events, dict(job_id=U, limit=10, after=(NOW, 1))),
    (
        "jobs",
        "job_mark_replayed",
        jobs.job_mark_replayed,
        dict(job_id=U, replay_id=U, corrected=["format"]),
    ),
    (
        "jobs",
        "job_fail_if_leased_many",
        jobs.job_fail_if_leased,
        dict(job_id=U, lease_token=U, error_code="e", error_detail="d"),
    ),
    (
        "jobs",
        "job_fail_if_leased_many",
        jobs.job_fail_if_leased_many,
        dict(failures=[jobs.Fail(U, U, "e", "d")], expired_only=True),
    ),
    (
        "jobs",
        "job_requeue_if_leased_many",
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
    (
        "jobs",
        "job_requeue_if_leased_many",
        jobs.job_requeue_if_leased_many,
        dict(requeues=[jobs.Requeue(U, U, U, 1.0, "e", "d")], margin_seconds=1.0),
    ),
    (
        "jobs",
        "job_cancel_if_leased_many",
        jobs.job_cancel_if_leased,
        dict(job_id=U, lease_token=U),
    ),
    (
        "jobs",
        "job_cancel_if_leased_many",
        jobs.job_cancel_if_leased_many,
        dict(leases=[(U, U)], expired_only=True),
    ),
    (
        "jobs",
        "job_request_cancel_many",
        jobs.job_request_cancel_many,
        dict(job_ids=[U], tenant_id=None, detail={"requested_by": "operator"}),
    ),
    (
        "jobs",
        "job_replay",
        jobs.job_replay,
        dict(original_id=U, job_id=U, message_id=U, max_attempts=3, deadline_seconds=60.0),
    ),
    (
        "jobs",
        "job_replay_many",
        jobs.job_replay_many,
        dict(
            dead_letter_ids=[1],
            job_ids=[U],
            message_ids=[U],
            actor="a",
            max_attempts=3,
            deadline_seconds=60.0,
        ),
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
        "jobs",
        "job_list_for_tenant_labelled",
        jobs.job_list_for_tenant,
        dict(tenant_id="t", limit=10, status=None, before=None, labels={"tags": ["a"]}),
    ),
    (
        "jobs",
        "job_list_admin",
        jobs.job_list_admin,
        dict(limit=10, tenant_id=None, status="failed", labels={"tags": ["a"]}, before=None),
    ),
    (
        "admission",
        "admission_admit",
        admission.admission_admit,
        dict(tenant_id="t", capacity=1, default_quota=1),
    ),
    (
        "admission",
        "admission_admit_many",
        admission.admission_admit_many,
        dict(tenant_id="t", count=2, capacity=1, default_quota=1),
    ),
    ("admission", "admission_usage", admission.admission_usage, dict(default_quota=1)),
    ("admission", "admission_reconcile", admission.admission_reconcile, {}),
    ("admission", "admission_counters", admission.admission_counters, {}),
    (
        "idempotency_keys",
        "idempotency_key_reserve",
        idempotency_keys.idempotency_key_reserve,
        dict(tenant_id="t", key="k", request_hash="h", job_id=U, retention_seconds=1.0),
    ),
    (
        "idempotency_keys",
        "idempotency_key_get",
        idempotency_keys.idempotency_key_get,
        dict(tenant_id="t", key="k"),
    ),
    (
        "idempotency_keys",
        "idempotency_key_delete_expired",
        idempotency_keys.idempotency_key_delete_expired,
        dict(limit=10),
    ),
    (
        "schedules",
        "schedule_insert",
        schedules.schedule_insert,
        SCHEDULE_FIELDS,
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
        SCHEDULE_FIELDS,
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
        dict(schedule_id=U, scheduled_at=NOW, outcome="created", job_id=U, trigger="manual"),
    ),
    (
        "schedules",
        "schedule_active_job",
        schedules.schedule_active_job,
        dict(schedule_id=U, window_seconds=7200.0),
    ),
    (
        "schedules",
        "schedule_active_slot_jobs",
        schedules.schedule_active_slot_jobs,
        dict(schedule_id=U, window_seconds=7200.0, limit=20),
    ),
    (
        "schedules",
        "schedule_lock_for_backfill",
        schedules.schedule_lock_for_backfill,
        dict(schedule_id=U),
    ),
    (
        "schedules",
        "slot_claim_backfill",
        schedules.slot_claim_backfill,
        dict(schedule_id=U, scheduled_at=NOW, job_id=U, detail="backfilled"),
    ),
    (
        "schedules",
        "slot_get",
        schedules.slot_get,
        dict(schedule_id=U, trigger="schedule", scheduled_at=NOW),
    ),
    (
        "schedules",
        "schedule_advance",
        schedules.schedule_advance,
        dict(schedule_id=U, next_due_at=NOW),
    ),
    (
        "schedules",
        "schedule_refuse",
        schedules.schedule_refuse,
        dict(schedule_id=U, retry_at=NOW, last_refusal={"code": "quota_exceeded"}),
    ),
    (
        "schedules",
        "schedule_pause",
        schedules.schedule_pause,
        dict(schedule_id=U, reason="unknown_notes", detail="d", now=NOW),
    ),
    (
        "schedules",
        "schedule_tenant_headroom",
        schedules.schedule_tenant_headroom,
        dict(tenant_id="t", default_quota=1),
    ),
    (
        "tenants",
        "tenant_set_rate",
        tenants.tenant_set_rate,
        dict(tenant_id="t", rate=1.0, burst=1),
    ),
    ("tenants", "tenant_submit_limit", tenants.tenant_submit_limit, dict(tenant_id="t")),
    ("schedules", "schedule_tenant_lock", schedules.schedule_tenant_lock, dict(tenant_id="t")),
    (
        "schedules",
        "schedule_count_for_tenant",
        schedules.schedule_count_for_tenant,
        dict(tenant_id="t"),
    ),
    (
        "schedules",
        "schedule_runs",
        schedules.schedule_runs,
        dict(schedule_id=U, limit=1, before=None),
    ),
    ("tenants", "tenant_set_quota", tenants.tenant_set_quota, dict(tenant_id="t", quota=1)),
    (
        "tenants",
        "tenant_set_recipients",
        tenants.tenant_set_recipients,
        dict(tenant_id="t", recipients=None),
    ),
    (
        "envelopes",
        "envelope_recipients_many",
        envelopes.envelope_recipients_many,
        dict(job_ids=[U]),
    ),
    (
        "envelopes",
        "envelope_record_many",
        envelopes.envelope_record_many,
        dict(rendered=[(SimpleNamespace(id=U, token=U), {"h": 1}, None)]),
    ),
    ("envelopes", "envelope_get", envelopes.envelope_get, dict(job_id=U, tenant_id="t")),
    (
        "tenants",
        "tenant_set_in_flight",
        tenants.tenant_set_in_flight,
        dict(tenant_id="t", bulk=1, fast=None),
    ),
    ("api_keys", "api_key_revoke", api_keys.api_key_revoke, dict(key="k")),
    ("api_keys", "api_key_list", api_keys.api_key_list, dict(tenant_id=None)),
    ("jobs", "job_cancel_if_queued_many", jobs.job_cancel_if_queued_many, dict(limit=10)),
    (
        "jobs",
        "job_fail_if_queued_exhausted_many",
        jobs.job_fail_if_queued_exhausted_many,
        dict(limit=10),
    ),
    (
        "jobs",
        "job_redispatch_if_lost_many",
        jobs.job_redispatch_if_lost_many,
        dict(threshold_seconds=60.0, max_factor=16, limit=10),
    ),
    (
        "jobs",
        "job_delete_terminal_before",
        jobs.job_delete_terminal_before,
        dict(retention_days=30.0, limit=10),
    ),
    (
        "outbox",
        "outbox_delete_sent_before",
        outbox.outbox_delete_sent_before,
        dict(retention_seconds=60.0, limit=10),
    ),
    ("jobs", "job_artifact_owners", jobs.job_artifact_owners, dict(job_ids=[U])),
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
        dict(key_id=U, key_hash=b"h", prefix="nex_op_x", label="l", role="admin"),
    ),
    (
        "operator_keys",
        "operator_key_lookup",
        operator_keys.operator_key_lookup,
        dict(key_hash=b"h"),
    ),
    ("operator_keys", "operator_key_list", operator_keys.operator_key_list, {}),
    ("operator_keys", "operator_key_revoke", operator_keys.operator_key_revoke, dict(key="k")),
    (
        "operator_keys",
        "operator_key_set_role",
        operator_keys.operator_key_set_role,
        dict(key="k", role="viewer"),
    ),
    (
        "dispatch_pauses",
        "dispatch_pause_insert",
        dispatch_pauses.dispatch_pause_insert,
        dict(queue="exports.bulk", tenant_id=None, reason="r", paused_by="a"),
    ),
    (
        "dispatch_pauses",
        "dispatch_pause_delete",
        dispatch_pauses.dispatch_pause_delete,
        dict(queue="exports.bulk", tenant_id="t"),
    ),
    (
        "dispatch_pauses",
        "dispatch_pause_get",
        dispatch_pauses.dispatch_pause_get,
        dict(queue="exports.bulk", tenant_id=None),
    ),
    ("dispatch_pauses", "dispatch_pauses_list", dispatch_pauses.dispatch_pauses_list, {}),
    (
        "dispatch_pauses",
        "dispatch_pause_covers",
        dispatch_pauses.dispatch_pause_covers,
        dict(queue="exports.fast", tenant_id="t"),
    ),
    (
        "operator_actions",
        "operator_action_insert",
        operator_actions.operator_action_insert,
        dict(
            actor_kind="operator",
            key_id=U,
            actor="a",
            action="replay",
            target_kind="job",
            target_id="x",
            tenant_id="t",
            job_id=U,
            filter=None,
            count=None,
            outcome="done",
            detail={},
        ),
    ),
    (
        "operator_actions",
        "operator_action_set_progress",
        operator_actions.operator_action_set_progress,
        dict(action_id=1, count=2, outcome="running", detail={}),
    ),
    (
        "operator_actions",
        "operator_action_get",
        operator_actions.operator_action_get,
        dict(action_id=1),
    ),
    (
        "operator_actions",
        "operator_actions_page",
        operator_actions.operator_actions_page,
        dict(limit=10, action="replay", job_id=U),
    ),
    (
        "operator_actions",
        "operator_actions_for_job",
        operator_actions.operator_actions_for_job,
        dict(job_id=U, limit=10),
    ),
    (
        "operator_actions",
        "operator_action_delete_before",
        operator_actions.operator_action_delete_before,
        dict(retention_seconds=60.0, limit=10),
    ),
    (
        "bulk_actions",
        "bulk_action_cancel_count",
        bulk_actions.bulk_action_count,
        dict(kind="cancel", filters={"tenant_id": "t"}, as_of=NOW),
    ),
    (
        "bulk_actions",
        "bulk_action_replay_count",
        bulk_actions.bulk_action_count,
        dict(kind="replay", filters={"reason": "r"}, as_of=NOW),
    ),
    (
        "bulk_actions",
        "bulk_action_cancel_targets",
        bulk_actions.bulk_action_targets,
        dict(kind="cancel", filters={}, as_of=NOW, after=None, limit=10),
    ),
    (
        "bulk_actions",
        "bulk_action_replay_targets",
        bulk_actions.bulk_action_targets,
        dict(kind="replay", filters={}, as_of=NOW, after="3", limit=10),
    ),
    (
        "bulk_actions",
        "bulk_action_insert",
        bulk_actions.bulk_action_insert,
        dict(
            request_id=U,
            kind="cancel",
            filters={},
            as_of=NOW,
            confirmed=3,
            audit_id=1,
            actor="a",
        ),
    ),
    ("bulk_actions", "bulk_action_get", bulk_actions.bulk_action_get, dict(bulk_id=1)),
    (
        "bulk_actions",
        "bulk_action_get_by_request",
        bulk_actions.bulk_action_get_by_request,
        dict(request_id=U),
    ),
    (
        "bulk_actions",
        "bulk_action_claim",
        bulk_actions.bulk_action_claim,
        dict(bulk_id=1, lease_token=U, lease_seconds=60.0),
    ),
    (
        "bulk_actions",
        "bulk_action_advance",
        bulk_actions.bulk_action_advance,
        dict(
            bulk_id=1,
            lease_token=U,
            cursor="c",
            seen=1,
            acted=1,
            skipped=0,
            state="running",
            stop_reason=None,
            lease_seconds=60.0,
        ),
    ),
    ("bulk_actions", "bulk_action_running", bulk_actions.bulk_actions_running, dict(limit=5)),
    (
        "bulk_actions",
        "bulk_action_as_of_future",
        bulk_actions.bulk_action_as_of_future,
        dict(as_of=NOW),
    ),
    ("bulk_actions", "bulk_action_nudge", bulk_actions.bulk_action_nudge, dict(bulk_id=1)),
    (
        "bulk_actions",
        "bulk_action_claim_next",
        bulk_actions.bulk_action_claim_next,
        dict(lease_token=U, lease_seconds=60.0),
    ),
    (
        "bulk_actions",
        "bulk_action_release",
        bulk_actions.bulk_action_release,
        dict(bulk_id=1, lease_token=U),
    ),
    (
        "console",
        "console_webhooks_page",
        console.webhooks_page,
        dict(limit=10, sample=500, tenant_id="t", after=("t", NOW, U)),
    ),
    ("console", "console_webhook", console.webhook, dict(endpoint_id=U)),
    (
        "console",
        "console_jobs_by_id_range",
        console.jobs_by_id_range,
        dict(low=U, high=U, suffix="5e6f", limit=10),
    ),
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
    ("notes", "notes_page", notes.notes_page, dict(tenant_id="t", limit=10, after=None)),
    ("notes", "notes_delete_many", notes.notes_delete_many, dict(tenant_id="t", note_ids=[1])),
    (
        "notes",
        "notes_delete_not_in_paths",
        notes.notes_delete_not_in_paths,
        dict(tenant_id="t", paths=["a.md"]),
    ),
    ("notes", "note_versions_prune_mark", notes.note_versions_prune_mark, dict(limit=10)),
    ("notes", "note_versions_prune_in_progress", notes.note_versions_prune_in_progress, {}),
    (
        "notes",
        "note_versions_prune_waiting",
        notes.note_versions_prune_waiting,
        dict(transactions=[(1, datetime(2026, 1, 1, tzinfo=UTC))]),
    ),
    (
        "notes",
        "note_versions_prune_sweep",
        notes.note_versions_prune_sweep,
        dict(versions=[(1, 2)]),
    ),
    (
        "schedules",
        "schedule_recent_succeeded",
        schedules.schedule_recent_succeeded,
        dict(schedule_id=U, limit=7),
    ),
    ("checkpoints", "checkpoint_get", checkpoints.checkpoint_get, dict(job_id=U)),
    (
        "checkpoints",
        "checkpoint_segments",
        checkpoints.checkpoint_segments,
        dict(job_id=U, ordinal=1),
    ),
    (
        "checkpoints",
        "checkpoint_save",
        checkpoints.checkpoint_save,
        dict(
            job_id=U,
            lease_token=U,
            layout=1,
            artifact_key="k",
            ordinal=1,
            rows=1,
            nbytes=1,
            sha256="s",
            upload_id=None,
            parts=[],
            renderer={},
            state=b"",
        ),
    ),
    (
        "checkpoints",
        "checkpoint_take_over",
        checkpoints.checkpoint_take_over,
        dict(
            job_id=U,
            lease_token=U,
            old_token=U,
            ordinal=1,
            artifact_key="k",
            upload_id=None,
            parts=[],
            seconds=0.1,
        ),
    ),
    (
        "checkpoints",
        "checkpoint_discard",
        checkpoints.checkpoint_discard,
        dict(job_id=U, lease_token=U),
    ),
    (
        "checkpoints",
        "checkpoint_delete_finished",
        checkpoints.checkpoint_delete_finished,
        dict(job_id=U, lease_token=U),
    ),
    (
        "checkpoints",
        "checkpoint_keys_in_use_many",
        checkpoints.checkpoint_keys_in_use_many,
        dict(job_ids=[U]),
    ),
    ("checkpoints", "checkpoint_progress", checkpoints.checkpoint_progress, dict(job_id=U)),
    (
        "manifests",
        "manifest_record_many",
        manifests.manifest_record_many,
        dict(
            job_ids=[U], lease_tokens=[U], sha256s=["s"], key_ids=[None], notes=[1], tombstones=[0]
        ),
    ),
    (
        "outbox",
        "outbox_mark_sent_and_claim_due",
        outbox.outbox_mark_sent_and_claim_due,
        dict(
            claim_token=U,
            limit=10,
            claim_seconds=30.0,
            bulk_cap=1,
            fast_cap=8,
            sent=[outbox.Sent(U, U, NOW)],
            fast_limit=2,
        ),
    ),
    ("outbox", "outbox_claim_lock", outbox.outbox_claim_lock, {}),
    (
        "outbox",
        "outbox_mark_sent_many",
        outbox.outbox_mark_sent_many,
        dict(sent=[outbox.Sent(U, U, NOW)]),
    ),
    (
        "outbox",
        "outbox_mark_delivered",
        outbox.outbox_mark_delivered,
        dict(message_ids=[U], take_token=U, carrier=U),
    ),
    (
        "outbox",
        "outbox_release_many",
        outbox.outbox_release_many,
        dict(ids=[U], claim_token=U, retry_seconds=[1.0], error="boom"),
    ),
    ("tenants", "tenant_upsert", tenants.tenant_upsert, dict(tenant_id="t", name="T")),
    ("tenants", "tenant_get", tenants.tenant_get, dict(tenant_id="t")),
    (
        "api_keys",
        "api_key_insert",
        api_keys.api_key_insert,
        dict(key_id=U, tenant_id="t", key_hash=b"h", prefix="nex_x", scopes=["admin"], label=""),
    ),
    ("api_keys", "api_key_lookup", api_keys.api_key_lookup, dict(key_hash=b"h")),
    (
        "webhook_endpoints",
        "webhook_endpoint_insert",
        webhook_endpoints.endpoint_insert,
        {
            **ENDPOINT_FIELDS,
            "secret_ciphertext": "gAAAAAx",
            "secret_key_id": "0123abcd",
            "secret_hint": "whsec_x…",
        },
    ),
    (
        "webhook_endpoints",
        "webhook_tenant_lock",
        webhook_endpoints.tenant_lock,
        dict(tenant_id="t"),
    ),
    (
        "webhook_endpoints",
        "webhook_endpoint_count_for_tenant",
        webhook_endpoints.endpoint_count_for_tenant,
        dict(tenant_id="t"),
    ),
    (
        "webhook_endpoints",
        "webhook_endpoint_get_for_tenant",
        webhook_endpoints.endpoint_get_for_tenant,
        dict(endpoint_id=U, tenant_id="t"),
    ),
    (
        "webhook_endpoints",
        "webhook_endpoint_lock_for_tenant",
        webhook_endpoints.endpoint_lock_for_tenant,
        dict(endpoint_id=U, tenant_id="t"),
    ),
    (
        "webhook_endpoints",
        "webhook_endpoint_list_for_tenant",
        webhook_endpoints.endpoint_list_for_tenant,
        dict(tenant_id="t", limit=1),
    ),
    (
        "webhook_endpoints",
        "webhook_endpoint_update",
        webhook_endpoints.endpoint_update,
        ENDPOINT_FIELDS,
    ),
    (
        "webhook_endpoints",
        "webhook_endpoint_delete",
        webhook_endpoints.endpoint_delete,
        dict(endpoint_id=U, tenant_id="t"),
    ),
    (
        "webhook_endpoints",
        "webhook_endpoint_rotate_secret",
        webhook_endpoints.endpoint_rotate_secret,
        dict(
            endpoint_id=U,
            tenant_id="t",
            secret_ciphertext="gAAAAAy",
            secret_key_id="0123abcd",
            secret_hint="whsec_y…",
            overlap_seconds=60,
        ),
    ),
    (
        "webhook_messages",
        "webhook_message_insert",
        webhook_messages.message_insert,
        dict(
            message_id=U,
            endpoint_id=U,
            tenant_id="t",
            event_type="webhook.test",
            subject_id=U,
            data={},
        ),
    ),
    (
        "webhook_messages",
        "webhook_message_claim_due",
        webhook_messages.claim_due,
        dict(
            claim_token=U,
            limit=1,
            claim_seconds=60,
            per_endpoint=4,
            per_tenant=8,
            threshold=5,
            key_ids=["0123abcd"],
        ),
    ),
    ("webhook_messages", "webhook_message_claim_lock", webhook_messages.claim_lock, {}),
    (
        "webhook_endpoints",
        "webhook_endpoint_secret_key_census",
        webhook_endpoints.secret_key_census,
        {},
    ),
    (
        "webhook_endpoints",
        "webhook_endpoint_secrets_to_reencrypt",
        webhook_endpoints.secrets_to_reencrypt,
        dict(current_key_id="0123abcd", limit=10),
    ),
    (
        "webhook_endpoints",
        "webhook_endpoint_secrets_reencrypted",
        webhook_endpoints.secrets_reencrypted,
        dict(
            rows=[
                dict(
                    id=U,
                    ciphertext="gAAAAAz",
                    key_id="0123abcd",
                    previous_ciphertext=None,
                    previous_key_id=None,
                )
            ]
        ),
    ),
    (
        "webhook_messages",
        "webhook_message_extend_claims",
        webhook_messages.extend_claims,
        dict(message_ids=[U], claim_tokens=[U], claim_seconds=60.0, within_seconds=40.0),
    ),
    ("webhook_messages", "webhook_message_pass_begin", webhook_messages.pass_begin, {}),
    (
        "webhook_endpoints",
        "webhook_endpoints_lock",
        webhook_endpoints.endpoints_lock,
        dict(ids=[U]),
    ),
    (
        "webhook_endpoints",
        "webhook_endpoints_set_health",
        webhook_endpoints.endpoints_set_health,
        dict(
            rows=[
                dict(
                    id=U,
                    enabled=True,
                    failures=0,
                    failing_since=None,
                    open_until=None,
                    disabled_reason=None,
                    last_error=None,
                    last_success_at=NOW,
                    last_failure_at=None,
                )
            ]
        ),
    ),
    (
        "webhook_messages",
        "webhook_message_record_attempts",
        webhook_messages.record_attempts,
        dict(columns={k: [] for k in webhook_messages.RECORD_KEYS}),
    ),
    (
        "webhook_messages",
        "webhook_attempts_for_endpoint",
        webhook_messages.attempts_for_endpoint,
        dict(endpoint_id=U, limit=1, before_id=None, outcome="timeout", since=NOW),
    ),
    (
        "webhook_messages",
        "webhook_message_recover_since",
        webhook_messages.recover_since,
        dict(endpoint_id=U, tenant_id="t", since=NOW),
    ),
    (
        "webhook_messages",
        "webhook_message_redeliver",
        webhook_messages.redeliver,
        dict(attempt_id=1, endpoint_id=U, tenant_id="t"),
    ),
    (
        "webhook_messages",
        "webhook_message_delete_before",
        webhook_messages.prune,
        dict(retention_seconds=60, limit=10),
    ),
    ("webhook_messages", "webhook_message_gauges", webhook_messages.gauges, {}),
    (
        "admission",
        "admission_refusal_record",
        admission.admission_refusal_record,
        dict(tenant_id="t", code="quota_exceeded"),
    ),
    ("console", "console_queue_counts", console.queue_counts, {}),
    ("console", "console_finished_by_minute", console.finished_by_minute, dict(minutes=60)),
    ("console", "console_open_dead_letters", console.open_dead_letters, {}),
    (
        "console",
        "console_jobs_page",
        console.jobs_page,
        dict(limit=10, status="failed", tenant_id="t", before=(NOW, U)),
    ),
    ("console", "console_job", console.job, dict(job_id=U)),
    ("console", "console_job_events", console.job_events, dict(job_id=U, limit=10)),
    ("console", "console_replay_chain", console.replay_chain, dict(job_id=U)),
    ("console", "console_dead_letter_groups", console.dead_letter_groups, dict(reason="r")),
    ("console", "console_reasons", console.reasons, {}),
    (
        "console",
        "console_schedules_page",
        console.schedules_page,
        dict(limit=10, runs=5, after=("t", NOW, U)),
    ),
    ("console", "console_schedule", console.schedule, dict(schedule_id=U)),
    (
        "console",
        "console_tenants_page",
        console.tenants_page,
        dict(limit=10, default_quota=5, after=None, prefix=None),
    ),
    (
        "console_sessions",
        "console_session_insert",
        console.session_insert,
        dict(token_hash=b"h", key_id=U, csrf_token="c", lifetime_seconds=60.0),
    ),
    (
        "console_sessions",
        "console_session_touch",
        console.session_touch,
        dict(token_hash=b"h", idle_seconds=60.0, touch_seconds=30.0),
    ),
    ("console_sessions", "console_session_delete", console.session_delete, dict(token_hash=b"h")),
    (
        "console_sessions",
        "console_session_prune",
        console.session_prune,
        dict(idle_seconds=60.0, limit=10),
    ),
]


METRICS_STATEMENTS = {
    ("metrics", name)
    for name in (
        "metrics_jobs_by_status",
        "metrics_oldest_queued",
        "metrics_outbox",
        "metrics_expired_leases",
        "metrics_dead_letters",
        "metrics_tenant_backlog",
        "metrics_schedules",
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
    lock = q("outbox", "outbox_claim_lock")  # the claim's transaction takes it first
    if name == "outbox_mark_sent_and_claim_due":
        assert conn.calls[0] == (lock, None)
        del conn.calls[0]
    explicit = name == "job_submit_many" or kwargs.get("note_ids") is not None
    if name.startswith("job_submit") and explicit:  # explicit ids: on their generic plan
        assert conn.calls[0] == (jobs.GENERIC_PLAN, None)
        del conn.calls[0]
    [(statement, params)] = conn.calls
    assert statement == q(aggregate, name)
    assert set(params or {}) == placeholders(statement)


def test_the_pass_and_the_claim_commit_without_waiting_for_the_flush_unless_told() -> None:
    """docs/architecture.md, "Commits a crash may lose": the worker's claim and the
    publisher's pass set synchronous_commit = off for their own transaction first; with
    CLAIMS_SYNCHRONOUS_COMMIT they do not."""
    from exportcore.claims import claim_delivery
    from exportcore.domain import FAST_QUEUE
    from exportcore.settings import Settings

    for synchronous in (False, True):
        conn = RecordingConn()
        settings = Settings(claims_synchronous_commit=synchronous)
        claim_delivery(conn, settings, job_ids=[U], message_ids=[U], queue=FAST_QUEUE)  # type: ignore[arg-type]
        statements = [stmt for stmt, _ in conn.calls]
        assert (statements[0] == outbox.ASYNC_COMMIT) is not synchronous
        assert statements.count(outbox.ASYNC_COMMIT) == (0 if synchronous else 1)
        assert q("jobs", "job_claim_many") in statements
        conn = RecordingConn()
        outbox.outbox_mark_sent_and_claim_due(
            conn,  # type: ignore[arg-type]
            asynchronous_commit=not synchronous,
            claim_token=U,
            limit=1,
            claim_seconds=30.0,
            bulk_cap=1,
            fast_cap=8,
        )
        assert (conn.calls[0][0] == outbox.ASYNC_COMMIT) is not synchronous
