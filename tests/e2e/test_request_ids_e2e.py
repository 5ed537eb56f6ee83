"""Request ids on a real gunicorn (the Procfile line, JSON logs, spans exported over OTLP to
a real receiver): the id the api answers with in X-Request-ID is on the request's access
line, on every other line the request causes — one written by the exception handler in the
event loop, one by a sync route on a worker thread — in its problem body and on its server
span, whose trace the log lines name too; a client's valid id is used throughout, an invalid
one replaced everywhere; no key and no invalid id reaches the log."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from devtools.api_client import bearer
from exportcore.auth import create_api_key
from exportcore.settings import Settings
from tests.e2e.conftest import gunicorn_api
from tests.support import OtlpReceiver, tenant_with_notes, wait_for

pytestmark = pytest.mark.e2e

GENERATED = re.compile(r"[0-9a-f]{32}")
SECRET_KEY = "nex_NotARealKeyButShapedLikeOne42"


@pytest.fixture
def api(
    settings: Settings, pool, notes_dir: Path, tmp_path: Path
) -> Iterator[tuple[str, dict[str, str], Path, OtlpReceiver]]:
    tid, _ = tenant_with_notes(pool, notes_dir)
    with pool.connection() as conn:
        key, _ = create_api_key(conn, tenant_id=tid, scopes=["exports:read", "exports:write"])
    receiver = OtlpReceiver()
    tracing = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }
    try:
        with gunicorn_api(settings, tmp_path, **tracing) as (url, log):
            yield url, bearer(key), log, receiver
    finally:
        receiver.close()


def records(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def lines_of(log: Path, rid: str) -> list[dict[str, Any]]:
    return [r for r in records(log) if r.get("request_id") == rid]


def access_line(log: Path, rid: str) -> dict[str, Any] | None:
    return next((r for r in lines_of(log, rid) if r["logger"] == "services.api.access"), None)


def span_of(receiver: OtlpReceiver, rid: str) -> dict[str, Any] | None:
    return next((s for s in receiver.spans() if s["attributes"].get("request_id") == rid), None)


def test_the_id_is_on_every_log_line_the_problem_and_the_span(api, settings: Settings) -> None:
    url, auth, log, receiver = api
    # Every new job row violates a constraint: the problem handler logs "write refused by a
    # constraint" (in the event loop) and answers a 422 problem.
    with psycopg.connect(str(settings.database_url), autocommit=True) as conn:
        conn.execute("ALTER TABLE export_jobs ADD CONSTRAINT forced CHECK (false) NOT VALID")
    refused = httpx.post(
        f"{url}/v1/exports", json={"all": True, "format": "json"}, headers=auth, timeout=30
    )
    assert refused.status_code == 422
    rid = refused.headers["x-request-id"]
    assert GENERATED.fullmatch(rid) and refused.json()["request_id"] == rid
    wait_for(lambda: access_line(log, rid), 10, "the request's access line")
    mine = lines_of(log, rid)
    assert {r["logger"] for r in mine} >= {"services.api.access", "services.api.problems"}
    assert any(r["message"] == "write refused by a constraint" for r in mine)
    line = access_line(log, rid)
    assert line is not None and line["path"] == "/v1/exports" and line["status"] == 422

    span = wait_for(lambda: span_of(receiver, rid), 10, "the request's server span")
    assert span["name"].startswith("POST /v1/exports") and span["parent_id"] is None
    assert {r.get("trace_id") for r in mine} == {span["trace_id"]}  # the logs name its trace

    # A console sign-in without its form token: the sync route logs a warning on a worker
    # thread of the event loop's pool; the key it was sent is in no line.
    sign_in = httpx.post(f"{url}/console/login", data={"key": SECRET_KEY}, timeout=30)
    assert sign_in.status_code == 403
    sid = sign_in.headers["x-request-id"]
    wait_for(lambda: access_line(log, sid), 10, "the sign-in's access line")
    warning = [r for r in lines_of(log, sid) if r["level"] == "WARNING"]
    assert warning and warning[0]["message"].startswith("console sign-in refused")
    assert sid != rid and SECRET_KEY not in log.read_text()


def test_a_clients_valid_id_is_used_throughout_an_invalid_one_nowhere(api) -> None:
    url, auth, log, receiver = api
    mine = "support-ticket-4711:try.2"
    kept = httpx.get(f"{url}/v1/exports/not-an-id", headers={**auth, "X-Request-ID": mine})
    assert kept.status_code == 422 and kept.headers["x-request-id"] == mine
    assert kept.json()["request_id"] == mine
    wait_for(lambda: access_line(log, mine), 10, "the access line with the client's id")
    wait_for(lambda: span_of(receiver, mine), 10, "the span with the client's id")

    for sent in ("two words\tand a tab", "nex_0123456789abcdefghij", "x" * 200):
        replaced = httpx.get(f"{url}/v1/exports", headers={**auth, "X-Request-ID": sent})
        new = replaced.headers["x-request-id"]
        assert replaced.status_code == 200 and GENERATED.fullmatch(new)
        wait_for(lambda new=new: access_line(log, new), 10, "the access line, new id")
        wait_for(lambda new=new: span_of(receiver, new), 10, "the span with the new id")
        assert sent not in log.read_text()
        assert all(s["attributes"].get("request_id") != sent for s in receiver.spans())
