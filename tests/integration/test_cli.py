"""``exportctl`` as a user runs it (a subprocess) against a real database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from uuid import uuid4

import pytest

from exportcore import faults
from exportcore.artifacts import FileArtifactStore
from exportcore.runner import JobRunner
from tests.support import count, submit, tenant_with_notes

EXPORTCTL = str(Path(sys.executable).parent / "exportctl")


def run(settings, *args: str, columns: int = 200) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": str(settings.database_url), "COLUMNS": str(columns)}
    return subprocess.run([EXPORTCTL, *args], env=env, capture_output=True, text=True, check=False)


def test_tenant_key_and_import_with_clear_errors(settings, pool, tmp_path: Path) -> None:
    bad = run(settings, "tenant", "create", "Not Valid!")
    assert bad.returncode == 1 and "invalid tenant id" in bad.stderr
    no_tenant = run(settings, "apikey", "create", "ghost")
    assert no_tenant.returncode == 5 and "exportctl tenant create ghost" in no_tenant.stderr
    assert run(settings, "tenant", "create", "acme").returncode == 0
    key = run(settings, "apikey", "create", "acme", "--quiet").stdout.strip()
    assert key.startswith("nex_")
    assert (
        count(
            pool, "SELECT count(*) FROM api_keys WHERE key_hash = sha256(%s::bytea)", key.encode()
        )
        == 1
    )
    bad_scope = run(settings, "apikey", "create", "acme", "--scope", "root")
    assert bad_scope.returncode == 1 and "unknown scope" in bad_scope.stderr
    keys = run(settings, "apikey", "list", "--tenant", "acme", columns=80)  # fits 80 columns
    assert keys.returncode == 0 and key[:12] in keys.stdout  # the prefix `revoke` takes
    assert max(len(line) for line in keys.stdout.splitlines()) <= 80
    too_big = run(settings, "tenant", "set-quota", "acme", str(2**31))
    assert too_big.returncode == 2 and "2147483647" in too_big.stderr
    assert "Traceback" not in too_big.stderr
    assert run(settings, "tenant", "set-quota", "acme", str(2**31 - 1)).returncode == 0

    vault = tmp_path / "vault"
    (vault / ".obsidian").mkdir(parents=True)
    (vault / ".obsidian" / "ignored.md").write_text("# hidden\n")
    (vault / "a.md").write_text("---\npinned: true\n---\n# Alpha\nbody\n")
    (vault / "b.txt").write_text("plain text\n")
    (vault / "bin.md").write_bytes(b"\x00\x01binary")
    (vault / "latin.md").write_bytes("caf\xe9".encode("latin-1"))
    (vault / "pic.png").write_bytes(b"\x89PNG")
    # Front matter the YAML parser cannot read (3000 nested brackets) is that file's warning.
    (vault / "crafted.md").write_text("---\nx: " + "[" * 3000 + "]" * 3000 + "\n---\nbody\n")
    (vault / "setup.md").write_text("```sh\n# install\napt install x\n```\n\n# Setup guide\n")
    first = run(settings, "notes", "import", str(vault), "--tenant", "acme")
    assert first.returncode == 0, first.stderr
    assert "crafted.md: front matter is not valid YAML; imported as plain text" in first.stderr
    assert first.stdout == ""  # the summary is a message: stderr
    assert (
        "imported 4 new" in first.stderr
        and "2 skipped" in first.stderr
        and "1 other files ignored" in first.stderr
    )
    assert "bin.md" in first.stderr and "binary" in first.stderr
    assert "latin.md" in first.stderr and "UTF-8" in first.stderr
    again = run(settings, "notes", "import", str(vault), "--tenant", "acme")
    assert "0 new, 0 changed, 4 unchanged" in again.stderr
    summary = json.loads(
        run(settings, "notes", "import", str(vault), "--tenant", "acme", "--output", "json").stdout
    )
    assert summary["unchanged"] == 4 and len(summary["skipped"]) == 2
    with pool.connection() as conn:
        rows = conn.execute("SELECT source_path, title FROM notes").fetchall()
    titles = {r["source_path"]: r["title"] for r in rows}
    assert titles["setup.md"] == "Setup guide"  # the first heading outside code
    assert (
        count(
            pool,
            "SELECT count(*) FROM notes WHERE tenant_id = 'acme' AND pinned AND title = 'Alpha'",
        )
        == 1
    )


def test_unreachable_database_is_a_clear_message(settings) -> None:
    down = settings.model_copy(update={"database_url": "postgresql://postgres@127.0.0.1:1/x"})
    r = run(down, "tenant", "create", "acme")
    assert (
        r.returncode == 1
        and "cannot reach the database" in r.stderr
        and "Traceback" not in r.stderr
    )


def test_dead_letters_database_fallback_and_api_commands_without_a_key(
    settings, pool, notes_dir, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dead letters are read from PostgreSQL only with --database (documented fallback);
    replays and resolutions go through the admin API (tests/e2e/test_operations.py)."""
    tid, ids = tenant_with_notes(pool, notes_dir)
    fault_file = tmp_path / "faults.json"
    monkeypatch.setenv(faults.ENV, str(fault_file))
    faults.arm(fault_file, "render.chunk", "permanent")
    failed = submit(pool, settings, tid, ids[:1])["id"]
    JobRunner(settings, pool, FileArtifactStore(settings.artifact_dir)).run(failed, uuid4())
    monkeypatch.delenv("API_KEY", raising=False)
    monkeypatch.delenv("OPERATOR_KEY", raising=False)
    listing = run(settings, "dead-letters", "list", "--database")
    assert (
        listing.returncode == 0
        and str(failed) in listing.stdout
        and "injected_permanent" in listing.stdout
        and "open" in listing.stdout
    )
    narrow = run(settings, "dead-letters", "list", "--database", columns=80)  # ids stay whole
    assert narrow.returncode == 0 and str(failed) in narrow.stdout
    empty = run(settings, "dead-letters", "list", "--database", "--state", "resolved", "--json")
    assert empty.returncode == 0 and empty.stdout.strip() == "[]"
    bad_state = run(settings, "dead-letters", "list", "--database", "--state", "lost")
    assert bad_state.returncode == 2 and "open, replayed, resolved" in bad_state.stderr
    for args in (("replay", str(failed)), ("dead-letters", "list")):
        no_key = run(settings, *args)
        assert no_key.returncode == 6 and "OPERATOR_KEY" in no_key.stderr, args  # unauthorised
    assert run(settings, "replay", "nope").returncode == 2
    both = run(settings, "replay", str(failed), "--all", "--note-id", "1")
    assert both.returncode == 2 and "not both" in both.stderr
    assert count(pool, "SELECT count(*) FROM export_jobs WHERE replay_of = %s", failed) == 0


def test_tenant_set_rate_overrides_and_resets_the_submit_limit(settings, pool) -> None:
    assert run(settings, "tenant", "create", "ratey").returncode == 0
    set_ = run(settings, "tenant", "set-rate", "ratey", "2.5", "--burst", "7")
    assert set_.returncode == 0 and "2.5 submits/s, bursts of 7" in set_.stderr, set_.stdout
    with pool.connection() as conn:
        row = conn.execute("SELECT submit_rate, submit_burst FROM tenants WHERE id = 'ratey'")
        assert row.fetchone() == {"submit_rate": 2.5, "submit_burst": 7}
    rate_only = run(settings, "tenant", "set-rate", "ratey", "4")
    assert "4 submits/s, bursts of 50 (default)" in rate_only.stderr, rate_only.stdout
    reset = run(settings, "tenant", "set-rate", "ratey")
    assert reset.returncode == 0 and "default rate 10 submits/s" in reset.stderr
    with pool.connection() as conn:
        row = conn.execute("SELECT submit_rate, submit_burst FROM tenants WHERE id = 'ratey'")
        assert row.fetchone() == {"submit_rate": None, "submit_burst": None}
    burst_alone = run(settings, "tenant", "set-rate", "ratey", "--burst", "3")
    assert burst_alone.returncode == 2 and "give RATE with --burst" in burst_alone.stderr
    zero = run(settings, "tenant", "set-rate", "ratey", "0")
    assert zero.returncode == 2 and "Traceback" not in zero.stderr
    ghost = run(settings, "tenant", "set-rate", "ghost", "1")
    assert ghost.returncode == 5 and "no tenant 'ghost'" in ghost.stderr


EVIL = "[bold]x[/]\x1b[31mred"
EVIL_FILE = "[blink]f\x1b[31mred"  # a file name has no "/"


def assert_text(shown: str, markup: str = "[bold]x[/]") -> None:
    """``EVIL`` (or ``EVIL_FILE``, ``markup="[blink]f"``) was printed as text: its markup
    visible, its ESC as ``\\x1b``, no escape sequence at all."""
    assert markup in shown and "\\x1b[31mred" in shown, shown
    assert "\x1b" not in shown


def test_tenant_and_notes_lists_with_json_pages_and_names_printed_as_text(
    settings, pool, tmp_path: Path
) -> None:
    assert run(settings, "tenant", "create", "listy", "--name", EVIL).returncode == 0
    assert run(settings, "tenant", "create", "listz").returncode == 0
    assert run(settings, "tenant", "set-quota", "listz", "7").returncode == 0
    vault = tmp_path / "vault"
    vault.mkdir()
    (vault / f"{EVIL_FILE}.md").write_text(f"# {EVIL}\nbody\n")
    (vault / "plain.md").write_text("# Plain\nbody\n")
    (vault / f"bin{EVIL_FILE}.md").write_bytes(b"\x00\x01binary")
    imported = run(settings, "notes", "import", str(vault), "--tenant", "listy")
    assert imported.returncode == 0, imported.stderr
    assert_text(imported.stderr, "[blink]f")  # the skipped file's name, in "not imported"

    tenants = run(settings, "tenant", "list", "--prefix", "list")
    assert tenants.returncode == 0, tenants.stderr
    assert_text(tenants.stdout)
    assert "listz" in tenants.stdout and "7" in tenants.stdout and "(default)" in tenants.stdout
    as_json = json.loads(run(settings, "tenant", "list", "--prefix", "list", "--json").stdout)
    assert [(t["id"], t["name"], t["quota"]) for t in as_json] == [
        ("listy", EVIL, settings.tenant_active_quota),
        ("listz", "listz", 7),
    ]
    first = run(settings, "tenant", "list", "--prefix", "list", "--limit", "1", "--json")
    assert [t["id"] for t in json.loads(first.stdout)] == ["listy"]
    assert "more: --after listy" in first.stderr
    rest = run(settings, "tenant", "list", "--prefix", "list", "--after", "listy", "--json")
    assert [t["id"] for t in json.loads(rest.stdout)] == ["listz"] and rest.stderr == ""

    notes = run(settings, "notes", "list", "--tenant", "listy")
    assert notes.returncode == 0, notes.stderr
    assert_text(notes.stdout)
    assert_text(notes.stdout, "[blink]f")
    assert "Plain" in notes.stdout and "plain.md" in notes.stdout
    rows = json.loads(run(settings, "notes", "list", "--tenant", "listy", "--json").stdout)
    assert sorted(r["title"] for r in rows) == sorted([EVIL, "Plain"])
    assert all("content" not in r and r["bytes"] > 0 for r in rows)
    with pool.connection() as conn:
        ids = [r["id"] for r in conn.execute("SELECT id FROM notes ORDER BY id")]
    page = run(settings, "notes", "list", "--tenant", "listy", "--limit", "1", "--json")
    assert [r["id"] for r in json.loads(page.stdout)] == ids[:1]
    assert f"more: --after {ids[0]}" in page.stderr
    after = run(settings, "notes", "list", "-t", "listy", "--after", str(ids[0]), "--json")
    assert [r["id"] for r in json.loads(after.stdout)] == ids[1:]
    ghost = run(settings, "notes", "list", "--tenant", "ghost")
    assert ghost.returncode == 5 and "no tenant 'ghost'" in ghost.stderr and ghost.stdout == ""


def test_apikey_list_json_has_the_rows_and_never_the_key(settings) -> None:
    assert run(settings, "tenant", "create", "keyed").returncode == 0
    key = run(settings, "apikey", "create", "keyed", "--quiet", "--label", EVIL).stdout.strip()
    listed = run(settings, "apikey", "list", "--tenant", "keyed", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(r["tenant_id"], r["label"]) for r in rows] == [("keyed", EVIL)]
    assert key.startswith(rows[0]["prefix"]) and key not in listed.stdout
    assert_text(run(settings, "apikey", "list", "--tenant", "keyed").stdout)
    narrow = run(settings, "apikey", "list", "--tenant", "keyed", columns=60).stdout
    assert rows[0]["prefix"] in narrow  # the handle `revoke` takes: never cut
    assert max(len(line) for line in narrow.splitlines()) <= 60


def test_key_changes_with_database_access_are_audited_with_the_os_user(
    settings, pool, notes_dir: Path
) -> None:
    tid, _ = tenant_with_notes(pool, notes_dir)
    created = run(settings, "operator-key", "create", "--label", "vera", "--role", "viewer")
    assert created.returncode == 0, created.stderr
    assert "(viewer)" in created.stderr and created.stdout.startswith("nex_op_")
    listed = json.loads(run(settings, "operator-key", "list", "--json").stdout)
    [key] = [k for k in listed if k["label"] == "vera"]
    assert key["role"] == "viewer"
    assert run(settings, "operator-key", "set-role", key["prefix"], "admin").returncode == 0
    bad_role = run(settings, "operator-key", "set-role", key["prefix"], "root")
    assert bad_role.returncode == 2 and "viewer, admin" in bad_role.stderr
    assert run(settings, "operator-key", "set-role", "nex_op_nobody", "admin").returncode == 5
    assert run(settings, "operator-key", "revoke", key["prefix"]).returncode == 0
    api_key = run(settings, "apikey", "create", tid, "--quiet").stdout.strip()
    assert run(settings, "apikey", "revoke", api_key[:12]).returncode == 0
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT action, actor_kind, actor, detail FROM operator_actions"
            " WHERE action <> 'notes_import' ORDER BY id"  # tenant_with_notes imported
        ).fetchall()
    assert [r["action"] for r in rows] == [
        "operator_key_create",
        "operator_key_set_role",
        "operator_key_revoke",
        "api_key_create",
        "api_key_revoke",
    ]
    assert all(
        r["actor_kind"] == "database" and r["actor"].startswith("exportctl as ") for r in rows
    )
    assert rows[1]["detail"]["role"] == "admin" and "nex_" not in str(rows[3]["detail"]).replace(
        api_key[:12], ""
    )
