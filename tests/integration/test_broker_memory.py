"""The broker's Redis memory against real servers: the publisher refuses to start on a
Redis that may evict (its queued messages are keys), the check works as the deployments'
ACL user (INFO, not the administrative CONFIG), and the rate-limit buckets that share the
broker's Redis cost a bounded, measured amount of its memory and all expire."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

import pytest
import redis

from devtools.stack import ROOT, Servers, free_port
from exportcore.broker_memory import EvictingBroker, check_broker_redis
from exportcore.ratelimit import Limit, RateLimiter
from exportcore.settings import Settings
from tests.support import wait_for

PASSWORD = "evict-test-pw"


@pytest.fixture
def evicting_redis(tmp_path: Path) -> Iterator[str]:
    """A Redis with maxmemory-policy allkeys-lru that admits only the ACL user ``exports``
    (no administrative commands, as k8s/dev-deps.yaml and make dev); yields its URL."""
    port = free_port()
    server = subprocess.Popen(
        [
            shutil.which("redis-server") or "redis-server",
            "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(tmp_path), "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru",
            "--user", "default", "off",
            "--user", "exports", "on", f">{PASSWORD}", "~*", "&*", "+@all", "-@admin",
        ],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"redis://exports:{PASSWORD}@127.0.0.1:{port}/0"
    try:
        wait_for(
            lambda: redis.Redis.from_url(url, socket_timeout=1).ping(),
            10,
            "the evicting Redis to answer",
            retry_on=(redis.ConnectionError,),
        )
        yield url
    finally:
        server.terminate()
        server.wait(10)


def test_the_check_refuses_an_evicting_broker_as_the_acl_user(
    evicting_redis: str, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(redis.exceptions.NoPermissionError):  # CONFIG is not allowed...
        redis.Redis.from_url(evicting_redis).config_get("maxmemory-policy")
    settings = Settings(celery_broker_url=evicting_redis)
    with pytest.raises(EvictingBroker, match="maxmemory-policy allkeys-lru"):
        check_broker_redis(settings)  # ...INFO is, and tells the policy
    warned = settings.model_copy(update={"broker_eviction_check": "warn"})
    with caplog.at_level(logging.INFO, logger="exportcore.broker_memory"):
        seen = check_broker_redis(warned)
    assert (seen.policy, seen.maxmemory) == ("allkeys-lru", 64 * 1024 * 1024)
    assert [r.levelname for r in caplog.records if "allkeys-lru" in r.getMessage()] == ["ERROR"]
    assert PASSWORD not in caplog.text


def test_the_publisher_process_refuses_to_start_on_an_evicting_broker(
    evicting_redis: str, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "CELERY_BROKER_URL": evicting_redis,
        "HEARTBEAT_FILE": str(tmp_path / "heartbeat"),
        "PYTHONPATH": str(ROOT),
    }
    env.pop("RATE_LIMIT_REDIS_URL", None)
    proc = subprocess.run(
        [sys.executable, "-m", "services.publisher"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 78, (proc.returncode, proc.stderr[-2000:])
    out = proc.stdout + proc.stderr
    assert "publisher refuses to start" in out and "maxmemory-policy allkeys-lru" in out
    assert "noeviction" in out and PASSWORD not in out


def test_the_dev_redis_is_noeviction_and_the_shared_buckets_are_small_and_expire(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    srv = Servers(tmp_path, free_port(), free_port(), redis_password="pw-" + uuid4().hex[:8])
    srv.start_redis()  # scripts/localstack.sh, as make dev starts it
    try:
        settings = Settings(celery_broker_url=srv.redis_url(0))
        with caplog.at_level(logging.INFO, logger="exportcore.broker_memory"):
            seen = check_broker_redis(settings)
        assert (seen.policy, seen.rate_limits_shared) == ("noeviction", True)
        line = next(r for r in caplog.records if r.getMessage() == "broker memory")
        assert "broker's Redis" in str(line.__dict__["rate_limit_buckets"])

        client = redis.Redis.from_url(srv.redis_url(0))
        before = int(client.info("memory")["used_memory"])
        limiter = RateLimiter(settings)
        n = 2000
        for i in range(n):  # a spray of sign-ins from distinct addresses
            limiter.check(f"198.51.{i // 250}.{i % 250}", Limit(0.1, 5), name="console-sign-in")
        keys = client.keys("exports:console-sign-in-rate:*")
        assert len(keys) == n
        per_bucket = (int(client.info("memory")["used_memory"]) - before) / n
        # docs/operations.md quotes the measure ("about 300 bytes": 283 on Redis 7.0); headroom
        assert per_bucket < 400, per_bucket
        ttls = [int(client.pttl(k)) for k in keys[:200]]
        # each expires once full again: (burst - tokens) / rate + 1 s = 10 s + 1 s here
        assert all(0 < t <= 11_000 for t in ttls), sorted(ttls)[:5]
        print(f"rate-limit bucket: {per_bucket:.0f} bytes of broker memory each")
    finally:
        srv.stop_redis()
