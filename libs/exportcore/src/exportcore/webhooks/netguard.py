"""Where a webhook may be sent: URL rules and the address policy against server-side request
forgery (SSRF).

A webhook URL is chosen by a client, and the sender runs inside the service's network, so a
URL that points at the service's own side (the loopback interface, the pod network, a cloud
metadata endpoint) would let a client make the service call it. The Standard Webhooks
specification ("Server side request forgery") asks senders to refuse such destinations.
Two checks, both here:

- :func:`validate_url` when an endpoint is registered or changed: ``https`` only (``http``
  only with ``WEBHOOK_ALLOW_HTTP``), no credentials or fragment, and no IP literal in a
  refused range;
- :func:`resolve_target` at every attempt: the host name is resolved once, every address it
  resolves to is checked, and the caller connects to the checked address itself (so a DNS
  answer that changes between check and connect, "DNS rebinding", cannot redirect it).

Refused unless ``WEBHOOK_ALLOW_PRIVATE_NETWORKS``: every address that is not globally
reachable. The ranges are written out once, in :data:`REFUSED_NETWORKS` (the IANA
special-purpose address registries, RFC 6890, with "globally reachable: false", plus
multicast and the reserved 240.0.0.0/4; for IPv6 everything outside the global unicast
space 2000::/3, RFC 4291, and the special-purpose blocks inside it): loopback, RFC 1918
private, link-local with the 169.254.169.254 and fd00:ec2::254 metadata endpoints, shared
address space 100.64.0.0/10 (CGNAT, RFC 6598, which also holds Alibaba's 100.100.100.200
metadata), "this network" 0.0.0.0/8, IETF protocol assignments, documentation and
benchmarking ranges, unique local fc00::/7, ... IPv6 forms that embed an IPv4 address
(IPv4-mapped ``::ffff:a.b.c.d``, RFC 4291; NAT64 ``64:ff9b::/96``, RFC 6052; 6to4
``2002::/16``, RFC 3056) are judged by the IPv4 address inside. Python's own
``ipaddress.is_global`` stays a second line for anything its registry adds later.

The chart's NetworkPolicy for webhook-delivery lists the same ranges in its egress
``except`` lists (``networkPolicy.egress.webhooks``); ``tests/chart/test_policy.py`` fails
while the two differ. An ipBlock cannot look inside an address, so the chart refuses the
embedding ranges whole: the network allows no more than this module does.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from exportcore.domain import ExportError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[..., Sequence[tuple[Any, ...]]]

MAX_URL_LENGTH = 2048
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
# RFC 1918 and unique local addresses (RFC 4193): the ranges networks are built from
_PRIVATE = tuple(
    ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")
)
_6TO4 = ipaddress.ip_network("2002::/16")
_METADATA = {
    ipaddress.ip_address("169.254.169.254"): "a cloud metadata endpoint",
    ipaddress.ip_address("fd00:ec2::254"): "a cloud metadata endpoint",
    ipaddress.ip_address("100.100.100.200"): "a cloud metadata endpoint",
}
GLOBAL_UNICAST_V6 = ipaddress.ip_network("2000::/3")
"""The IPv6 global unicast space (RFC 4291 section 2.4; IANA IPv6 address space): every other
IPv6 address is loopback, link-local, unique local, multicast, an embedded IPv4 form or
reserved by the IETF."""


@dataclass(frozen=True)
class RefusedNetwork:
    """A range webhooks are never sent to: ``why`` (a phrase for the error), and whether
    ``embeds_ipv4`` (then an address in it is judged by the IPv4 address inside)."""

    network: ipaddress.IPv4Network | ipaddress.IPv6Network
    why: str
    embeds_ipv4: bool = False


def _refused(cidr: str, why: str, embeds_ipv4: bool = False) -> RefusedNetwork:
    return RefusedNetwork(ipaddress.ip_network(cidr), why, embeds_ipv4)


REFUSED_NETWORKS: tuple[RefusedNetwork, ...] = (
    _refused("0.0.0.0/8", "a reserved address (this network, RFC 791)"),
    _refused("10.0.0.0/8", "a private address"),
    _refused("100.64.0.0/10", "a shared (CGNAT) address"),
    _refused("127.0.0.0/8", "a loopback address"),
    _refused("169.254.0.0/16", "a link-local address"),
    _refused("172.16.0.0/12", "a private address"),
    _refused("192.0.0.0/24", "a reserved address (IETF protocol assignments, RFC 6890)"),
    _refused("192.0.2.0/24", "a reserved address (documentation, RFC 5737)"),
    _refused("192.168.0.0/16", "a private address"),
    _refused("198.18.0.0/15", "a reserved address (benchmarking, RFC 2544)"),
    _refused("198.51.100.0/24", "a reserved address (documentation, RFC 5737)"),
    _refused("203.0.113.0/24", "a reserved address (documentation, RFC 5737)"),
    _refused("224.0.0.0/4", "a multicast address"),
    _refused("240.0.0.0/4", "a reserved address (RFC 1112; with the broadcast address)"),
    # IPv6: outside the global unicast space (loopback ::1, unique local fc00::/7,
    # link-local fe80::/10, multicast ff00::/8 and the IETF's reserved blocks are there) ...
    _refused("::/3", "a reserved (not global unicast) address"),
    _refused("::ffff:0:0/96", "an IPv4-mapped address", embeds_ipv4=True),
    _refused("64:ff9b::/96", "a NAT64 address", embeds_ipv4=True),
    _refused("4000::/2", "a reserved (not global unicast) address"),
    _refused("8000::/1", "a reserved (not global unicast) address"),
    # ... and the special-purpose blocks inside it
    _refused("2001::/23", "a reserved address (IETF protocol assignments, RFC 2928)"),
    _refused("2001:db8::/32", "a reserved address (documentation, RFC 3849)"),
    _refused("2002::/16", "a 6to4 address", embeds_ipv4=True),
    _refused("3fff::/20", "a reserved address (documentation, RFC 9637)"),
)
"""Every range this module refuses, written out once (the chart's NetworkPolicy lists the
same ranges). Embedding ranges lie inside broader ones (``::/3``): an address in one is
judged by its IPv4 address, never by the broader range."""


class InvalidWebhookUrl(ExportError):
    """A webhook URL that may not be used (scheme, form, or a refused address)."""

    code = "invalid_webhook_url"
    title = "Invalid webhook URL"
    kind = "invalid"


class RefusedAddress(Exception):
    """Delivery refused: the host resolves to an address in a refused range (or not at all).

    ``str(exc)`` says why (the address only when the URL holds an IP literal: the text is
    shown to the tenant); ``args[1]``, when present, is the refused address, for the
    operators' log. It never contains the URL's path or query.
    """


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.sixtofour is not None:
        return ip.sixtofour
    return None


def address_refusal(ip: IPAddress) -> str | None:
    """Why a delivery to ``ip`` is refused (a phrase such as ``"a loopback address"``), or
    None when it is a globally reachable unicast address. Pure: the specific kinds first
    (metadata, loopback, link-local, multicast, unspecified, CGNAT, private), then
    :data:`REFUSED_NETWORKS`, then Python's ``ipaddress`` registry (RFC 6890) as a second
    line; see the module docstring for the ranges and their sources."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = _embedded_ipv4(ip)
        if inner is not None:
            why = address_refusal(inner)
            return None if why is None else f"{why} (embedded in the IPv6 address {ip})"
    if ip in _METADATA:
        return _METADATA[ip]
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_unspecified:
        return "the unspecified address"
    if isinstance(ip, ipaddress.IPv4Address) and ip in _CGNAT:
        return "a shared (CGNAT) address"
    if any(ip.version == net.version and ip in net for net in _PRIVATE):
        return "a private address"
    for refused in REFUSED_NETWORKS:
        if ip.version == refused.network.version and ip in refused.network:
            return refused.why
    if ip.is_private or not ip.is_global or ip.is_reserved:
        return "a reserved (not globally reachable) address"
    return None


@dataclass(frozen=True)
class WebhookUrl:
    """A parsed, validated endpoint URL: scheme, host (no brackets), port, path with query."""

    url: str
    scheme: str
    host: str
    port: int
    target: str  # path and query, as sent in the request line

    @property
    def host_header(self) -> str:
        """The ``Host`` header (RFC 9110 section 7.2): the host, with the port when not the
        scheme's default, IPv6 literals in brackets."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


def parse_url(url: str) -> WebhookUrl:
    """Parse ``url`` into its parts; raises InvalidWebhookUrl when it is not an absolute
    http(s) URL with a host, or carries credentials or a fragment. Schemes are not judged
    here (see :func:`validate_url`)."""
    if len(url) > MAX_URL_LENGTH:
        raise InvalidWebhookUrl(f"the URL is longer than {MAX_URL_LENGTH} characters")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise InvalidWebhookUrl("the URL contains spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidWebhookUrl(f"the URL cannot be parsed ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise InvalidWebhookUrl("the URL must start with https://")
    if not parts.hostname:
        raise InvalidWebhookUrl("the URL has no host name")
    if parts.username is not None or parts.password is not None:
        raise InvalidWebhookUrl(
            "the URL must not carry credentials (user:password@); authenticate the sender "
            "by its signature instead"
        )
    if parts.fragment or url.endswith("#"):
        raise InvalidWebhookUrl("the URL must not have a #fragment")
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    return WebhookUrl(
        url=url,
        scheme=scheme,
        host=parts.hostname.lower().rstrip("."),
        port=port or (443 if scheme == "https" else 80),
        target=target,
    )


def literal_address(host: str) -> IPAddress | None:
    """The IP address when ``host`` is an IP literal, else None (a name to resolve)."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def validate_url(url: str, *, allow_http: bool, allow_private: bool) -> WebhookUrl:
    """Check an endpoint URL at registration; returns it parsed.

    Raises InvalidWebhookUrl: not https (unless ``allow_http``), malformed, credentials, a
    fragment, or an IP literal in a refused range (unless ``allow_private``). Host names are
    checked when they are resolved, at every attempt (:func:`resolve_target`)."""
    parsed = parse_url(url)
    if parsed.scheme == "http" and not allow_http:
        raise InvalidWebhookUrl(
            "only https:// URLs are accepted (plain http needs WEBHOOK_ALLOW_HTTP=true)"
        )
    ip = literal_address(parsed.host)
    if ip is not None and not allow_private:
        why = address_refusal(ip)
        if why is not None:
            raise InvalidWebhookUrl(
                f"{ip} is {why}; webhooks are only sent to public addresses "
                "(WEBHOOK_ALLOW_PRIVATE_NETWORKS=true allows others)"
            )
    return parsed


def resolve_target(
    parsed: WebhookUrl,
    *,
    allow_private: bool,
    resolver: Resolver = socket.getaddrinfo,
) -> IPAddress:
    """Resolve the URL's host once and return the address to connect to.

    Every address of the answer is checked (an answer that mixes a public and a private
    address is refused as a whole); the first one is returned. Raises RefusedAddress when
    the name does not resolve or an address is refused (unless ``allow_private``)."""
    ip = literal_address(parsed.host)
    if ip is not None:
        addresses: list[IPAddress] = [ip]
    else:
        try:
            infos = resolver(parsed.host, parsed.port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise RefusedAddress(f"{parsed.host} does not resolve ({exc})") from None
        addresses = []
        for info in infos:
            candidate = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
            if candidate not in addresses:
                addresses.append(candidate)
        if not addresses:
            raise RefusedAddress(f"{parsed.host} resolves to no address")
    if not allow_private:
        for candidate in addresses:
            why = address_refusal(candidate)
            if why is not None:
                # The resolved address itself is not named when the URL held a name: the
                # error is shown to the tenant, who must not learn internal addresses.
                shown = f"{candidate}, " if ip is not None else ""
                raise RefusedAddress(
                    f"{parsed.host} resolves to {shown}{why}; refused "
                    "(WEBHOOK_ALLOW_PRIVATE_NETWORKS=true allows it)",
                    candidate,
                )
    return addresses[0]
