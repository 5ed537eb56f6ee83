"""The chaos soak fails when it did not test recovery (devtools/drills/soak.py,
``untested_recoveries``): a run whose chaos targeted the bulk worker and Redis must record
at least one lease recovery and one lost-dispatch recovery; a run that targeted neither
needs none. The soak itself runs in tests/drills (two minutes) and ``make soak``."""

from __future__ import annotations

from devtools.drills.soak import COMPONENTS, untested_recoveries

ONE = [{"job_id": "j"}]


def test_a_soak_of_every_component_needs_both_kinds_of_recovery() -> None:
    assert untested_recoveries({"lease": [], "dispatch": []}, COMPONENTS) == [
        "lease",
        "dispatch",
    ]
    assert untested_recoveries({"lease": ONE, "dispatch": []}, COMPONENTS) == ["dispatch"]
    assert untested_recoveries({"lease": [], "dispatch": ONE}, COMPONENTS) == ["lease"]
    assert untested_recoveries({"lease": ONE, "dispatch": ONE}, COMPONENTS) == []


def test_only_the_targets_that_cause_a_recovery_require_one() -> None:
    nothing: dict[str, list[object]] = {"lease": [], "dispatch": []}
    assert untested_recoveries(nothing, ["api", "publisher", "postgres"]) == []
    assert untested_recoveries(nothing, ["bulk-worker-child"]) == ["lease"]
    assert untested_recoveries(nothing, ["redis"]) == ["dispatch"]
