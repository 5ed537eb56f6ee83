"""Alembic: upgrade head, downgrade base and upgrade head again on an empty database; what
revisions that change existing rows do to them."""

from __future__ import annotations

import psycopg
import pytest
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from devtools.stack import ROOT, Servers

TABLES = {
    "tenants",
    "api_keys",
    "notes",
    "export_jobs",
    "export_job_items",
    "export_outbox",
    "export_job_events",
}


def _tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        ).fetchall()
    return {r[0] for r in rows} - {"alembic_version"}


def _alembic(url: str) -> Config:
    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.attributes["database_url"] = url
    cfg.attributes["configure_logger"] = False
    return cfg


def test_upgrade_downgrade_upgrade_on_empty_database(servers: Servers) -> None:
    url = servers.create_database("t_migrations_roundtrip")
    try:
        cfg = _alembic(url)
        command.upgrade(cfg, "head")
        assert _tables(url) >= TABLES
        command.downgrade(cfg, "base")
        assert _tables(url) == set()
        command.upgrade(cfg, "head")
        assert _tables(url) >= TABLES
    finally:
        servers.drop_database("t_migrations_roundtrip")


def test_snapshot_items_and_history_are_immutable(servers: Servers, database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO tenants (id, name) VALUES ('imm', 'imm')")
        conn.execute(
            "INSERT INTO export_jobs (id, tenant_id, queue, format, payload, note_count,"
            " request_hash, max_attempts, deadline_at) VALUES"
            " ('00000000-0000-0000-0000-000000000001', 'imm', 'exports.fast', 'json', '{}', 1,"
            " 'h', 3, now() + interval '1 hour')"
        )
        conn.execute(
            "INSERT INTO export_job_events (job_id, kind) VALUES"
            " ('00000000-0000-0000-0000-000000000001', 'submitted')"
        )
        try:
            conn.execute("UPDATE export_job_events SET kind = 'forged'")
        except psycopg.errors.ObjectNotInPrerequisiteState:
            pass
        else:
            raise AssertionError("history rows must not be updatable")
        kinds = [r[0] for r in conn.execute("SELECT kind FROM export_job_events")]
        assert kinds == ["submitted"]


def test_schedules_that_exist_keep_allowing_overlap_and_new_ones_skip(servers: Servers) -> None:
    """Revision 0019 changes nothing a schedule already did (overlap allow_all, the old
    behaviour), defaults new ones to skip, and marks every skipped slot so far catch_up."""
    url = servers.create_database("t_migrations_overlap")
    try:
        cfg = _alembic(url)
        command.upgrade(cfg, "0018")
        with psycopg.connect(url) as conn:
            conn.execute("INSERT INTO tenants (id, name) VALUES ('t', 't')")
            conn.execute(
                "INSERT INTO export_schedules (id, tenant_id, interval_seconds, payload, format,"
                " next_due_at, catch_up) VALUES (gen_random_uuid(), 't', 60, '{}', 'json',"
                " now(), 'all') RETURNING id"
            )
            conn.execute(
                "INSERT INTO export_schedule_slots (schedule_id, scheduled_at, outcome)"
                " SELECT id, now(), 'skipped' FROM export_schedules"
            )
        command.upgrade(cfg, "head")
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT overlap FROM export_schedules").fetchall() == [
                ("allow_all",)
            ]
            assert conn.execute("SELECT reason FROM export_schedule_slots").fetchall() == [
                ("catch_up",)
            ]
            conn.execute(
                "INSERT INTO export_schedules (id, tenant_id, interval_seconds, payload, format,"
                " next_due_at, catch_up) VALUES (gen_random_uuid(), 't', 60, '{}', 'json',"
                " now(), 'skip')"
            )
            assert conn.execute(
                "SELECT count(*) FROM export_schedules WHERE overlap = 'skip'"
            ).fetchone() == (1,)
        command.downgrade(cfg, "0018")
    finally:
        servers.drop_database("t_migrations_overlap")


def test_schedules_that_exist_keep_firing_on_the_instant_and_cancel_other_downgrades(
    servers: Servers,
) -> None:
    """Revision 0026 gives every existing schedule jitter 0 (offset 0: it fires on its
    instants as before), derives the offset of a jittered one from its id, accepts
    ``cancel_other``; its downgrade turns ``cancel_other`` into ``skip`` (the default of
    revision 0019) and drops the columns."""
    url = servers.create_database("t_migrations_jitter")
    try:
        cfg = _alembic(url)
        command.upgrade(cfg, "0022")
        with psycopg.connect(url) as conn:
            conn.execute("INSERT INTO tenants (id, name) VALUES ('t', 't')")
            conn.execute(
                "INSERT INTO export_schedules (id, tenant_id, interval_seconds, payload, format,"
                " next_due_at, catch_up, overlap) VALUES (gen_random_uuid(), 't', 60, '{}',"
                " 'json', now(), 'skip', 'allow_all')"
            )
        command.upgrade(cfg, "0026")
        with psycopg.connect(url) as conn:
            assert conn.execute(
                "SELECT jitter, jitter_offset FROM export_schedules"
            ).fetchall() == [(0, 0)]
            conn.execute(
                "UPDATE export_schedules SET jitter = 3600, overlap = 'cancel_other', catch_up"
                " = 'skip'"
            )
            conn.commit()
            (offset,) = conn.execute("SELECT jitter_offset FROM export_schedules").fetchone()
            assert 0 <= offset <= 3600
            try:
                conn.execute("UPDATE export_schedules SET jitter = 3601")
            except psycopg.errors.CheckViolation:
                conn.rollback()
            else:
                raise AssertionError("a jitter over an hour must be refused")
        command.downgrade(cfg, "0022")
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT overlap FROM export_schedules").fetchall() == [("skip",)]
            columns = {
                r[0]
                for r in conn.execute(
                    "SELECT column_name FROM information_schema.columns"
                    " WHERE table_name IN ('export_schedules', 'export_schedule_slots')"
                )
            }
            assert not {"jitter", "jitter_offset", "backfilled_at"} & columns
        command.upgrade(cfg, "head")
    finally:
        servers.drop_database("t_migrations_jitter")


def test_age_recipients_revision_downgrades_and_upgrades_again(servers: Servers) -> None:
    """The revision of encrypted exports adds ``tenants.age_recipients`` (only recipient
    shapes accepted) and ``export_envelopes``; its downgrade removes both, and it applies
    again on top."""
    url = servers.create_database("t_migrations_age")
    try:
        cfg = _alembic(url)
        command.upgrade(cfg, "head")
        before = ScriptDirectory.from_config(cfg).get_revision("0027").down_revision
        assert isinstance(before, str)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("INSERT INTO tenants (id, name) VALUES ('t1', 't1')")
            good = "age1" + "q" * 58
            conn.execute("UPDATE tenants SET age_recipients = %s WHERE id = 't1'", ([good],))
            with pytest.raises(psycopg.errors.CheckViolation):
                conn.execute(
                    "UPDATE tenants SET age_recipients = %s WHERE id = 't1'", (["age1nope"],)
                )
        assert "export_envelopes" in _tables(url)
        command.downgrade(cfg, before)
        assert "export_envelopes" not in _tables(url)
        with psycopg.connect(url) as conn:
            cols = conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'tenants'"
            ).fetchall()
        assert ("age_recipients",) not in cols
        command.upgrade(cfg, "head")
        assert "export_envelopes" in _tables(url)
    finally:
        servers.drop_database("t_migrations_age")
