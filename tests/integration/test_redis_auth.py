"""The broker and the rate-limit Redis as a careful deployment runs them, against real
servers: an ACL user with a password (the default user off), TLS verified against a CA, and
a master found through three Sentinels that follows a failover. Every client outside
Celery (the rate limiter, the publisher's broker window) and Celery itself (kombu) is built
from the same settings."""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import subprocess
from pathlib import Path
from uuid import uuid4

import pytest
import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from devtools.ha.redis import APP_USER, MASTER_NAME, RedisHA, RedisPasswords
from devtools.stack import Servers, free_port
from exportcore.broker import EXPORT_TASK, make_celery
from exportcore.broker_inspect import BrokerKeys
from exportcore.domain import FAST_QUEUE
from exportcore.ratelimit import Limit, RateLimiter
from exportcore.redis_urls import redis_client
from exportcore.settings import Settings
from tests.support import wait_for


def _works(settings: Settings) -> None:
    """A submit's rate-limit decision in Redis, a message sent through Celery, and the
    broker read through the same client kind (Sentinel, TLS)."""
    decision = RateLimiter(settings).check(f"t-{uuid4().hex[:6]}", Limit(10.0, 5))
    assert (decision.allowed, decision.backend) == (True, "redis")
    make_celery(settings).send_task(EXPORT_TASK, args=[str(uuid4())], queue=FAST_QUEUE)
    client = redis_client(settings, settings.broker_url, timeout=2.0)
    keys = BrokerKeys(make_celery(settings).conf.broker_transport_options)
    try:
        assert sum(int(client.llen(key)) for key in keys.lists(FAST_QUEUE)) >= 1
    finally:
        client.close()


def test_redis_admits_only_the_acl_user(tmp_path: Path) -> None:
    srv = Servers(tmp_path, free_port(), free_port(), redis_password="p@ss word/1")
    srv.start_redis()
    try:
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=srv.redis_port, socket_timeout=2).ping()
        url = srv.redis_url(0)
        assert url.startswith(f"redis://{APP_USER}:p%40ss%20word%2F1@")
        with pytest.raises(redis.exceptions.NoPermissionError):  # no administrative commands
            redis.Redis.from_url(url).config_get("maxmemory")
        _works(Settings(celery_broker_url=url))
    finally:
        srv.stop_redis()


def _certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA and a certificate for 127.0.0.1 it signed: (ca.pem, cert.pem, key.pem)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "notes-exports test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "redis")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = folder / "ca.pem", folder / "cert.pem", folder / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


def test_a_tls_broker_is_verified_against_the_configured_ca(tmp_path: Path) -> None:
    ca, cert, key = _certificates(tmp_path)
    port = free_port()
    server = subprocess.Popen(
        [
            shutil.which("redis-server") or "redis-server",
            "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
            "--tls-cert-file", str(cert), "--tls-key-file", str(key),
            "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no",
            "--save", "", "--appendonly", "no", "--dir", str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"rediss://127.0.0.1:{port}/0"
        good = Settings(celery_broker_url=url, broker_tls_ca_file=ca)
        wait_for(
            lambda: RateLimiter(good).client.ping(),
            10,
            "the TLS Redis to answer",
            retry_on=(redis.ConnectionError,),
        )
        _works(good)
        (tmp_path / "other").mkdir()
        other_ca, _, _ = _certificates(tmp_path / "other")
        stranger = Settings(celery_broker_url=url, broker_tls_ca_file=other_ca)
        with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
            RateLimiter(stranger).client.ping()
    finally:
        server.terminate()
        server.wait(10)


def test_the_clients_follow_a_sentinel_failover(tmp_path: Path) -> None:
    ha = RedisHA(
        tmp_path / "redis",
        redis_ports=(free_port(), free_port()),
        sentinel_ports=(free_port(), free_port(), free_port()),
        passwords=RedisPasswords("app-pw", "replica-pw", "sentinel-user-pw", "sentinel-pw"),
    )
    ha.start()
    try:
        settings = Settings(
            celery_broker_url=ha.broker_url(0),
            broker_sentinel_master=MASTER_NAME,
            broker_sentinel_password="sentinel-pw",
        )
        _works(settings)
        limiter, app = RateLimiter(settings, redis_retry_seconds=0.1), make_celery(settings)
        tenant = f"t-{uuid4().hex[:6]}"
        assert limiter.check(tenant, Limit(10.0, 5)).backend == "redis"
        old, _ = ha.kill_master()
        new, _ = ha.wait_new_master(old, 60)
        assert new != old
        # The same clients ask the Sentinels again after the connection error.
        wait_for(
            lambda: limiter.check(tenant, Limit(10.0, 5)).backend == "redis",
            15,
            "the rate limiter to use the new master",
        )
        app.send_task(EXPORT_TASK, args=[str(uuid4())], queue=FAST_QUEUE)
        assert ha.node_client(new).llen(FAST_QUEUE) >= 1
        _works(settings)
    finally:
        ha.stop()
