"""A wall-clock deadline for one webhook attempt: name resolution, connect, TLS handshake,
sending the request, the answer's headers and its body, together.

Per-operation socket timeouts do not bound an attempt: a receiver that answers
``HTTP/1.1 200 OK\\r\\nX-Slow: `` and then one byte per second never lets a single read wait
as long as the read timeout, and keeps the attempt (and its sender thread) for as long as it
likes. httpx has no total timeout (encode/httpx#1450), so the sender talks to httpcore, the
engine under httpx, through :class:`DeadlineBackend`: a network backend whose every socket
operation gets ``min(its own timeout, time left to the attempt's deadline)``, and which
refuses an operation once the deadline has passed. A TLS handshake is one operation (CPython
applies a socket timeout to the whole ``do_handshake``), so it is bounded too; a write is
sent in slices, each bounded by the time then left.

The deadline is per attempt, while a connection is reused by later attempts (keep-alive):
so the deadline is not stored in the stream but read from the calling thread
(:func:`attempt`), which is where a synchronous httpcore request does all of its I/O.

Name resolution (``getaddrinfo``) takes no timeout at all; :func:`resolve_within` runs it on
a small pool of resolver threads and stops waiting at the deadline. The resolver thread
itself ends when the system resolver gives up (``resolv.conf`` timeouts), but the attempt,
and its sender thread, do not wait for it.
"""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from typing import Any, TypeVar

import httpcore

_T = TypeVar("_T")
WRITE_SLICE = 16 * 1024
"""Bytes handed to one ``send`` call, so that each slice is bounded by the time left."""

_local = threading.local()
_resolvers = ThreadPoolExecutor(max_workers=8, thread_name_prefix="webhook-dns")


class AttemptDeadlineExceeded(httpcore.TimeoutException):
    """The attempt's wall-clock deadline passed (``WEBHOOK_TIMEOUT_SECONDS`` after it began)."""


@contextmanager
def attempt(deadline: float) -> Iterator[None]:
    """Run the block as one attempt that must end by ``deadline`` (``time.monotonic()``
    seconds): every socket operation of :class:`DeadlineBackend` made by this thread inside
    the block is bounded by it."""
    previous = getattr(_local, "deadline", None)
    _local.deadline = deadline
    try:
        yield
    finally:
        _local.deadline = previous


def remaining() -> float | None:
    """Seconds left to the current thread's attempt deadline (None: no attempt)."""
    deadline: float | None = getattr(_local, "deadline", None)
    return None if deadline is None else deadline - time.monotonic()


def bound(timeout: float | None, what: str) -> float:
    """``timeout`` capped at the time left to this thread's attempt deadline. Raises
    :class:`AttemptDeadlineExceeded` when nothing is left (``what`` names the operation)."""
    left = remaining()
    if left is None:
        if timeout is None:
            raise ValueError("an unbounded socket operation outside an attempt")
        return timeout
    if left <= 0:
        raise AttemptDeadlineExceeded(f"the attempt's deadline passed while {what}")
    return left if timeout is None else min(timeout, left)


def resolve_within(resolver: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """Call ``resolver(*args, **kwargs)`` (``socket.getaddrinfo``) on a resolver thread and
    wait at most until this thread's attempt deadline. Raises
    :class:`AttemptDeadlineExceeded` when the answer does not come in time."""
    wait = bound(None, "resolving the host name")
    future = _resolvers.submit(resolver, *args, **kwargs)
    try:
        return future.result(timeout=wait)
    except FutureTimeout:
        future.cancel()
        raise AttemptDeadlineExceeded(
            "the attempt's deadline passed while resolving the host name"
        ) from None


@contextmanager
def _bounded(
    timeout: float | None, what: str, error: type[httpcore.TimeoutException]
) -> Iterator[float]:
    """The time one socket operation may take (``timeout`` capped at the deadline); a
    timeout of the operation that is the deadline's, or no time left at all, is raised as
    ``error`` saying so (the attempt's result names the deadline, not a read timeout)."""
    try:
        wait = bound(timeout, what)
    except AttemptDeadlineExceeded as exc:
        raise error(str(exc)) from None
    try:
        yield wait
    except httpcore.TimeoutException:
        left = remaining()
        if left is not None and left <= 0.01:
            raise error(f"the attempt's deadline passed while {what}") from None
        raise


class DeadlineStream(httpcore.NetworkStream):
    """A connection whose reads, writes and TLS handshake are bounded by the current
    thread's attempt deadline (see the module docstring)."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        """Read at most ``max_bytes``; raises ``httpcore.ReadTimeout`` at the deadline."""
        with _bounded(timeout, "reading the answer", httpcore.ReadTimeout) as wait:
            return self._inner.read(max_bytes, wait)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        """Send ``buffer`` in slices, each bounded by the time then left; raises
        ``httpcore.WriteTimeout`` at the deadline."""
        view = memoryview(buffer)
        while view:
            with _bounded(timeout, "sending the request", httpcore.WriteTimeout) as wait:
                self._inner.write(bytes(view[:WRITE_SLICE]), wait)
            view = view[WRITE_SLICE:]

    def close(self) -> None:
        """Close the connection."""
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        """The TLS handshake, bounded as a whole; raises ``httpcore.ConnectTimeout``."""
        with _bounded(timeout, "in the TLS handshake", httpcore.ConnectTimeout) as wait:
            return DeadlineStream(self._inner.start_tls(ssl_context, server_hostname, wait))

    def get_extra_info(self, info: str) -> Any:
        """What the wrapped stream says (``ssl_object``, ``is_readable``…)."""
        return self._inner.get_extra_info(info)


class DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's synchronous socket backend with every operation bounded by the calling
    thread's attempt deadline."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        """Connect, bounded; raises ``httpcore.ConnectTimeout`` at the deadline."""
        with _bounded(timeout, "connecting", httpcore.ConnectTimeout) as wait:
            return DeadlineStream(
                self._inner.connect_tcp(host, port, wait, local_address, socket_options)
            )

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        """Webhooks never use Unix sockets."""
        raise httpcore.UnsupportedProtocol("webhooks are sent over TCP only")

    def sleep(self, seconds: float) -> None:
        """Sleep, at most until the deadline."""
        left = remaining()
        time.sleep(max(0.0, seconds if left is None else min(seconds, left)))
