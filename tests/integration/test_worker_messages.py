"""What a real fast-worker process (the Procfile's command, on a real Redis and PostgreSQL)
does with the messages it is given:

- **JSON only on the broker**: a message serialised with pickle (``application/x-python-
  serialize``), shaped as a genuine export task for a queued job, is refused and discarded
  (kombu's ``ContentDisallowed``: "Refusing to deserialize untrusted content") without
  being unpickled — its payload would create a folder while unpickling — and without
  running: the job stays queued, unclaimed, with no history but its submit. The worker stays
  up and runs the job when it then arrives as a JSON message (docs/architecture.md, "Queues
  and shutdown"; SECURITY.md).
- **A redelivery is told from a re-execution at the default level**: the worker's one INFO
  line per message (``batch done``) carries, for each job, its result, attempt and lease
  token (``runs``). A job whose first attempt failed transiently runs again as attempt 2
  under a new token; the first message delivered again is refused with the attempt and token
  of the execution it repeats (docs/observability.md, "Redelivery or re-execution").
"""

from __future__ import annotations

import json
import operator
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
import redis
from kombu import Exchange, Queue

from devtools import waiting
from devtools.stack import ManagedProcess, Stack
from exportcore import faults
from exportcore.broker import EXPORT_TASK, make_celery
from exportcore.domain import FAST_QUEUE
from exportcore.publisher import Publisher
from exportcore.settings import Settings
from tests.support import events, job, submit

NODE = f"fast@{socket.gethostname()}"
REFUSAL = "Refusing to deserialize untrusted content"


@pytest.fixture
def fast_worker(
    settings: Settings, artifact_dir: Path, tmp_path: Path, failpoints: Path
) -> Iterator[ManagedProcess]:
    """The Procfile's fast-worker, one child, at the default log level (JSON lines), with
    the test's failpoints file and retries due within 0.2 s; answering remote control."""
    stack = Stack.build(
        database_url=str(settings.database_url),
        broker_url=settings.broker_url,
        artifact_dir=artifact_dir,
        log_dir=tmp_path / "logs",
        names=("fast-worker",),
        extra_env={
            "LOG_LEVEL": "INFO",
            "LOG_FORMAT": "json",
            "FAST_WORKER_CONCURRENCY": "1",
            "RETRY_BASE_SECONDS": "0.1",
            "RETRY_CAP_SECONDS": "0.2",
            faults.ENV: str(failpoints),
        },
    ).start(wait=False)
    proc = stack.procs["fast-worker"]
    inspect = make_celery(settings).control.inspect(destination=[NODE], timeout=2)
    try:
        waiting.wait_for(
            inspect.ping,
            90,
            "the fast-worker to answer",
            check=lambda: _alive(proc),
            detail=lambda: proc.log_text()[-3000:],
        )
        yield proc
    finally:
        assert stack.stop(30)["fast-worker"] == 0, proc.log_text()[-3000:]


def _alive(proc: ManagedProcess) -> None:
    if not proc.alive:
        raise AssertionError("the fast-worker exited:\n" + proc.log_text()[-3000:])


def records(proc: ManagedProcess) -> list[dict[str, Any]]:
    """The worker's JSON log lines, parsed."""
    out = []
    for line in proc.log_text().splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


# --- JSON only ------------------------------------------------------------------------------


class _Unpickled:
    """Unpickles as ``os.makedirs(marker, exist_ok=True)``: the visible side effect of being
    unpickled (by the consumer, and again by the child that would run the task)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.makedirs, (str(self.marker), 0o755, True))


class _JobIdWithSideEffect:
    """Unpickles as the job id string, creating ``marker`` on the way: were pickle accepted,
    the worker would both show the side effect and run the export."""

    def __init__(self, job_id: UUID, marker: Path) -> None:
        self.job_id = job_id
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (operator.getitem, ((str(self.job_id), _Unpickled(self.marker)), 0))


def publish_pickle(settings: Settings, job_id: UUID, marker: Path) -> str:
    """Send, with kombu, a task message of protocol 2 for ``run_export(job_id)`` whose body
    is a pickle (``application/x-python-serialize``) to exports.fast; returns its task id."""
    task_id = str(uuid4())
    exchange = Exchange(FAST_QUEUE, "direct")
    body = (
        [_JobIdWithSideEffect(job_id, marker)],
        {},
        {"callbacks": None, "errbacks": None, "chain": None, "chord": None},
    )
    with make_celery(settings).connection_for_write() as conn:
        conn.Producer().publish(
            body,
            exchange=exchange,
            routing_key=FAST_QUEUE,
            declare=[Queue(FAST_QUEUE, exchange, routing_key=FAST_QUEUE)],
            serializer="pickle",
            headers={
                "lang": "py",
                "task": EXPORT_TASK,
                "id": task_id,
                "root_id": task_id,
                "parent_id": None,
                "group": None,
                "retries": 0,
                "eta": None,
                "expires": None,
                "timelimit": [None, None],
                "argsrepr": f"['{job_id}']",
                "kwargsrepr": "{}",
                "origin": "test",
            },
        )
    return task_id


def test_a_pickled_message_is_refused_with_nothing_run(
    fast_worker: ManagedProcess, pool, settings: Settings, tenant, tmp_path: Path
) -> None:
    tid, ids = tenant
    row = submit(pool, settings, tid, ids[:2])
    marker = tmp_path / "unpickled"
    task_id = publish_pickle(settings, row["id"], marker)

    def not_unpickled() -> None:
        _alive(fast_worker)
        assert not marker.exists(), "the worker unpickled the message"

    refusals = waiting.wait_for(
        lambda: [r for r in records(fast_worker) if REFUSAL in r.get("message", "")],
        30,
        "the worker to refuse the pickled message",
        check=not_unpickled,
        detail=lambda: fast_worker.log_text()[-3000:],
    )
    [refusal] = refusals
    assert "application/x-python-serialize" in refusal["message"]
    assert (refusal["level"], refusal["logger"]) == ("ERROR", "celery.worker.consumer.consumer")
    # Never unpickled, never run: no side effect, the job untouched.
    assert not marker.exists()
    after = job(pool, row["id"])
    assert (after["status"], after["attempts"], after["lease_token"]) == ("queued", 0, None)
    assert [e["kind"] for e in events(pool, row["id"])] == ["submitted"]
    assert not [r for r in batch_lines(fast_worker) if r["message_id"] == task_id]
    # Discarded, not requeued: nothing waits in the queue or unacknowledged.
    broker = redis.Redis.from_url(settings.broker_url)
    waiting.wait_for(
        lambda: broker.llen(FAST_QUEUE) == 0 and broker.hlen("unacked") == 0,
        10,
        "the pickled message to be discarded",
    )

    # The worker is still healthy: the job, published as JSON by the publisher, runs.
    publisher = Publisher(settings, pool, make_celery(settings))
    assert publisher.run_once()["published"] == 1
    done = waiting.wait_for(
        lambda: (j := job(pool, row["id"]))["status"] == "succeeded" and j,
        60,
        "the JSON message's export to succeed",
        check=lambda: _alive(fast_worker),
        detail=lambda: fast_worker.log_text()[-3000:],
    )
    assert done["attempts"] == 1
    assert not marker.exists()


# --- redelivery or re-execution -------------------------------------------------------------


def batch_lines(proc: ManagedProcess) -> list[dict[str, Any]]:
    """The worker's per-message INFO lines."""
    return [r for r in records(proc) if r.get("message") == "batch done"]


def test_the_per_message_line_tells_a_redelivery_from_a_re_execution(
    fast_worker: ManagedProcess, pool, settings: Settings, tenant, failpoints: Path
) -> None:
    tid, ids = tenant
    row = submit(pool, settings, tid, ids[:2])
    # The first attempt fails with a transient storage error: the job runs again.
    faults.arm(failpoints, "render.chunk", "io", only=row["id"])
    publisher = Publisher(settings, pool, make_celery(settings))

    def succeeded() -> bool:
        publisher.run_once()  # the submit's message, then the retry's
        return job(pool, row["id"])["status"] == "succeeded"

    waiting.wait_for(
        succeeded,
        60,
        "the export to succeed on its second attempt",
        check=lambda: _alive(fast_worker),
        detail=lambda: fast_worker.log_text()[-3000:],
    )
    claims = [e for e in events(pool, row["id"]) if e["kind"] == "claimed"]
    assert [c["attempt"] for c in claims] == [1, 2]
    first, second = claims
    assert first["lease_token"] != second["lease_token"]

    # The first message comes back (a redelivery: the visibility timeout, a lost ack).
    make_celery(settings).send_task(
        EXPORT_TASK, args=[str(row["id"])], task_id=str(first["message_id"]), queue=FAST_QUEUE
    )
    lines = waiting.wait_for(
        lambda: (found := batch_lines(fast_worker)) and len(found) >= 3 and found,
        30,
        "three per-message lines",
        check=lambda: _alive(fast_worker),
        detail=lambda: fast_worker.log_text()[-3000:],
    )
    assert len(lines) == 3, lines
    for line in lines:
        assert line["level"] == "INFO"  # the default level
        assert line["job_ids"] == [str(row["id"])]
    runs = [(line["message_id"], line["runs"]) for line in lines]

    def run(result: str, claim: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {
            "job_id": str(row["id"]),
            "result": result,
            "attempt": claim["attempt"],
            "lease_token": str(claim["lease_token"]),
            **extra,
        }

    retried = runs[0][1][0]
    assert runs[0] == (str(first["message_id"]), [run("retry", first, reason=retried["reason"])])
    # a re-execution: a new attempt under a new lease token, carried by the retry's message
    assert runs[1] == (str(second["message_id"]), [run("succeeded", second)])
    assert second["message_id"] != first["message_id"]
    # a redelivery: the same message, refused, naming the execution it repeats
    assert runs[2] == (str(first["message_id"]), [run("refused", second, reason="terminal")])
    assert job(pool, row["id"])["attempts"] == 2
