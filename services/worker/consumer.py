"""The workers' Celery consumer: it reconnects after ANY loss of the broker connection.

Celery 5.7 handles a lost connection by collecting it and then closing it again. When the
broker is still unreachable at that moment and the worker holds unacknowledged messages
(every running export does: ``acks_late``), two things go wrong with the Redis transport,
both with an ``AttributeError`` that escapes Celery's filter of connection errors, so the
worker logs "Unrecoverable error" and exits instead of reconnecting (found by the chaos
soak, SIGKILL of Redis while exports run; reproduced by the ``redis_killed_mid_export``
drill):

1. the second close tries to restore the unacknowledged messages through a transport
   that the collect already detached;
2. an export that was running through the outage finishes after the worker reconnected,
   and its acknowledgement goes to the channel of the lost connection, equally detached.

This consumer lets the reconnect cycle continue after (1), and marks the requests that
belong to the lost connection so that (2) is logged and dropped instead of fatal. Nothing
is lost by either: the job's state lives in PostgreSQL; a message Redis still holds comes
back after the visibility timeout (and its claim is refused), and a message Redis lost is
re-dispatched by the recovery-scanner.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.worker import state
from celery.worker.consumer import Consumer as CeleryConsumer
from kombu.exceptions import MessageStateError

log = logging.getLogger(__name__)

STALE_ACK_ERRORS: tuple[type[BaseException], ...] = (AttributeError, MessageStateError)
"""What acknowledging a message of a lost connection raises with the Redis transport."""


def tolerate_stale_ack(request: Any) -> None:
    """Make the ack/reject of ``request`` (a message of a connection that is gone) log
    its failure instead of raising it into the worker's event loop."""
    errors = tuple(request.connection_errors or ())
    if not set(STALE_ACK_ERRORS) <= set(errors):
        request._connection_errors = errors + STALE_ACK_ERRORS


class Consumer(CeleryConsumer):
    """Celery's consumer, minus two crashes on a half-detached broker connection."""

    def on_connection_error_after_connected(self, exc: Any) -> None:
        held = [*state.active_requests, *state.reserved_requests]
        for request in held:
            tolerate_stale_ack(request)
        try:
            super().on_connection_error_after_connected(exc)
        except AttributeError as cleanup_error:
            # Celery already dropped the connection (self.connection is None): only the
            # cleanup of a connection that is gone anyway failed.
            self.connection = None
            log.warning(
                "broker connection cleanup failed; reconnecting anyway",
                extra={
                    "error": repr(cleanup_error),
                    "cause": repr(exc),
                    "unacknowledged": len(held),
                },
            )
