"""Operator keys are their own kind: tied to no tenant, made only with
database access, the only keys that reach ``/v1/admin``; a tenant key can never hold a
cross-tenant scope, and revision 0007 strips it from the keys that had it. Real
PostgreSQL; the api in-process; exportctl as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

import psycopg
import pytest
from alembic import command
from alembic.config import Config
from fastapi.testclient import TestClient
from psycopg.rows import dict_row

from devtools.stack import ROOT, Servers
from exportcore.auth import authenticate, create_api_key, create_operator_key, hash_key
from exportcore.settings import Settings
from services.api.app import create_app
from tests.support import key_cache_clock, tenant_with_notes

EXPORTCTL = str(Path(sys.executable).parent / "exportctl")
PROBLEM = "application/problem+json"


def run(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": str(settings.database_url), "COLUMNS": "200"}
    env.pop("OPERATOR_KEY", None)
    env.pop("API_KEY", None)
    return subprocess.run([EXPORTCTL, *args], env=env, capture_output=True, text=True, check=False)


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_tenant_keys_never_hold_the_admin_scope(pool, settings) -> None:
    with pool.connection() as conn:
        conn.execute("INSERT INTO tenants (id, name) VALUES ('acme', 'acme')")
        with pytest.raises(ValueError, match="operator-key create"):
            create_api_key(conn, tenant_id="acme", scopes=["exports:read", "admin"])
    # not through the library either: the database refuses the row
    with pool.connection() as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(
            "INSERT INTO api_keys (id, tenant_id, key_hash, prefix, scopes)"
            " VALUES (%s, 'acme', %s, 'nex_x', ARRAY['exports:read', 'admin'])",
            (uuid4(), b"h" * 32),
        )
    refused = run(settings, "apikey", "create", "acme", "--scope", "admin")
    assert refused.returncode == 1 and "operator-key create" in refused.stderr


def test_operator_keys_reach_admin_only_and_tenant_keys_never(
    client, pool, notes_dir, settings
) -> None:
    demo, _ = tenant_with_notes(pool, notes_dir)
    other, _ = tenant_with_notes(pool, notes_dir)
    with pool.connection() as conn:
        demo_key, _ = create_api_key(conn, tenant_id=demo, scopes=["exports:read"])
        other_key, _ = create_api_key(
            conn, tenant_id=other, scopes=["exports:read", "exports:write"]
        )
        operator, row = create_operator_key(conn, label="on-call")
        assert row["prefix"].startswith("nex_op_") and "tenant_id" not in row
        ctx = authenticate(conn, operator)
    assert ctx is not None and ctx.is_operator and ctx.kind == "operator"
    assert ctx.tenant_id is None and ctx.actor == f"{row['prefix']} (on-call)"
    job_id = client.post("/v1/exports", json={"all": True}, headers=bearer(other_key)).json()["id"]
    # the finding: a key of tenant `other` listing and replaying another tenant's dead letters
    for key in (demo_key, other_key):
        for method, path in (
            ("GET", "/v1/admin/dead-letters"),
            ("POST", f"/v1/admin/exports/{job_id}/replay"),
            ("GET", f"/v1/admin/exports/{job_id}"),
            ("GET", f"/v1/admin/exports/{job_id}/events"),
            ("POST", "/v1/admin/dead-letters/1/resolve"),
        ):
            r = client.request(method, path, headers=bearer(key))
            assert r.status_code == 403 and r.headers["content-type"].startswith(PROBLEM), path
            assert r.json()["type"].endswith("/operator_key_required")
    assert client.get("/v1/admin/dead-letters", headers=bearer(operator)).status_code == 200
    seen = client.get(f"/v1/admin/exports/{job_id}", headers=bearer(operator))
    assert seen.status_code == 200 and seen.json()["tenant_id"] == other
    # an operator key acts for no tenant: the tenant routes refuse it
    for method, path in (
        ("GET", "/v1/exports"),
        ("POST", "/v1/exports"),
        ("GET", f"/v1/exports/{job_id}"),
        ("GET", "/v1/schedules"),
    ):
        r = client.request(method, path, json={"all": True}, headers=bearer(operator))
        assert r.status_code == 403, (method, path, r.text)
        assert r.json()["type"].endswith("/operator_key_not_allowed")


def test_exportctl_creates_lists_and_revokes_operator_keys(client, settings) -> None:
    created = run(settings, "operator-key", "create", "--label", "alice")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert key.startswith("nex_op_") and "store it now" in created.stderr
    clock = key_cache_clock(client.app)
    assert client.get("/v1/admin/dead-letters", headers=bearer(key)).status_code == 200
    listing = run(settings, "operator-key", "list")
    prefix = key[: len("nex_op_") + 8]
    assert listing.returncode == 0 and prefix in listing.stdout and "alice" in listing.stdout
    assert key not in listing.stdout + listing.stderr
    as_json = run(settings, "operator-key", "list", "--json")
    assert '"label": "alice"' in as_json.stdout
    no_label = run(settings, "operator-key", "create", "--label", "  ")
    assert no_label.returncode == 2 and "--label" in no_label.stderr
    revoked = run(settings, "operator-key", "revoke", prefix)
    assert revoked.returncode == 0, revoked.stderr
    clock.advance(1.0)  # refused once the api's cached lookup is 1 s old
    r = client.get("/v1/admin/dead-letters", headers=bearer(key))
    assert r.status_code == 401 and r.headers["content-type"].startswith(PROBLEM)
    again = run(settings, "operator-key", "revoke", prefix)
    assert again.returncode == 1 and "operator-key list" in again.stderr


def _alembic(url: str) -> Config:
    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.attributes["database_url"] = url
    cfg.attributes["configure_logger"] = False
    return cfg


def test_revision_0007_strips_admin_from_tenant_keys_and_repairs_replays(
    servers: Servers,
) -> None:
    """Data written under 0006 (admin-scoped tenant keys, replays made before replay was
    idempotent) is migrated safely."""
    name = f"t_0007_{uuid4().hex[:8]}"
    url = servers.create_database(name)
    try:
        command.upgrade(_alembic(url), "0006")
        keys = {
            "mixed": (uuid4(), ["admin", "exports:read"]),
            "admin_only": (uuid4(), ["admin"]),
            "plain": (uuid4(), ["exports:read", "exports:write"]),
        }
        failed, replay_a, replay_b, replay_c = uuid4(), uuid4(), uuid4(), uuid4()
        with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
            conn.execute("INSERT INTO tenants (id, name) VALUES ('acme', 'acme')")
            for label, (key_id, scopes) in keys.items():
                conn.execute(
                    "INSERT INTO api_keys (id, tenant_id, key_hash, prefix, scopes, label)"
                    " VALUES (%s, 'acme', %s, 'nex_0', %s, %s)",
                    (key_id, hash_key(label), scopes, label),
                )
            job = (
                "INSERT INTO export_jobs (id, tenant_id, status, queue, format, payload,"
                " note_count, request_hash, max_attempts, deadline_at, replay_of, created_at,"
                " lease_token, lease_expires_at)"
                " VALUES (%s, 'acme', %s, 'exports.fast', 'json', '{}', 1, 'h', 3,"
                " now() + interval '1 hour', %s, now() + %s::interval, %s, %s)"
            )
            conn.execute(job, (failed, "failed", None, "-1 hour", None, None))
            conn.execute(
                "INSERT INTO export_dead_letters (job_id, tenant_id, reason, attempts)"
                " VALUES (%s, 'acme', 'injected_permanent', 1)",
                (failed,),
            )
            # three replays at once (the old bug): one running, two queued
            token = uuid4()
            conn.execute(job, (replay_a, "queued", failed, "-3 minutes", None, None))
            conn.execute(job, (replay_b, "running", failed, "-2 minutes", token, "2100-01-01"))
            conn.execute(job, (replay_c, "queued", failed, "-1 minutes", None, None))
        command.upgrade(_alembic(url), "head")
        with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
            rows = {
                r["label"]: r
                for r in conn.execute("SELECT label, scopes, revoked_at FROM api_keys")
            }
            jobs = {
                r["id"]: r for r in conn.execute("SELECT id, status, replay_of FROM export_jobs")
            }
            dl = conn.execute(
                "SELECT * FROM export_dead_letters WHERE job_id = %s", (failed,)
            ).fetchone()
            repairs = conn.execute(
                "SELECT job_id, kind FROM export_job_events ORDER BY job_id"
            ).fetchall()
        assert rows["mixed"]["scopes"] == ["exports:read"] and rows["mixed"]["revoked_at"] is None
        assert rows["admin_only"]["scopes"] == [] and rows["admin_only"]["revoked_at"] is not None
        assert rows["plain"]["scopes"] == ["exports:read", "exports:write"]
        assert rows["plain"]["revoked_at"] is None
        # the oldest active replay stays; the queued duplicate never runs; the running one
        # finishes but is no longer the replay
        assert jobs[replay_a]["status"] == "queued" and jobs[replay_a]["replay_of"] == failed
        assert jobs[replay_c]["status"] == "cancelled"
        assert jobs[replay_b]["status"] == "running" and jobs[replay_b]["replay_of"] is None
        assert sorted((str(r["job_id"]), r["kind"]) for r in repairs) == sorted(
            [(str(replay_b), "replay_detached"), (str(replay_c), "cancelled")]
        )
        assert dl is not None and dl["state"] == "replayed"
        assert dl["replay_job_id"] == replay_a  # the active replay
        command.downgrade(_alembic(url), "0006")
        command.upgrade(_alembic(url), "head")
    finally:
        servers.drop_database(name)
