"""The submit coalescer's turn-taking (exportcore.coalesce) with the database left out: who
writes, with whom, and that nothing waits for company."""

from __future__ import annotations

import threading
from typing import Any
from uuid import uuid4

from exportcore.coalesce import SubmitCoalescer
from exportcore.settings import Settings
from exportcore.store.jobs import SubmitRow
from tests.support import run_queued


def row(n: int) -> SubmitRow:
    return SubmitRow(uuid4(), uuid4(), "t", "json", {}, (n,), "h")


class Shared(SubmitCoalescer):
    """A coalescer whose shared statement is recorded instead of run."""

    def __init__(self, max_batch: int, gate: threading.Event | None = None) -> None:
        super().__init__(None, Settings(api_submit_batch=max_batch), self._alone)  # type: ignore[arg-type]
        self.gate = gate
        self.statements: list[list[int]] = []
        self.lock = threading.Lock()

    def _alone(self, r: SubmitRow) -> dict[str, Any]:
        if self.gate is not None:
            self.gate.wait(10)
        with self.lock:
            self.statements.append([r.note_ids[0]])
        return {"id": r.job_id, "n": r.note_ids[0]}

    def _write_many(self, batch: list[Any]) -> None:
        with self.lock:
            self.statements.append([p.row.note_ids[0] for p in batch])
        for p in batch:
            p.result = {"id": p.row.job_id, "n": p.row.note_ids[0]}


def test_a_submit_alone_is_written_at_once_alone() -> None:
    c = Shared(16)
    assert c.submit(row(1))["n"] == 1 and c.statements == [[1]]
    assert c.submit(row(2))["n"] == 2 and c.statements == [[1], [2]]


def test_submits_arriving_during_a_write_share_the_next_statement() -> None:
    gate = threading.Event()
    c = Shared(16, gate)
    results: dict[int, Any] = {}

    def send(n: int) -> None:
        results[n] = c.submit(row(n))

    run_queued(c, gate, [threading.Thread(target=send, args=(n,)) for n in range(6)])
    assert c.statements[0] == [0]
    assert sorted(c.statements[1]) == [1, 2, 3, 4, 5] and len(c.statements) == 2
    assert {n: r["n"] for n, r in results.items()} == {n: n for n in range(6)}
    assert not c._writing and not c._waiting


def test_a_shared_statement_takes_at_most_api_submit_batch_rows() -> None:
    gate = threading.Event()
    c = Shared(3, gate)
    run_queued(c, gate, [threading.Thread(target=c.submit, args=(row(n),)) for n in range(8)])
    assert [len(s) for s in c.statements] == [1, 3, 3, 1]
    assert sorted(n for s in c.statements for n in s) == list(range(8))
