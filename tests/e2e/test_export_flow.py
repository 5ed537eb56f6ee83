"""Submit over HTTP to the real gunicorn api; the real publisher and Celery workers run the
exports; download and check the files against the snapshot and their SHA-256."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from pathlib import Path

import httpx
import psycopg
import pytest
import yaml

from devtools.ha.pgbouncer import PgBouncer
from devtools.stack import Servers
from tests.e2e.conftest import E2E, running_stack

pytestmark = pytest.mark.e2e


def snapshot(e2e: E2E, job_id: str) -> list[tuple]:
    with psycopg.connect(e2e.database_url) as conn:
        return conn.execute(
            "SELECT note_id, title, content, pinned FROM export_job_items i"
            " JOIN (SELECT id, version, title, content, pinned FROM notes UNION ALL"
            "       SELECT note_id, version, title, content, pinned FROM note_versions) n"
            "   ON n.id = i.note_id AND n.version = i.version"
            " WHERE job_id = %s ORDER BY ordinal",
            (job_id,),
        ).fetchall()


def download(client: httpx.Client, status: dict) -> bytes:
    r = client.get(status["links"]["download"])
    assert r.status_code == 200, r.text
    data = r.content
    assert hashlib.sha256(data).hexdigest() == status["result"]["sha256"]
    assert r.headers["etag"] == f'"{status["result"]["sha256"]}"'
    assert len(data) == status["result"]["bytes"]
    return data


def test_small_and_large_exports_run_on_their_queues_and_download_intact(e2e: E2E) -> None:
    export_flow(e2e)


def test_the_flow_behind_pgbouncer_in_transaction_mode(
    servers: Servers,
    template_db: str,
    notes_dir: Path,
    tmp_path: Path,
    pgbouncer: PgBouncer,
) -> None:
    """The same flow once more with every process (and the CLI that sets the tenant up)
    behind a transaction pooler: no prepared statements, the session defaults checked, the
    publisher's and webhook-delivery's LISTEN over the direct URL."""
    with running_stack(servers, template_db, notes_dir, tmp_path, pooler=pgbouncer) as e2e:
        assert e2e.stack.env["DATABASE_URL"].endswith(
            f":{pgbouncer.port}/" + e2e.database_url.rsplit("/", 1)[1]
        )
        export_flow(e2e)
        listening = e2e.db.scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name IN"
            " ('exports-publisher-listen', 'exports-webhook-listen') AND query ILIKE 'LISTEN%%'"
            " AND datname = current_database()"
        )
        assert listening == 2  # around the pooler, each on a session of its own


def export_flow(e2e: E2E) -> None:
    """Submit a small, a bulk and an ndjson export over HTTP; each succeeds on its queue's
    worker on the first attempt and downloads intact, equal to its snapshot."""
    with httpx.Client(base_url=e2e.stack.api_url, headers=e2e.api.auth, timeout=10) as client:
        with psycopg.connect(e2e.database_url) as conn:
            ids = [
                r[0]
                for r in conn.execute(
                    "SELECT id FROM notes WHERE tenant_id = %s ORDER BY id", (e2e.tenant,)
                )
            ]
        assert len(ids) > 30, "the real notes folder must hold enough notes for a bulk export"

        small = client.post("/v1/exports", json={"note_ids": ids[:5], "format": "json"})
        large = client.post("/v1/exports", json={"all": True, "format": "markdown_zip"})
        lines = client.post("/v1/exports", json={"note_ids": ids[5:25], "format": "ndjson"})
        for r in (small, large, lines):
            assert r.status_code == 202, r.text
        assert small.json()["queue"] == "exports.fast"
        assert large.json()["queue"] == "exports.bulk"

        s_small = e2e.api.wait_terminal(small.json()["id"], client=client)
        s_large = e2e.api.wait_terminal(large.json()["id"], client=client)
        s_lines = e2e.api.wait_terminal(lines.json()["id"], client=client)
        for s in (s_small, s_large, s_lines):
            assert s["status"] == "succeeded", s
            assert s["attempts"] == 1

        doc = json.loads(download(client, s_small))
        assert doc["export"]["id"] == s_small["id"] and doc["export"]["count"] == 5
        assert [(n["id"], n["title"], n["content"], n["pinned"]) for n in doc["notes"]] == snapshot(
            e2e, s_small["id"]
        )

        *ndjson, trailer = download(client, s_lines).decode().splitlines()
        assert [
            (n["id"], n["title"], n["content"], n["pinned"]) for n in map(json.loads, ndjson)
        ] == snapshot(e2e, s_lines["id"])
        assert json.loads(trailer)["manifest"]["notes"] == len(ndjson)  # the manifest line

        archive = zipfile.ZipFile(io.BytesIO(download(client, s_large)))
        manifest = json.loads(archive.read("manifest.json"))
        expected = snapshot(e2e, s_large["id"])
        assert len(manifest["files"]) == len(expected) == len(ids)
        for entry, (note_id, title, content, pinned) in zip(
            manifest["files"], expected, strict=True
        ):
            text = archive.read(entry["path"]).decode()
            _, front, body = text.split("---\n", 2)
            meta = yaml.safe_load(front)
            assert (meta["id"], meta["title"], meta["pinned"]) == (note_id, title, pinned)
            assert body.lstrip("\n").rstrip("\n") == content.rstrip("\n")

    # Each export ran on the worker of its queue.
    fast_log = e2e.stack.procs["fast-worker"].log_text()
    bulk_log = e2e.stack.procs["bulk-worker"].log_text()
    assert s_small["id"] in fast_log and s_small["id"] not in bulk_log
    assert s_large["id"] in bulk_log and s_large["id"] not in fast_log


def test_the_result_lives_in_the_configured_store(e2e: E2E) -> None:
    with httpx.Client(base_url=e2e.stack.api_url, headers=e2e.api.auth, timeout=10) as client:
        r = client.post("/v1/exports", json={"all": True, "format": "ndjson"})
        assert r.status_code == 202, r.text
        status = e2e.api.wait_terminal(r.json()["id"], client=client)
        assert status["status"] == "succeeded"
        data = download(client, status)
    with psycopg.connect(e2e.database_url) as conn:
        ref, etag = conn.execute(
            "SELECT result_ref, result_etag FROM export_jobs WHERE id = %s", (status["id"],)
        ).fetchone()
    listed = [(a.key, a.complete) for a in e2e.store.entries(e2e.tenant, status["id"])]
    assert listed == [(ref, True)]
    stream, size = e2e.store.open_reader(ref)
    with stream:
        assert stream.read() == data and size == len(data)
    local = [p for p in e2e.artifact_dir.rglob("*") if p.is_file()]
    if e2e.backend == "file":
        assert etag is None
        assert any(p.relative_to(e2e.artifact_dir).as_posix() == ref for p in local)
    else:  # nothing on the local disk: the object, with the ETag the store gave it
        assert local == []
        head = e2e.store.client().head_object(
            Bucket=e2e.store.config.bucket, Key=e2e.store.object_key(ref)
        )
        assert etag == head["ETag"].strip('"')
