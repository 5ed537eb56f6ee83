"""The console's sign-in throttle on the real gunicorn api behind a proxy: one client's
failed sign-ins lock out that client only, never every operator behind the same Gateway;
X-Forwarded-For counts only when the TCP peer is a trusted proxy (FORWARDED_ALLOW_IPS, the
chart's trustedProxies), and a client that writes the header itself gains nothing.

This test's process plays the proxy: it connects from 127.0.0.1 and sends the
X-Forwarded-For a proxy would (the client's header, then the address the proxy saw)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.conftest import E2E, running_stack

pytestmark = pytest.mark.e2e

LOGIN_TOKEN = re.compile(r'name="login_token" value="([^"]+)"')
WRONG_KEY = "nex_op_00000000_" + "w" * 43
# three attempts per address, then one every ~17 minutes: the test never waits for a refill
THROTTLE = {"CONSOLE_SIGN_IN_RATE": "0.001", "CONSOLE_SIGN_IN_BURST": "3"}


@pytest.fixture(scope="module")
def behind_trusted_proxy(servers, template_db, notes_dir, tmp_path_factory) -> Iterator[E2E]:
    """The api trusting its loopback peer as a proxy (what the chart does for the proxies'
    addresses)."""
    env = {**THROTTLE, "FORWARDED_ALLOW_IPS": "127.0.0.1"}
    base = tmp_path_factory.mktemp("trusted-proxy")
    with running_stack(servers, template_db, notes_dir, base, env, names=("api",)) as e:
        yield e


@pytest.fixture(scope="module")
def no_trusted_proxy(servers, template_db, notes_dir, tmp_path_factory) -> Iterator[E2E]:
    """The api trusting another address only: this test's connections are not a proxy's."""
    env = {**THROTTLE, "FORWARDED_ALLOW_IPS": "192.0.2.1"}
    base = tmp_path_factory.mktemp("untrusted-peer")
    with running_stack(servers, template_db, notes_dir, base, env, names=("api",)) as e:
        yield e


def sign_in(api_url: str, key: str, forwarded_for: str | None) -> httpx.Response:
    """A whole sign-in (the form, then the post) as one browser behind the proxy."""
    headers = {"X-Forwarded-For": forwarded_for} if forwarded_for else {}
    with httpx.Client(base_url=api_url, headers=headers, timeout=20) as client:
        form = client.get("/console/login")
        token = LOGIN_TOKEN.search(form.text)
        assert token, form.text[:300]
        return client.post(
            "/console/login",
            data={"key": key, "login_token": token.group(1), "next": "/console/"},
        )


def test_a_throttled_client_does_not_lock_out_another_behind_the_same_proxy(
    behind_trusted_proxy: E2E,
) -> None:
    e = behind_trusted_proxy
    url, operator_key = e.stack.api_url, e.api.admin_key or ""
    guesser = "203.0.113.7"
    assert [sign_in(url, WRONG_KEY, guesser).status_code for _ in range(3)] == [401] * 3
    locked = sign_in(url, operator_key, guesser)
    assert locked.status_code == 429 and "Too many sign-in attempts" in locked.text
    # another client behind the same proxy signs in
    assert sign_in(url, operator_key, "198.51.100.20").status_code == 303
    # what the guesser writes itself before the proxy's entry does not change its bucket:
    # the client is the nearest untrusted address, the one the proxy appended
    for forged in ("192.0.2.50", "198.51.100.20", "127.0.0.1"):
        assert sign_in(url, operator_key, f"{forged}, {guesser}").status_code == 429
    log = e.stack.procs["api"].log_text()
    assert guesser in log and "console sign-in throttled" in log


def test_x_forwarded_for_from_an_untrusted_peer_is_ignored(no_trusted_proxy: E2E) -> None:
    e = no_trusted_proxy
    url, operator_key = e.stack.api_url, e.api.admin_key or ""
    # a guesser naming a new address each time is still one client: its TCP address
    answers = [sign_in(url, WRONG_KEY, f"203.0.113.{n}").status_code for n in range(1, 4)]
    assert answers == [401] * 3
    assert sign_in(url, operator_key, "198.51.100.99").status_code == 429
    assert sign_in(url, operator_key, None).status_code == 429
    assert "203.0.113." not in e.stack.procs["api"].log_text()
