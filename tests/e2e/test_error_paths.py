"""Unexpected errors of the real gunicorn api are problem+json (RFC 9457): an I/O error
inside the submit transaction, explicit nulls in schedule fields, constraint violations.
No answer carries the error's text; the api log names the error's type, never its message."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from exportcore import faults
from tests.e2e.conftest import E2E, running_stack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def api_only(servers, template_db, notes_dir, tmp_path_factory) -> Iterator[E2E]:
    base = tmp_path_factory.mktemp("errors")
    env = {"EXPORTS_FAULTS_FILE": str(base / "faults.json")}
    with running_stack(servers, template_db, notes_dir, base, env, names=("api",)) as e:
        yield e


def _client(e: E2E) -> httpx.Client:
    return httpx.Client(base_url=e.stack.api_url, headers=e.api.auth, timeout=20)


def _is_problem(answer: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json"), answer.headers
    body: dict[str, Any] = answer.json()
    assert body["status"] == status and body["type"].endswith("/" + code), body
    return body


def test_an_io_error_inside_the_submit_transaction_is_a_500_problem_without_detail(
    api_only: E2E,
) -> None:
    e = api_only
    faults.arm(Path(e.stack.env["EXPORTS_FAULTS_FILE"]), "submit.before_commit", "io")
    answer = _client(e).post("/v1/exports", json={"all": True})
    body = _is_problem(answer, 500, "internal_error")
    assert re.fullmatch(r"[0-9a-f]{32}", body["error_id"])
    for leak in ("injected", "EIO", "OSError", "Errno", "before_commit", "Traceback"):
        assert leak not in answer.text, (leak, answer.text)
    with e.db.connect() as conn:  # the transaction rolled back: nothing was accepted
        assert conn.execute("SELECT count(*) AS n FROM export_jobs").fetchone()["n"] == 0
    log = e.stack.procs["api"].log_text()
    line = next(x for x in log.splitlines() if body["error_id"] in x)
    assert "OSError" in line and "injected I/O error" not in line
    # the request's id, in the header and the body, names the line too
    assert body["request_id"] == answer.headers["x-request-id"] and body["request_id"] in line
    assert "Traceback" not in log and "injected I/O error" not in log
    # the next submit goes through: the failpoint fired once
    assert _client(e).post("/v1/exports", json={"all": True}).status_code == 202


@pytest.mark.parametrize(
    "field", ["enabled", "name", "catch_up", "max_catch_up", "overlap", "all", "format"]
)
def test_explicit_null_schedule_fields_are_a_422_naming_the_field(api_only: E2E, field) -> None:
    api = _client(api_only)
    create = api.post("/v1/schedules", json={"interval_seconds": 3600, "all": True, field: None})
    body = _is_problem(create, 422, "invalid_request")
    assert ["body", field] in [e["loc"][:2] for e in body["errors"]]
    sched = api.post("/v1/schedules", json={"interval_seconds": 3600, "all": True})
    assert sched.status_code == 201, sched.text
    patch = api.patch(f"/v1/schedules/{sched.json()['id']}", json={field: None})
    body = _is_problem(patch, 422, "invalid_request")
    assert ["body", field] in [e["loc"][:2] for e in body["errors"]]
    assert api.delete(f"/v1/schedules/{sched.json()['id']}").status_code == 204


def test_constraint_violations_are_4xx_problems_that_leak_no_row(api_only: E2E) -> None:
    """Constraints the application does not check itself (installed here for the test) are
    answered as a client error, never as a 500 carrying the database's 'Failing row'."""
    e = api_only
    with e.db.connect() as conn:
        conn.execute(
            "ALTER TABLE export_schedules ADD CONSTRAINT test_short_name CHECK (length(name) < 12)"
        )
        conn.execute(
            "CREATE UNIQUE INDEX test_unique_name ON export_schedules (tenant_id, name)"
            " WHERE name <> ''"
        )
    try:
        api = _client(e)
        body = {"interval_seconds": 3600, "all": True, "name": "a secret name"}
        long_name = api.post("/v1/schedules", json=body)
        _is_problem(long_name, 422, "invalid_value")
        first = api.post("/v1/schedules", json={**body, "name": "nightly"})
        assert first.status_code == 201, first.text
        again = api.post("/v1/schedules", json={**body, "name": "nightly"})
        _is_problem(again, 409, "conflict")
        for leak in ("secret", "nightly", "Failing row", "test_", "DETAIL"):
            assert leak not in long_name.text + again.text, leak
        assert "Failing row" not in e.stack.procs["api"].log_text()
    finally:
        with e.db.connect() as conn:
            conn.execute("DROP INDEX test_unique_name")
            conn.execute("ALTER TABLE export_schedules DROP CONSTRAINT test_short_name")
            conn.execute("DELETE FROM export_schedules")
