"""Encrypted exports on the client's side: ``download --identity`` and ``verify`` of an
age file (docs/cli.md "Encrypted exports").

An encrypted export is an age file; what binds it to the export is its *envelope*
(``GET /v1/exports/{id}/envelope``, :mod:`exportcore.encryption`), signed with the
deployment's manifest key. ``exportctl download`` without ``--identity`` saves the age
file and the envelope beside it (``<file>.envelope.json``); ``verify`` checks the age file
against the envelope without any key (signature, SHA-256, size, recipient count) and,
given ``--identity``, decrypts it into a private temporary file and checks the contents
against the inner signed manifest and the envelope (each note's plaintext hash through
``entries_sha256``). The plaintext is written nowhere but that temporary file (mode 0600,
removed after) or, for ``download --identity``, the target once everything verified.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from exportcore import encryption, manifests
from exportctl.common import fail

ENVELOPE_SUFFIX = ".envelope.json"
"""The envelope's file beside a downloaded age file: ``<file>.envelope.json``."""


def is_age_file(path: Path) -> bool:
    """True when ``path`` starts like an age v1 file (raises OSError when unreadable)."""
    with open(path, "rb") as fh:
        return fh.read(len(encryption.AGE_MAGIC)) == encryption.AGE_MAGIC


def identities_from(path: Path) -> list[Any]:
    """The age identities of the file ``path`` (``age-keygen`` output); a CLI error (exit
    2) when it cannot be read or holds none, saying what to fix (never the key)."""
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise fail(f"cannot read --identity {path}: {exc}", 2) from None
    try:
        return encryption.load_identities(text, f"--identity {path}")
    except ValueError as exc:
        raise fail(f"{exc}; give the file age-keygen wrote", 2) from None


def load_envelope(path: Path) -> dict[str, Any]:
    """``{"envelope": {...}, "signature": {...} | None}`` read from ``path``; a CLI error
    (exit 2) when it is missing or malformed, saying where it comes from."""
    try:
        doc = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise fail(
            f"no envelope {path}: exportctl download saves it beside the age file; or pass "
            "--envelope FILE (GET /v1/exports/ID/envelope)",
            2,
        ) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise fail(f"cannot read the envelope {path}: {exc}", 2) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("envelope"), dict):
        raise fail(f"{path} is not an envelope ({{'envelope': ..., 'signature': ...}})", 2)
    return doc


def ciphertext_problems(
    path: Path, doc: dict[str, Any], keys: dict[str, Any], *, allow_unsigned: bool = False
) -> list[str]:
    """Every way the age file ``path`` does not match its envelope ``doc``, checked without
    any key: the envelope's signature (``keys``: ``{key_id: Ed25519 public key}``), the
    file's SHA-256 and size, its age header and the number of its recipient stanzas."""
    env: dict[str, Any] = doc["envelope"]
    out: list[str] = []
    signature = doc.get("signature")
    if signature is None:
        if not allow_unsigned:
            out.append("the envelope is not signed (--allow-unsigned to check the hashes only)")
    else:
        wrong = manifests.check_signature(env, signature, keys, encryption.ENVELOPE_CONTEXT)
        if wrong:
            out.append(f"envelope: {wrong}")
    with open(path, "rb") as fh:
        digest, size = encryption.file_sha256(fh)
        fh.seek(0)
        try:
            stanzas = encryption.age_recipient_stanzas(fh)
        except encryption.DecryptionFailed as exc:
            out.append(str(exc))
            stanzas = None
    if size != env.get("ciphertext_size"):
        out.append(
            f"the file has {size} bytes, the envelope says {env.get('ciphertext_size')} "
            "(truncated or extended)"
        )
    if digest != env.get("ciphertext_sha256"):
        out.append(
            f"the file's SHA-256 is {digest}, the envelope's {env.get('ciphertext_sha256')} "
            "(the ciphertext was changed)"
        )
    recipients = env.get("recipients") or []
    if stanzas is not None and stanzas != len(recipients):
        out.append(
            f"the age header has {stanzas} X25519 recipients, the envelope names {len(recipients)}"
        )
    return out


@contextmanager
def decrypted(path: Path, identities: list[Any]) -> Iterator[Path]:
    """The plaintext of the age file ``path`` in a private temporary file (mode 0600, in
    ``TMPDIR``), removed when the block ends. Raises a CLI error (exit 1) saying why it
    cannot be decrypted: a wrong identity, a truncated or altered file."""
    fd, name = tempfile.mkstemp(prefix="exportctl-plain-", suffix=".part")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as dst, open(path, "rb") as src:
            try:
                encryption.decrypt(src, dst, identities)
            except encryption.DecryptionFailed as exc:
                raise fail(f"{path} cannot be decrypted: {exc}", 1) from None
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)


def envelope_binds(env: dict[str, Any], manifest: dict[str, Any]) -> list[str]:
    """What in the inner manifest (signed, read from the plaintext) disagrees with the
    envelope: the export, the manifest's identity and its ``entries_sha256``."""
    out = []
    if manifest.get("export_id") != env.get("export_id"):
        out.append(
            f"the envelope is of export {env.get('export_id')}, the contents of "
            f"{manifest.get('export_id')}"
        )
    if manifests.manifest_sha256(manifest) != env.get("manifest_sha256"):
        out.append("the contents' manifest is not the one the envelope names (manifest_sha256)")
    if manifest.get("entries_sha256") != env.get("entries_sha256"):
        out.append("the contents' entries_sha256 is not the envelope's")
    return out
