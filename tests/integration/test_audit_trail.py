"""The audit trail on real PostgreSQL: append-only in the database (revision 0021's trigger
refuses UPDATE, DELETE and TRUNCATE even to the superuser the tests connect as; the
processes' role ``notes_exports_app`` has no UPDATE of a row's facts, no DELETE, no
TRUNCATE), retention through ``operator_actions_prune`` only, and the changes that used to
leave no row: creating, changing and deleting a schedule, importing and deleting notes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import psycopg
import pytest
from pydantic import ValidationError

from exportcore import audit
from exportcore.artifacts import FileArtifactStore
from exportcore.audit import Actor
from exportcore.db import make_pool, transaction
from exportcore.recovery import RecoveryScanner
from exportcore.settings import Settings
from exportcore.store import operator_actions as action_store
from exportctl.importer import import_notes
from tests.support import create_tenant

APP_ROLE = "notes_exports_app"
EXPORTCTL = str(Path(sys.executable).parent / "exportctl")
REFUSED = psycopg.errors.ObjectNotInPrerequisiteState
OPERATOR = Actor(kind="operator", name="nex_op_test (tests)")


def rows(pool, sql: str, *args: Any) -> list[dict[str, Any]]:
    with pool.connection() as conn:
        return conn.execute(sql, args).fetchall()


def actions(pool, *names: str) -> list[dict[str, Any]]:
    """The audit rows of ``names``, oldest first."""
    return rows(
        pool, "SELECT * FROM operator_actions WHERE action = ANY(%s) ORDER BY id", list(names)
    )


def insert_row(pool, *, days_old: float, action: str = "cancel", outcome: str = "done") -> int:
    """An audit row written ``days_old`` days ago (an explicit ``at``: the superuser the
    tests connect as may insert one; nothing may change it afterwards)."""
    with pool.connection() as conn:
        row = conn.execute(
            "INSERT INTO operator_actions (at, actor_kind, actor, action, target_kind, outcome,"
            " count) VALUES (now() - make_interval(days => %s), 'system', 'tests', %s, 'job',"
            " %s, 0) RETURNING id",
            (days_old, action, outcome),
        ).fetchone()
    assert row is not None
    return int(row["id"])


# --- append-only, whoever asks ---------------------------------------------------------------


def test_update_delete_and_truncate_are_refused_even_to_the_superuser(pool) -> None:
    with transaction(pool) as conn:
        entry = audit.record(conn, OPERATOR, "cancel", target_kind="job", target_id="j")
        assert conn.execute(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
        ).fetchone()["rolsuper"]  # privileges would not stop this session: the trigger does
    for statement, said in (
        ("UPDATE operator_actions SET actor = 'someone else' WHERE id = %s", "may not be updated"),
        ("UPDATE operator_actions SET outcome = 'refused' WHERE id = %s", "may not be updated"),
        ("DELETE FROM operator_actions WHERE id = %s", "may not be deleted"),
        ("TRUNCATE operator_actions CASCADE", "TRUNCATE refused"),
    ):
        with pool.connection() as conn, pytest.raises(REFUSED) as refused:
            conn.execute(statement, (entry["id"],) if "%s" in statement else ())
        assert "append-only" in str(refused.value) and said in str(refused.value), statement
    # the mark retention uses does not let a recent row go either
    with pool.connection() as conn, pytest.raises(REFUSED), conn.transaction():
        conn.execute("SELECT set_config('notes_exports.audit_prune', 'on', true)")
        conn.execute("DELETE FROM operator_actions WHERE id = %s", (entry["id"],))
    [kept] = rows(pool, "SELECT actor, outcome FROM operator_actions WHERE id = %s", entry["id"])
    assert kept == {"actor": OPERATOR.name, "outcome": "done"}


def test_a_bulk_action_advances_its_own_row_while_it_runs_then_it_is_sealed(pool) -> None:
    with transaction(pool) as conn:
        entry = audit.record(
            conn, OPERATOR, "bulk_cancel", target_kind="filter", count=0, outcome="running"
        )
        plain = audit.record(conn, OPERATOR, "cancel", target_kind="job", outcome="running")
    with transaction(pool) as conn:  # what each batch does
        audit.advance(conn, entry["id"], count=3, outcome="running", detail={"batches": 1})
    for statement in (
        "UPDATE operator_actions SET count = 1 WHERE id = %s",  # never lower
        "UPDATE operator_actions SET actor = 'x', count = 4 WHERE id = %s",  # its facts stay
        "UPDATE operator_actions SET at = now() - interval '1 day' WHERE id = %s",
    ):
        with pool.connection() as conn, pytest.raises(REFUSED):
            conn.execute(statement, (entry["id"],))
    with pool.connection() as conn, pytest.raises(REFUSED):  # not a bulk action's row
        audit.advance(conn, plain["id"], count=1, outcome="done", detail={})
    with transaction(pool) as conn:
        audit.advance(conn, entry["id"], count=5, outcome="done", detail={"batches": 2})
    with pool.connection() as conn, pytest.raises(REFUSED):  # done: sealed
        audit.advance(conn, entry["id"], count=6, outcome="running", detail={})
    [row] = rows(
        pool, "SELECT count, outcome, detail FROM operator_actions WHERE id = %s", entry["id"]
    )
    assert (row["count"], row["outcome"], row["detail"]) == (5, "done", {"batches": 2})


def test_retention_prunes_only_rows_past_it_and_never_under_thirty_days(
    pool, settings: Settings
) -> None:
    old = insert_row(pool, days_old=45)
    recent = insert_row(pool, days_old=20)
    finished_bulk = insert_row(pool, days_old=45, action="bulk_replay", outcome="done")
    running_bulk = insert_row(pool, days_old=45, action="bulk_cancel", outcome="running")
    with pool.connection() as conn:
        for audit_id, state in ((finished_bulk, "done"), (running_bulk, "running")):
            conn.execute(
                "INSERT INTO bulk_actions (request_id, kind, filter, as_of, confirmed, state,"
                " audit_id, actor) VALUES (%s, 'cancel', '{}', now(), 0, %s, %s, 'tests')",
                (uuid4(), state, audit_id),
            )
    with pool.connection() as conn, pytest.raises(psycopg.errors.InvalidParameterValue) as low:
        action_store.operator_action_delete_before(conn, retention_seconds=7 * 86400, limit=10)
    assert "at least 30 days" in str(low.value)
    kept_40_days = settings.model_copy(update={"audit_retention_days": 40})
    scanner = RecoveryScanner(kept_40_days, pool, FileArtifactStore(settings.artifact_dir))
    assert scanner.prune_audit() == 2  # the old row and the finished bulk action's
    left = {r["id"] for r in rows(pool, "SELECT id FROM operator_actions")}
    assert left == {recent, running_bulk}
    runs = rows(pool, "SELECT audit_id FROM bulk_actions")
    assert [r["audit_id"] for r in runs] == [running_bulk]  # the finished run went with it
    assert old not in left
    with pytest.raises(ValidationError, match="30"):
        Settings(database_url=str(settings.database_url), audit_retention_days=7)


# --- the processes' role ---------------------------------------------------------------------


def test_the_processes_role_cannot_change_or_remove_audit_rows(pool) -> None:
    def has(sql: str, *args: Any) -> bool:
        [row] = rows(pool, f"SELECT {sql} AS ok", *args)
        return bool(row["ok"])

    table = "has_table_privilege(%s, 'operator_actions', %s)"
    for privilege in ("UPDATE", "DELETE", "TRUNCATE", "TRIGGER", "REFERENCES"):
        assert not has(table, APP_ROLE, privilege), privilege
    for privilege in ("SELECT", "INSERT"):
        assert has(table, APP_ROLE, privilege), privilege
    column = "has_column_privilege(%s, 'operator_actions', %s, 'UPDATE')"
    for name in ("count", "outcome", "detail"):  # a running bulk action's progress
        assert has(column, APP_ROLE, name), name
    for name in ("at", "actor", "actor_kind", "key_id", "action", "target_id", "tenant_id"):
        assert not has(column, APP_ROLE, name), name
    prune = "has_function_privilege(%s, 'operator_actions_prune(interval, integer)', 'EXECUTE')"
    assert has(prune, APP_ROLE)
    assert not has(prune, "public")
    # what the processes need elsewhere, and no more on the schema's version
    for name in ("export_jobs", "notes", "export_schedules", "bulk_actions"):
        assert has("has_table_privilege(%s, %s, 'DELETE')", APP_ROLE, name), name
    assert has("has_table_privilege(%s, 'alembic_version', 'SELECT')", APP_ROLE)
    assert not has("has_table_privilege(%s, 'alembic_version', 'UPDATE')", APP_ROLE)
    [role] = rows(pool, "SELECT rolcanlogin, rolsuper FROM pg_roles WHERE rolname = %s", APP_ROLE)
    assert role == {"rolcanlogin": False, "rolsuper": False}  # its members log in


@pytest.fixture
def app_user(pool, settings: Settings, servers) -> Iterator[Settings]:
    """A login user of the cluster that is a member of ``notes_exports_app``, as a
    deployment's processes connect: settings on this test's database as that user."""
    name = f"t_app_{uuid4().hex[:12]}"
    with psycopg.connect(servers.admin_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {name} LOGIN IN ROLE {APP_ROLE}")
    url = str(settings.database_url).replace("postgresql://postgres@", f"postgresql://{name}@")
    try:
        yield settings.model_copy(update={"database_url": url})
    finally:
        with psycopg.connect(servers.admin_dsn, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (name,),
            )
            conn.execute(f"DROP ROLE {name}")


def test_a_member_of_the_role_writes_the_trail_but_cannot_rewrite_it(
    pool, app_user: Settings
) -> None:
    old = insert_row(pool, days_old=45)  # written by the owner, long ago
    app = make_pool(app_user, "tests-app", min_size=1, max_size=2, open_wait=True)
    try:
        with transaction(app) as conn:
            entry = audit.record(
                conn, OPERATOR, "bulk_cancel", target_kind="filter", count=0, outcome="running"
            )
        with transaction(app) as conn:
            audit.advance(conn, entry["id"], count=1, outcome="done", detail={"batches": 1})
        for statement in (
            "UPDATE operator_actions SET actor = 'x' WHERE id = %s",
            "DELETE FROM operator_actions WHERE id = %s",
            "TRUNCATE operator_actions",
        ):
            with app.connection() as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement, (old,) if "%s" in statement else ())
        with app.connection() as conn:  # retention, through the function only
            pruned = action_store.operator_action_delete_before(
                conn, retention_seconds=31 * 86400, limit=10
            )
        assert pruned == 1
    finally:
        app.close()
    left = {r["id"] for r in rows(pool, "SELECT id FROM operator_actions")}
    assert left == {entry["id"]}


# --- every change leaves its row -----------------------------------------------------------


def test_creating_changing_and_deleting_a_schedule_are_audited(api, pool, tenant) -> None:
    client, user, _ = api
    tid, ids = tenant
    made = client.post(
        "/v1/schedules",
        json={"name": "nightly", "cron": "0 2 * * *", "timezone": "UTC", "note_ids": ids[:2]},
        headers=user,
    )
    assert made.status_code == 201, made.text
    sid = made.json()["id"]
    [created] = actions(pool, "schedule_create")
    assert (created["actor_kind"], created["target_kind"], created["target_id"]) == (
        "tenant",
        "schedule",
        sid,
    )
    assert created["tenant_id"] == tid and created["key_id"] is not None
    assert created["detail"]["name"] == "nightly" and created["detail"]["selection"] == "2 note ids"
    changed = client.patch(
        f"/v1/schedules/{sid}", json={"name": "daily", "enabled": False}, headers=user
    )
    assert changed.status_code == 200, changed.text
    [updated] = actions(pool, "schedule_update")
    assert updated["detail"] == {"fields": ["name"]}
    assert [r["target_id"] for r in actions(pool, "pause")] == [sid]
    same = client.patch(f"/v1/schedules/{sid}", json={"name": "daily"}, headers=user)
    assert same.status_code == 200 and len(actions(pool, "schedule_update")) == 1  # no change
    assert client.delete(f"/v1/schedules/{sid}", headers=user).status_code == 204
    [deleted] = actions(pool, "schedule_delete")
    assert (deleted["target_id"], deleted["tenant_id"]) == (sid, tid)
    assert deleted["detail"]["name"] == "daily" and deleted["detail"]["enabled"] is False
    assert client.delete(f"/v1/schedules/{sid}", headers=user).status_code == 404
    assert len(actions(pool, "schedule_delete")) == 1  # nothing deleted, nothing audited
    listed = client.get(
        "/v1/admin/audit?target_kind=schedule", headers={"Authorization": api[2]["Authorization"]}
    )
    assert [i["action"] for i in listed.json()["items"]] == [
        "schedule_delete",
        "schedule_update",
        "pause",
        "schedule_create",
    ]


def run_cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": str(settings.database_url), "COLUMNS": "200"}
    return subprocess.run([EXPORTCTL, *args], env=env, capture_output=True, text=True, check=False)


def test_importing_and_deleting_notes_are_audited(pool, settings: Settings, tmp_path) -> None:
    tid = create_tenant(pool)
    vault = tmp_path / "vault"
    vault.mkdir()
    for i in range(5):
        (vault / f"n{i}.md").write_text(f"# Note {i}\nsecret body {i}\n")
    report = import_notes(pool, tid, vault, batch_size=2)  # three batches
    assert report.inserted == 5
    batches = actions(pool, "notes_import")
    assert [(r["count"], r["detail"]["batch"]) for r in batches] == [(2, 1), (2, 2), (1, 3)]
    assert len({r["detail"]["import_id"] for r in batches}) == 1
    assert all(r["tenant_id"] == tid and r["actor_kind"] == "system" for r in batches)
    assert "secret body" not in json.dumps([r["detail"] for r in batches])
    import_notes(pool, tid, vault)  # nothing changed: no row
    assert len(actions(pool, "notes_import")) == 3

    (vault / "n0.md").write_text("# Note 0\nchanged\n")
    (vault / "n4.md").unlink()
    cli = run_cli(settings, "notes", "import", str(vault), "--tenant", tid, "--replace")
    assert cli.returncode == 0, cli.stderr
    [*_, changed] = actions(pool, "notes_import")
    assert (changed["count"], changed["detail"]["updated"]) == (1, 1)
    assert changed["actor_kind"] == "database" and changed["actor"].startswith("exportctl as ")
    [replaced] = actions(pool, "notes_delete")
    assert (
        replaced["count"] == 1 and replaced["detail"]["import_id"] == changed["detail"]["import_id"]
    )

    ids = [r["id"] for r in rows(pool, "SELECT id FROM notes WHERE tenant_id = %s", tid)]
    gone = run_cli(settings, "notes", "delete", "--tenant", tid, str(ids[0]), str(ids[1]), "999999")
    assert gone.returncode == 5, gone.stderr  # one id was not the tenant's
    [_, deleted] = actions(pool, "notes_delete")
    assert deleted["count"] == 2 and deleted["detail"]["note_ids"] == sorted(ids[:2])
    assert deleted["actor_kind"] == "database" and deleted["target_id"] == tid
    nothing = run_cli(settings, "notes", "delete", "--tenant", tid, "999999")
    assert nothing.returncode == 5 and len(actions(pool, "notes_delete")) == 2


def test_a_notes_change_whose_audit_row_fails_did_not_happen(pool, tmp_path) -> None:
    tid = create_tenant(pool)
    vault = tmp_path / "vault"
    vault.mkdir()
    (vault / "a.md").write_text("# A\n")
    with pool.connection() as conn:
        conn.execute(
            "CREATE FUNCTION refuse_audit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            " RAISE EXCEPTION 'refused (the test''s trigger)' USING ERRCODE = 'check_violation';"
            " END $$"
        )
        conn.execute(
            "CREATE TRIGGER refuse_audit BEFORE INSERT ON operator_actions"
            " FOR EACH ROW EXECUTE FUNCTION refuse_audit()"
        )
    with pytest.raises(psycopg.errors.CheckViolation):
        import_notes(pool, tid, vault)
    assert rows(pool, "SELECT id FROM notes WHERE tenant_id = %s", tid) == []
