"""A real webhook receiver on loopback, for tests, the benchmark and ``make dev``.

It verifies every request the way a Standard Webhooks consumer does — with the
specification's own library (``standardwebhooks.Webhook.verify``) and, independently, with
the algorithm written out from the specification (HMAC-SHA256 over
``{webhook-id}.{webhook-timestamp}.{body}``, base64, ``v1,`` prefix, any of the
space-separated signatures) — and records what it got. What it answers is scripted
(``respond``): a status, a delay (a slow receiver), or dropping the connection.
:class:`TricklingReceiver` is the hostile one: it trickles its answer a byte at a time.

Run alone (prints one JSON line per request on stdout, or to ``--log``)::

    python -m devtools.webhook_receiver --port 8787 --secret whsec_...
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import http.server
import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from standardwebhooks import Webhook, WebhookVerificationError


def spec_signature_valid(
    secret: str, webhook_id: str, timestamp: str, body: bytes, header: str
) -> bool:
    """Standard Webhooks 1.0 "Signature scheme", written out (not the library): True when
    one ``v1,`` entry of ``header`` is the HMAC-SHA256 of ``id.timestamp.body`` under the
    base64-decoded secret (``whsec_`` prefix removed), compared in constant time."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    expected = hmac.new(key, f"{webhook_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    for entry in header.split(" "):
        version, _, value = entry.partition(",")
        if version != "v1":
            continue
        try:
            given = base64.b64decode(value, validate=True)
        except ValueError:
            continue
        if hmac.compare_digest(expected, given):
            return True
    return False


@dataclass(frozen=True)
class Received:
    """One request as the receiver saw it."""

    at: float  # time.time() when the body was read
    path: str
    host: str
    webhook_id: str
    timestamp: str
    signature: str
    body: bytes
    #: indexes of the receiver's secrets whose signature verified (library and spec agree)
    verified_by: tuple[int, ...]
    answered: int | None  # status answered (None: connection dropped)

    @property
    def payload(self) -> Any:
        """The JSON body."""
        return json.loads(self.body)

    @property
    def signatures(self) -> list[str]:
        """The entries of ``webhook-signature``."""
        return self.signature.split(" ")


@dataclass
class Answer:
    """What to do with one request: ``status`` after ``delay`` seconds, optional headers;
    ``drop`` closes the connection without an answer."""

    status: int = 204
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    drop: bool = False


class Receiver:
    """A threaded HTTP/1.1 server on ``127.0.0.1`` (keep-alive, one thread per connection).

    ``secrets`` are the signing secrets the receiver trusts (a rotation test gives it the
    old and the new one); ``respond(n, request_headers)`` decides the answer to the n-th
    request (from 0). ``stop()`` closes the port (a receiver that is down: connection
    refused); ``start()`` opens the same port again."""

    def __init__(
        self,
        secrets: Sequence[str] = (),
        respond: Callable[[int, dict[str, str]], Answer] | None = None,
        port: int = 0,
        log: TextIO | None = None,
    ) -> None:
        self.secrets = list(secrets)
        self.respond = respond or (lambda n, h: Answer())
        self.port = port
        self.log = log
        self.received: list[Received] = []
        self.concurrent = 0
        self.max_concurrent = 0
        self._lock = threading.Lock()
        self._server: http.server.ThreadingHTTPServer | None = None
        self._count = 0

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Receiver:
        """Listen (again) on the port; returns self."""
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                receiver._handle(self)

            def log_message(self, *args: object) -> None:
                pass

        http.server.ThreadingHTTPServer.allow_reuse_address = True
        server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self.port = int(server.server_address[1])
        self._server = server
        threading.Thread(target=server.serve_forever, name="webhook-receiver", daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop listening and close the port."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def verify(self, headers: dict[str, str], body: bytes) -> tuple[int, ...]:
        """Indexes of ``secrets`` that verify this request by BOTH the library and the spec
        algorithm (the library also checks the timestamp is within 5 minutes)."""
        ok = []
        for i, secret in enumerate(self.secrets):
            try:
                Webhook(secret).verify(body, headers)
                by_library = True
            except (WebhookVerificationError, ValueError):
                by_library = False
            by_spec = spec_signature_valid(
                secret,
                headers.get("webhook-id", ""),
                headers.get("webhook-timestamp", ""),
                body,
                headers.get("webhook-signature", ""),
            )
            if by_library and by_spec:
                ok.append(i)
        return tuple(ok)

    def _handle(self, h: http.server.BaseHTTPRequestHandler) -> None:
        with self._lock:
            n = self._count
            self._count += 1
            self.concurrent += 1
            self.max_concurrent = max(self.max_concurrent, self.concurrent)
        try:
            length = int(h.headers.get("content-length") or 0)
            body = h.rfile.read(length)
            at = time.time()
            headers = {k.lower(): v for k, v in h.headers.items()}
            answer = self.respond(n, headers)
            got = Received(
                at=at,
                path=h.path,
                host=headers.get("host", ""),
                webhook_id=headers.get("webhook-id", ""),
                timestamp=headers.get("webhook-timestamp", ""),
                signature=headers.get("webhook-signature", ""),
                body=body,
                verified_by=self.verify(headers, body),
                answered=None if answer.drop else answer.status,
            )
            with self._lock:
                self.received.append(got)
                if self.log is not None:
                    self.log.write(
                        json.dumps(
                            {
                                "at": got.at,
                                "webhook_id": got.webhook_id,
                                "verified": bool(got.verified_by),
                                "concurrent": self.concurrent,
                            }
                        )
                        + "\n"
                    )
                    self.log.flush()
            if answer.delay:
                time.sleep(answer.delay)
            if answer.drop:
                h.close_connection = True
                h.connection.close()
                return
            h.send_response(answer.status)
            for k, v in answer.headers.items():
                h.send_header(k, v)
            h.send_header("Content-Length", "0")
            h.end_headers()
        finally:
            with self._lock:
                self.concurrent -= 1

    def ids(self) -> list[str]:
        """The ``webhook-id`` of every request, in arrival order."""
        with self._lock:
            return [r.webhook_id for r in self.received]


class TricklingReceiver:
    """A receiver that never finishes its answer: for each request it reads the request
    whole, sends ``HTTP/1.1 200 OK\\r\\nX-Slow: `` and then one more header byte every
    ``interval`` seconds until the client hangs up, ``stop()``, or ``limit`` seconds have
    passed (then it closes the connection: a client without a deadline is not kept for
    ever). Every single read of the client returns within ``interval``, so only a deadline
    over the whole attempt ends it: a slow-header ("slowloris") receiver, on a real socket
    on ``127.0.0.1``.

    ``connections`` counts accepted connections; ``webhook_ids`` lists the ``webhook-id`` of
    each request; ``open`` is the number of connections still being trickled to."""

    def __init__(self, interval: float = 1.0, limit: float = 60.0) -> None:
        self.interval = interval
        self.limit = limit
        self.connections = 0
        self.open = 0
        self.webhook_ids: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._sock.getsockname()[1])

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> TricklingReceiver:
        """Accept connections on a thread; returns self."""
        threading.Thread(target=self._accept, name="trickling-receiver", daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop trickling and close the port."""
        self._stop.set()
        self._sock.close()

    def __enter__(self) -> TricklingReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                self.open += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                head, _ = _read_request(conn)
                webhook_id = ""
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"webhook-id":
                        webhook_id = value.strip().decode("latin-1")
                with self._lock:
                    self.webhook_ids.append(webhook_id)
                conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                until = time.monotonic() + self.limit
                while time.monotonic() < until and not self._stop.wait(self.interval):
                    conn.sendall(b"a")
        except OSError:  # the client hung up: that is the point
            pass
        finally:
            with self._lock:
                self.open -= 1


def _read_request(conn: socket.socket) -> tuple[bytes, bytes]:
    """One HTTP/1.1 request from ``conn``: its head (request line and headers) and its body
    (``Content-Length`` bytes)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            raise OSError("the client closed before sending a request")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head, body


def main(argv: list[str] | None = None) -> int:
    """Run a receiver until interrupted; one JSON line per request."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8787)
    parser.add_argument("--secret", action="append", default=[], help="repeatable")
    parser.add_argument("--status", type=int, default=204, help="status to answer")
    parser.add_argument("--log", default="", help="file for the JSON lines (default stdout)")
    args = parser.parse_args(argv)
    out = open(args.log, "a", buffering=1) if args.log else sys.stdout  # noqa: SIM115
    receiver = Receiver(
        args.secret, lambda n, h: Answer(status=args.status), port=args.port, log=out
    ).start()
    print(f"listening on {receiver.url}", file=sys.stderr, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        receiver.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
