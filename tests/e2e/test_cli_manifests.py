"""exportctl's commands for signed manifests and delta chains, run as a user runs them (a
subprocess) against a running stack whose manifests are signed with a key that
``exportctl manifest-key new`` printed: ``manifest-key new`` itself, ``verify FILE`` (a good
file exits 0; a tampered one exits 1 naming what does not match), ``notes delete`` and
``notes import --replace`` (each leaves a tombstone that the next delta carries) and
``restore --chain ID DIR`` (base + deltas through the API equal a full export taken at the
same moment; an unknown export or a broken chain is an error exit that writes nothing).

Every test works on a small account of its own (a few notes), exported by the stack's
real workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from uuid import uuid4

import httpx
import pytest

from devtools.stack import Servers
from exportcore import manifests
from exportctl.verify import Artifact, read_artifact
from tests.e2e.conftest import E2E, running_stack

pytestmark = pytest.mark.e2e

EXPORTCTL = str(Path(sys.executable).parent / "exportctl")


@pytest.fixture(scope="module")
def backend() -> str:
    """The commands are the same on both stores: the file store keeps this module quick."""
    return "file"


def cli(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``exportctl ARGS`` in ``cwd`` with exactly ``env`` (plus a wide terminal)."""
    return subprocess.run(
        [EXPORTCTL, *args],
        env={**env, "COLUMNS": "200"},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def ok(env: dict[str, str], cwd: Path, *args: str) -> str:
    """Run ``exportctl ARGS``; its stdout, failing the test with stderr on a non-zero exit."""
    done = cli(env, cwd, *args)
    assert done.returncode == 0, f"exportctl {' '.join(args)}: {done.stderr}"
    return done.stdout


def new_key_pair(env: dict[str, str], cwd: Path) -> dict[str, str]:
    """``exportctl manifest-key new --output json``: ``{private_key, public_key, key_id}``."""
    pair: dict[str, str] = json.loads(ok(env, cwd, "manifest-key", "new", "--output", "json"))
    return pair


@dataclass
class Signed:
    """The module's stack and the key pair it signs manifests with."""

    e2e: E2E
    key: dict[str, str]


@pytest.fixture(scope="module")
def signed(
    servers: Servers,
    template_db: str,
    notes_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Signed]:
    """A stack (file store) whose ``MANIFEST_SIGNING_KEY`` is a key printed by
    ``exportctl manifest-key new``."""
    base = tmp_path_factory.mktemp("cli-manifests")
    key = new_key_pair(dict(os.environ), base)
    with running_stack(
        servers, template_db, notes_dir, base, {"MANIFEST_SIGNING_KEY": key["private_key"]}
    ) as e:
        yield Signed(e, key)


@dataclass
class Account:
    """A tenant of the stack with a few notes imported from ``folder``: ``env`` runs
    exportctl as its user (``API_URL``, its ``API_KEY``) and as an operator of the database
    (``DATABASE_URL``)."""

    e2e: E2E
    tenant: str
    folder: Path
    env: dict[str, str]
    cwd: Path

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``exportctl ARGS`` as this account."""
        return cli(self.env, self.cwd, *args)

    def note_ids(self) -> dict[str, int]:
        """``{source file: note id}`` of the account's notes."""
        rows = self.e2e.db.sql(
            "SELECT source_path, id FROM notes WHERE tenant_id = %s", (self.tenant,)
        )
        return {r["source_path"]: r["id"] for r in rows}

    def export(self, *args: str) -> tuple[str, Path]:
        """Submit an all-notes ndjson export (``args``: e.g. ``--since ID``), wait for the
        stack's workers to finish it, download it: ``(export id, file)``."""
        job = ok(self.env, self.cwd, "submit", "--all", "--format", "ndjson", *args).strip()
        self.e2e.db.wait_status(job, "succeeded", 60)
        path = self.cwd / f"export-{job}.ndjson"
        ok(self.env, self.cwd, "download", job, "-o", str(path))
        return job, path


@pytest.fixture
def account(signed: Signed, tmp_path: Path) -> Account:
    """A new tenant with an API key and three notes (``a.md``, ``b.md``, ``c.md``), imported
    with ``exportctl notes import``."""
    e = signed.e2e
    tenant = "cli-" + uuid4().hex[:6]
    folder = tmp_path / "vault"
    folder.mkdir()
    for name in "abc":
        (folder / f"{name}.md").write_text(f"# Note {name}\n\nbody of {name}\n")
    # a config folder of its own: a restore pins the API's keys there on first use
    env = {**e.stack.env, "API_URL": e.stack.api_url, "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    ok(env, tmp_path, "tenant", "create", tenant)
    env["API_KEY"] = ok(env, tmp_path, "apikey", "create", tenant, "--quiet").strip()
    ok(env, tmp_path, "notes", "import", str(folder), "--tenant", tenant)
    return Account(e, tenant, folder, env, tmp_path)


def notes_and_tombstones(art: Artifact) -> tuple[dict[int, int], dict[int, int]]:
    """``({note id: version}, {tombstoned note id: version})`` of an export file."""
    notes = {i.id: i.version for i in art.items if not i.deleted}
    return notes, {i.id: i.version for i in art.items if i.deleted}


# --- manifest-key new -------------------------------------------------------------------------


def test_manifest_key_new_prints_a_key_pair_the_deployment_signs_with(
    signed: Signed, account: Account
) -> None:
    """``manifest-key new`` runs without a database or an API: stdout is the private key
    alone (for ``MANIFEST_SIGNING_KEY``), stderr its public key and key id, and what the
    private key signs verifies with that public key; ``--output json`` has all three; every
    run is a new key. The stack signs with the pair its fixture got that way: the API
    serves its public key, and its exports verify against the printed public key and
    against no other."""
    bare = {"PATH": os.environ["PATH"], "HOME": str(account.cwd)}
    if "PYTHONPATH" in os.environ:  # the checkout's packages, as the stack runs them
        bare["PYTHONPATH"] = os.environ["PYTHONPATH"]
    printed = cli(bare, account.cwd, "manifest-key", "new")
    assert printed.returncode == 0, printed.stderr
    [private] = printed.stdout.splitlines()  # PRIVATE=$(exportctl manifest-key new)
    public = manifests.load_private_key(private).public_key()
    kid = manifests.key_id(public)
    assert f"(key id {kid})" in printed.stderr and private not in printed.stderr
    shown_public = manifests.load_public_key(printed.stderr.split("public key ", 1)[1].split()[0])
    assert manifests.key_id(shown_public) == kid
    signer = manifests.Signer.from_texts(private)  # as the processes read MANIFEST_SIGNING_KEY
    assert signer is not None
    header = {"export_id": "x", "key_id": kid}
    assert manifests.check_signature(header, signer.sign(header), {kid: shown_public}) is None

    pair = new_key_pair(bare, account.cwd)
    assert pair["private_key"] != private
    assert manifests.key_id(manifests.load_public_key(pair["public_key"])) == pair["key_id"]
    assert (
        manifests.key_id(manifests.load_private_key(pair["private_key"]).public_key())
        == pair["key_id"]
    )
    assert pair["key_id"] != kid

    # The stack's key (printed the same way) is the one the API publishes and signs with.
    served = httpx.get(f"{account.e2e.stack.api_url}/v1/manifest-keys", timeout=10).json()
    assert [k["kid"] for k in served["keys"]] == [signed.key["key_id"]]
    _, path = account.export()
    art = read_artifact(path.read_bytes())
    assert art.signature is not None and art.signature["key_id"] == signed.key["key_id"]
    good = account.run("verify", str(path), "--public-key", signed.key["public_key"])
    assert good.returncode == 0, good.stderr
    other = account.run("verify", str(path), "--public-key", pair["public_key"])
    assert other.returncode == 1
    assert f"signed by key {signed.key['key_id']}, which is not among the trusted keys" in (
        other.stderr
    )


# --- verify -----------------------------------------------------------------------------------


def test_verify_passes_a_good_file_and_names_what_a_tampered_one_does_not_match(
    account: Account,
) -> None:
    """A downloaded export verifies against the API's public keys (exit 0, the verdict in
    ``--output json``); a changed byte in a note, a removed note and a changed count in the
    manifest each exit 1 and are named; a file that is not an export exits 1 too (it does
    not verify), one that cannot be read 2."""
    job, path = account.export()
    good = account.run("verify", str(path))
    assert good.returncode == 0, good.stderr
    assert f"verified export {job} (full, 3 notes, 0 tombstones" in good.stderr
    verdict = json.loads(account.run("verify", str(path), "--output", "json").stdout)
    assert verdict["verified"] is True and verdict["problems"] == []
    assert (verdict["export_id"], verdict["kind"], verdict["notes"]) == (job, "full", 3)

    ids = account.note_ids()
    lines = path.read_bytes().split(b"\n")  # three note lines, the manifest, ""

    def verify(name: str, tampered: list[bytes]) -> subprocess.CompletedProcess[str]:
        bad = account.cwd / name
        bad.write_bytes(b"\n".join(tampered))
        return account.run("verify", str(bad))

    changed = [lines[0].replace(b"body of a", b"body of A"), *lines[1:]]
    assert changed != lines
    byte = verify("changed.ndjson", changed)
    assert byte.returncode == 1
    assert f"note {ids['a.md']}: its bytes do not match its SHA-256 in the manifest" in byte.stderr
    removed = verify("removed.ndjson", [lines[0], *lines[2:]])
    assert removed.returncode == 1
    assert f"note {ids['b.md']} is in the manifest but missing from the file" in removed.stderr
    trailer = json.loads(lines[3])
    trailer["manifest"]["notes"] = 2
    forged = verify("forged.ndjson", [*lines[:3], json.dumps(trailer).encode(), b""])
    assert forged.returncode == 1
    assert "the signature does not match the manifest" in forged.stderr
    assert "the manifest counts 2 notes and 0 tombstones; its entries hold 3 and 0" in forged.stderr
    (account.cwd / "notes.txt").write_text("not an export\n")
    junk = account.run("verify", str(account.cwd / "notes.txt"))
    assert junk.returncode == 1 and "not an export file" in junk.stderr
    gone = account.run("verify", str(account.cwd / "no-such-file"))
    assert gone.returncode == 2 and "cannot read" in gone.stderr
    assert "Traceback" not in byte.stderr + removed.stderr + forged.stderr + junk.stderr


# --- tombstones -------------------------------------------------------------------------------


def test_notes_delete_leaves_a_tombstone_the_next_delta_carries(account: Account) -> None:
    """``notes delete`` removes the tenant's note and leaves its tombstone (with the version
    after the note's last one); the delta since a full export carries it, and verifies
    against that export as its base. An id that is not the tenant's is listed, exits 5 and
    leaves no tombstone."""
    base, base_file = account.export()
    ids = account.note_ids()
    gone = ids["b.md"]
    deleted = account.run("notes", "delete", "--tenant", account.tenant, str(gone))
    assert deleted.returncode == 0, deleted.stderr
    assert "deleted 1 note" in deleted.stderr and "1 notes" not in deleted.stderr
    assert account.note_ids().keys() == {"a.md", "c.md"}
    ghost = 2**31 - 7
    missing = account.run(
        "notes", "delete", "--tenant", account.tenant, str(ghost), "--output", "json"
    )
    assert missing.returncode == 5
    assert json.loads(missing.stdout) == {"deleted": [], "missing": [ghost]}
    tombstones = account.e2e.db.sql(
        "SELECT note_id, version FROM note_tombstones WHERE tenant_id = %s", (account.tenant,)
    )
    assert [(t["note_id"], t["version"]) for t in tombstones] == [(gone, 2)]

    _, delta_file = account.export("--since", base)
    art = read_artifact(delta_file.read_bytes())
    assert art.manifest["kind"] == "delta" and art.manifest["base"]["export_id"] == base
    assert notes_and_tombstones(art) == ({}, {gone: 2})
    linked = account.run("verify", str(delta_file), "--base", str(base_file))
    assert linked.returncode == 0, linked.stderr


def test_notes_import_replace_leaves_a_tombstone_for_a_file_that_is_gone(
    account: Account,
) -> None:
    """Without ``--replace`` an import never deletes; with it, the imported note whose file
    left the folder is deleted and its tombstone is in the next delta, next to the note
    whose file changed (its new version)."""
    base, _ = account.export()
    ids = account.note_ids()
    (account.folder / "b.md").unlink()
    (account.folder / "c.md").write_text("# Note c\n\nbody of c, edited\n")
    kept = json.loads(
        account.run(
            "notes", "import", str(account.folder), "--tenant", account.tenant, "--output", "json"
        ).stdout
    )
    assert (kept["updated"], kept["deleted"]) == (1, 0)
    assert "b.md" in account.note_ids()
    replaced = account.run(
        "notes",
        "import",
        str(account.folder),
        "-t",
        account.tenant,
        "--replace",
        "--output",
        "json",
    )
    assert replaced.returncode == 0, replaced.stderr
    report = json.loads(replaced.stdout)
    assert (report["inserted"], report["updated"], report["deleted"]) == (0, 0, 1)
    assert account.note_ids() == {"a.md": ids["a.md"], "c.md": ids["c.md"]}

    _, delta_file = account.export("--since", base)
    art = read_artifact(delta_file.read_bytes())
    assert notes_and_tombstones(art) == ({ids["c.md"]: 2}, {ids["b.md"]: 2})
    assert account.run("verify", str(delta_file)).returncode == 0


# --- restore ----------------------------------------------------------------------------------


def test_restore_rebuilds_a_chain_equal_to_a_full_export_and_refuses_a_broken_one(
    account: Account,
) -> None:
    """``restore --chain`` follows a full export and two deltas (edits, a deleted note, a
    new note, a replacing import) back through the API, verifies and applies them: the
    restored notes are byte for byte the notes of a full export taken at the same moment,
    and ``chain.json`` names the chain oldest first. An unknown export exits 5, a folder
    that is not empty 2, and a chain whose base file is gone from storage 1, naming that
    export; none of them writes the folder."""
    base, _ = account.export()
    ids = account.note_ids()
    assert account.run("notes", "delete", "-t", account.tenant, str(ids["a.md"])).returncode == 0
    (account.folder / "a.md").unlink()
    (account.folder / "c.md").write_text("# Note c\n\nc, second version\n")
    (account.folder / "d.md").write_text("# Note d\n\nnew\n")
    ok(account.env, account.cwd, "notes", "import", str(account.folder), "-t", account.tenant)
    first, _ = account.export("--since", base)
    (account.folder / "b.md").unlink()
    (account.folder / "d.md").write_text("# Note d\n\nd, second version\n")
    ok(
        account.env,
        account.cwd,
        *("notes", "import", str(account.folder), "-t", account.tenant, "--replace"),
    )
    second, _ = account.export("--since", first)
    _, full_file = account.export()  # nothing changed since the second delta

    target = account.cwd / "restored"
    restored = account.run("restore", "--chain", second, str(target))
    assert restored.returncode == 0, restored.stderr
    assert f"restored 2 notes from 3 exports into {target}" in restored.stderr
    said = " ".join(restored.stderr.split())
    assert f"pinned the manifest keys of {account.e2e.stack.api_url} for the first time" in said
    full_notes = full_file.read_bytes().split(b"\n")[:-2]  # without the manifest line
    assert len(full_notes) == 2
    assert (target / "notes.ndjson").read_bytes() == b"".join(n + b"\n" for n in full_notes)
    chain = json.loads((target / "chain.json").read_text())
    assert [(c["export_id"], c["kind"]) for c in chain["chain"]] == [
        (base, "full"),
        (first, "delta"),
        (second, "delta"),
    ]
    assert chain["notes"] == 2

    ghost = account.cwd / "ghost"
    unknown = account.run("restore", "--chain", str(uuid4()), str(ghost))
    assert unknown.returncode == 5 and "HTTP 404" in unknown.stderr
    not_empty = account.run("restore", "--chain", second, str(target))
    assert not_empty.returncode == 2 and "is not an empty folder" in not_empty.stderr
    assert account.e2e.store.delete(account.e2e.db.job(base)["result_ref"])
    broken = account.run("restore", "--chain", second, str(ghost))
    assert broken.returncode == 1 and "HTTP 410" in broken.stderr
    assert f"the file of export {base} is gone from storage" in broken.stderr
    assert not ghost.exists()
    assert "Traceback" not in unknown.stderr + not_empty.stderr + broken.stderr
