"""``ARTIFACT_URL`` parsing: where the artifact store lives (no I/O, no client library).

- ``file:///var/lib/notes-exports/artifacts`` (or ``file://localhost/...``, or a relative
  ``file:artifacts``): a folder on this machine.
- ``s3://bucket`` or ``s3://bucket/some/prefix``: objects under ``prefix/`` in ``bucket``.

Nothing else is accepted: no credentials, port, query or fragment in the URL (credentials
come from their own settings or the default AWS chain, so a URL is always safe to log).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlsplit

_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_PREFIX_SEGMENT = re.compile(r"[A-Za-z0-9._-]{1,200}")
_BUCKET_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_BUCKET_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", "--x-s3", ".mrap")


@dataclass(frozen=True)
class ArtifactLocation:
    """A parsed artifact store location: a folder (``path``) or a bucket and key prefix."""

    scheme: Literal["file", "s3"]
    path: Path | None = None
    bucket: str = ""
    prefix: str = ""

    def __str__(self) -> str:
        if self.scheme == "file":
            return f"file://{self.path}"
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


def validate_bucket(name: str) -> str:
    """Return ``name`` if it is a valid S3 bucket name (the rules shared by AWS S3 general
    purpose buckets and MinIO), else raise ValueError."""
    if not _BUCKET.fullmatch(name):
        raise ValueError(
            f"invalid S3 bucket name {name!r}: 3-63 lower-case letters, digits, dots and "
            "hyphens, starting and ending with a letter or digit"
        )
    if ".." in name or ".-" in name or "-." in name:
        raise ValueError(f"invalid S3 bucket name {name!r}: adjacent dots or dot-hyphen")
    try:
        ipaddress.IPv4Address(name)
    except ValueError:
        pass
    else:
        raise ValueError(f"invalid S3 bucket name {name!r}: formatted as an IP address")
    if name.startswith(_BUCKET_RESERVED_PREFIXES) or name.endswith(_BUCKET_RESERVED_SUFFIXES):
        raise ValueError(f"invalid S3 bucket name {name!r}: reserved prefix or suffix")
    return name


def normalise_prefix(prefix: str) -> str:
    """``prefix`` without leading/trailing slashes; each segment limited to letters, digits,
    ``.``, ``_`` and ``-`` (never ``.`` or ``..``); raises ValueError otherwise."""
    stripped = prefix.strip("/")
    if not stripped:
        return ""
    segments = stripped.split("/")
    for segment in segments:
        if not _PREFIX_SEGMENT.fullmatch(segment) or segment in (".", ".."):
            raise ValueError(
                f"invalid key prefix {prefix!r}: segments of letters, digits, '.', '_' and "
                "'-' separated by single slashes"
            )
    if len(stripped) > 512:
        raise ValueError("the key prefix is longer than 512 characters")
    return stripped


def parse_artifact_url(url: str) -> ArtifactLocation:
    """Parse ``ARTIFACT_URL``; raises ValueError naming what is wrong."""
    text = url.strip()
    if "\\" in text or any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise ValueError("the artifact URL contains a backslash or a control character")
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme not in ("file", "s3"):
        raise ValueError(
            f"unsupported artifact URL scheme {parts.scheme!r}: use file:///path or "
            "s3://bucket/prefix"
        )
    if parts.query or parts.fragment or "?" in text or "#" in text:
        raise ValueError("the artifact URL must not have a query or a fragment")
    if "@" in parts.netloc:
        raise ValueError(
            "the artifact URL must not carry credentials: set S3_ACCESS_KEY_ID and "
            "S3_SECRET_ACCESS_KEY (or use the default AWS credential chain)"
        )
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"a file URL names no remote host (got {parts.netloc!r})")
        raw = unquote(parts.path)
        if not raw or "\x00" in raw:
            raise ValueError("the file artifact URL has no path")
        return ArtifactLocation("file", path=Path(raw))
    if ":" in parts.netloc:
        raise ValueError("an s3 URL names a bucket, not a host and port: set S3_ENDPOINT_URL")
    bucket = validate_bucket(parts.netloc)
    return ArtifactLocation("s3", bucket=bucket, prefix=normalise_prefix(parts.path))
