"""Load generators for POST /v1/exports.

- :func:`open_loop`: a fixed arrival rate (requests are *scheduled* at start + i / rate and
  each latency is measured from its scheduled time, so a slow server cannot slow the
  generator down and hide its own queueing: no coordinated omission). It is a minimal
  asyncio HTTP/1.1 client over keep-alive connections with a pre-encoded request: on a
  2-core machine a generator must cost far less CPU than the server it measures, and
  httpx costs roughly ten times more per request than this.
- :func:`closed_loop`: ``connections`` clients each sending the next request when the last
  answered (saturation), with the same client.
- :func:`wrk`: Debian's ``wrk`` (C, closed loop, per-request latency histogram) for the
  highest sustained rate, when installed.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


@dataclass
class LoadResult:
    sent: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)  # seconds, 2xx only
    errors: int = 0
    reconnects: int = 0  # kept-alive connections closed by the server while idle, retried
    started: float = 0.0  # wall clock
    elapsed: float = 0.0  # until the last answer
    send_elapsed: float = 0.0  # until the last request was sent (open loop)
    # with keep_bodies: (wall-clock send time, s; response body) of every 2xx answer, the
    # send time being the scheduled one in an open loop
    accepted: list[tuple[float, bytes]] = field(default_factory=list)
    keep_bodies: bool = False

    @property
    def ok(self) -> int:
        return sum(n for s, n in self.statuses.items() if 200 <= s < 300)

    @property
    def rate(self) -> float:
        return self.ok / self.elapsed if self.elapsed else 0.0


def build_request(
    url: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[str, int, bytes]:
    parts = urlsplit(url)
    payload = json.dumps(body).encode()
    lines = [
        f"POST {parts.path} HTTP/1.1",
        f"Host: {parts.hostname}:{parts.port}",
        "Content-Type: application/json",
        f"Content-Length: {len(payload)}",
        *(f"{k}: {v}" for k, v in headers.items()),
        "",
        "",
    ]
    return (
        parts.hostname or "127.0.0.1",
        int(parts.port or 80),
        "\r\n".join(lines).encode() + payload,
    )


class _Closed(ConnectionError):
    """The server closed the connection before answering."""


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.used = False

    async def send(self, request: bytes) -> tuple[int, bytes]:
        self.writer.write(request)
        try:
            status_line = await self.reader.readline()
        except ConnectionResetError as exc:
            raise _Closed("reset before the answer") from exc
        if not status_line:
            raise _Closed("closed before the answer")
        status = int(status_line.split(b" ", 2)[1])
        length = 0
        close = False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.partition(b":")
            lname = name.strip().lower()
            if lname == b"content-length":
                length = int(value.strip())
            elif lname == b"connection" and value.strip().lower() == b"close":
                close = True
        body = await self.reader.readexactly(length) if length else b""
        if close:
            raise ConnectionResetError("server closed")
        return status, body

    def close(self) -> None:
        self.writer.close()


class _Pool:
    def __init__(self, host: str, port: int, limit: int) -> None:
        self.host, self.port, self.limit = host, port, limit
        self.idle: list[_Conn] = []
        self.open = 0
        self.cond = asyncio.Condition()

    async def get(self, fresh: bool = False) -> _Conn:
        """An idle kept-alive connection, or a new one (always a new one with ``fresh``: a
        retry after the server closed an idle connection must not take another idle one it
        may have closed too)."""
        async with self.cond:
            while True:
                if self.idle and not fresh:
                    return self.idle.pop()
                if self.open < self.limit:
                    break
                if self.idle:  # fresh, at the limit: make room by closing an idle one
                    self.idle.pop().close()
                    self.open -= 1
                    break
                await self.cond.wait()
            self.open += 1
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            async with self.cond:
                self.open -= 1
                self.cond.notify()
            raise
        return _Conn(reader, writer)

    async def put(self, conn: _Conn | None) -> None:
        async with self.cond:
            if conn is None:
                self.open -= 1
            else:
                self.idle.append(conn)
            self.cond.notify()

    def close(self) -> None:
        for c in self.idle:
            c.close()


async def _one(pool: _Pool, request: bytes, res: LoadResult, t_ref: float, t_wall: float) -> None:
    for attempt in range(2):
        conn: _Conn | None = None
        try:
            conn = await pool.get(fresh=attempt > 0)
            status, body = await conn.send(request)
        except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError, IndexError) as e:
            if conn is not None:
                conn.close()
            await pool.put(None)
            # A kept-alive connection that the server closed while idle (gunicorn's
            # keepalive) answers nothing: the request was not read, so send it once more
            # on a new connection. Anything else is an error.
            if attempt == 0 and conn is not None and conn.used and isinstance(e, _Closed):
                res.reconnects += 1
                continue
            res.errors += 1
            return
        conn.used = True
        done = time.perf_counter()
        res.statuses[status] = res.statuses.get(status, 0) + 1
        if 200 <= status < 300:
            res.latencies.append(done - t_ref)
            if res.keep_bodies:
                res.accepted.append((t_wall, body))
        await pool.put(conn)
        return


async def _open_loop(
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    rate: float,
    seconds: float,
    max_connections: int,
    keep_bodies: bool,
) -> LoadResult:
    host, port, request = build_request(url, body, headers)
    pool = _Pool(host, port, max_connections)
    res = LoadResult(started=time.time(), keep_bodies=keep_bodies)
    n = int(rate * seconds)
    wall_minus_perf = time.time() - time.perf_counter()
    start = time.perf_counter() + 0.05
    tasks = []
    for i in range(n):
        t_sched = start + i / rate
        delay = t_sched - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(
            asyncio.create_task(_one(pool, request, res, t_sched, t_sched + wall_minus_perf))
        )
        res.sent += 1
    res.send_elapsed = time.perf_counter() - start
    await asyncio.gather(*tasks)
    res.elapsed = time.perf_counter() - start
    pool.close()
    return res


async def _closed_loop(
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    connections: int,
    total: int,
    keep_bodies: bool,
) -> LoadResult:
    host, port, request = build_request(url, body, headers)
    pool = _Pool(host, port, connections)
    res = LoadResult(started=time.time(), keep_bodies=keep_bodies)
    remaining = [total]

    async def client() -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            res.sent += 1
            await _one(pool, request, res, time.perf_counter(), time.time())

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(connections)))
    res.elapsed = time.perf_counter() - start
    pool.close()
    return res


def open_loop(
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    rate: float,
    seconds: float,
    max_connections: int = 256,
    keep_bodies: bool = False,
) -> LoadResult:
    """``rate`` requests/s for ``seconds``; latency from each request's scheduled time.
    With ``keep_bodies`` the result also lists every 2xx answer's body with its scheduled
    send time (wall clock), for latencies measured past the answer (submit -> succeeded)."""
    return asyncio.run(_open_loop(url, body, headers, rate, seconds, max_connections, keep_bodies))


def closed_loop(
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    connections: int,
    total: int,
    keep_bodies: bool = False,
) -> LoadResult:
    """``total`` requests over ``connections`` busy connections (``keep_bodies``: as for
    :func:`open_loop`, with each request's actual send time)."""
    return asyncio.run(_closed_loop(url, body, headers, connections, total, keep_bodies))


# --- wrk -------------------------------------------------------------------------------------

_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


def _seconds(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text.strip())
    if not m:
        raise ValueError(text)
    return float(m.group(1)) * _UNITS[m.group(2)]


def have_wrk() -> bool:
    return shutil.which("wrk") is not None


def wrk(
    url: str, body: dict[str, Any], headers: dict[str, str], connections: int, seconds: float
) -> dict[str, Any]:
    """One ``wrk --latency`` run; returns rate, p50/p90/p99 (ms) and non-2xx count."""
    hdrs = {"Content-Type": "application/json", **headers}
    script = "wrk.method = 'POST'\n" + f"wrk.body = {json.dumps(json.dumps(body))}\n"
    script += "".join(f"wrk.headers[{json.dumps(k)}] = {json.dumps(v)}\n" for k, v in hdrs.items())
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as fh:
        fh.write(script)
        lua = Path(fh.name)
    try:
        out = subprocess.run(
            [
                "wrk",
                "-t1",
                f"-c{connections}",
                f"-d{max(1, int(seconds))}s",
                "--timeout",
                "10s",
                "--latency",
                "-s",
                str(lua),
                url,
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        lua.unlink(missing_ok=True)
    return {"connections": connections, **parse_wrk(out)}


def parse_wrk(out: str) -> dict[str, Any]:
    """Rate, p50/p90/p99 (ms), non-2xx and socket error counts from ``wrk --latency``."""
    res: dict[str, Any] = {"raw": out}
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    res["rate"] = float(m.group(1)) if m else None
    for pct in ("50", "90", "99"):
        m = re.search(rf"^\s+{pct}%\s+(\S+)", out, re.MULTILINE)
        res[f"p{pct}_ms"] = _seconds(m.group(1)) * 1000 if m else None
    m = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    res["non_2xx"] = int(m.group(1)) if m else 0
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    res["socket_errors"] = sum(int(x) for x in m.groups()) if m else 0
    m = re.search(r"(\d+) requests in", out)
    res["requests"] = int(m.group(1)) if m else None
    return res
