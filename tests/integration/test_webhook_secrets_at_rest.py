"""Webhook signing secrets encrypted at rest (docs/webhooks.md "Encryption at rest") against
real PostgreSQL, a real receiver on loopback and the real processes: a dump of the database
holds no secret; delivery signs with the decrypted secrets through a key rotation; a missing
or wrong key is a clear error at start; revision 0022 encrypts the secrets that exist."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest
from alembic import command
from fastapi.testclient import TestClient
from pydantic import SecretStr

from devtools.stack import ROOT, Servers, free_port
from devtools.webhook_receiver import Receiver
from exportcore.auth import create_api_key
from exportcore.settings import Settings
from exportcore.webhooks import endpoints, secret_keys
from exportcore.webhooks.delivery import WebhookDelivery
from exportcore.webhooks.encryption import (
    SecretBox,
    SecretKeysMissing,
    SecretUndecryptable,
    key_id,
    new_key,
)
from exportcore.webhooks.signing import new_secret
from services.api.app import create_app
from tests.integration.test_migrations import _alembic
from tests.integration.test_webhooks import pump

KEY_A, KEY_B, KEY_C = new_key(), new_key(), new_key()
ID_A, ID_B, ID_C = (key_id(k.encode()) for k in (KEY_A, KEY_B, KEY_C))
EXPORTCTL = str(Path(sys.executable).parent / "exportctl")


def with_keys(settings: Settings, keys: str | None) -> Settings:
    """``settings`` for loopback receivers with ``WEBHOOK_SECRET_KEYS`` = ``keys``."""
    return Settings(
        **{
            **settings.model_dump(),
            "webhook_allow_http": True,
            "webhook_allow_private_networks": True,
            "webhook_poll_seconds": 0.05,
            "webhook_retry_schedule": "0.05,0.1",
            "webhook_secret_keys": SecretStr(keys) if keys else None,
        }
    )


def secret_forms(secret: str) -> list[str]:
    """The ways a secret could show in a dump: as issued, its base64 body, its raw bytes
    in hex (bytea) and as a Python bytes repr would."""
    body = secret.removeprefix("whsec_")
    raw = base64.b64decode(body)
    return [secret, body, raw.hex(), "\\x" + raw.hex()]


def pg_dump(database_url: str) -> str:
    """The whole database as ``pg_dump`` writes it (plain SQL, data included)."""
    out = subprocess.run(
        ["pg_dump", "--no-owner", "--dbname", database_url],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout


def endpoint_row(pool: Any, endpoint_id: UUID) -> dict[str, Any]:
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT * FROM webhook_endpoints WHERE id = %s", (endpoint_id,)
        ).fetchone()
    assert row is not None
    return dict(row)


def deliver_test_message(
    pool: Any, settings: Settings, tid: str, endpoint_id: UUID, receiver: Receiver
) -> Any:
    """Queue a ``webhook.test`` message and run a delivery process (``settings``' keys)
    until the receiver has it; returns what the receiver got."""
    before = len(receiver.received)
    endpoints.send_test(pool, tenant_id=tid, endpoint_id=endpoint_id)
    d = WebhookDelivery(settings, pool)
    try:
        pump(d, lambda: len(receiver.received) > before)
    finally:
        d.close(timeout=5)
    return receiver.received[-1]


def test_a_database_dump_holds_no_signing_secret(
    pool, settings: Settings, database_url: str, tenant
) -> None:
    tid, _ = tenant
    s = with_keys(settings, KEY_A)
    ep = endpoints.create_endpoint(pool, s, tenant_id=tid, url="https://hooks.example.com/a")
    rotation = endpoints.rotate_secret(
        pool, s, tenant_id=tid, endpoint_id=ep["id"], overlap_seconds=3600
    )
    row = endpoint_row(pool, ep["id"])
    assert row["secret_ciphertext"].startswith("gAAAAA") and row["secret_key_id"] == ID_A
    assert row["previous_secret_ciphertext"].startswith("gAAAAA")
    assert row["secret_hint"] == rotation.secret[:10] + "…"
    assert "secret" not in row and "previous_secret" not in row

    dump = pg_dump(database_url)
    assert "secret_ciphertext" in dump  # the table is in the dump
    for secret in (ep["secret"], rotation.secret):
        for form in secret_forms(secret):
            assert form not in dump, "a signing secret is readable in the database dump"

    # the schema itself refuses a secret in clear
    with pytest.raises(psycopg.errors.CheckViolation), pool.connection() as conn:
        conn.execute(
            "UPDATE webhook_endpoints SET secret_ciphertext = %s WHERE id = %s",
            (new_secret(), ep["id"]),
        )


def test_delivery_signs_through_a_key_rotation_and_reencrypt_moves_every_secret(
    pool, settings: Settings, tenant
) -> None:
    tid, _ = tenant
    only_a, b_then_a, only_b = (with_keys(settings, k) for k in (KEY_A, f"{KEY_B},{KEY_A}", KEY_B))
    with Receiver() as receiver:
        old = endpoints.create_endpoint(pool, only_a, tenant_id=tid, url=receiver.url)
        receiver.secrets = [old["secret"]]
        assert deliver_test_message(pool, only_a, tid, old["id"], receiver).verified_by == (0,)

        # step 1 of a key rotation: the new key first, the old one after
        new = endpoints.create_endpoint(pool, b_then_a, tenant_id=tid, url=receiver.url)
        assert endpoint_row(pool, new["id"])["secret_key_id"] == ID_B
        rotated = endpoints.rotate_secret(
            pool, b_then_a, tenant_id=tid, endpoint_id=old["id"], overlap_seconds=3600
        )
        row = endpoint_row(pool, old["id"])
        assert (row["secret_key_id"], row["previous_secret_key_id"]) == (ID_B, ID_A)
        assert secret_keys.check_keys(pool, b_then_a.webhook_secret_box()) == {ID_A: 1, ID_B: 2}
        # old rows decrypt during the rotation: both secrets of the rotated endpoint sign
        receiver.secrets = [old["secret"], rotated.secret]
        got = deliver_test_message(pool, b_then_a, tid, old["id"], receiver)
        assert len(got.signatures) == 2 and got.verified_by == (0, 1)
        receiver.secrets = [new["secret"]]
        assert deliver_test_message(pool, b_then_a, tid, new["id"], receiver).verified_by == (0,)

        # the old key cannot be dropped yet: the processes would refuse to start
        with pytest.raises(secret_keys.SecretKeyNotHeld) as held:
            secret_keys.check_keys(pool, only_b.webhook_secret_box())
        assert ID_A in held.value.detail and "reencrypt-secrets" in held.value.detail

        # step 2: re-encrypt, then the old key goes
        box = b_then_a.webhook_secret_box()
        assert box is not None
        before = endpoint_row(pool, old["id"])
        done = secret_keys.reencrypt(pool, box, batch=1)
        assert (done.secrets, done.expired, done.census) == (1, 0, {ID_B: 3})
        after = endpoint_row(pool, old["id"])
        assert after["previous_secret_ciphertext"] != before["previous_secret_ciphertext"]
        assert after["secret_ciphertext"] == before["secret_ciphertext"]  # already under B
        assert secret_keys.reencrypt(pool, box).secrets == 0  # again: nothing to do

        # step 3: only the new key; every secret still signs
        assert secret_keys.check_keys(pool, only_b.webhook_secret_box()) == {ID_B: 3}
        receiver.secrets = [old["secret"], rotated.secret]
        assert deliver_test_message(pool, only_b, tid, old["id"], receiver).verified_by == (0, 1)

    # a previous secret whose overlap ended is dropped by the re-encryption
    with pool.connection() as conn:
        conn.execute(
            "UPDATE webhook_endpoints SET previous_secret_expires_at = now() - interval '1 s'"
            " WHERE id = %s",
            (old["id"],),
        )
    only_b_box = only_b.webhook_secret_box()
    assert only_b_box is not None
    done = secret_keys.reencrypt(pool, only_b_box)
    assert (done.secrets, done.expired) == (0, 1)
    row = endpoint_row(pool, old["id"])
    assert row["previous_secret_ciphertext"] is None and row["previous_secret_expires_at"] is None


def test_without_the_key_nothing_is_stored_and_the_processes_refuse_to_start(
    pool, settings: Settings, database_url: str, tenant
) -> None:
    tid, _ = tenant
    keyless = with_keys(settings, None)
    with pytest.raises(SecretKeysMissing, match="WEBHOOK_SECRET_KEYS is not set"):
        endpoints.create_endpoint(pool, keyless, tenant_id=tid, url="https://hooks.example.com/")
    with pool.connection() as conn:
        user, _ = create_api_key(conn, tenant_id=tid, scopes=["exports:read", "exports:write"])
    auth = {"Authorization": f"Bearer {user}"}
    with TestClient(create_app(keyless)) as client:  # no secret stored yet: it starts
        r = client.post("/v1/webhooks", json={"url": "https://hooks.example.com/"}, headers=auth)
    assert r.status_code == 503, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["type"].endswith("/webhook_secret_keys_missing")
    with pool.connection() as conn:
        assert conn.execute("SELECT count(*) AS n FROM webhook_endpoints").fetchone()["n"] == 0

    s = with_keys(settings, KEY_A)
    ep = endpoints.create_endpoint(pool, s, tenant_id=tid, url="https://hooks.example.com/")
    with pytest.raises(SecretKeysMissing, match=f"1 webhook signing secret.*{ID_A}"):
        secret_keys.check_keys(pool, None)
    wrong = with_keys(settings, KEY_C)
    with pytest.raises(secret_keys.SecretKeyNotHeld, match=ID_A):
        secret_keys.check_keys(pool, wrong.webhook_secret_box())
    wrong_box = wrong.webhook_secret_box()
    assert wrong_box is not None
    with pytest.raises(SecretUndecryptable, match=f"key id {ID_A}.*{ID_C}"):
        wrong_box.open(endpoint_row(pool, ep["id"])["secret_ciphertext"], ID_A)

    # the api fails at start, not at the first request
    for bad in (keyless, wrong):
        with pytest.raises(SecretKeysMissing), TestClient(create_app(bad)):
            pass

    # a delivery process without the key never claims the endpoint's messages
    endpoints.send_test(pool, tenant_id=tid, endpoint_id=ep["id"])
    d = WebhookDelivery(wrong, pool)
    try:
        assert d.run_once()["claimed"] == 0
    finally:
        d.close(timeout=5)
    with pool.connection() as conn:
        assert conn.execute("SELECT attempts FROM webhook_messages").fetchone()["attempts"] == 0

    # the webhook-delivery process itself: exit 78 with a message that says what to set,
    # and never the key it was given
    for keys in ("", KEY_C):
        env = {
            k: v for k, v in os.environ.items() if k not in ("WEBHOOK_SECRET_KEYS", "DATABASE_URL")
        }
        env.update(
            DATABASE_URL=database_url,
            WEBHOOK_SECRET_KEYS=keys,
            METRICS_PORT=str(free_port()),
            LOG_FORMAT="text",
        )
        proc = subprocess.run(
            [sys.executable, "-m", "services.webhook_delivery"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 78, out
        assert "WEBHOOK_SECRET_KEYS" in out and ID_A in out, out
        assert "Traceback" not in out
        if keys:
            assert keys not in out


def test_reencrypt_secrets_and_secret_key_new_from_the_command_line(
    pool, settings: Settings, tenant
) -> None:
    tid, _ = tenant
    endpoints.create_endpoint(
        pool, with_keys(settings, KEY_A), tenant_id=tid, url="https://hooks.example.com/"
    )

    def exportctl(*args: str, keys: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "DATABASE_URL": str(settings.database_url), "COLUMNS": "200"}
        env["WEBHOOK_SECRET_KEYS"] = keys
        return subprocess.run(
            [EXPORTCTL, *args], env=env, capture_output=True, text=True, check=False
        )

    made = exportctl("webhook", "new-secret-key", keys="")
    assert made.returncode == 0, made.stderr
    printed = made.stdout.strip()
    assert SecretBox.from_text(printed) is not None and key_id(printed.encode()) in made.stderr

    none = exportctl("webhook", "reencrypt-secrets", keys="")
    assert none.returncode == 2 and "WEBHOOK_SECRET_KEYS is not set" in none.stderr
    wrong = exportctl("webhook", "reencrypt-secrets", keys=KEY_C)
    assert wrong.returncode == 1 and ID_A in wrong.stderr and KEY_C not in wrong.stderr
    moved = exportctl("webhook", "reencrypt-secrets", "--output", "json", keys=f"{printed},{KEY_A}")
    assert moved.returncode == 0, moved.stderr
    result = json.loads(moved.stdout)
    new_id = key_id(printed.encode())
    assert result == {
        "current_key_id": new_id,
        "reencrypted": 1,
        "expired_dropped": 0,
        "secrets_by_key_id": {new_id: 1},
        "done": True,
    }
    assert printed not in moved.stdout + moved.stderr and KEY_A not in moved.stdout + moved.stderr


def test_revision_0022_encrypts_the_secrets_that_exist(
    servers: Servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = servers.create_database("t_migrations_webhook_secrets")
    current, previous = new_secret(), new_secret()
    try:
        cfg = _alembic(url)
        command.upgrade(cfg, "0021")
        with psycopg.connect(url) as conn:
            conn.execute("INSERT INTO tenants (id, name) VALUES ('t', 't')")
            conn.execute(
                "INSERT INTO webhook_endpoints (id, tenant_id, url, events, secret,"
                " previous_secret, previous_secret_expires_at) VALUES"
                " (gen_random_uuid(), 't', 'https://hooks.example.com/', '{export.failed}', %s,"
                " %s, now() + interval '1 hour'),"
                " (gen_random_uuid(), 't', 'https://hooks.example.com/', '{export.failed}', %s,"
                " NULL, NULL)",
                (current, previous, previous),
            )

        # before 0022 a dump shows them (what the checks below would catch)
        with psycopg.connect(url) as conn:
            plain = " ".join(r[0] for r in conn.execute("SELECT t::text FROM webhook_endpoints t"))
        assert current in plain and previous in plain

        # with secrets to encrypt and no key: a clear refusal, nothing changed
        monkeypatch.delenv("WEBHOOK_SECRET_KEYS", raising=False)
        with pytest.raises(RuntimeError, match=r"holds 2 signing secret.*WEBHOOK_SECRET_KEYS"):
            command.upgrade(cfg, "head")
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT version_num FROM alembic_version").fetchone() == ("0021",)
            assert conn.execute(
                "SELECT count(*) FROM webhook_endpoints WHERE secret IS NOT NULL"
            ).fetchone() == (2,)

        monkeypatch.setenv("WEBHOOK_SECRET_KEYS", KEY_A)
        command.upgrade(cfg, "head")
        box = SecretBox.from_text(KEY_A)
        assert box is not None
        with psycopg.connect(url) as conn:
            rows = conn.execute(
                "SELECT secret_ciphertext, secret_key_id, secret_hint,"
                " previous_secret_ciphertext, previous_secret_key_id, t::text"
                " FROM webhook_endpoints t ORDER BY previous_secret_ciphertext NULLS LAST"
            ).fetchall()
        first, second = rows
        assert box.open(first[0]) == current and box.open(first[3]) == previous
        assert (first[1], first[2], first[4]) == (ID_A, current[:10] + "…", ID_A)
        assert box.open(second[0]) == previous and second[3] is None and second[4] is None
        for row in rows:
            for secret in (current, previous):
                for form in secret_forms(secret):
                    assert form not in row[5]

        command.downgrade(cfg, "0021")
        with psycopg.connect(url) as conn:
            assert sorted(
                conn.execute("SELECT secret, previous_secret FROM webhook_endpoints").fetchall(),
                key=lambda r: r[1] is None,
            ) == [(current, previous), (previous, None)]
    finally:
        servers.drop_database("t_migrations_webhook_secrets")
