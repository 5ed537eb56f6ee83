"""Patroni's timing in the drills' topology (devtools/ha/postgres.py): values Patroni would
silently change are refused, the generated configuration carries the timing, and the
failover drills' budgets follow from it (docs/operations.md, "What bounds the
unavailability")."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from devtools.drills.config import FAILOVER_ALLOWANCE_SECONDS, DrillSettings
from devtools.ha.postgres import TIMING, MemberPorts, PatroniTiming, PostgresHA


@pytest.mark.parametrize(
    ("timing", "message"),
    [
        # the brief's "ttl=10, loop_wait=2, retry_timeout=4": Patroni would run with ttl=20
        (PatroniTiming(ttl=10, loop_wait=2, retry_timeout=4), "raises any ttl under 20"),
        (PatroniTiming(ttl=20, loop_wait=1, retry_timeout=2), "retry_timeout >= 3"),
        (PatroniTiming(ttl=20, loop_wait=0, retry_timeout=5), "loop_wait >= 1"),
        (PatroniTiming(ttl=20, loop_wait=4, retry_timeout=9), "exceeds ttl=20"),
        (PatroniTiming(primary_start_timeout=-1), "primary_start_timeout"),
    ],
)
def test_timings_patroni_would_change_are_refused(timing: PatroniTiming, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        timing.check()


def test_the_topology_keeps_patronis_rule() -> None:
    assert TIMING.check() is TIMING
    assert TIMING.loop_wait + 2 * TIMING.retry_timeout <= TIMING.ttl


def test_every_member_is_bootstrapped_with_the_timing_and_synchronous_mode(
    tmp_path: Path,
) -> None:
    ha = PostgresHA(tmp_path, etcd_ports=(1, 2), members=[MemberPorts(3, 4), MemberPorts(5, 6)])
    for member in ha.members.values():
        member.write_config()
        dcs = yaml.safe_load(member.config_path.read_text())["bootstrap"]["dcs"]
        assert {k: dcs[k] for k in TIMING.dcs()} == TIMING.dcs()
        assert dcs["synchronous_mode"] is True


def test_the_drills_unavailability_budgets_follow_from_the_timing() -> None:
    s = DrillSettings()
    switchover = s.failover_unavailable_budget("switchover")
    crash = s.failover_unavailable_budget("crash")
    kill = s.failover_unavailable_budget("kill")
    # the leader releases its key: a switchover, a crash of PostgreSQL alone (one loop)
    assert switchover == FAILOVER_ALLOWANCE_SECONDS < 10.0
    assert TIMING.primary_start_timeout == 0
    assert crash == TIMING.loop_wait + FAILOVER_ALLOWANCE_SECONDS < 10.0
    # a machine's death: nobody releases the key; its lease runs out (Patroni's floor, 20 s)
    assert kill == TIMING.ttl + FAILOVER_ALLOWANCE_SECONDS
    assert s.budgets()["pg_kill_unavailable_seconds"] == kill
