"""The worker's consumer keeps reconnecting after a broker loss (services/worker/consumer.py;
the redis_killed_mid_export drill shows it on real processes)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from celery.worker import state
from celery.worker.consumer import Consumer as CeleryConsumer
from kombu.exceptions import MessageStateError

from services.worker.consumer import Consumer, tolerate_stale_ack


class FakeRequest:
    """The two attributes of celery.worker.request.Request the consumer touches."""

    def __init__(self, errors: tuple[type[BaseException], ...]) -> None:
        self._connection_errors = errors

    @property
    def connection_errors(self) -> tuple[type[BaseException], ...]:
        return self._connection_errors


def test_a_stale_request_tolerates_the_errors_of_a_detached_channel() -> None:
    request = FakeRequest((ConnectionError,))
    tolerate_stale_ack(request)
    tolerate_stale_ack(request)  # idempotent
    assert request.connection_errors == (ConnectionError, AttributeError, MessageStateError)


def test_a_failed_cleanup_of_the_lost_connection_does_not_stop_the_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken_cleanup(self: Any, exc: Any) -> None:
        self.connection = None
        raise AttributeError("'NoneType' object has no attribute 'hostname'")

    monkeypatch.setattr(CeleryConsumer, "on_connection_error_after_connected", broken_cleanup)
    held = FakeRequest(())
    state.active_requests.add(held)  # type: ignore[arg-type]
    try:
        consumer = Consumer.__new__(Consumer)  # no broker needed for this one method
        consumer.connection = SimpleNamespace()
        consumer.on_connection_error_after_connected(ConnectionError("lost"))
    finally:
        state.active_requests.discard(held)  # type: ignore[arg-type]
    assert consumer.connection is None
    assert AttributeError in held.connection_errors


def test_the_worker_app_uses_this_consumer() -> None:
    from services.worker.app import app

    assert app.conf.worker_consumer == "services.worker.consumer:Consumer"
