"""Failpoints: arming, counting across processes, and the record of who took each fault."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import psycopg
import pytest

from exportcore import faults


@pytest.fixture
def armed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "faults.json"
    monkeypatch.setenv(faults.ENV, str(path))
    return path


def test_hits_record_the_process_and_time_of_each_injection(armed: Path) -> None:
    faults.arm(armed, "render.chunk", "io", times=2)
    before = time.time()
    for _ in range(2):
        with pytest.raises(OSError) as exc:
            faults.hit("render.chunk")
        assert exc.value.errno == errno.EIO
    faults.hit("render.chunk")  # disarmed after two: no exception, no record
    hits = faults.hits(armed, "render.chunk")
    assert [h["pid"] for h in hits] == [os.getpid()] * 2
    assert all(before <= h["at"] <= time.time() and h["fault"] == "io" for h in hits)
    assert faults.remaining(armed, "render.chunk") == 0


def test_arming_again_forgets_earlier_hits(armed: Path) -> None:
    faults.arm(armed, "worker.before_finish", "sleep:0", times=1)
    faults.hit("worker.before_finish")
    assert len(faults.hits(armed, "worker.before_finish")) == 1
    faults.arm(armed, "worker.before_finish", "sleep:0", times=1)
    assert faults.hits(armed, "worker.before_finish") == []


def test_disarm_all(armed: Path) -> None:
    faults.arm(armed, "submit.before_commit", "db", times=3)
    faults.disarm_all(armed)
    faults.hit("submit.before_commit")
    assert faults.remaining(armed, "submit.before_commit") == 0


def test_unknown_failpoint_is_refused(armed: Path) -> None:
    with pytest.raises(ValueError, match="unknown failpoint"):
        faults.arm(armed, "nowhere", "io")


def test_a_failpoint_armed_for_one_subject_ignores_the_others(armed: Path) -> None:
    faults.arm(armed, "worker.before_claim", "db", times=1, only="job-b")
    faults.hit("worker.before_claim")  # no subjects: not it
    faults.hit("worker.before_claim", subjects=["job-a", "job-c"])  # another delivery
    assert faults.remaining(armed, "worker.before_claim") == 1
    assert faults.hits(armed, "worker.before_claim") == []
    with pytest.raises(psycopg.OperationalError):
        faults.hit("worker.before_claim", subjects=["job-a", "job-b"])
    assert faults.remaining(armed, "worker.before_claim") == 0


def test_skip_lets_the_first_hits_of_its_subject_pass(armed: Path) -> None:
    faults.arm(armed, "render.chunk", "db", times=1, only="job-b", skip=2)
    faults.hit("render.chunk", subjects=["job-a"])  # another job: not counted
    faults.hit("render.chunk", subjects=["job-b"])  # chunk 1
    faults.hit("render.chunk", subjects=["job-b"])  # chunk 2
    assert faults.hits(armed, "render.chunk") == []
    with pytest.raises(psycopg.OperationalError):
        faults.hit("render.chunk", subjects=["job-b"])  # chunk 3
    assert faults.remaining(armed, "render.chunk") == 0
