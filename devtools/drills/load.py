"""Load and front-door observations: a steady HTTP submit load with one Idempotency-Key
per request, the answers it got, and the checks that every 202 names a committed job and
no failed request left one behind."""

from __future__ import annotations

import contextlib
import queue
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

import httpx

from devtools.drills.evidence import Evidence
from devtools.drills.harness import DrillEnvironment, Tenant


@dataclass
class Attempt:
    """One HTTP submit made by a load generator and what came back."""

    key: str
    body: dict[str, Any]
    sent_at: float
    done_at: float = 0.0
    status: int | None = None
    job_id: str | None = None
    error: str | None = None
    problem: str | None = None
    retry_after: str | None = None
    content_type: str | None = None
    try_number: int = 1


class LoadGenerator:
    """Submits exports over HTTP at a steady rate from a few threads, each request with its
    own Idempotency-Key, recording every answer (or transport error).

    With ``retries``, a request answered 503 (or not answered) is sent again with the same
    key and body after its ``Retry-After`` (at most ``retry_cap`` seconds), as a careful
    client does; each try is an :class:`Attempt` of its own (``try_number``)."""

    def __init__(
        self,
        env: DrillEnvironment,
        tenant: Tenant,
        rate: float,
        *,
        threads: int = 4,
        bulk_share: float = 0.1,
        max_notes: int = 8,
        seed: int | None = None,
        timeout: float = 30.0,
        retries: int = 0,
        retry_cap: float = 5.0,
    ) -> None:
        self.env = env
        self.tenant = tenant
        self.rate = rate
        self.threads = threads
        self.bulk_share = bulk_share
        self.max_notes = max_notes
        self.timeout = timeout
        self.retries = retries
        self.retry_cap = retry_cap
        self.rng = random.Random(seed)
        self.attempts: list[Attempt] = []
        self._lock = threading.Lock()
        self._tickets: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._stop = threading.Event()
        self._pool: list[threading.Thread] = []
        self.on_accepted: Callable[[Attempt], object] | None = None

    def body(self) -> dict[str, Any]:
        """A random export request: mostly small, sometimes everything (bulk queue)."""
        fmt = self.rng.choice(["json", "ndjson", "markdown_zip"])
        if self.rng.random() < self.bulk_share:
            return {"all": True, "format": fmt}
        n = self.rng.randint(1, min(self.max_notes, len(self.tenant.note_ids)))
        return {"note_ids": sorted(self.rng.sample(self.tenant.note_ids, n)), "format": fmt}

    def enqueue(self, body: dict[str, Any]) -> None:
        """Send one request ``body`` beside the steady rate (by the next free sender thread),
        recorded like every other attempt."""
        self._tickets.put(body)

    def start(self) -> LoadGenerator:
        """Start the ticker and the sender threads."""
        for i in range(self.threads):
            t = threading.Thread(target=self._sender, name=f"load-{i}", daemon=True)
            t.start()
            self._pool.append(t)
        ticker = threading.Thread(target=self._ticker, name="load-ticker", daemon=True)
        ticker.start()
        self._pool.append(ticker)
        return self

    def _ticker(self) -> None:
        period = 1.0 / self.rate
        next_at = time.monotonic()
        while not self._stop.is_set():
            self._tickets.put(self.body())
            next_at += period
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def _sender(self) -> None:
        with self.tenant.api.http(timeout=self.timeout) as client:
            while True:
                body = self._tickets.get()
                if body is None:
                    return
                self._send(client, body)

    def _send(self, client: httpx.Client, body: dict[str, Any]) -> None:
        key = f"load-{uuid4().hex}"
        for try_number in range(1, self.retries + 2):
            attempt = self._try(client, key, body, try_number)
            unavailable = attempt.status is None or attempt.status == 503
            if not unavailable or try_number > self.retries:
                return  # (a stop does not abandon a retry: its first try may have committed)
            try:
                wait = float(attempt.retry_after or 1)
            except ValueError:
                wait = 1.0
            time.sleep(min(max(wait, 0.1), self.retry_cap))

    def _try(self, client: httpx.Client, key: str, body: dict[str, Any], n: int) -> Attempt:
        attempt = Attempt(key=key, body=body, sent_at=time.time(), try_number=n)
        try:
            r = self.tenant.api.submit(body, key=key, client=client)
            attempt.status = r.status_code
            attempt.content_type = r.headers.get("content-type")
            attempt.retry_after = r.headers.get("retry-after")
            if r.status_code == 202:
                attempt.job_id = str(r.json()["id"])
            else:
                with contextlib.suppress(ValueError):
                    attempt.problem = str(r.json().get("type", "")).rsplit("/", 1)[-1]
        except httpx.HTTPError as exc:
            attempt.error = type(exc).__name__
        attempt.done_at = time.time()
        with self._lock:
            self.attempts.append(attempt)
        if attempt.job_id and self.on_accepted is not None:
            self.on_accepted(attempt)
        return attempt

    def stop(self, drain_timeout: float = 60.0) -> None:
        """Stop ticking; let the senders finish the requests already due."""
        self._stop.set()
        for _ in range(self.threads):
            self._tickets.put(None)
        deadline = time.monotonic() + drain_timeout
        for t in self._pool:
            t.join(timeout=max(0.1, deadline - time.monotonic()))

    # --- what came back -------------------------------------------------------------------------

    @property
    def accepted(self) -> list[Attempt]:
        """Attempts answered 202."""
        return [a for a in self.attempts if a.status == 202]

    @property
    def refused(self) -> list[Attempt]:
        """Attempts that got anything but 202 (an HTTP error or no answer at all)."""
        return [a for a in self.attempts if a.status != 202]

    def outcome_counts(self) -> dict[str, int]:
        """Answers by kind."""
        return outcome_counts(self.attempts)

    def jobs_for_keys(self) -> dict[str, str]:
        """``{idempotency key: job id}`` for the attempts that have a committed job."""
        return self.env.jobs_for_keys(self.tenant.id, [a.key for a in self.attempts])


def outcome_counts(attempts: Sequence[Attempt]) -> dict[str, int]:
    """``{"202": n, "503 database_unavailable": n, "ConnectError": n, ...}``."""
    counts: dict[str, int] = defaultdict(int)
    for a in attempts:
        if a.status is None:
            counts[a.error or "no answer"] += 1
        elif a.status == 202:
            counts["202"] += 1
        else:
            counts[f"{a.status} {a.problem or ''}".strip()] += 1
    return dict(sorted(counts.items()))


def check_answers(
    ev: Evidence,
    env: DrillEnvironment,
    tenant: Tenant,
    attempts: Sequence[Attempt],
    allowed_errors: set[str],
) -> None:
    """The front-door promises under a fault: every 202 names a committed job (with the key
    it was sent with); no request that got an error (or no answer) left a job behind; every
    HTTP error is a problem+json of an allowed kind (``"503 database_unavailable"``)."""
    accepted = [a for a in attempts if a.status == 202]
    refused = [a for a in attempts if a.status != 202]
    ev.observe("answers", outcome_counts(attempts))
    ev.check("the load was accepted at least once", bool(accepted), f"{len(accepted)} x 202")
    by_key = env.jobs_for_keys(tenant.id, [a.key for a in attempts])
    lost = [a.job_id for a in accepted if by_key.get(a.key) != a.job_id]
    ev.check(
        "every 202 names a committed job",
        not lost,
        f"{len(accepted)} accepted; missing or different: {lost[:5]}",
    )
    # A job whose request got an error is a ghost unless the client's retry with the same
    # key was answered 202 with that very job (a commit whose answer was lost, resolved).
    resolved = {a.key for a in accepted if by_key.get(a.key) == a.job_id}
    ghosts = [a.key for a in refused if a.key in by_key and a.key not in resolved]
    ev.check(
        "no request that got an error or no answer left a job (unless its retry with the"
        " same key was answered 202 with that job)",
        not ghosts,
        f"{len(refused)} not accepted; with a job: {ghosts[:5]}",
    )
    bad = [
        f"{a.status} {a.problem}"
        for a in refused
        if a.status is not None
        and (
            f"{a.status} {a.problem}" not in allowed_errors
            or not (a.content_type or "").startswith("application/problem+json")
            or not a.retry_after
        )
    ]
    ev.check(
        f"every HTTP error is a problem+json with Retry-After in {sorted(allowed_errors)}",
        not bad,
        f"other answers: {sorted(set(bad))[:5]}" if bad else f"{len(refused)} checked",
    )


@dataclass
class Sampler:
    """Samples a callable every ``interval`` seconds in a thread: ``[(unix time, value)]``."""

    fn: Callable[[], Any]
    interval: float = 0.2
    samples: list[tuple[float, Any]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Sampler:
        """Start sampling."""

        def run() -> None:
            while not self._stop.is_set():
                try:
                    value = self.fn()
                except Exception as exc:
                    value = f"{type(exc).__name__}"
                self.samples.append((time.time(), value))
                self._stop.wait(self.interval)

        self._thread = threading.Thread(target=run, name="sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[tuple[float, Any]]:
        """Stop and return the samples."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        return self.samples


def readyz_status(env: DrillEnvironment) -> int | str:
    """The api's /readyz status code (or the transport error)."""
    try:
        return httpx.get(env.api_url + "/readyz", timeout=3).status_code
    except httpx.HTTPError as exc:
        return type(exc).__name__
