"""Liveness: touch, the freshness check, the CLI probe and the ServiceLoop hook."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from exportcore import liveness
from exportcore.service import ServiceLoop
from exportcore.settings import get_settings
from exportctl.main import app


def test_touch_creates_the_file_and_its_folders(tmp_path: Path) -> None:
    path = tmp_path / "run" / "deeper" / "heartbeat"
    liveness.touch(path)
    assert path.is_file()
    assert abs(path.stat().st_mtime - time.time()) < 5


def test_touch_advances_the_mtime_of_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "hb"
    path.write_text("keep")
    os.utime(path, (1_000_000, 1_000_000))
    liveness.touch(path)
    assert path.stat().st_mtime > 1_000_000 + 10**8
    assert path.read_text() == "keep", "touch must not rewrite the content"


def test_touch_raises_when_the_folder_is_not_writable(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError):
        liveness.touch(blocker / "heartbeat")


def test_check_fresh_stale_and_missing(tmp_path: Path) -> None:
    path = tmp_path / "hb"
    missing = liveness.check(path, 10)
    assert not missing.fresh and missing.age is None and "does not exist" in missing.message

    liveness.touch(path)
    mtime = path.stat().st_mtime
    fresh = liveness.check(path, 10, now=mtime + 9.5)
    assert fresh.fresh and fresh.age == pytest.approx(9.5) and fresh.message.startswith("fresh")

    stale = liveness.check(path, 10, now=mtime + 10.5)
    assert not stale.fresh and stale.age == pytest.approx(10.5)
    assert "stale" in stale.message and "10.5s ago" in stale.message


def test_healthcheck_cli_exit_codes(tmp_path: Path) -> None:
    runner = CliRunner()
    path = tmp_path / "hb"

    missing = runner.invoke(app, ["healthcheck", "--file", str(path), "--max-age", "5"])
    assert missing.exit_code == 1 and "does not exist" in missing.output

    liveness.touch(path)
    fresh = runner.invoke(app, ["healthcheck", "--file", str(path), "--max-age", "5"])
    assert fresh.exit_code == 0 and "fresh" in fresh.output

    old = time.time() - 30
    os.utime(path, (old, old))
    stale = runner.invoke(app, ["healthcheck", "--file", str(path), "--max-age", "5"])
    assert stale.exit_code == 1 and "stale: last heartbeat" in stale.output

    # The file may come from HEARTBEAT_FILE, as it does in the pods.
    liveness.touch(path)
    from_env = runner.invoke(
        app, ["healthcheck", "--max-age", "5"], env={"HEARTBEAT_FILE": str(path)}
    )
    assert from_env.exit_code == 0, from_env.output


@pytest.fixture
def heartbeat_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "loop-heartbeat"
    monkeypatch.setenv("HEARTBEAT_FILE", str(path))
    get_settings.cache_clear()
    yield path
    get_settings.cache_clear()


class _Service:
    """Fails its first passes; records whether the heartbeat existed when each pass began."""

    name = "probe"

    def __init__(self, fail_first: int, watch: Path | None = None) -> None:
        self.fail_first = fail_first
        self.watch = watch
        self.calls = 0
        self.seen: list[bool] = []

    def run_once(self) -> dict[str, int]:
        self.calls += 1
        if self.watch is not None:
            self.seen.append(self.watch.exists())
        if self.calls <= self.fail_first:
            raise RuntimeError("database unreachable")
        return {"done": 1}

    def idle(self, timeout: float, stop: threading.Event) -> None:
        stop.wait(timeout)

    def next_wait(self, counts: dict[str, int], interval: float) -> float:
        return 0.0


def test_service_loop_touches_the_heartbeat_only_after_a_successful_pass(
    heartbeat_env: Path,
) -> None:
    service = _Service(fail_first=2, watch=heartbeat_env)
    loop = ServiceLoop(service, interval=0.01, jitter=0.0, max_error_pause=0.01)
    assert loop.run(max_passes=2) == 2
    # Passes 1 and 2 failed: no heartbeat before pass 3; pass 3 succeeded and touched it.
    assert service.seen == [False, False, False, True]
    assert liveness.check(heartbeat_env, 5).fresh


def test_service_loop_without_heartbeat_file_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HEARTBEAT_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    get_settings.cache_clear()
    try:
        assert liveness.touch_configured() is False
        ServiceLoop(_Service(fail_first=0), interval=0.01).run(max_passes=2)
    finally:
        get_settings.cache_clear()
    assert list(tmp_path.iterdir()) == []


def test_the_probe_loads_nothing_but_the_standard_library(tmp_path: Path) -> None:
    """An exec probe runs every few seconds in every pod within its CPU limit: ``exportctl
    healthcheck`` (the whole CLI: typer, pydantic, psycopg, boto3...) took over the probe's
    10 s timeout on the test cluster and failed every background pod's startup probe."""
    import subprocess
    import sys

    path = tmp_path / "hb"
    liveness.touch(path)
    code = (
        "import sys; from exportcore import liveness; "
        f"rc = liveness.main(['--file', {str(path)!r}, '--max-age', '5']); "
        "third = sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names) - {'exportcore', '__main__'} - {m for m in sys.modules if m.startswith('_')}); "
        "print(rc, third)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "0 []", out.stdout
    exportcore_modules = subprocess.run(
        [
            sys.executable,
            "-c",
            code.replace(
                "print(rc, third)",
                "print(sorted(m for m in sys.modules if m.startswith('exportcore')))",
            ),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "exportcore.settings" not in exportcore_modules


def test_the_probe_exit_codes(tmp_path: Path, monkeypatch, capsys) -> None:
    from exportcore.liveness import main

    path = tmp_path / "hb"
    assert main(["--file", str(path), "--max-age", "5"]) == 1
    liveness.touch(path)
    assert main(["--file", str(path), "--max-age", "5"]) == 0
    monkeypatch.setenv("HEARTBEAT_FILE", str(path))
    assert main(["--max-age", "5"]) == 0
    monkeypatch.delenv("HEARTBEAT_FILE")
    assert main(["--max-age", "5"]) == 2
    assert "HEARTBEAT_FILE" in capsys.readouterr().err


def test_service_loop_logs_a_pass_at_the_services_level(caplog: pytest.LogCaptureFixture) -> None:
    """The publisher passes once per message at low load: its pass line is DEBUG (its counts
    are metrics); other services keep INFO."""
    quiet = _Service(fail_first=0)
    quiet.pass_log_level = logging.DEBUG  # type: ignore[attr-defined]
    with caplog.at_level(logging.INFO, logger="exportcore.service"):
        ServiceLoop(quiet, interval=0.01, jitter=0.0).run(max_passes=1)
        ServiceLoop(_Service(fail_first=0), interval=0.01, jitter=0.0).run(max_passes=1)
    assert [r.levelno for r in caplog.records if r.getMessage() == "pass done"] == [logging.INFO]
