"""Redis URLs of the broker and the rate limiter: plain, TLS, Sentinel; the settings that
go with them; and the errors a malformed one gets (never echoing its password)."""

from __future__ import annotations

import ssl

import pydantic
import pytest

from exportcore.broker import make_celery
from exportcore.redis_urls import celery_ssl, parse_redis_url, sentinel_transport_options
from exportcore.settings import Settings

SENTINELS = (
    "sentinel://exports:s%40cret@10.0.0.1:26379/2;sentinel://10.0.0.2:26380;sentinel://10.0.0.3"
)


def test_a_plain_url_with_an_acl_user() -> None:
    t = parse_redis_url("redis://exports:pw@cache:6380/3")
    assert (t.sentinels, t.username, t.password, t.db, t.tls) == ((), "exports", "pw", 3, False)


def test_a_sentinel_url_lists_every_sentinel_and_takes_the_first_ones_credentials() -> None:
    t = parse_redis_url(SENTINELS)
    assert t.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26380), ("10.0.0.3", 26379))
    assert (t.username, t.password, t.db) == ("exports", "s@cret", 2)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://cache:6379/0", "unsupported Redis URL scheme"),
        ("redis://a:6379/0;redis://b:6379/0", "only a sentinel:// URL may list several"),
        ("sentinel://a:26379;redis://b:6379", "lists only sentinel://"),
        ("redis://exports:hunter2@cache:port/0", "numeric port"),
    ],
)
def test_a_malformed_url_is_refused_at_start_without_its_password(url: str, says: str) -> None:
    with pytest.raises(pydantic.ValidationError) as err:
        Settings(celery_broker_url=url)
    assert says in str(err.value) and "hunter2" not in str(err.value)


def test_a_sentinel_broker_needs_the_master_name() -> None:
    with pytest.raises(pydantic.ValidationError, match="BROKER_SENTINEL_MASTER"):
        Settings(celery_broker_url=SENTINELS)
    with pytest.raises(pydantic.ValidationError, match="RATE_LIMIT_REDIS_URL"):
        Settings(rate_limit_redis_url=SENTINELS)


def test_celery_gets_the_master_name_and_the_sentinels_own_password() -> None:
    s = Settings(
        celery_broker_url=SENTINELS,
        broker_sentinel_master="exports",
        broker_sentinel_password="sentinel-pw",
        broker_publish_timeout=2,
    )
    options = make_celery(s).conf.broker_transport_options
    assert options["master_name"] == "exports"
    assert options["sentinel_kwargs"] == {
        "password": "sentinel-pw",
        "socket_timeout": 2,
        "socket_connect_timeout": 2,
    }
    assert options["visibility_timeout"] == s.broker_visibility_timeout  # kept
    assert sentinel_transport_options(Settings()) == {}


def test_a_tls_broker_verifies_the_server_with_the_configured_ca(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    s = Settings(celery_broker_url="rediss://exports:pw@cache:6380/0", broker_tls_ca_file=ca)
    assert celery_ssl(s) == {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": str(ca)}
    assert make_celery(s).conf.broker_use_ssl["ssl_cert_reqs"] == ssl.CERT_REQUIRED
    assert celery_ssl(Settings()) is None
