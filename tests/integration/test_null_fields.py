"""Explicit nulls in every top-level field of every JSON request body,
required or optional, read from the app's own OpenAPI document so that a new route or field
is covered without editing this test: a field whose schema does not allow null answers 422
naming it; a nullable one never makes the server fail. Real PostgreSQL behind the app;
Hypothesis picks the fields."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from exportcore.auth import create_api_key, create_operator_key
from exportcore.settings import Settings
from services.api.app import create_app
from tests.support import failed, tenant_with_notes

# A valid body per operation with a JSON body; "{schedule_id}", "{endpoint_id}" and
# "{job_id}" (a failed export) are filled with real ones, "{dead_letter_id}" with one that
# does not exist (a 404 after the body was validated).
BASE_BODIES: dict[tuple[str, str], dict[str, Any]] = {
    ("post", "/v1/exports"): {"all": True},
    ("post", "/v1/schedules"): {"interval_seconds": 3600, "all": True},
    ("post", "/v1/schedule-preview"): {"cron": "@daily", "timezone": "UTC"},
    ("patch", "/v1/schedules/{schedule_id}"): {"name": "renamed"},
    ("post", "/v1/schedules/{schedule_id}/backfill"): {
        "from": "2026-01-01T00:00:00Z",
        "to": "2026-01-01T00:00:00Z",
    },
    ("post", "/v1/admin/schedules/{schedule_id}/backfill"): {
        "from": "2026-01-01T00:00:00Z",
        "to": "2026-01-01T00:00:00Z",
    },
    ("post", "/v1/webhooks"): {"url": "http://127.0.0.1:9/hook"},
    ("patch", "/v1/webhooks/{endpoint_id}"): {"description": "renamed"},
    ("post", "/v1/webhooks/{endpoint_id}/rotate-secret"): {},
    ("post", "/v1/admin/replays"): {"reason": "no_such_reason"},
    ("post", "/v1/admin/dead-letters/{dead_letter_id}/resolve"): {"note": "checked"},
    ("post", "/v1/webhooks/{endpoint_id}/recover"): {"since": "2026-01-01T00:00:00Z"},
    ("post", "/v1/admin/exports/{job_id}/replay"): {"format": "ndjson", "all": True},
    ("post", "/v1/admin/bulk-actions/preview"): {"action": "replay", "filter": {}},
    ("post", "/v1/admin/queues/{queue}/pause"): {"reason": "null fields", "tenant": "nobody"},
    ("post", "/v1/admin/queues/{queue}/resume"): {"reason": "null fields", "tenant": "nobody"},
    ("post", "/v1/admin/bulk-actions"): {
        "action": "cancel",
        "filter": {"tenant": "no-such-tenant"},
        "as_of": "2026-01-01T00:00:00Z",
        "confirmed_count": 0,
        "request_id": "00000000-0000-4000-8000-000000000016",
    },
}


def body_operations(openapi: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """``(method, path, resolved body schema)`` of every operation with a JSON body."""
    schemas = openapi["components"]["schemas"]
    found = []
    for path, operations in openapi["paths"].items():
        for method, op in operations.items():
            content = op.get("requestBody", {}).get("content", {}).get("application/json")
            if content is None:
                continue
            schema = content["schema"]
            if "anyOf" in schema:  # an optional body: the model, or null
                schema = next(alt for alt in schema["anyOf"] if "$ref" in alt)
            if "$ref" in schema:
                schema = schemas[schema["$ref"].rsplit("/", 1)[-1]]
            found.append((method, path, schema))
    return found


def nullable(prop: dict[str, Any]) -> bool:
    """Whether a property's JSON Schema admits null."""
    types = prop.get("type")
    if types == "null" or (isinstance(types, list) and "null" in types):
        return True
    return any(nullable(alt) for alt in prop.get("anyOf", []) + prop.get("oneOf", []))


@pytest.fixture
def client(
    settings: Settings, pool, notes_dir: Path
) -> Iterator[tuple[TestClient, dict, dict[str, str], dict[str, str]]]:
    """The app, the tenant's and an operator's auth headers, and the path parameters."""
    tid, ids = tenant_with_notes(pool, notes_dir)
    bad = failed(pool, settings, tid, ids)
    with pool.connection() as conn:
        key, _ = create_api_key(conn, tenant_id=tid, scopes=["exports:read", "exports:write"])
        operator, _ = create_operator_key(conn, label="null-fields")
    generous = settings.model_copy(
        update={
            "tenant_submit_burst": 100_000,
            "webhook_allow_http": True,
            "webhook_allow_private_networks": True,
        }
    )
    with TestClient(create_app(generous), raise_server_exceptions=False) as c:
        auth = {"Authorization": f"Bearer {key}"}
        sched = c.post("/v1/schedules", json={"interval_seconds": 3600, "all": True}, headers=auth)
        assert sched.status_code == 201, sched.text
        hook = c.post("/v1/webhooks", json={"url": "http://127.0.0.1:9/hook"}, headers=auth)
        assert hook.status_code == 201, hook.text
        params = {
            "{schedule_id}": sched.json()["id"],
            "{endpoint_id}": hook.json()["id"],
            "{dead_letter_id}": "999999999",
            "{job_id}": str(bad["id"]),
            "{queue}": "exports.bulk",
        }
        yield c, auth, {"Authorization": f"Bearer {operator}"}, params


def test_every_body_operation_has_a_base_body(settings: Settings) -> None:
    ops = {(m, p) for m, p, _ in body_operations(create_app(settings).openapi())}
    assert ops == set(BASE_BODIES), "add a valid base body for the new operation(s)"


@hypothesis_settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_explicit_nulls_are_a_422_naming_the_field_or_harmless(client, data) -> None:
    c, tenant_auth, operator_auth, params = client
    operations = body_operations(c.app.openapi())  # type: ignore[attr-defined]
    method, path, schema = data.draw(st.sampled_from(operations), label="operation")
    fields = sorted(schema["properties"])
    nulls = data.draw(st.sets(st.sampled_from(fields), min_size=1), label="null fields")
    body = {**BASE_BODIES[(method, path)], **dict.fromkeys(nulls)}
    url = path
    for name, value in params.items():
        url = url.replace(name, value)
    auth = operator_auth if path.startswith("/v1/admin/") else tenant_auth
    answer = c.request(method, url, json=body, headers=auth)
    assert answer.status_code < 500, (method, path, body, answer.text)
    assert answer.headers["content-type"].startswith(("application/json", "application/problem"))
    refused = {n for n in nulls if not nullable(schema["properties"][n])}
    if refused:
        assert answer.status_code == 422, (method, path, body, answer.text)
        named = {tuple(e["loc"][:2]) for e in answer.json()["errors"]}
        assert {("body", n) for n in refused} <= named, answer.json()
