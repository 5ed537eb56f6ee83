"""Alembic: upgrade head, downgrade base and upgrade head again on an empty database."""

from __future__ import annotations

import psycopg
from alembic import command
from alembic.config import Config

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
