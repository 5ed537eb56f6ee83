"""SQL by table (docs/architecture.md, "SQL by table"): a statement lives in the file of the
table whose rows it changes, so every transition of a table is found in one file."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from exportcore import sql
from exportcore.sql import parse

# The tables each file may UPDATE or DELETE from (and INSERT into).
OWNS: dict[str, set[str]] = {
    "jobs": {"export_jobs", "export_job_items"},
    "outbox": {"export_outbox"},
    "dead_letters": {"export_dead_letters"},
    "admission": {"export_admission_counters", "tenant_admission_refusals"},
    "idempotency_keys": {"export_idempotency_keys"},
    "schedules": {"export_schedules", "export_schedule_slots"},
    "tenants": {"tenants"},
    "api_keys": {"api_keys"},
    "operator_keys": {"operator_keys"},
    "notes": {"notes", "note_tombstones"},
    "checkpoints": {"export_checkpoints", "export_checkpoint_segments"},
    "manifests": {"export_manifests"},
    "operator_actions": {"operator_actions"},
    "bulk_actions": {"bulk_actions"},
    "console_sessions": {"console_sessions"},
    "webhook_endpoints": {"webhook_endpoints"},
    "webhook_messages": {"webhook_messages", "webhook_attempts"},
    # read-only projections, one file per reader
    "console": set(),
    "metrics": set(),
    "broker": set(),
}
# What a transition writes beside its own row, in the same statement: the history event,
# the outbox event of a dispatch / retry / replay, the dead letter of a failure.
SIDE_INSERTS = {"export_job_events", "export_outbox", "export_dead_letters", "export_job_items"}
# The cross-table updates: the publisher's mark stamps the job's dispatch (read by the
# lost-dispatch rule; not derivable from the outbox, whose sent events are pruned); a bulk
# replay's batch (job_replay_many) moves each dead letter open -> replayed in the statement
# that writes its replay, the dead letter's state being the guard of "replayed once".
STAMPS = {
    ("outbox", "export_jobs"): {"last_dispatched_at", "dispatch_count"},
    ("jobs", "export_dead_letters"): {"state", "replay_job_id", "replayed_at", "replayed_by"},
}

WRITE = re.compile(r"\b(UPDATE|INSERT\s+INTO|DELETE\s+FROM)\s+([a-z_]+)(?:\s+[a-z]\b)?", re.I)


def files() -> dict[str, dict[str, str]]:
    root = resources.files(sql)
    return {
        p.name.removesuffix(".sql"): parse(p.read_text("utf-8"))
        for p in root.iterdir()
        if p.name.endswith(".sql")
    }


LOCKS = re.compile(r"\b(?:FOR\s+(?:NO\s+KEY\s+)?UPDATE|DO\s+UPDATE)\b", re.I)


def code(statement: str) -> str:
    """The statement without comments, row locks (``FOR UPDATE``) and upsert arms
    (``ON CONFLICT … DO UPDATE``, which change the INSERT's own table)."""
    text = "\n".join(line.split("--", 1)[0] for line in statement.splitlines())
    return LOCKS.sub(" ", text)


def set_columns(statement: str, table: str) -> set[str]:
    """Columns assigned by ``UPDATE table [alias] SET a = …, b = …`` (up to FROM/WHERE)."""
    m = re.search(
        rf"UPDATE\s+{table}(?:\s+[a-z])?\s+SET\s+(.*?)\s+(?:FROM|WHERE|RETURNING)\b",
        statement,
        re.I | re.S,
    )
    assert m, f"no SET of {table}"
    depth, parts, cur = 0, [], ""
    for ch in m.group(1):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return {p.split("=", 1)[0].strip() for p in parts}


def test_every_file_has_an_owner_entry() -> None:
    assert set(files()) == set(OWNS)


@pytest.mark.parametrize("name", sorted(OWNS))
def test_statements_change_only_the_tables_of_their_file(name: str) -> None:
    wrong = []
    for stmt_name, statement in files()[name].items():
        body = code(statement)
        for verb, table in WRITE.findall(body):
            table = table.lower()
            if table in OWNS[name]:
                continue
            if verb.upper().startswith("INSERT") and table in SIDE_INSERTS:
                continue
            allowed = STAMPS.get((name, table))
            if verb.upper() == "UPDATE" and allowed and set_columns(body, table) <= allowed:
                continue
            wrong.append(f"{stmt_name}: {verb} {table}")
    assert wrong == [], f"{name}.sql changes tables of another file: {wrong}"


def test_every_table_is_changed_from_one_file() -> None:
    owners: dict[str, list[str]] = {}
    for name, tables in OWNS.items():
        for t in tables:
            owners.setdefault(t, []).append(name)
    assert {t: o for t, o in owners.items() if len(o) > 1} == {}


def test_statement_names_start_with_their_entity() -> None:
    """Names are entity + verb + condition; the entity is the file's (singular) table."""
    prefixes = {
        "jobs": ("job_",),
        "outbox": ("outbox_",),
        "dead_letters": ("dead_letter",),
        "admission": ("admission_",),
        "idempotency_keys": ("idempotency_key_",),
        "schedules": ("schedule_", "slot_"),
        "tenants": ("tenant_",),
        "api_keys": ("api_key_",),
        "operator_keys": ("operator_key_",),
        "operator_actions": ("operator_action",),
        "bulk_actions": ("bulk_action_",),
        "notes": ("note_", "notes_"),
        "checkpoints": ("checkpoint_",),
        "manifests": ("manifest_",),
        "console_sessions": ("console_session_",),
        "webhook_endpoints": ("webhook_endpoint", "webhook_tenant_"),
        "webhook_messages": ("webhook_message_", "webhook_attempts_"),
        "console": ("console_",),
        "metrics": ("metrics_",),
        "broker": ("broker_",),
    }
    bad = [
        f"{f}.{n}"
        for f, statements in files().items()
        for n in statements
        if not n.startswith(prefixes[f])
    ]
    assert bad == []
