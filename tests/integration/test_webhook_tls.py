"""https delivery to a real TLS receiver on loopback: the sender connects to the address it
resolved and checked, while the TLS server name (SNI), the certificate check and the Host
header keep the endpoint's own name."""

from __future__ import annotations

import datetime as dt
import http.server
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from devtools.webhook_receiver import spec_signature_valid
from exportcore.settings import Settings
from exportcore.webhooks.sender import Delivery, Sender
from exportcore.webhooks.signing import new_secret

NAME = "hooks.example.test"


def _cert(
    subject: str, issuer_key: Any, issuer: x509.Name | None, ca: bool
) -> tuple[Any, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(subject)]), critical=False
        )
    return key, builder.sign(issuer_key or key, hashes.SHA256())


@pytest.fixture
def tls(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A CA, and a TLS server on 127.0.0.1 presenting a certificate for NAME signed by it."""
    ca_key, ca = _cert("test CA", None, None, ca=True)
    key, cert = _cert(NAME, ca_key, ca.subject, ca=False)
    (tmp_path / "server.pem").write_bytes(
        cert.public_bytes(serialization.Encoding.PEM)
        + key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    seen: dict[str, Any] = {"sni": [], "requests": []}
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(tmp_path / "server.pem")
    server_ctx.sni_callback = lambda sock, name, ctx: seen["sni"].append(name)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            seen["requests"].append(({k.lower(): v for k, v in self.headers.items()}, body))
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = server_ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client_ctx = ssl.create_default_context(
        cadata=ca.public_bytes(serialization.Encoding.PEM).decode()
    )
    yield {"port": server.server_address[1], "seen": seen, "client_ctx": client_ctx}
    server.shutdown()
    server.server_close()


def _delivery(url: str, secret: str) -> Delivery:
    mid = uuid4()
    return Delivery(
        message_id=mid,
        webhook_id=f"msg_{mid.hex}",
        endpoint_id=uuid4(),
        url=url,
        body='{"type":"webhook.test"}',
        signing_secrets=(secret,),
        attempt=1,
        budget_used=1,
        redelivery=False,
        claim_token=uuid4(),
        event_type="webhook.test",
        created_at=dt.datetime.now(dt.UTC),
    )


def _resolver(host: str, port: int, **kw: Any) -> list[Any]:
    assert host in (NAME, "other.example.test")
    return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]


def test_https_keeps_the_name_for_sni_certificate_and_host(tls: dict[str, Any]) -> None:
    settings = Settings(webhook_allow_private_networks=True)
    sender = Sender(settings, resolver=_resolver, ssl_context=tls["client_ctx"])
    secret = new_secret()
    try:
        result = sender.send(_delivery(f"https://{NAME}:{tls['port']}/in", secret))
    finally:
        sender.close()
    assert result.outcome == "delivered", result.error
    assert result.address == "127.0.0.1"
    assert tls["seen"]["sni"] == [NAME]
    [(headers, body)] = tls["seen"]["requests"]
    assert headers["host"] == f"{NAME}:{tls['port']}"
    assert spec_signature_valid(
        secret,
        headers["webhook-id"],
        headers["webhook-timestamp"],
        body,
        headers["webhook-signature"],
    )


def test_a_certificate_for_another_name_is_refused(tls: dict[str, Any]) -> None:
    settings = Settings(webhook_allow_private_networks=True)
    sender = Sender(settings, resolver=_resolver, ssl_context=tls["client_ctx"])
    try:
        result = sender.send(_delivery(f"https://other.example.test:{tls['port']}/", new_secret()))
    finally:
        sender.close()
    assert result.outcome == "connection_error"
    assert "CERTIFICATE_VERIFY_FAILED" in (result.error or "")
    assert tls["seen"]["requests"] == []
