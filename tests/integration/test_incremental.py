"""Incremental exports, tombstones and signed manifests on real PostgreSQL: a full export
plus its deltas, restored (exportctl restore's apply_chain), equals a full export taken at
the same moment, for random histories of edits, deletes and replacing imports; and
``exportctl verify`` names a changed byte, a removed note, a forged manifest and a swapped
base."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from exportcore.artifacts import open_store
from exportcore.domain import ExportFormat, ExportRequest, InvalidSelection, UnusableBase
from exportcore.manifests import Signer, new_private_key_text
from exportcore.runner import JobRunner
from exportcore.settings import Settings
from exportcore.submit import submit_export
from exportctl.importer import import_notes
from exportctl.restore import apply_chain
from exportctl.verify import Artifact, problems, read_artifact
from tests.support import create_tenant, job

KEY = new_private_key_text()[0]


@pytest.fixture
def signed(settings: Settings) -> Settings:
    """The test's settings with a signing key (every note a fast export: one attempt)."""
    return settings.model_copy(update={"manifest_signing_key": SecretStr(KEY)})


def keys(s: Settings) -> dict[str, Any]:
    signer = s.manifest_signer()
    assert isinstance(signer, Signer)
    return {signer.key_id: signer.private.public_key()}


def export(pool: Any, s: Settings, tid: str, fmt: str = "ndjson", since: Any = None) -> Artifact:
    """Submit and run an export of every note (a delta with ``since``); its artifact."""
    request = ExportRequest.build(ExportFormat(fmt), None, True, since)
    row = submit_export(pool, s, tenant_id=tid, request=request, source="test").job
    runner = JobRunner(s, pool, open_store(s))
    assert runner.run(row["id"], uuid4()).result == "succeeded"
    done = job(pool, row["id"])
    return read_artifact((s.artifact_dir / done["result_ref"]).read_bytes())


def state_of(art: Artifact) -> dict[int, tuple[int, str | None, bytes]]:
    return {i.id: (i.version, i.sha256, i.data) for i in art.items if not i.deleted}


def add_note(conn: Any, tid: str, title: str, content: str) -> int:
    row = conn.execute(
        "INSERT INTO notes (tenant_id, title, content) VALUES (%s, %s, %s) RETURNING id",
        (tid, title, content),
    ).fetchone()
    return int(row["id"])


# Text PostgreSQL can store: UTF-8 without NUL.
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("create"), TEXT),
        st.tuples(st.just("edit"), st.integers(0, 50), TEXT),
        st.tuples(st.just("delete"), st.integers(0, 50)),
        st.tuples(st.just("import"), st.sets(st.integers(0, 5), max_size=6)),
        st.just(("delta",)),
    ),
    min_size=1,
    max_size=14,
)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=OPS, fmt=st.sampled_from(["ndjson", "json", "markdown_zip"]))
def test_base_plus_deltas_restores_to_the_full_export(
    pool, signed: Settings, tmp_path: Path, ops: list[tuple[Any, ...]], fmt: str
) -> None:
    tid = create_tenant(pool)
    with pool.connection() as conn:
        for n in range(3):
            add_note(conn, tid, f"seed {n}", f"seed body {n}")
    chain = [export(pool, signed, tid, fmt)]
    folder = tmp_path / f"vault-{tid}"
    for op in ops:
        with pool.connection() as conn:
            ids = [
                r["id"]
                for r in conn.execute(
                    "SELECT id FROM notes WHERE tenant_id = %s ORDER BY id", (tid,)
                )
            ]
            if op[0] == "create":
                add_note(conn, tid, op[1] or "untitled", op[1])
            elif op[0] == "edit" and ids:
                conn.execute(
                    "UPDATE notes SET content = content || %s, updated_at = now() WHERE id = %s",
                    (op[2] + "!", ids[op[1] % len(ids)]),
                )
            elif op[0] == "delete" and ids:
                conn.execute("DELETE FROM notes WHERE id = %s", (ids[op[1] % len(ids)],))
        if op[0] == "import":  # an import that replaces the imported notes by this folder
            folder.mkdir(exist_ok=True)
            for old in folder.iterdir():
                old.unlink()
            for n in op[1]:
                (folder / f"file-{n}.md").write_text(f"# File {n}\n\nbody {n} {len(ops)}\n")
            import_notes(pool, tid, folder, replace=True)
        if op[0] == "delta":
            chain.append(
                export(pool, signed, tid, fmt, since=UUID(chain[-1].manifest["export_id"]))
            )
    chain.append(export(pool, signed, tid, fmt, since=UUID(chain[-1].manifest["export_id"])))
    try:
        expected = state_of(export(pool, signed, tid, fmt))
    except InvalidSelection:  # every note was deleted: no full export of an empty account
        expected = {}
    for art in chain:
        assert problems(art, keys(signed)) == []
    restored = {k: (v.version, v.sha256, v.data) for k, v in apply_chain(chain).items()}
    assert restored == expected


def test_a_delta_needs_a_succeeded_full_base_of_the_same_format(pool, signed: Settings) -> None:
    tid = create_tenant(pool)
    with pool.connection() as conn:
        add_note(conn, tid, "a", "b")
    base = export(pool, signed, tid, "ndjson")
    base_id = UUID(base.manifest["export_id"])
    for fmt, since in (("json", base_id), ("ndjson", uuid4())):
        request = ExportRequest.build(ExportFormat(fmt), None, True, since)
        with pytest.raises(UnusableBase):
            submit_export(pool, signed, tenant_id=tid, request=request, source="test")
    other = create_tenant(pool)
    with pytest.raises(UnusableBase):
        request = ExportRequest.build(ExportFormat.NDJSON, None, True, base_id)
        submit_export(pool, signed, tenant_id=other, request=request, source="test")
    empty = export(pool, signed, tid, "ndjson", since=base_id)  # nothing changed: empty delta
    assert (empty.manifest["notes"], empty.manifest["tombstones"]) == (0, 0)
    assert empty.manifest["base"] == {
        "export_id": str(base_id),
        "manifest_sha256": base.manifest_sha256,
    }


# --- tampering ------------------------------------------------------------------------------


@pytest.fixture
def exported(pool, signed: Settings) -> tuple[bytes, Artifact, Artifact, dict[str, Any]]:
    """(the ndjson bytes of a delta, that delta, its base, trusted keys)."""
    tid = create_tenant(pool)
    with pool.connection() as conn:
        ids = [add_note(conn, tid, f"t{n}", f"content {n}") for n in range(5)]
    base = export(pool, signed, tid)
    with pool.connection() as conn:
        conn.execute("UPDATE notes SET content = 'changed' WHERE id = %s", (ids[1],))
        conn.execute("DELETE FROM notes WHERE id = %s", (ids[3],))
        add_note(conn, tid, "new", "new note")
    request = ExportRequest.build(ExportFormat.NDJSON, None, True, UUID(base.manifest["export_id"]))
    row = submit_export(pool, signed, tenant_id=tid, request=request, source="test").job
    runner = JobRunner(signed, pool, open_store(signed))
    runner.run(row["id"], uuid4())
    data = (signed.artifact_dir / job(pool, row["id"])["result_ref"]).read_bytes()
    delta = read_artifact(data)
    assert (delta.manifest["notes"], delta.manifest["tombstones"]) == (2, 1)
    assert problems(delta, keys(signed), base=base) == []
    return data, delta, base, keys(signed)


def test_verify_names_a_changed_byte(exported) -> None:
    data, delta, _, trusted = exported
    note = delta.items[0]
    tampered = data.replace(
        note.data, note.data.replace(b"content", b"c0ntent").replace(b"changed", b"chanGed"), 1
    )
    assert tampered != data
    assert problems(read_artifact(tampered), trusted) == [
        f"note {note.id}: its bytes do not match its SHA-256 in the manifest"
    ]


def test_verify_names_a_removed_note(exported) -> None:
    data, delta, _, trusted = exported
    note = delta.items[1]
    tampered = data.replace(note.data + b"\n", b"", 1)
    assert problems(read_artifact(tampered), trusted) == [
        f"note {note.id} is in the manifest but missing from the file"
    ]


def test_verify_names_a_forged_manifest(exported) -> None:
    data, _, _, trusted = exported
    lines = data.split(b"\n")
    trailer = json.loads(lines[-2])
    trailer["manifest"]["notes"] = 3
    lines[-2] = json.dumps(trailer).encode()
    found = problems(read_artifact(b"\n".join(lines)), trusted)
    assert found[0].startswith("the signature does not match the manifest")
    assert any("counts 3 notes" in p for p in found)


def test_verify_names_a_swapped_base(pool, signed: Settings, exported) -> None:
    _, delta, base, trusted = exported
    tid = create_tenant(pool)
    with pool.connection() as conn:
        add_note(conn, tid, "x", "y")
    other = export(pool, signed, tid)
    [found] = problems(delta, trusted, base=other)
    assert found.startswith(f"the manifest's base is export {base.manifest['export_id']}")
    with pytest.raises(ValueError, match="does not name export"):
        apply_chain([other, delta])


def test_an_incremental_schedule_takes_a_full_export_every_n_slots(pool, signed: Settings) -> None:
    from datetime import UTC, datetime, timedelta

    from exportcore.schedules.management import create_schedule
    from exportcore.schedules.ticker import ScheduleTicker

    tid = create_tenant(pool)
    with pool.connection() as conn:
        add_note(conn, tid, "a", "b")
    t0 = datetime(2030, 1, 7, 9, 0, tzinfo=UTC)
    schedule = create_schedule(
        pool,
        tenant_id=tid,
        fields={"interval_seconds": 60, "all": True, "format": "ndjson", "full_every": 3},
        settings=signed,
    )
    assert schedule["payload"]["full_every"] == 3
    with pool.connection() as conn:
        conn.execute(
            "UPDATE export_schedules SET next_due_at = %s WHERE id = %s", (t0, schedule["id"])
        )
    runner = JobRunner(signed, pool, open_store(signed))
    bases: list[Any] = []
    ids: list[Any] = []
    for n in range(5):
        ScheduleTicker(signed, pool).tick(now=t0 + timedelta(minutes=n, seconds=1))
        with pool.connection() as conn:
            row = conn.execute(
                "SELECT j.id, j.base_job_id FROM export_jobs j"
                " JOIN export_schedule_slots s ON s.job_id = j.id"
                " WHERE s.schedule_id = %s ORDER BY j.created_at DESC LIMIT 1",
                (schedule["id"],),
            ).fetchone()
            add_note(conn, tid, f"n{n}", "more")
        assert runner.run(row["id"], uuid4()).result == "succeeded"
        ids.append(row["id"])
        bases.append(row["base_job_id"])
    # full, delta of the full, delta of that delta, then full again (every 3rd slot).
    assert bases == [None, ids[0], ids[1], None, ids[3]]
