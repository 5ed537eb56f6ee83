"""Exports only the client can read, on the real processes (gunicorn api, publisher, both
Celery workers) against each artifact store (a folder, a bucket of the real S3 server):
a request's or a tenant's age recipients encrypt the artifact while it streams, the store
holds no byte of any note's text (every file under the folder, every object and
unfinished upload of the bucket is searched), ``exportctl download --identity`` decrypts
and verifies, ``exportctl verify`` checks the ciphertext without the key and the contents
with it, and a wrong identity, a malformed recipient or a truncated file is a clear error.

Identities are made by pyrage (as ``age-keygen`` makes them) and kept in the test's own
folder, as a client keeps its key."""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from uuid import uuid4

import httpx
import pytest
from pyrage import x25519

from devtools.api_client import bearer
from devtools.stack import Servers
from exportcore import encryption, manifests
from exportcore.artifacts import S3ArtifactStore
from tests.e2e.conftest import E2E, moto_for, running_stack
from tests.e2e.test_cli_manifests import cli, ok

pytestmark = pytest.mark.e2e


@dataclass
class Key:
    """An age key pair as a client holds it: the identity file and its public key."""

    file: Path
    recipient: str


def new_key(folder: Path, name: str) -> Key:
    """A new X25519 identity written as ``age-keygen`` writes it (a comment, the key)."""
    identity = x25519.Identity.generate()
    path = folder / f"{name}.key"
    recipient = str(identity.to_public())
    path.write_text(f"# public key: {recipient}\n{identity}\n")
    path.chmod(0o600)
    return Key(path, recipient)


@pytest.fixture(scope="module")
def signed(
    request: pytest.FixtureRequest,
    servers: Servers,
    template_db: str,
    notes_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    backend: str,
) -> Iterator[E2E]:
    """A stack on ``backend`` whose manifests (and envelopes) are signed; an export of more
    than 2 notes goes to the bulk queue, which checkpoints every 64 KiB."""
    base = tmp_path_factory.mktemp(f"encrypted-{backend}")
    private, _ = manifests.new_private_key_text()
    env = {
        "MANIFEST_SIGNING_KEY": private,
        "FAST_QUEUE_MAX_NOTES": "2",
        "CHECKPOINT_BYTES": str(64 * 1024),
    }
    with running_stack(
        servers,
        template_db,
        notes_dir,
        base,
        env,
        backend=backend,
        s3=moto_for(request, backend),
    ) as e:
        yield e


@dataclass
class Account:
    """A tenant of the stack with notes of its own, whose texts are ``texts``."""

    e2e: E2E
    tenant: str
    env: dict[str, str]
    cwd: Path
    texts: list[str]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``exportctl ARGS`` as this account (its API key; the stack's database)."""
        return cli(self.env, self.cwd, *args)

    def ok(self, *args: str) -> str:
        """``exportctl ARGS`` that must succeed; its stdout."""
        return ok(self.env, self.cwd, *args)

    def export(self, *args: str) -> str:
        """Submit an all-notes export (``args``: format, recipients) and wait until it
        succeeded; its id."""
        job = self.ok("submit", "--all", *args).strip()
        self.e2e.db.wait_status(job, "succeeded", 90)
        return job

    def status(self, job: str) -> dict[str, object]:
        """The export's status as the API answers it."""
        r = httpx.get(
            f"{self.e2e.stack.api_url}/v1/exports/{job}", headers=bearer(self.env["API_KEY"])
        )
        assert r.status_code == 200, r.text
        status: dict[str, object] = r.json()
        return status


@pytest.fixture
def account(signed: E2E, tmp_path: Path) -> Account:
    """A new tenant with four notes whose texts appear nowhere else (so an export of all of
    them is a bulk export)."""
    e = signed
    tenant = "age-" + uuid4().hex[:6]
    folder = tmp_path / "vault"
    folder.mkdir()
    texts = []
    for name in "abcd":
        text = f"confidential {name} {uuid4().hex} — entrée ünïcode {uuid4().hex}"
        (folder / f"{name}.md").write_text(f"# Note {name}\n\n{text}\n")
        texts.append(text)
    env = {**e.stack.env, "API_URL": e.stack.api_url, "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    ok(env, tmp_path, "tenant", "create", tenant)
    env["API_KEY"] = ok(env, tmp_path, "apikey", "create", tenant, "--quiet").strip()
    ok(env, tmp_path, "notes", "import", str(folder), "--tenant", tenant)
    return Account(e, tenant, env, tmp_path, texts)


def stored_bytes(e: E2E) -> list[tuple[str, bytes]]:
    """``(name, content)`` of everything the artifact store holds: every file under the
    folder (temporary files included), or every object of the bucket (whatever its key)
    and every part of every unfinished multipart upload."""
    if e.backend == "file":
        return [(str(p), p.read_bytes()) for p in e.artifact_dir.rglob("*") if p.is_file()]
    store = e.store
    assert isinstance(store, S3ArtifactStore)
    client, bucket = store.client(), store.config.bucket
    out = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            body = client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
            out.append((obj["Key"], body))
    for upload in client.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
        parts = client.list_parts(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
        out.append(
            (f"{upload['Key']} (unfinished upload, {len(parts.get('Parts', []))} parts)", b"")
        )
    return out


def needles(texts: list[str]) -> list[bytes]:
    """What must never be found in the store: each note's text, as UTF-8 and as the JSON
    formats escape it, and a long enough piece of it on its own (a compressed or split
    record still holds its random hex whole)."""
    out = []
    for text in texts:
        out += [text.encode(), json.dumps(text).encode()[1:-1], text.split()[2].encode()]
    return out


def assert_no_plaintext(e: E2E, texts: list[str]) -> int:
    """Search every byte of the store for each note's text; the number of objects read."""
    found = stored_bytes(e)
    assert found, "the store holds nothing: the search would prove nothing"
    for name, data in found:
        for needle in needles(texts):
            assert needle not in data, f"{name} holds a note's text in plain"
    return len(found)


def test_a_requests_recipients_encrypt_each_format_and_the_store_holds_no_plaintext(
    signed: E2E, account: Account
) -> None:
    """json, ndjson and markdown_zip, each encrypted to two recipients named by the request:
    the status says so, the store holds only age files (no text of any note, the search
    itself checked on the decrypted download), each identity alone decrypts the download,
    and ``verify`` passes without the key (ciphertext, envelope) and with it (contents)."""
    alice, bob = new_key(account.cwd, "alice"), new_key(account.cwd, "bob")
    jobs = {
        fmt: account.export(
            "--format", fmt, "--recipient", alice.recipient, "--recipient", bob.recipient
        )
        for fmt in ("json", "ndjson", "markdown_zip")
    }
    assert assert_no_plaintext(signed, account.texts) >= 3
    for fmt, job in jobs.items():
        status = account.status(job)
        assert status["recipients"] == sorted([alice.recipient, bob.recipient])
        result = status["result"]
        assert isinstance(result, dict) and result["encrypted"] is True
        assert str(result["envelope"]).endswith(f"/v1/exports/{job}/envelope")
        row = signed.db.job(job)
        assert row["result_ref"].endswith(".age"), row["result_ref"]

        # without the key: the age file and its envelope; verify checks the ciphertext
        sealed = account.cwd / f"{fmt}.age"
        account.ok("download", job, "-o", str(sealed))
        assert sealed.read_bytes().startswith(encryption.AGE_MAGIC)
        envelope = json.loads(Path(f"{sealed}.envelope.json").read_text())
        assert envelope["envelope"]["ciphertext_sha256"] == result["sha256"]
        assert envelope["envelope"]["recipients"] == sorted([alice.recipient, bob.recipient])
        assert envelope["signature"]["alg"] == "Ed25519"
        done = account.run("verify", str(sealed))
        assert done.returncode == 0, done.stderr
        assert "contents not checked" in done.stderr
        verdict = json.loads(account.ok("verify", str(sealed), "--output", "json"))
        assert verdict["verified"] is True and verdict["contents_checked"] is False

        # with the key: every note's text is there once decrypted
        for key in (alice, bob):
            verdict = json.loads(
                account.ok("verify", str(sealed), "--identity", str(key.file), "--output", "json")
            )
            assert verdict["verified"] is True and verdict["contents_checked"] is True
            assert verdict["notes"] == len(account.texts)
        plain = account.cwd / f"plain-{fmt}"
        account.ok("download", job, "--identity", str(alice.file), "-o", str(plain))
        data = plain.read_bytes()
        if fmt == "markdown_zip":
            with zipfile.ZipFile(plain) as zf:
                data = b"".join(zf.read(n) for n in zf.namelist())
        for needle in needles(account.texts)[::3]:
            assert needle in data or json.dumps(needle.decode()).encode()[1:-1] in data
        done = account.run("verify", str(plain))
        assert done.returncode == 0, done.stderr


def test_a_tenants_recipients_encrypt_its_bulk_exports_until_cleared(
    signed: E2E, account: Account
) -> None:
    """An operator sets the tenant's recipient: the next (bulk) export is encrypted to it
    and to the request's own, each identity decrypts it; cleared, the next is plain."""
    operator, client = new_key(account.cwd, "operator"), new_key(account.cwd, "client")
    done = account.run("tenant", "set-recipients", account.tenant, operator.recipient)
    assert done.returncode == 0, done.stderr
    assert operator.recipient in done.stderr
    job = account.export("--format", "ndjson", "--recipient", client.recipient)
    assert signed.db.job(job)["queue"] == "exports.bulk"
    account.ok("download", job, "-o", str(account.cwd / "bulk.age"))
    doc = json.loads((account.cwd / "bulk.age.envelope.json").read_text())
    assert doc["envelope"]["recipients"] == sorted([operator.recipient, client.recipient])
    assert account.status(job)["recipients"] == [client.recipient]  # the request's own
    for key in (operator, client):
        out = account.cwd / f"bulk-{key.file.stem}.ndjson"
        account.ok("download", job, "--identity", str(key.file), "-o", str(out))
        assert all(t.encode() in out.read_bytes() for t in account.texts)
    assert_no_plaintext(signed, account.texts)

    tenant_only = account.export("--format", "json")
    result = account.status(tenant_only)["result"]
    assert isinstance(result, dict) and result["encrypted"] is True

    account.ok("tenant", "set-recipients", account.tenant)
    plain = account.export("--format", "json")
    result = account.status(plain)["result"]
    assert isinstance(result, dict) and result["encrypted"] is False
    done = account.run("download", plain, "--identity", str(client.file))
    assert done.returncode == 2 and "not encrypted" in done.stderr


def test_bad_recipients_identities_and_files_get_clear_errors(
    signed: E2E, account: Account
) -> None:
    """A malformed recipient: 422 problem+json from the API (nothing accepted), a CLI
    message from ``submit`` and ``tenant set-recipients``; a secret key given as a
    recipient is refused without being echoed. A wrong identity, a malformed identity file
    and a truncated age file: ``download``/``verify`` say which, writing nothing. The same
    Idempotency-Key with other recipients is a conflict (recipients are part of the
    request)."""
    alice, mallory = new_key(account.cwd, "alice"), new_key(account.cwd, "mallory")
    url = f"{signed.stack.api_url}/v1/exports"
    headers = bearer(account.env["API_KEY"])
    for bad in (["age1notakey"], [alice.recipient[:-1] + "x"], [], ["x" * 5000]):
        r = httpx.post(url, json={"all": True, "recipients": bad}, headers=headers)
        assert r.status_code == 422, (bad, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
    secret = alice.file.read_text().splitlines()[1]
    r = httpx.post(url, json={"all": True, "recipients": [secret]}, headers=headers)
    assert r.status_code == 422 and r.json()["type"].endswith("/invalid_recipients")
    assert secret not in r.text and "secret key" in r.json()["detail"]
    assert (
        signed.db.scalar("SELECT count(*) FROM export_jobs WHERE tenant_id = %s", (account.tenant,))
        == 0
    )

    done = account.run("submit", "--all", "--recipient", "age1nope")
    assert done.returncode == 2 and "not an age X25519 recipient" in done.stderr
    done = account.run("tenant", "set-recipients", account.tenant, secret)
    assert done.returncode == 2 and secret not in done.stderr + done.stdout

    key = f"k-{uuid4().hex[:8]}"
    first = httpx.post(
        url,
        json={"all": True, "recipients": [alice.recipient]},
        headers={**headers, "Idempotency-Key": key},
    )
    assert first.status_code == 202, first.text
    again = httpx.post(
        url,
        json={"all": True, "recipients": [mallory.recipient]},
        headers={**headers, "Idempotency-Key": key},
    )
    assert again.status_code == 409, again.text
    job = first.json()["id"]
    signed.db.wait_status(job, "succeeded", 90)

    target = account.cwd / "wrong.json"
    done = account.run("download", job, "--identity", str(mallory.file), "-o", str(target))
    assert done.returncode == 1 and "none of the given identities" in done.stderr
    assert not target.exists()
    broken = account.cwd / "broken.key"
    broken.write_text("AGE-SECRET-KEY-1NOTAKEY\n")
    done = account.run("download", job, "--identity", str(broken), "-o", str(target))
    assert done.returncode == 2 and "line 1" in done.stderr and "NOTAKEY" not in done.stderr

    sealed = account.cwd / "t.age"
    account.ok("download", job, "-o", str(sealed))
    data = sealed.read_bytes()
    sealed.write_bytes(data[: len(data) - 40])
    done = account.run("verify", str(sealed))
    assert done.returncode == 1 and "truncated" in done.stderr
    done = account.run("verify", str(sealed), "--identity", str(alice.file))
    assert done.returncode == 1 and "truncated or was altered" in done.stderr
    done = account.run("verify", str(sealed), "--identity", str(mallory.file))
    assert done.returncode == 1 and "none of the given identities" in done.stderr
    assert not list(account.cwd.glob(".*.part")) and not list(account.cwd.glob(".*.age"))
    os.remove(f"{sealed}.envelope.json")
    done = account.run("verify", str(sealed))
    assert done.returncode == 2 and "no envelope" in done.stderr
