"""A note file swapped for a symbolic link while `import_notes` runs (after the walk, before
its open) is skipped and reported, and nothing outside the folder reaches the database. The
swap is deterministic: the progress callback swaps the next file (files are read in sorted
order, after the walk)."""

from __future__ import annotations

from pathlib import Path

from psycopg_pool import ConnectionPool

from exportcore.db import Conn
from exportctl.importer import import_notes
from tests.support import create_tenant

SECRET = "-----BEGIN PRIVATE KEY-----\nnot for export\n"


def test_a_file_swapped_for_a_link_during_the_import_is_skipped(
    pool: ConnectionPool[Conn], tmp_path: Path
) -> None:
    vault, outside = tmp_path / "vault", tmp_path / "outside"
    vault.mkdir()
    outside.mkdir()
    for name in ("a.md", "b.md", "c.md"):
        (vault / name).write_text(f"# {name}\n")
    (outside / "id_rsa").write_text(SECRET)
    tenant = create_tenant(pool)

    def swap(done: int, total: int) -> None:
        if done == 1:  # a.md was read; b.md is next
            (vault / "b.md").unlink()
            (vault / "b.md").symlink_to(outside / "id_rsa")

    report = import_notes(pool, tenant, vault, on_progress=swap)
    assert report.skipped == [("b.md", "a symbolic link (links are not followed)")]
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT source_path, content FROM notes WHERE tenant_id = %s ORDER BY source_path",
            (tenant,),
        ).fetchall()
    assert [r["source_path"] for r in rows] == ["a.md", "c.md"]
    assert all(SECRET not in r["content"] for r in rows)
