"""services/worker/consumer.py overrides Celery internals of ONE version (see its docstring):
these tests fail loudly, with what to do, as soon as a lock refresh moves Celery or kombu, or
the internals it relies on change shape or source.

When one fails after an upgrade: read the new source of the named function, check that the
two crashes the consumer works around still exist (or drop the workaround), run the
``redis_killed_mid_export`` drill (``make drills DRILLS=redis_killed_mid_export``), then
update the pins in libs/exportcore/pyproject.toml and the fingerprints below.
"""

from __future__ import annotations

import hashlib
import inspect
import tomllib
import weakref
from collections.abc import Callable
from typing import Any

import celery
import kombu
import pytest
from celery.worker import state
from celery.worker.consumer.consumer import Consumer as CeleryConsumer
from celery.worker.request import Request
from kombu.transport import redis as kombu_redis

from devtools.stack import ROOT
from services.worker.consumer import Consumer

WHAT_TO_DO = (
    "services/worker/consumer.py was written against celery/kombu 5.7.0: re-verify it "
    "(this file's docstring says how) before updating the pin or this fingerprint"
)

# sha256 of inspect.getsource(...) of each internal the consumer depends on, in 5.7.0.
FINGERPRINTS: dict[str, tuple[Callable[..., Any], str]] = {
    "celery Consumer.on_connection_error_after_connected": (
        CeleryConsumer.on_connection_error_after_connected,
        "4f84dbfff329d28f48fb7dffad999b194b4b12bc1e3b444161ec106efce91f64",
    ),
    "celery Request.acknowledge": (
        Request.acknowledge,
        "60dad9ce9c39f54ca7c456f700fe5cb037172f4eaad92e5f77232479868c5d2e",
    ),
    "celery Request.reject": (
        Request.reject,
        "08be2378bcc6c01762458ccac12b806074c49ab5696b74f1b09170fdfc55b0bc",
    ),
    "celery Request.connection_errors": (
        Request.connection_errors.fget,  # type: ignore[attr-defined]
        "7b224dfd5df84277b7c084750f7e2e5552e53f3abc283d9148cccbe11066dd99",
    ),
    "kombu redis QoS.restore_unacked": (
        kombu_redis.QoS.restore_unacked,
        "8954efef014d546e047d213e437d5a27ad91b8288d6b90b4484addca86b3c6e2",
    ),
}


def _pins() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "libs/exportcore/pyproject.toml").read_text())["project"][
        "dependencies"
    ]
    pins = {}
    for dep in deps:
        name, sep, version = dep.partition("==")
        if sep:
            pins[name.split("[")[0].strip().lower()] = version.strip()
    return pins


def test_celery_and_kombu_are_pinned_exactly_to_the_installed_versions() -> None:
    pins = _pins()
    assert pins.get("celery") == "5.7.0", f"celery must be pinned with == ({WHAT_TO_DO})"
    assert pins.get("kombu") == "5.7.0", f"kombu must be pinned with == ({WHAT_TO_DO})"
    assert celery.__version__ == pins["celery"], WHAT_TO_DO
    assert kombu.__version__ == pins["kombu"], WHAT_TO_DO


@pytest.mark.parametrize("name", sorted(FINGERPRINTS))
def test_the_internals_the_consumer_overrides_are_unchanged(name: str) -> None:
    fn, expected = FINGERPRINTS[name]
    actual = hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()
    assert actual == expected, f"{name} changed (sha256 {actual}): {WHAT_TO_DO}"


def test_the_shapes_the_consumer_touches_are_still_there() -> None:
    # The two registries of held requests it walks.
    assert isinstance(state.active_requests, weakref.WeakSet), WHAT_TO_DO
    assert isinstance(state.reserved_requests, weakref.WeakSet), WHAT_TO_DO
    # The private slot behind Request.connection_errors, which acknowledge/reject pass on.
    assert "_connection_errors" in Request.__slots__, WHAT_TO_DO
    assert "self._connection_errors" in inspect.getsource(Request.acknowledge), WHAT_TO_DO
    # The method it overrides, with the same signature, and that it really overrides it.
    assert list(
        inspect.signature(CeleryConsumer.on_connection_error_after_connected).parameters
    ) == [
        "self",
        "exc",
    ], WHAT_TO_DO
    assert issubclass(Consumer, CeleryConsumer)
    assert (
        Consumer.on_connection_error_after_connected
        is not CeleryConsumer.on_connection_error_after_connected
    )
