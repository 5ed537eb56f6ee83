"""The api's logs on a real gunicorn (the Procfile line): a forced integrity error's row
content reaches no log (gunicorn's and uvicorn's own loggers go through the same redaction
filter, DETAIL lines dropped), request lines carry the route template and never the query
string or the key, and every line of the stream has one format."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from devtools.api_client import bearer
from exportcore.auth import create_api_key
from exportcore.settings import Settings
from exportctl.importer import import_notes
from tests.e2e.conftest import gunicorn_api
from tests.support import wait_for

pytestmark = pytest.mark.e2e

MARKER = "tenant-rowleak-7f3a"


@pytest.fixture
def api(settings: Settings, pool, tmp_path: Path) -> Iterator[tuple[str, dict[str, str], Path]]:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "diary.md").write_text("# Diary\n\nprivate\n")
    with pool.connection() as conn:
        conn.execute("INSERT INTO tenants (id, name) VALUES (%s, %s)", (MARKER, MARKER))
        key, _ = create_api_key(conn, tenant_id=MARKER, scopes=["exports:read", "exports:write"])
    import_notes(pool, MARKER, notes)
    with gunicorn_api(settings, tmp_path) as (url, log):
        yield url, bearer(key), log


def test_a_forced_integrity_error_leaves_no_row_content_in_any_log(
    api: tuple[str, dict[str, str], Path], settings: Settings
) -> None:
    url, auth, log = api
    # Every new job row now violates a constraint: PostgreSQL's error carries
    # "DETAIL: Failing row contains (<the whole row: tenant, selection, ...>)".
    with psycopg.connect(str(settings.database_url), autocommit=True) as conn:
        conn.execute(
            "ALTER TABLE export_jobs ADD CONSTRAINT forced_failure CHECK (false) NOT VALID"
        )
    answer = httpx.post(
        f"{url}/v1/exports?token=query-secret",
        json={"all": True, "format": "json"},
        headers=auth,
        timeout=30,
    )
    assert answer.status_code >= 400
    wait_for(lambda: '"status": ' in log.read_text(), 10, "the request line")
    text = log.read_text()
    assert "forced_failure" in text or "CheckViolation" in text or "500" in text, text[-3000:]
    assert MARKER not in text, text[-3000:]  # the row's tenant id, its selection ...
    assert "Failing row contains (" not in text
    assert "query-secret" not in text and auth["Authorization"].split()[1] not in text
    lines = [line for line in text.splitlines() if line.strip()]
    records = [json.loads(line) for line in lines if line.startswith("{")]
    tracebacks = [line for line in lines if not line.startswith("{")]
    assert records and not tracebacks, tracebacks[:5]  # one format: gunicorn's lines too
    request = next(r for r in records if r.get("path") == "/v1/exports" and "status" in r)
    assert request["method"] == "POST" and request["status"] == answer.status_code
    assert isinstance(request["duration_ms"], float)
    assert any(r["logger"].startswith("gunicorn") for r in records)
