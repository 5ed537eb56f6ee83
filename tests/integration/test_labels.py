"""Metadata and tags on real PostgreSQL, through the API in-process (FastAPI TestClient):
submitted, returned everywhere the export is, filtered, part of the Idempotency-Key's
request, inherited from a schedule, carried by replays, webhooks and bulk actions
(docs/api.md "Metadata and tags")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from fastapi.testclient import TestClient

from devtools.stack import ROOT
from exportcore import bulk
from exportcore.audit import as_actor
from exportcore.auth import create_api_key, create_operator_key
from exportcore.cancel import request_cancel
from exportcore.domain import ExportFormat, ExportRequest, Labels
from exportcore.replays import Correction, replay_export
from exportcore.settings import Settings
from exportcore.store.jobs import job_claim, job_fail_if_leased
from exportcore.submit import submit_export
from exportcore.webhooks import endpoints
from services.api.app import create_app
from tests.support import count, create_tenant, tenant_with_notes

PROBLEM = "application/problem+json"
LABELS = {"metadata": {"order_id": "ord_1", "team": "a"}, "tags": ["nightly", "team-a"]}


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c


@pytest.fixture
def tenant(pool, notes_dir: Path) -> tuple[str, list[int], dict[str, str]]:
    tid, ids = tenant_with_notes(pool, notes_dir)
    with pool.connection() as conn:
        key, _ = create_api_key(conn, tenant_id=tid, scopes=["exports:read", "exports:write"])
    return tid, ids, {"Authorization": f"Bearer {key}"}


def _submit(client: TestClient, auth: dict[str, str], note_id: int, **labels: Any) -> Any:
    r = client.post("/v1/exports", json={"note_ids": [note_id], **labels}, headers=auth)
    assert r.status_code == 202, r.text
    return r.json()


def _listed(client: TestClient, auth: dict[str, str], query: str) -> list[str]:
    r = client.get(f"/v1/exports?{query}", headers=auth)
    assert r.status_code == 200, r.text
    return [item["id"] for item in r.json()["items"]]


def test_labels_are_returned_by_submit_status_and_list(client, pool, tenant) -> None:
    _, ids, auth = tenant
    body = _submit(client, auth, ids[0], metadata=LABELS["metadata"], tags=["team-a", "nightly"])
    assert body["metadata"] == LABELS["metadata"] and body["tags"] == ["nightly", "team-a"]
    status = client.get(f"/v1/exports/{body['id']}", headers=auth).json()
    assert (status["metadata"], status["tags"]) == (body["metadata"], body["tags"])
    plain = _submit(client, auth, ids[1])
    assert plain["metadata"] == {} and plain["tags"] == []
    items = {i["id"]: i for i in client.get("/v1/exports", headers=auth).json()["items"]}
    assert items[body["id"]]["tags"] == ["nightly", "team-a"] and items[plain["id"]]["tags"] == []
    # stored in the canonical payload; an export without labels has no member at all
    with pool.connection() as conn:
        rows = {
            str(r["id"]): r["payload"]
            for r in conn.execute("SELECT id, payload FROM export_jobs").fetchall()
        }
    assert rows[body["id"]]["labels"] == LABELS and "labels" not in rows[plain["id"]]


def test_the_list_filters_by_every_tag_and_metadata_pair_asked(client, tenant, pool) -> None:
    _, ids, auth = tenant
    both = _submit(client, auth, ids[0], tags=["nightly", "team-a"], metadata={"team": "a"})
    nightly = _submit(client, auth, ids[1], tags=["nightly"], metadata={"team": "b"})
    _submit(client, auth, ids[2])
    other = create_tenant(pool)
    with pool.connection() as conn:
        key, _ = create_api_key(conn, tenant_id=other, scopes=["exports:read"])
    assert _listed(client, auth, "tag=nightly") == [nightly["id"], both["id"]]
    assert _listed(client, auth, "tag=nightly&tag=team-a") == [both["id"]]
    assert _listed(client, auth, "metadata[team]=b") == [nightly["id"]]
    assert _listed(client, auth, "tag=nightly&metadata[team]=a") == [both["id"]]
    assert _listed(client, auth, "tag=nightly&status=succeeded") == []
    assert _listed(client, auth, "tag=absent") == []
    assert _listed(client, {"Authorization": f"Bearer {key}"}, "tag=nightly") == []
    # pages of a filtered list keep the filter (the cursor is a position, the filter is asked)
    first = client.get("/v1/exports?tag=nightly&limit=1", headers=auth).json()
    assert [i["id"] for i in first["items"]] == [nightly["id"]] and first["next_cursor"]
    cursor = first["next_cursor"]
    assert _listed(client, auth, f"tag=nightly&limit=1&cursor={cursor}") == [both["id"]]


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ("metadata.team=a", "a metadata filter is metadata[key]=value"),
        ("metadata=a", "a metadata filter is metadata[key]=value"),
        ("metadata[team]=a&metadata[team]=b", "given twice with different values"),
        ("metadata[a%20b]=x", "metadata[a b]: a key is 1-40 letters"),
        ("tag=has%20space", "tag[has space]: a tag is"),
    ],
)
def test_a_malformed_filter_is_a_problem_naming_it(client, tenant, query, words) -> None:
    _, _, auth = tenant
    r = client.get(f"/v1/exports?{query}", headers=auth)
    assert r.status_code == 422 and r.headers["content-type"].startswith(PROBLEM), r.text
    problem = r.json()
    assert problem["type"].endswith("/invalid_labels") and words in problem["detail"]
    assert problem["errors"][0]["loc"]


@pytest.mark.parametrize(
    ("labels", "code", "words", "loc"),
    [
        ({"metadata": {f"k{i}": "v" for i in range(51)}}, "invalid_labels", "51 keys", None),
        ({"metadata": {"k": "v" * 501}}, "invalid_labels", "metadata[k]: the value has 501", "k"),
        ({"metadata": {"bad key": "v"}}, "invalid_labels", "metadata[bad key]", "bad key"),
        ({"tags": ["a/b"]}, "invalid_labels", "tags[a/b]: a tag is", "a/b"),
        ({"tags": [f"t{i}" for i in range(21)]}, "invalid_labels", "21 tags", None),
        ({"metadata": {"k": 1}}, "invalid_request", "metadata.k must be a string", None),
        ({"tags": "nightly"}, "invalid_request", "tags", None),
    ],
)
def test_labels_out_of_bounds_are_a_422_that_says_what_is_wrong(
    client, pool, tenant, labels, code, words, loc
) -> None:
    _, ids, auth = tenant
    r = client.post("/v1/exports", json={"note_ids": ids[:1], **labels}, headers=auth)
    assert r.status_code == 422 and r.headers["content-type"].startswith(PROBLEM), r.text
    problem = r.json()
    assert problem["type"].endswith("/" + code) and words in problem["detail"], problem
    if loc is not None:
        assert problem["errors"][0]["loc"][-1] == loc
    assert count(pool, "SELECT count(*) FROM export_jobs") == 0


def test_labels_are_part_of_the_idempotent_request(client, pool, tenant) -> None:
    _, ids, auth = tenant
    keyed = {**auth, "Idempotency-Key": "labelled-1"}
    body = {"note_ids": ids[:1], "metadata": {"order_id": "ord_1"}, "tags": ["a", "b"]}
    first = client.post("/v1/exports", json=body, headers=keyed)
    assert first.status_code == 202, first.text
    # the same labels in another order are the same request
    again = client.post("/v1/exports", json={**body, "tags": ["b", "a", "a"]}, headers=keyed)
    assert again.status_code == 202 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    for changed in ({"metadata": {"order_id": "ord_2"}}, {"tags": ["a"]}, {"metadata": None}):
        r = client.post("/v1/exports", json={**body, **changed}, headers=keyed)
        assert r.status_code == 409 and r.json()["type"].endswith("/idempotency_key_reused"), r.text
    assert count(pool, "SELECT count(*) FROM export_jobs") == 1


def test_a_schedule_gives_its_labels_to_its_exports(client, tenant) -> None:
    _, ids, auth = tenant
    created = client.post(
        "/v1/schedules",
        json={
            "interval_seconds": 3600,
            "note_ids": ids[:2],
            "metadata": {"source": "nightly-job"},
            "tags": ["scheduled"],
        },
        headers=auth,
    )
    assert created.status_code == 201, created.text
    schedule = created.json()
    assert schedule["metadata"] == {"source": "nightly-job"} and schedule["tags"] == ["scheduled"]
    run = client.post(f"/v1/schedules/{schedule['id']}/runs", headers=auth)
    assert run.status_code == 202, run.text
    export = run.json()["export"]
    assert export["metadata"] == {"source": "nightly-job"} and export["tags"] == ["scheduled"]
    assert _listed(client, auth, "tag=scheduled") == [export["id"]]

    # a patch replaces the labels whole; null removes them
    patched = client.patch(
        f"/v1/schedules/{schedule['id']}", json={"tags": ["weekly"]}, headers=auth
    )
    assert patched.status_code == 200, patched.text
    assert patched.json()["tags"] == ["weekly"]
    assert patched.json()["metadata"] == {"source": "nightly-job"}
    cleared = client.patch(f"/v1/schedules/{schedule['id']}", json={"metadata": None}, headers=auth)
    assert cleared.json()["metadata"] == {} and cleared.json()["tags"] == ["weekly"]
    bad = client.patch(f"/v1/schedules/{schedule['id']}", json={"tags": ["no way"]}, headers=auth)
    assert bad.status_code == 422 and bad.json()["type"].endswith("/invalid_labels")
    later = client.post(f"/v1/schedules/{schedule['id']}/runs", headers=auth).json()["export"]
    assert later["tags"] == ["weekly"] and later["metadata"] == {}


def test_a_replay_keeps_the_labels_of_the_export_it_redrives(pool, settings, tenant) -> None:
    tid, ids, _ = tenant
    labels = Labels.build({"order_id": "ord_9"}, ["retry-me"])
    request = ExportRequest.build(ExportFormat.JSON, ids[:2], False, labels=labels)
    job = submit_export(pool, settings, tenant_id=tid, request=request).job
    with pool.connection() as conn:
        claimed = job_claim(conn, job_id=job["id"], message_id=None, lease_seconds=30)
        assert claimed is not None
        assert job_fail_if_leased(
            conn, job_id=job["id"], lease_token=claimed.token, error_code="boom", error_detail="x"
        )
    same = replay_export(pool, settings, original_id=job["id"]).job
    assert Labels.from_payload(same["payload"]) == labels
    # a corrected replay is a new submit of the corrected request: still the same labels
    corrected = Correction(format=ExportFormat.NDJSON, note_ids=None, select_all=False)
    assert Labels.from_payload(corrected.request(job["payload"]).canonical()) == labels


def test_the_webhook_payload_carries_the_labels(pool, settings, tenant) -> None:
    tid, ids, _ = tenant
    wh = Settings(
        **{
            **settings.model_dump(),
            "webhook_allow_http": True,
            "webhook_allow_private_networks": True,
        }
    )
    endpoints.create_endpoint(pool, wh, tenant_id=tid, url="http://127.0.0.1:9/hook")
    labels = Labels.build({"order_id": "ord_7"}, ["billing"])
    labelled = submit_export(
        pool,
        settings,
        tenant_id=tid,
        request=ExportRequest.build(ExportFormat.JSON, ids[:1], False, labels=labels),
    ).job
    plain = submit_export(
        pool,
        settings,
        tenant_id=tid,
        request=ExportRequest.build(ExportFormat.JSON, ids[:1], False),
    ).job
    for job in (labelled, plain):
        request_cancel(pool, tenant_id=tid, job_id=job["id"])
    with pool.connection() as conn:
        data = {
            r["subject_id"]: r["data"]["export"]
            for r in conn.execute("SELECT subject_id, data FROM webhook_messages").fetchall()
        }
    assert data[labelled["id"]]["metadata"] == {"order_id": "ord_7"}
    assert data[labelled["id"]]["tags"] == ["billing"]
    assert data[plain["id"]]["metadata"] == {} and data[plain["id"]]["tags"] == []


def test_bulk_actions_filter_by_labels(pool, settings, tenant) -> None:
    tid, ids, _ = tenant

    def submit(labels: Labels) -> UUID:
        request = ExportRequest.build(ExportFormat.JSON, ids[:1], False, labels=labels)
        job_id: UUID = submit_export(pool, settings, tenant_id=tid, request=request).job["id"]
        return job_id

    noisy = [submit(Labels.build({"batch": "7"}, ["noisy"])) for _ in range(3)]
    quiet = submit(Labels.build({"batch": "8"}, ["noisy"]))
    plain = submit(Labels())
    by_tag = bulk.preview(pool, "cancel", bulk.BulkFilter(tags=("noisy",)))
    assert by_tag.count == 4
    filt = bulk.BulkFilter(tags=("noisy",), metadata=(("batch", "7"),))
    seen = bulk.preview(pool, "cancel", filt)
    assert seen.count == 3
    assert filt.describe() == "tags noisy, metadata batch=7"
    assert bulk.BulkFilter.from_json(filt.as_json()) == filt
    run, created = bulk.start(
        pool,
        as_actor("labels-test"),
        "cancel",
        filt,
        as_of=seen.as_of,
        confirmed=seen.count,
        request_id=uuid4(),
        lease_token=(token := uuid4()),
    )
    assert created
    bulk.run(pool, settings, run["id"], token=token)
    with pool.connection() as conn:
        asked = {
            r["id"]: r["cancel_requested"] or r["status"] == "cancelled"
            for r in conn.execute("SELECT id, status, cancel_requested FROM export_jobs")
        }
    assert all(asked[j] for j in noisy) and not asked[quiet] and not asked[plain]


def test_the_migration_downgrades_and_upgrades_again(servers) -> None:
    """Revision 0025's downgrade drops the index and gives the webhook trigger back its
    payload without labels; upgrading again restores both. Labels stay in the payloads."""
    name = f"t_labels_migration_{uuid4().hex[:8]}"
    url = servers.create_database(name)
    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.attributes["database_url"] = url
    cfg.attributes["configure_logger"] = False
    before = ScriptDirectory.from_config(cfg).get_revision("0025").down_revision
    assert isinstance(before, str)

    def state() -> tuple[bool, bool]:
        with psycopg.connect(url) as conn:
            index = conn.execute(
                "SELECT count(*) FROM pg_indexes WHERE indexname = 'export_jobs_labels_idx'"
            ).fetchone()
            source = conn.execute(
                "SELECT prosrc FROM pg_proc WHERE proname = 'webhook_export_terminal'"
            ).fetchone()
        assert index is not None and source is not None
        return index[0] == 1, "'labels'" in source[0]

    try:
        command.upgrade(cfg, "head")
        assert state() == (True, True)
        command.downgrade(cfg, before)
        assert state() == (False, False)
        command.upgrade(cfg, "head")
        assert state() == (True, True)
    finally:
        servers.drop_database(name)


def test_the_admin_api_lists_any_tenants_exports_by_labels(client, pool, tenant) -> None:
    _, ids, auth = tenant
    other, other_ids = tenant_with_notes_of_another(pool, ids)
    mine = _submit(client, auth, ids[0], tags=["nightly"], metadata={"order_id": "ord_1"})
    theirs = _submit(client, other, other_ids[0], tags=["nightly"])
    _submit(client, auth, ids[1])
    with pool.connection() as conn:
        key, _ = create_operator_key(conn, label="ops")
    ops = {"Authorization": f"Bearer {key}"}

    def listed(query: str) -> list[str]:
        r = client.get(f"/v1/admin/exports?{query}", headers=ops)
        assert r.status_code == 200, r.text
        return [i["id"] for i in r.json()["items"]]

    assert listed("tag=nightly") == [theirs["id"], mine["id"]]
    assert listed("tag=nightly&metadata[order_id]=ord_1") == [mine["id"]]
    tenant_id = client.get(f"/v1/admin/exports/{mine['id']}", headers=ops).json()["tenant_id"]
    assert listed(f"tag=nightly&tenant={tenant_id}") == [mine["id"]]
    assert len(listed("limit=500")) == 3
    page = client.get("/v1/admin/exports?tag=nightly&limit=1", headers=ops).json()
    assert page["items"][0]["metadata"] == {} and page["items"][0]["tags"] == ["nightly"]
    assert listed(f"tag=nightly&limit=1&cursor={page['next_cursor']}") == [mine["id"]]
    bad = client.get("/v1/admin/exports?metadata.order_id=ord_1", headers=ops)
    assert bad.status_code == 422 and bad.json()["type"].endswith("/invalid_labels")
    assert client.get("/v1/admin/exports", headers=auth).status_code == 403  # a tenant key


def tenant_with_notes_of_another(pool, ids: list[int]) -> tuple[dict[str, str], list[int]]:
    """A second tenant with one note, and its key."""
    other = create_tenant(pool)
    with pool.connection() as conn:
        note = conn.execute(
            "INSERT INTO notes (tenant_id, title, content) SELECT %s, title, content"
            " FROM notes WHERE id = %s RETURNING id",
            (other, ids[0]),
        ).fetchone()
        key, _ = create_api_key(conn, tenant_id=other, scopes=["exports:read", "exports:write"])
    assert note is not None
    return {"Authorization": f"Bearer {key}"}, [note["id"]]
