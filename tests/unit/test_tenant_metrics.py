"""Per-tenant backlog gauges keep their label set bounded (top N + named + other)."""

from __future__ import annotations

from exportcore.metrics import snapshot_families
from exportcore.store.metrics import OTHER, tenant_backlog


def row(tenant: str, queue: str, queued: int, running: int, age: float, held: int = 0) -> dict:
    return {
        "tenant_id": tenant,
        "queue": queue,
        "queued": queued,
        "running": running,
        "oldest_age": age,
        "held_back": held,
    }


EMPTY = {"queued": 0, "running": 0, "oldest_age": 0.0, "held_back": 0}

ROWS = [
    row("flood", "exports.bulk", 900, 1, 5.0, 899),
    row("victim", "exports.bulk", 1, 0, 120.0),
    *(row(f"t{i}", "exports.fast", 1, 0, float(i)) for i in range(50)),
]


def test_the_tenants_furthest_behind_keep_their_label_and_the_rest_are_other() -> None:
    out = tenant_backlog(ROWS, top_n=3, named=frozenset())
    labels = {t for t, _ in out}
    assert labels == {"victim", "t49", "t48", OTHER}  # oldest queued job first
    assert out[("victim", "exports.bulk")] == {
        "queued": 1,
        "running": 0,
        "oldest_age": 120.0,
        "held_back": 0,
    }
    assert out[("victim", "exports.fast")] == EMPTY
    assert out[(OTHER, "exports.bulk")] == {
        "queued": 900,
        "running": 1,
        "oldest_age": 5.0,
        "held_back": 899,
    }
    assert out[(OTHER, "exports.fast")]["queued"] == 48
    assert out[(OTHER, "exports.fast")]["oldest_age"] == 47.0


def test_named_tenants_always_get_a_label_and_star_names_everyone() -> None:
    named = tenant_backlog(ROWS, top_n=0, named=frozenset({"flood", "quiet"}))
    assert {t for t, _ in named} == {"flood", "quiet", OTHER}
    assert named[("quiet", "exports.fast")]["queued"] == 0
    everyone = tenant_backlog(ROWS, top_n=0, named=frozenset({"*"}))
    assert len({t for t, _ in everyone}) == 53


def test_no_active_jobs_still_exports_the_other_series() -> None:
    assert tenant_backlog([], top_n=10, named=frozenset()) == {
        (OTHER, "exports.bulk"): EMPTY,
        (OTHER, "exports.fast"): EMPTY,
    }


def test_families_carry_the_tenant_and_schedule_series() -> None:
    snapshot = {
        "jobs": {},
        "oldest_queued": {},
        "outbox_unpublished": 0,
        "outbox_oldest_age": 0,
        "expired_leases": 0,
        "dead_letters": {},
        "admission_active": 0,
        "admission_capacity": 1,
        "tenants_at_quota": 0,
        "tenant_backlog": tenant_backlog(ROWS, top_n=1, named=frozenset()),
        "schedules": {"enabled": 3, "backing_off": 1},
        "schedules_paused": {"unknown_notes": 2},
    }
    families = {f.name: f for f in snapshot_families(snapshot)}
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for name in ("exports_tenant_jobs", "exports_schedules", "exports_schedules_paused")
        for s in families[name].samples
    }
    assert (
        samples[
            (
                "exports_tenant_jobs",
                (("queue", "exports.bulk"), ("status", "running"), ("tenant", "victim")),
            )
        ]
        == 0
    )
    assert samples[("exports_schedules", (("state", "paused"),))] == 2
    assert samples[("exports_schedules_paused", (("reason", "requested"),))] == 0
    held = {
        tuple(sorted(s.labels.items())): s.value
        for s in families["exports_tenant_held_back"].samples
    }
    assert held[(("queue", "exports.bulk"), ("tenant", "other"))] == 899
    assert held[(("queue", "exports.bulk"), ("tenant", "victim"))] == 0
    assert families["exports_outbox_held_back"].samples == []  # no held_back in the snapshot
