"""The api's X-Request-ID and RateLimit fields, in this process against real PostgreSQL and
Redis: a generated id in the header and the problem body, a valid client id kept and an
invalid one replaced, the id on the console's error page; RateLimit-Policy / RateLimit on
every answer of a limited route (the remaining count falling with each request, the 429's
reset equal to its Retry-After), never on a 401 or an unlimited route, and describing the
local share while Redis is unreachable. The id in the log lines of a real gunicorn and on
the span: tests/e2e/test_request_ids_e2e.py."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import http_sf
import pytest
from fastapi.testclient import TestClient

from devtools.stack import free_port
from exportcore.auth import create_api_key
from exportcore.settings import Settings
from services.api.app import create_app
from tests.support import tenant_with_notes

GENERATED = re.compile(r"[0-9a-f]{32}")
SLOW = 0.01  # tokens per second: nothing refills while a test runs (one token per 100 s)


@pytest.fixture
def tenant_key(pool, notes_dir: Path) -> dict[str, str]:
    tid, _ = tenant_with_notes(pool, notes_dir)
    with pool.connection() as conn:
        key, _ = create_api_key(conn, tenant_id=tid, scopes=["exports:read", "exports:write"])
    return {"Authorization": f"Bearer {key}"}


def _client(settings: Settings, **update: Any) -> TestClient:
    return TestClient(create_app(settings.model_copy(update=update)))


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with _client(
        settings,
        tenant_read_rate=SLOW,
        tenant_read_burst=3,
        tenant_submit_rate=SLOW,
        tenant_submit_burst=2,
        tenant_limits_cache_seconds=0,
        console_sign_in_rate=SLOW,
        console_sign_in_burst=2,
    ) as c:
        yield c


def fields(response: Any) -> tuple[list[Any], list[Any]]:
    """``(RateLimit-Policy, RateLimit)`` parsed as structured-field Lists (RFC 9651): a
    malformed field fails here, as it would in a client."""
    return (
        http_sf.parse(response.headers["ratelimit-policy"].encode(), tltype="list"),
        http_sf.parse(response.headers["ratelimit"].encode(), tltype="list"),
    )


def test_a_generated_id_is_returned_and_named_in_the_problem(client, tenant_key) -> None:
    first = client.get(f"/v1/exports/{uuid4()}", headers=tenant_key)
    second = client.get(f"/v1/exports/{uuid4()}", headers=tenant_key)
    for r in (first, second):
        assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json"
        assert GENERATED.fullmatch(r.headers["x-request-id"])
        assert r.json()["request_id"] == r.headers["x-request-id"]
    assert first.headers["x-request-id"] != second.headers["x-request-id"]
    # an answer of no route, and the documentation, carry one too
    assert GENERATED.fullmatch(client.get("/healthz").headers["x-request-id"])
    assert GENERATED.fullmatch(client.get("/openapi.json").headers["x-request-id"])


VALID = [str(uuid4()), "ticket-4711.retry:2", "01HZX3K5G7Q2W8E4R6T9Y1U3I5", "a" * 128, "7"]
INVALID = [
    "a" * 129,  # too long
    "two words",
    'quote"d',
    "semi;colon",
    "caf\u00e9",  # not ASCII
    "nex_0123456789abcdefghij",  # the shape of an API key: never echoed, logged or traced
    "",
]


def test_a_valid_client_id_is_kept_an_invalid_one_replaced(client, tenant_key) -> None:
    for sent in VALID:
        r = client.get(f"/v1/exports/{uuid4()}", headers={**tenant_key, "X-Request-ID": sent})
        assert r.headers["x-request-id"] == sent and r.json()["request_id"] == sent
    for sent in INVALID:
        r = client.get(
            f"/v1/exports/{uuid4()}", headers={**tenant_key, "X-Request-ID": sent.encode()}
        )
        rid = r.headers["x-request-id"]
        assert GENERATED.fullmatch(rid) and r.json()["request_id"] == rid, sent
        assert sent == "" or sent not in r.text


def test_the_consoles_error_page_names_the_request(client) -> None:
    r = client.post("/console/bulk/cancel", headers={"X-Request-ID": "console-page-1"})
    assert r.status_code == 401 and r.headers["content-type"].startswith("text/html")
    assert r.headers["x-request-id"] == "console-page-1"
    assert "<code>console-page-1</code>" in r.text


def test_reads_carry_the_read_policy_and_a_falling_remaining_count(client, tenant_key) -> None:
    answers = [client.get("/v1/exports", headers=tenant_key) for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    for a in answers:
        policy, _ = fields(a)
        assert policy == [("read", {"q": 3, "w": 300})]  # 3 tokens, refilled in 3 / 0.01 s
    remaining = [fields(a)[1][0][1]["r"] for a in answers]
    assert remaining == [2, 1, 0, 0]
    for a in answers[:3]:  # the next token comes within 100 s (one token at 0.01/s)
        (name, params) = fields(a)[1][0]
        assert name == "read" and 1 <= params["t"] <= 100
    refused = answers[3]
    (_, params) = fields(refused)[1][0]
    retry_after = int(refused.headers["retry-after"])
    assert params == {"r": 0, "t": retry_after} and 90 < retry_after <= 100
    assert refused.json()["request_id"] == refused.headers["x-request-id"]


def test_a_submit_carries_the_submit_policy_also_when_refused(client, tenant_key) -> None:
    body = {"all": True, "format": "json"}
    accepted = client.post("/v1/exports", json=body, headers=tenant_key)
    assert accepted.status_code == 202
    assert fields(accepted) == ([("submit", {"q": 2, "w": 200})], [("submit", {"r": 1, "t": 100})])
    # a request the bucket allowed and the route then refused still tells the count
    invalid = client.post("/v1/exports", json={"format": "nope"}, headers=tenant_key)
    assert invalid.status_code == 422 and fields(invalid)[1][0][1]["r"] == 0
    refused = client.post("/v1/exports", json=body, headers=tenant_key)
    assert refused.status_code == 429
    (_, params) = fields(refused)[1][0]
    assert params == {"r": 0, "t": int(refused.headers["retry-after"])}


def test_no_fields_where_no_limiter_decided(client, tenant_key) -> None:
    # a 401 comes before the bucket: it tells nothing about anyone's bucket
    unknown = client.get("/v1/exports", headers={"Authorization": "Bearer nex_unknownkey000"})
    assert unknown.status_code == 401
    one = client.get(f"/v1/exports/{uuid4()}", headers=tenant_key)  # a status read: unlimited
    for r in (unknown, one, client.get("/healthz")):
        assert "ratelimit" not in r.headers and "ratelimit-policy" not in r.headers
        assert "x-request-id" in r.headers


def test_console_sign_ins_carry_their_policy(client) -> None:
    answers = [client.post("/console/login", data={"key": "x"}) for _ in range(3)]
    assert [a.status_code for a in answers] == [403, 403, 429]  # no form token, then throttled
    assert [fields(a)[1][0][1]["r"] for a in answers] == [1, 0, 0]
    assert fields(answers[0])[0] == [("console-sign-in", {"q": 2, "w": 200})]
    (_, params) = fields(answers[2])[1][0]
    assert params["t"] == int(answers[2].headers["retry-after"])


def test_while_redis_is_unreachable_the_fields_describe_the_local_share(
    settings: Settings, tenant_key
) -> None:
    with _client(
        settings,
        rate_limit_redis_url=f"redis://127.0.0.1:{free_port()}/0",
        rate_limit_local_share=0.5,
        tenant_read_rate=SLOW,
        tenant_read_burst=4,
    ) as c:
        r = c.get("/v1/exports", headers=tenant_key)
    assert r.status_code == 200
    assert fields(r) == ([("read", {"q": 2, "w": 400})], [("read", {"r": 1, "t": 200})])
