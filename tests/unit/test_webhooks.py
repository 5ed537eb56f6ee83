"""Pure webhook logic: the specification's test vector, the SSRF address policy, URL rules,
payload rendering, retry and breaker decisions."""

from __future__ import annotations

import base64
import ipaddress
import json
import random
from datetime import UTC, datetime, timedelta
from uuid import UUID

import pytest
from hypothesis import given
from hypothesis import strategies as st
from standardwebhooks import Webhook

from devtools.webhook_receiver import spec_signature_valid
from exportcore.settings import Settings, parse_waits
from exportcore.webhooks import events, netguard, policy, signing

# The published test vector of the Standard Webhooks reference libraries
# (standard-webhooks/standard-webhooks, libraries/*/tests: "test_sign_function").
VECTOR_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
VECTOR_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
VECTOR_TIMESTAMP = 1614265330
VECTOR_BODY = '{"test": 2432232314}'
VECTOR_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_signing_matches_the_specification_test_vector() -> None:
    header = signing.signature_header(VECTOR_ID, VECTOR_TIMESTAMP, VECTOR_BODY, [VECTOR_SECRET])
    assert header == VECTOR_SIGNATURE
    # and the receivers' spec algorithm (written out, not the library) accepts it
    assert spec_signature_valid(
        VECTOR_SECRET, VECTOR_ID, str(VECTOR_TIMESTAMP), VECTOR_BODY.encode(), header
    )
    assert not spec_signature_valid(
        VECTOR_SECRET, VECTOR_ID, str(VECTOR_TIMESTAMP + 1), VECTOR_BODY.encode(), header
    )


def test_a_rotation_signs_with_every_valid_secret_space_separated() -> None:
    old, new = signing.new_secret(), signing.new_secret()
    ts = int(datetime.now(UTC).timestamp())
    headers = signing.webhook_headers("msg_1", ts, '{"a":1}', [new, old])
    parts = headers["webhook-signature"].split(" ")
    assert len(parts) == 2 and all(p.startswith("v1,") for p in parts)
    for secret in (old, new):
        Webhook(secret).verify('{"a":1}', headers)  # raises when no signature matches
    with pytest.raises(ValueError):
        signing.signature_header("msg_1", ts, "{}", [])


def test_new_secrets_are_whsec_with_32_random_bytes() -> None:
    a, b = signing.new_secret(), signing.new_secret()
    assert a != b and a.startswith("whsec_")
    assert len(base64.b64decode(a.removeprefix("whsec_"))) == 32
    assert signing.secret_hint(a) == a[:10] + "…"


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "loopback"),
        ("127.5.6.7", "loopback"),
        ("::1", "loopback"),
        ("169.254.169.254", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("100.100.100.200", "metadata"),
        ("169.254.10.1", "link-local"),
        ("fe80::1", "link-local"),
        ("10.0.0.1", "private"),
        ("172.16.5.4", "private"),
        ("192.168.1.1", "private"),
        ("fc00::1", "private"),
        ("100.64.0.1", "CGNAT"),
        ("100.127.255.254", "CGNAT"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("ff0e::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("192.0.2.1", "reserved"),
        ("240.0.0.1", "reserved"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:169.254.169.254", "metadata"),
        ("::ffff:10.1.2.3", "private"),
        ("64:ff9b::a9fe:a9fe", "metadata"),  # NAT64 of 169.254.169.254
        ("2002:7f00:1::", "loopback"),  # 6to4 of 127.0.0.1
        ("2001:db8::1", "reserved"),
    ],
)
def test_refused_addresses(address: str, why: str) -> None:
    reason = netguard.address_refusal(ipaddress.ip_address(address))
    assert reason is not None
    assert why.lower() in reason.lower()


@pytest.mark.parametrize(
    "address", ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700:4700::1111", "::ffff:8.8.8.8"]
)
def test_public_addresses_are_allowed(address: str) -> None:
    assert netguard.address_refusal(ipaddress.ip_address(address)) is None


@given(st.ip_addresses())
def test_every_allowed_address_is_global_unicast(
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> None:
    if netguard.address_refusal(ip) is None:
        inner = getattr(ip, "ipv4_mapped", None) or ip
        assert inner.is_global and not inner.is_multicast and not inner.is_loopback


def listed_refusal(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether REFUSED_NETWORKS, read on its own, refuses ``ip``: an address in an embedding
    range by the IPv4 address inside, any other by whether a listed range holds it."""
    listed = [r.network for r in netguard.REFUSED_NETWORKS if r.network.version == ip.version]
    if isinstance(ip, ipaddress.IPv6Address):
        for r in netguard.REFUSED_NETWORKS:
            if r.embeds_ipv4 and r.network.version == 6 and ip in r.network:
                inner = (
                    ip.ipv4_mapped or ip.sixtofour or ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
                )
                return listed_refusal(inner)
    return any(ip in net for net in listed)


def edges() -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The first and last address of every listed range and their neighbours outside it."""
    out: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []
    for r in netguard.REFUSED_NETWORKS:
        first, last = r.network.network_address, r.network.broadcast_address
        out += [first, last]
        if int(first) > 0:
            out.append(first - 1)
        if int(last) < (2**32 if r.network.version == 4 else 2**128) - 1:
            out.append(last + 1)
    return out


@pytest.mark.parametrize("ip", edges(), ids=str)
def test_the_guard_refuses_exactly_its_listed_ranges_at_their_edges(
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> None:
    assert (netguard.address_refusal(ip) is not None) == listed_refusal(ip)


@given(st.ip_addresses())
def test_the_guard_refuses_exactly_its_listed_ranges(
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> None:
    """REFUSED_NETWORKS is the whole policy (the chart's NetworkPolicy copies it): no address
    is refused only by Python's registry, none listed is let through."""
    assert (netguard.address_refusal(ip) is not None) == listed_refusal(ip)


def test_resolution_checks_every_answer_and_returns_the_checked_address() -> None:
    parsed = netguard.parse_url("https://hooks.example.com:8443/in?x=1")
    assert (parsed.host, parsed.port, parsed.target) == ("hooks.example.com", 8443, "/in?x=1")
    assert parsed.host_header == "hooks.example.com:8443"

    def answer(*ips: str) -> netguard.Resolver:
        return lambda host, port, **kw: [(2, 1, 6, "", (ip, port)) for ip in ips]

    ip = netguard.resolve_target(parsed, allow_private=False, resolver=answer("93.184.216.34"))
    assert str(ip) == "93.184.216.34"
    with pytest.raises(netguard.RefusedAddress, match="resolves to a private address"):
        netguard.resolve_target(
            parsed, allow_private=False, resolver=answer("93.184.216.34", "10.0.0.7")
        )
    assert (
        str(netguard.resolve_target(parsed, allow_private=True, resolver=answer("10.0.0.7")))
        == "10.0.0.7"
    )

    def fails(host: str, port: int, **kw: object) -> list[object]:
        raise OSError("Name or service not known")

    with pytest.raises(netguard.RefusedAddress, match="does not resolve"):
        netguard.resolve_target(parsed, allow_private=False, resolver=fails)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://example.com/", "WEBHOOK_ALLOW_HTTP"),
        ("ftp://example.com/", "https://"),
        ("https:///path", "no host"),
        ("https://u:p@example.com/", "credentials"),
        ("https://example.com/#x", "fragment"),
        ("https://exa mple.com/", "spaces"),
        ("https://example.com:99999/", "cannot be parsed"),
        ("https://127.0.0.1/", "loopback"),
        ("https://[::ffff:169.254.169.254]/", "metadata"),
        ("https://" + "a" * 2050 + ".com/", "longer than"),
    ],
)
def test_url_rules(url: str, message: str) -> None:
    with pytest.raises(netguard.InvalidWebhookUrl, match=message):
        netguard.validate_url(url, allow_http=False, allow_private=False)


def test_allow_settings_open_http_and_private_addresses() -> None:
    parsed = netguard.validate_url("http://127.0.0.1:8787/x", allow_http=True, allow_private=True)
    assert parsed.host_header == "127.0.0.1:8787"
    assert netguard.parse_url("https://[::1]/").host_header == "[::1]"


def test_body_is_thin_deterministic_and_carries_links() -> None:
    data = {
        "export": {
            "id": "0190a0b0-0000-7000-8000-000000000001",
            "status": "succeeded",
            "result": {"rows": 3, "bytes": 120, "sha256": "ab"},
        }
    }
    at = datetime(2026, 12, 1, 10, 0, 0, 123456, tzinfo=UTC)
    a = events.render_body("export.succeeded", at, data, "https://api.example.com/")
    assert a == events.render_body("export.succeeded", at, data, "https://api.example.com/")
    assert a.startswith('{"data":') and " " not in a

    body = json.loads(a)
    assert body["type"] == "export.succeeded"
    assert body["timestamp"] == "2026-12-01T10:00:00.123456Z"
    links = body["data"]["export"]["links"]
    assert links["download"] == (
        "https://api.example.com/v1/exports/0190a0b0-0000-7000-8000-000000000001/download"
    )
    failed = json.loads(events.render_body("export.failed", at, data))
    assert "download" not in failed["data"]["export"]["links"]
    uuid = UUID("0190a0b0-0000-7000-8000-000000000001")
    assert events.message_uuid(events.webhook_id(uuid)) == uuid


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (200, "delivered"),
        (204, "delivered"),
        (299, "delivered"),
        (301, "redirect"),
        (308, "redirect"),
        (410, "gone"),
        (404, "http_error"),
        (429, "http_error"),
        (500, "http_error"),
    ],
)
def test_outcome_of_status(status: int, outcome: str) -> None:
    assert policy.outcome_of_status(status) == outcome


def test_retry_after_seconds_and_dates() -> None:
    now = datetime(2026, 12, 1, 10, 0, 0, tzinfo=UTC)
    assert policy.parse_retry_after("120", now) == 120.0
    assert policy.parse_retry_after("Tue, 01 Dec 2026 10:01:00 GMT", now) == 60.0
    assert policy.parse_retry_after("soon", now) is None
    assert policy.parse_retry_after(None, now) is None


def test_retries_follow_the_schedule_with_jitter_and_span_a_day_by_default() -> None:
    p = policy.RetrySchedule(waits=(5.0, 300.0, 1800.0))
    rng = random.Random(7)
    for attempt, wait in enumerate(p.waits, start=1):
        delay = p.next_delay(attempt, rng=rng)
        assert delay is not None and 0.9 * wait <= delay <= 1.1 * wait
    assert p.max_attempts == 4 and p.next_delay(4) is None
    assert p.next_delay(1, retry_after=90) >= 90
    assert p.next_delay(1, retry_after=10**6) <= 1800
    # the defaults: Svix's schedule, 8 attempts, never less than 24 hours from first to last
    s = Settings()
    defaults = policy.RetrySchedule(waits=s.webhook_retry_waits)
    shortest, longest = defaults.horizon()
    assert s.webhook_max_attempts == 8 and s.webhook_retry_waits[:2] == (5.0, 300.0)
    assert shortest >= 24 * 3600 and longest <= 31 * 3600
    assert parse_waits("30, 1.5m,2h ,1d") == (30.0, 90.0, 7200.0, 86400.0)
    for bad in ("", "5x", "0s", "-1m", ",".join(["1s"] * 101)):
        with pytest.raises(ValueError, match="WEBHOOK_RETRY_SCHEDULE"):
            parse_waits(bad)


def _breaker() -> policy.BreakerPolicy:
    return policy.BreakerPolicy(
        threshold=3, base_seconds=10, cap_seconds=60, disable_after=timedelta(hours=24)
    )


def test_breaker_opens_after_the_threshold_and_backs_off_per_failed_probe() -> None:
    b = _breaker()
    t0 = datetime(2026, 12, 1, tzinfo=UTC)
    h = policy.Health(enabled=True)
    rng = random.Random(1)
    pauses = []
    for i in range(8):
        now = t0 + timedelta(minutes=i)
        h = b.after_attempt(h, outcome="timeout", started_at=now, now=now, error="timeout", rng=rng)
        if h.circuit_open_until:
            pauses.append((h.circuit_open_until - now).total_seconds())
        if i < 2:
            assert h.circuit_open_until is None and not b.is_half_open(h)
    assert h.failing_since == t0 and h.consecutive_failures == 8 and h.enabled
    assert b.is_half_open(h)
    assert 8 <= pauses[0] <= 12 and 16 <= pauses[1] <= 24 and all(p <= 72 for p in pauses)
    h = b.after_attempt(
        h, outcome="delivered", started_at=t0, now=t0 + timedelta(hours=1), error=None
    )
    assert (h.consecutive_failures, h.failing_since, h.circuit_open_until) == (0, None, None)
    assert h.last_success_at == t0 + timedelta(hours=1)


def test_a_day_of_failures_or_a_410_disables_with_the_reason() -> None:
    b = _breaker()
    t0 = datetime(2026, 12, 1, tzinfo=UTC)
    h = b.after_attempt(
        policy.Health(enabled=True), outcome="http_error", started_at=t0, now=t0, error="HTTP 500"
    )
    later = t0 + timedelta(hours=23, minutes=59)
    h = b.after_attempt(h, outcome="http_error", started_at=later, now=later, error="HTTP 500")
    assert h.enabled
    day = t0 + timedelta(hours=24)
    h = b.after_attempt(h, outcome="http_error", started_at=day, now=day, error="HTTP 503")
    assert not h.enabled
    assert h.disabled_reason is not None
    assert "since 2026-12-01T00:00:00Z" in h.disabled_reason and "HTTP 503" in h.disabled_reason
    gone = b.after_attempt(
        policy.Health(enabled=True), outcome="gone", started_at=t0, now=t0, error="HTTP 410"
    )
    assert not gone.enabled and "410 Gone" in (gone.disabled_reason or "")


def test_claim_must_outlast_an_attempt() -> None:
    with pytest.raises(ValueError, match="WEBHOOK_CLAIM_SECONDS"):
        Settings(webhook_timeout_seconds=30, webhook_claim_seconds=20)


def test_a_tenants_share_of_the_senders_leaves_some_for_the_others() -> None:
    with pytest.raises(ValueError, match="WEBHOOK_TENANT_CONCURRENCY"):
        Settings(webhook_max_in_flight=8, webhook_tenant_concurrency=8)
    assert Settings(webhook_max_in_flight=8, webhook_tenant_concurrency=7)


def test_every_event_type_has_a_json_schema_its_bodies_follow() -> None:
    import jsonschema

    from exportcore.webhooks import events

    assert set(events.EVENT_SCHEMAS) == {*events.EVENT_TYPES, events.TEST_EVENT}
    export = {
        "id": "01a23bb0-3183-727a-b007-42b699d0dfe2",
        "status": "succeeded",
        "format": "json",
        "note_count": 2,
        "attempts": 1,
        "replay_of": None,
        "created_at": "2026-12-01T10:00:00+00:00",
        "finished_at": "2026-12-01T10:00:01+00:00",
        "result": {"rows": 2, "bytes": 10, "sha256": "a" * 64},
        "error": None,
    }
    at = datetime(2026, 12, 1, 10, 0, 1, tzinfo=UTC)
    failed = {**export, "status": "failed", "result": None, "error": {"code": "x"}}
    bodies = {
        events.EXPORT_SUCCEEDED: {"export": export},
        events.EXPORT_FAILED: {"export": failed},
        events.EXPORT_CANCELLED: {"export": {**export, "status": "cancelled", "result": None}},
        events.SCHEDULE_PAUSED: {
            "schedule": {
                "id": export["id"],
                "enabled": False,
                "format": "json",
                "next_due_at": "2026-12-02T02:00:00+00:00",
                "paused_at": "2026-12-01T10:00:00+00:00",
            }
        },
        events.TEST_EVENT: {"webhook": {"id": export["id"]}},
    }
    for name, data in bodies.items():
        body = json.loads(events.render_body(name, at, data, "https://api.example.com"))
        jsonschema.validate(body, events.EVENT_SCHEMAS[name])
    wrong = json.loads(events.render_body(events.EXPORT_FAILED, at, {"export": export}))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(wrong, events.EVENT_SCHEMAS[events.EXPORT_FAILED])
