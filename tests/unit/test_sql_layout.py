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
    "notes": {"notes", "note_tombstones", "note_versions"},
    "checkpoints": {"export_checkpoints", "export_checkpoint_segments"},
    "manifests": {"export_manifests"},
    "envelopes": {"export_envelopes"},
    "operator_actions": {"operator_actions"},
    "bulk_actions": {"bulk_actions"},
    "dispatch_pauses": {"dispatch_pauses"},
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
        "dispatch_pauses": ("dispatch_pause",),
        "notes": ("note_", "notes_"),
        "checkpoints": ("checkpoint_",),
        "manifests": ("manifest_",),
        "envelopes": ("envelope_",),
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


# docs/architecture.md INV-17 children-with-their-job: the hot child rows of a job have no
# foreign key (migration 0017); the statement that writes one must insert, update or lock
# the job itself.
HOT_CHILDREN = {"export_job_items", "export_outbox", "export_job_events"}
WITH_THE_JOB = re.compile(
    r"\b(?:INSERT\s+INTO|UPDATE)\s+export_jobs\b"
    r"|\bFROM\s+export_jobs\b[^;]*?\bFOR\s+(?:(?:NO\s+)?KEY\s+)?(?:UPDATE|SHARE)\b",
    re.I | re.S,
)


def test_hot_child_rows_are_written_by_a_statement_that_holds_their_job() -> None:
    """Every statement that inserts a snapshot item, an outbox event or a history event also
    inserts, updates or row-locks ``export_jobs`` (at least FOR KEY SHARE, the lock the
    foreign key took), so the job exists and cannot be deleted
    while its child is written. (job_replay's ``replayed`` event on the original: the
    original is locked by job_lock_for_replay in the same transaction, exportcore.replays.)"""
    writers = []
    for name, statements in files().items():
        for stmt_name, statement in statements.items():
            body = "\n".join(line.split("--", 1)[0] for line in statement.splitlines())
            children = {
                t.lower()
                for verb, t in WRITE.findall(body)
                if verb.upper().startswith("INSERT") and t.lower() in HOT_CHILDREN
            }
            if children:
                writers.append(stmt_name)
                assert WITH_THE_JOB.search(body), f"{name}.sql {stmt_name} writes {children}"
    assert {"job_submit", "job_claim_many", "outbox_mark_sent_and_claim_due"} <= set(writers)


# docs/architecture.md "SQL by table": a statement reads whole where it is written. What
# several statements must write alike is written out in each of them (or is one call of a
# database function with the same arguments), and these are the copies that must stay
# identical: (file, statements, first line, last line) of each. A copy's lines are compared
# without comments and indentation.
COPIES: dict[str, tuple[str, tuple[str, ...], str, str]] = {
    "batch lock order": (
        "jobs",
        (
            "job_finish_if_leased_many",
            "job_requeue_if_leased_many",
            "job_fail_if_leased_many",
            "job_cancel_if_leased_many",
        ),
        "), locked AS (",
        "FOR NO KEY UPDATE OF j",
    ),
    "lease guard": (
        "jobs",
        ("job_requeue_if_leased_many", "job_fail_if_leased_many", "job_cancel_if_leased_many"),
        "WHERE j.id = r.job_id",
        "AND (NOT %(expired_only)s OR j.lease_expires_at <= now())",
    ),
    "publisher's mark": (
        "outbox",
        ("outbox_mark_sent_and_claim_due", "outbox_mark_sent_many"),
        "UPDATE export_outbox o",
        "ORDER BY sent.id",
    ),
    "bulk cancel targets": (
        "bulk_actions",
        ("bulk_action_cancel_count", "bulk_action_cancel_targets"),
        "FROM exports_bulk_cancel_match(",
        "%(tenant_id)s::text, %(created_from)s::timestamptz, %(created_to)s::timestamptz) j",
    ),
    "bulk replay targets": (
        "bulk_actions",
        ("bulk_action_replay_count", "bulk_action_replay_targets"),
        "FROM exports_bulk_replay_match(",
        "%(queue)s::text, %(created_from)s::timestamptz, %(created_to)s::timestamptz) d",
    ),
    "checkpoint holder": (
        "checkpoints",
        ("checkpoint_save", "checkpoint_take_over", "checkpoint_discard"),
        "WITH holder AS (",
        "SELECT h.id FROM exports_lease_holder(%(job_id)s, %(lease_token)s) h",
    ),
}


def copy_of(statement: str, first: str, last: str) -> list[str]:
    """The code lines of ``statement`` (comments dropped, stripped) from the first that
    starts with ``first`` to the next after it that starts with ``last``; [] if absent."""
    lines = [line.split("--", 1)[0].strip() for line in statement.splitlines()]
    lines = [line for line in lines if line]
    for i, line in enumerate(lines):
        if line.startswith(first):
            for j in range(i + 1, len(lines)):
                if lines[j].startswith(last):
                    return lines[i : j + 1]
    return []


@pytest.mark.parametrize("what", sorted(COPIES))
def test_the_copies_of_what_statements_must_write_alike_are_identical(what: str) -> None:
    aggregate, names, first, last = COPIES[what]
    statements = files()[aggregate]
    copies = {name: copy_of(statements[name], first, last) for name in names}
    assert all(len(c) >= 2 for c in copies.values()), copies
    assert len({tuple(c) for c in copies.values()}) == 1, copies


def test_the_publishers_mark_locks_its_jobs_as_the_batch_transitions_do() -> None:
    """The mark stamps several jobs at once, so it takes their locks in the one order of
    jobs.sql's batch statements (the jobs.sql header)."""
    _, _, first, last = COPIES["batch lock order"]
    jobs_lock = copy_of(files()["jobs"]["job_finish_if_leased_many"], first, last)
    for name in ("outbox_mark_sent_and_claim_due", "outbox_mark_sent_many"):
        assert copy_of(files()["outbox"][name], first, last) == jobs_lock


def test_the_fair_claim_and_the_held_back_gauge_read_a_pairs_load_alike() -> None:
    """docs/architecture.md INV-16: the claim and the gauge read a pair's cap and jobs in
    flight through the one function exports_pair_load (migration 0020), with the same
    arguments."""
    first, last = "LEFT JOIN tenants t ON t.id = g.tenant_id", "%(fast_cap)s, %(bulk_cap)s"
    claim = copy_of(files()["outbox"]["outbox_mark_sent_and_claim_due"], first, last)
    gauge = copy_of(files()["metrics"]["metrics_tenant_backlog"], first, last)
    assert len(claim) == 3 and claim == gauge
    assert claim[1].startswith("CROSS JOIN LATERAL exports_pair_load(g.tenant_id, g.queue,")


def test_the_fair_claim_and_the_held_back_gauge_skip_a_paused_pair_alike() -> None:
    """An operator's pause (dispatch_pauses.sql) leaves a pair's events unclaimed and not
    counted as held by its cap: the claim and the held-back gauge test it with the same
    words, after the pair's load."""
    first, last = "WHERE NOT EXISTS (SELECT 1 FROM dispatch_pauses p", "AND (p.tenant_id IS NULL"
    claim = copy_of(files()["outbox"]["outbox_mark_sent_and_claim_due"], first, last)
    gauge = copy_of(files()["metrics"]["metrics_tenant_backlog"], first, last)
    assert len(claim) == 3 and claim == gauge


SQL_CLAUSE = re.compile(r"\b(SELECT|FROM|WHERE|JOIN|WITH|UNION|GROUP|ORDER|LIMIT)\b", re.I)


def depth_zero(text: str) -> str:
    """``text`` without what stands inside parentheses."""
    out, depth = [], 0
    for ch in text:
        depth += ch == "("
        if depth == 0:
            out.append(ch)
        depth -= ch == ")"
    return "".join(out)


def test_a_fragment_is_a_column_list_of_its_own_file() -> None:
    """The only SQL a file writes once and includes is a list of columns (sqlc's
    ``embed``): no clause outside parentheses, no CTE, and no include of another file's
    fragment (the loader refuses ``{{file.name}}``)."""
    root = resources.files(sql)
    found = []
    for p in root.iterdir():
        if not p.name.endswith(".sql"):
            continue
        text = p.read_text("utf-8")
        assert not re.search(r"\{\{\s*[a-z_]+\.", text), p.name
        for name, body in sql.fragments(text).items():
            found.append(name)
            top = depth_zero(re.sub(r"\{\{[^}]*\}\}", "x", body))
            assert not SQL_CLAUSE.search(top), f"{p.name} fragment {name} is not a column list"
            assert not re.search(r"\bAS\s*$", top.strip(), re.I), name
    assert sorted(found) == [
        "bulk_action_columns",
        "item_note_columns",
        "job_progress",
        "job_row",
        "job_row_columns",
    ]
