"""scripts/localstack.sh: servers belong to their directory (pid files), never to a port.

- the port probe asks for a LISTENER (connect), so a port whose last connections are in
  TIME_WAIT (a server that closed first, as HTTP servers do) is free, as it is for the
  servers, which bind with SO_REUSEADDR;
- a stop stops only the directory's own server, whatever port it uses, and a start refuses
  a port where someone else listens instead of adopting that server.
"""

from __future__ import annotations

import errno
import socket
import subprocess
from pathlib import Path

import pytest
import redis

from devtools.drills.harness import pid_alive
from devtools.stack import LOCALSTACK, ROOT, Servers, free_port
from tests.support import wait_for


def localstack(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(LOCALSTACK), *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def listening(port: int) -> bool:
    return localstack("port-listening", str(port)).returncode == 0


def bind_fails(port: int) -> bool:
    """What the old probe did: bind without SO_REUSEADDR."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            assert exc.errno == errno.EADDRINUSE
            return True
    return False


def test_a_port_with_only_time_wait_connections_is_free_a_listener_is_not() -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.listen()
    assert listening(port)
    client = socket.create_connection(("127.0.0.1", port))
    while True:  # the probe's own connection is in the backlog first
        served, peer = listener.accept()
        if peer == client.getsockname():
            break
        served.close()
    served.close()  # the server closes first: its side of the connection enters TIME_WAIT
    assert client.recv(1) == b""
    client.close()
    listener.close()
    # Nothing listens any more, but the TIME_WAIT connection still holds the address for a
    # bind without SO_REUSEADDR: the old probe reported "port in use" here.
    assert bind_fails(port)
    assert not listening(port)
    # ... and a server binding with SO_REUSEADDR (gunicorn, PostgreSQL, Redis) can start.
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))
        again.listen()
        assert listening(port)


@pytest.fixture
def dirs(tmp_path: Path) -> list[Path]:
    made = [ROOT / ".test" / f"ls-{tmp_path.name[-12:]}-{i}" for i in range(2)]
    yield made
    for d in made:
        localstack("redis-stop", str(d / "redis"))
        localstack("pg-stop", str(d / "pg"))
        subprocess.run(["rm", "-rf", str(d)], check=False)


def test_redis_is_stopped_by_its_directory_and_never_adopted_by_port(dirs: list[Path]) -> None:
    a, b = (d / "redis" for d in dirs)
    port_a, port_b = free_port(), free_port()
    assert localstack("redis-start", str(a), str(port_a)).returncode == 0
    pid_a = int((a / "redis.pid").read_text())
    # Another directory on the same port: refused with a message, and A is left alone.
    refused = localstack("redis-start", str(b), str(port_a))
    assert refused.returncode == 3 and f"port {port_a} is in use" in refused.stderr
    localstack("redis-stop", str(b), str(port_a))  # B has no server: stops nothing
    assert redis.Redis(port=port_a).ping()
    # A second Redis of B beside it, then stopping A (no port given) leaves B running.
    assert localstack("redis-start", str(b), str(port_b)).returncode == 0
    assert localstack("redis-start", str(a), str(port_a)).returncode == 0  # adopts its own
    assert localstack("redis-stop", str(a)).returncode == 0
    assert not pid_alive(pid_a)
    assert redis.Redis(port=port_b).ping()
    # A's own server on another port than asked: a clear refusal, not a second server.
    assert localstack("redis-start", str(b), str(free_port())).returncode == 3


def test_postgres_refuses_a_port_another_server_listens_on(
    dirs: list[Path], servers: Servers
) -> None:
    refused = localstack("pg-start", str(dirs[0] / "pg"), str(servers.pg_port))
    assert refused.returncode == 3, refused.stderr
    assert f"port {servers.pg_port} is in use" in refused.stderr
    assert not (dirs[0] / "pg" / "data").exists()  # refused before initdb
    # the test servers' PostgreSQL still answers
    wait_for(lambda: listening(servers.pg_port), 5, "the test PostgreSQL")
