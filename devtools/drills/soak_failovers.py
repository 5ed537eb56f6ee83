"""Failovers among the chaos soak's faults (``make soak FAILOVERS=1``): on the
high-availability topology, every ``every`` seconds the PostgreSQL primary goes away, by
turns a ``patronictl switchover`` and a SIGKILL of the primary's Patroni and PostgreSQL;
the killed member is started again once the new primary runs (it rejoins as a replica).
The ``every`` seconds count from the end of the previous failover (its member rejoined):
with ``synchronous_mode`` Patroni promotes only a synchronous standby, so a primary killed
while the other member is still rejoining is two failures at once, not a failover.
The random chaos loop keeps killing and stalling processes meanwhile; its ``redis`` fault
here kills the Sentinel master (the replica is promoted, the old master comes back as a
replica). Each failover is a chaos event, so recovery windows that overlap it get the same
allowance as for any other fault, and the soak reports each one's unavailable window (the
longest time clients got no 202).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from devtools.drills.background import BackgroundLoop
from devtools.drills.failover import unavailable_window
from devtools.drills.harness import DrillEnvironment, wait_for
from devtools.drills.load import Attempt

# The random chaos loop's targets the failovers replace on this topology: the single
# server's crash and stall (pg_ctl) have no meaning under Patroni.
NOT_ON_HA = ("postgres",)


class FailoverLoop(BackgroundLoop):
    """A thread that makes a failover ``every`` seconds after the previous one ended (the
    killed member rejoined; the first after ``every`` seconds) and records each one as a
    chaos event through ``record(target, action, started, ended, detail, error)``.
    :meth:`stop` finishes the failover in hand (the killed member is started again)."""

    name = "failovers"

    def __init__(
        self,
        env: DrillEnvironment,
        every: float,
        record: Callable[[str, str, float, float, str, str | None], None],
    ) -> None:
        self.env = env
        self.every = every
        self.record = record
        self.failovers: list[dict[str, Any]] = []
        super().__init__()

    def _run(self) -> None:
        n = 0
        while not self._stop.wait(self.every):
            action = ("switchover", "kill")[n % 2]
            n += 1
            started = time.time()
            detail, error = "", None
            pg = self.env.ha.postgres
            try:
                old = pg.leader()
                if action == "switchover":
                    new = pg.switchover()
                else:
                    old, _ = pg.kill_leader()
                    new = self._new_leader(old)
                promoted = time.time()
                detail = f"{old} -> {new}"
                self.env.ensure_servers()  # the killed member rejoins as a replica
                self.failovers.append(
                    {"action": action, "from": old, "to": new, "at": started, "promoted": promoted}
                )
            except Exception as exc:  # recorded; the settle phase restores what is left
                error = f"{type(exc).__name__}: {exc}"
            self.record("postgres-primary", action, started, time.time(), detail, error)

    def _new_leader(self, old: str | None) -> str:
        pg = self.env.ha.postgres
        name: str = wait_for(
            lambda: (leader := pg.leader_or_none()) not in (None, old) and leader,
            120,
            "Patroni to promote the synchronous standby",
            interval=0.1,
        )
        return name


def failover_report(
    failovers: Sequence[dict[str, Any]], attempts: Sequence[Attempt]
) -> dict[str, Any]:
    """Each failover with the unavailable window clients saw from it on (until the next
    one), and the longest of them."""
    rows = []
    for i, f in enumerate(failovers):
        until = failovers[i + 1]["at"] if i + 1 < len(failovers) else float("inf")
        window = unavailable_window([a for a in attempts if a.sent_at < until], f["at"])
        rows.append(
            {
                **f,
                "to_new_primary_seconds": round(f["promoted"] - f["at"], 3),
                "unavailable_window_seconds": window["longest_gap_seconds"],
                "errors": window["errors"],
            }
        )
    return {
        "failovers": rows,
        "longest_unavailable_window_seconds": max(
            (r["unavailable_window_seconds"] for r in rows), default=0.0
        ),
    }
