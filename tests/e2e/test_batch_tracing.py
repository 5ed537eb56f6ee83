"""One export, one trace, for exports that ran in batches on the real processes: the
Procfile's api (gunicorn, uvicorn workers), publisher and fast-worker (Celery prefork)
export their spans with the SDK's own batch processor and OTLP/HTTP exporter to a real
receiver (``tests.support.OtlpReceiver``). A burst of small exports is submitted over HTTP
while the publisher is paused, so that it waits in the outbox as a backlog and the claims
of the publisher's first messages take it in batches (docs/architecture.md, "Where batches
form"); the checks are those of tests/integration/test_tracing.py, shared in
tests/support.py."""

from __future__ import annotations

import signal
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.e2e.conftest import E2E, running_stack
from tests.support import OtlpReceiver, assert_batch_traces, trace_gaps, wait_for

pytestmark = pytest.mark.e2e

# With the defaults (PUBLISHER_MESSAGES_AHEAD 2, WORKER_CLAIM_JOBS 8, TENANT_FAST_IN_FLIGHT
# 8) the first claim finds BURST - 2 due events beside its message and at most the two sent
# messages of the tenant in flight: it takes six of them, so a batch forms whatever the
# timing of the rest.
BURST = 20


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def traced(servers, template_db, notes_dir, tmp_path_factory, receiver) -> Iterator[E2E]:
    """The api, the publisher and the fast-worker with their spans going to ``receiver``
    (no recovery-scanner: a re-dispatch would give a job a second claim)."""
    env = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_TRACES_SAMPLER": "parentbased_always_on",  # every span, whatever the shell says
        "OTEL_BSP_SCHEDULE_DELAY": "200",  # ms: the spans arrive while the stack runs
    }
    with running_stack(
        servers,
        template_db,
        notes_dir,
        tmp_path_factory.mktemp("traced"),
        env,
        names=("api", "publisher", "fast-worker"),
    ) as e:
        yield e


def submit_burst(e: E2E) -> list[str]:
    """BURST one-note exports submitted concurrently over HTTP while the publisher is
    stopped (SIGSTOP): each is committed, with its outbox event, when its 202 comes back,
    and nothing is sent before the publisher continues."""
    notes = e.note_ids(BURST)
    publisher = e.stack.procs["publisher"]
    publisher.signal(signal.SIGSTOP, group=True)
    try:
        with ThreadPoolExecutor(BURST) as pool:
            return list(
                pool.map(
                    lambda i: e.api.submit_ok({"note_ids": [notes[i % len(notes)]]}),
                    range(BURST),
                )
            )
    finally:
        publisher.signal(signal.SIGCONT, group=True)


def claims_in_database(e: E2E, job_ids: list[str]) -> list[set[str]]:
    """The jobs grouped by the claim statement that took them (its transaction time is each
    job's ``started_at``), after asserting that every job was claimed exactly once."""
    rows = e.db.sql(
        "SELECT j.id::text AS id, j.started_at,"
        " (SELECT count(*) FROM export_job_events v"
        "   WHERE v.job_id = j.id AND v.kind = 'claimed') AS claims"
        " FROM export_jobs j WHERE j.id = ANY(%s::uuid[])",
        (job_ids,),
    )
    assert {r["id"]: r["claims"] for r in rows} == {j: 1 for j in job_ids}
    by_claim: dict[object, set[str]] = defaultdict(set)
    for r in rows:
        by_claim[r["started_at"]].add(r["id"])
    return list(by_claim.values())


def test_every_export_of_a_batch_is_one_trace(traced: E2E, receiver: OtlpReceiver) -> None:
    e = traced
    jobs = submit_burst(e)
    with e.api.http() as client:
        states = {job: e.api.wait_terminal(job, 60, client)["status"] for job in jobs}
    assert set(states.values()) == {"succeeded"}, states
    wait_for(
        lambda: not trace_gaps(receiver.spans(), jobs),
        30,
        "every export's spans at the receiver",
        detail=lambda: "\n".join(trace_gaps(receiver.spans(), jobs)[:20]),
    )
    spans = receiver.spans()

    batches = assert_batch_traces(spans, jobs)
    sizes = [len(b) for b in batches]
    print(f"batch sizes: {sizes}")
    assert sorted(j for b in batches for j in b) == sorted(jobs)
    assert sizes[0] >= 2, f"no claim took several jobs: {sizes}"
    assert max(sizes) <= e.settings.worker_claim_jobs
    # the batches the spans tell are the claims the database recorded
    assert sorted(map(sorted, claims_in_database(e, jobs))) == sorted(map(sorted, batches))

    # each span came from the process that owns its step
    for job in jobs:
        mine = {s["name"]: s for s in spans if s["attributes"].get("job_id") == job}
        assert mine["exports.submit"]["service"] == "notes-exports-api"
        publisher = mine["exports.publish"]["attributes"].get("dispatched_by") != "claim"
        assert mine["exports.publish"]["service"] == (
            "notes-exports-publisher" if publisher else "notes-exports-worker"
        )
        for name in ("exports.claim", "exports.render", "exports.write", "exports.finish"):
            assert mine[name]["service"] == "notes-exports-worker"
