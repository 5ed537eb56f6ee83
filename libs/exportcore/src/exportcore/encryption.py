"""Exports only the client can read: age encryption while the artifact streams, and the
signed envelope that binds the ciphertext to the export's manifest.

The format is age v1 (https://age-encryption.org/v1) with X25519 recipients (``age1…``,
public keys), through ``pyrage`` (the Python binding of the Rust ``age`` crate): the
worker never holds a key that can decrypt, and what the store keeps is the age file only.

- :class:`AgeSink` is the sink a renderer writes to: it hands the plaintext to
  ``pyrage.encrypt_io`` running in a thread of its own (pyrage reads, it cannot be pushed
  to) through a bounded queue, so an export of any size holds at most
  ``PIECE_BYTES * QUEUE_PIECES`` of plaintext in the queue, and writes the ciphertext to the
  artifact writer as age's STREAM produces it (64 KiB chunks).
- The *envelope* (:func:`envelope_header`) is what cannot be inside the ciphertext: its
  SHA-256 and size, the recipients, and the inner manifest's identity (``manifest_sha256``,
  ``entries_sha256``: the SHA-256 of each note's plaintext record, :mod:`exportcore.manifests`).
  It is signed with the deployment's manifest key under its own context
  (``ENVELOPE_CONTEXT``), stored in ``export_envelopes`` and served at
  ``GET /v1/exports/{id}/envelope``: ``exportctl verify`` checks a ciphertext against it
  without the key, and the plaintext against the inner manifest with it.
- An encrypted export never resumes from a checkpoint: it starts over (docs/architecture.md
  "Checkpoints", "Encrypted exports").
"""

from __future__ import annotations

import contextlib
import hashlib
import queue
import re
import threading
from collections.abc import Iterable, Sequence
from typing import Any, BinaryIO, Protocol

import pyrage
from pyrage import x25519

ENVELOPE_VERSION = 1
ENVELOPE_CONTEXT = b"notes-exports encrypted artifact v1\n"
"""Prefixed to the canonical envelope before signing: an envelope signature can never pass
for a manifest signature, nor the other way round."""
ENCRYPTION = "age-x25519"
"""The ``encryption`` of an envelope: age v1 files to X25519 recipients."""
EXTENSION = "age"
"""The artifact key extension of an encrypted export (``<tenant>/<job>/<token>.age``)."""
MAX_RECIPIENTS = 16
"""The most recipients of one export (the tenant's and the request's together)."""
RECIPIENT = re.compile(r"age1[02-9ac-hj-np-z]{58}")
"""The shape of an age X25519 recipient: Bech32, human-readable part ``age``, 32 bytes."""
AGE_MAGIC = b"age-encryption.org/v1\n"
"""The first line of every age v1 file."""
PIECE_BYTES = 1 << 16
"""A write is handed to the encrypting thread in pieces of at most this many bytes."""
QUEUE_PIECES = 16
"""Pieces waiting for the encrypting thread at most (with ``PIECE_BYTES``: 1 MiB)."""
_POLL_SECONDS = 0.5


class InvalidRecipient(ValueError):
    """A recipient that is not an age X25519 public key (``age1…``), or too many."""


class DecryptionFailed(Exception):
    """A ciphertext could not be decrypted: no identity matches a recipient, the file is
    truncated or altered, or it is not an age file. The message says which, in words."""


def parse_recipients(values: Iterable[str]) -> tuple[str, ...]:
    """The sorted unique recipients of ``values`` (each an ``age1…`` X25519 public key,
    surrounding spaces ignored). Raises InvalidRecipient naming the first bad one (its
    position and its first characters: recipients are public, but a pasted secret key
    must not be echoed whole) or when there are more than ``MAX_RECIPIENTS``."""
    out: set[str] = set()
    for i, raw in enumerate(values):
        value = str(raw).strip()
        shown = value[:12] + ("…" if len(value) > 12 else "")
        if value.upper().startswith("AGE-SECRET-KEY-"):
            raise InvalidRecipient(
                f"recipient {i + 1} is an age secret key (an identity): give its public "
                "key (age1…, as `age-keygen -y` prints it) and keep the secret key to yourself"
            )
        if not RECIPIENT.fullmatch(value):
            raise InvalidRecipient(
                f"recipient {i + 1} ({shown!r}) is not an age X25519 recipient: expected "
                "age1 followed by 58 lowercase Bech32 characters"
            )
        try:
            x25519.Recipient.from_str(value)
        except pyrage.RecipientError:
            raise InvalidRecipient(
                f"recipient {i + 1} ({shown!r}) is not a valid age X25519 recipient "
                "(its checksum or key does not decode)"
            ) from None
        out.add(value)
    if len(out) > MAX_RECIPIENTS:
        raise InvalidRecipient(
            f"{len(out)} recipients; an export may have at most {MAX_RECIPIENTS}"
        )
    return tuple(sorted(out))


def load_identities(text: str, where: str = "the identity file") -> list[Any]:
    """The X25519 identities (``AGE-SECRET-KEY-1…`` lines; ``#`` comments and blank lines
    skipped) of an age identity file, as ``age-keygen`` writes it. Raises ValueError saying
    what is wrong (never the key)."""
    identities: list[Any] = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            identities.append(x25519.Identity.from_str(line))
        except pyrage.IdentityError:
            raise ValueError(
                f"{where}, line {n}: not an age X25519 identity (AGE-SECRET-KEY-1…)"
            ) from None
    if not identities:
        raise ValueError(f"{where} holds no age identity (AGE-SECRET-KEY-1… lines)")
    return identities


class _Writer(Protocol):
    def write(self, data: bytes, /) -> int: ...


_EOF = memoryview(b"")


class _Aborted(Exception):
    pass


class AgeSink:
    """A renderer's sink (``write``, ``tell``, ``flush``) that encrypts to ``recipients``
    and writes the age file to ``out`` (an artifact writer) while the render streams.

    ``pyrage.encrypt_io`` runs in a thread and pulls the plaintext through :meth:`read`
    from a queue of at most ``QUEUE_PIECES`` pieces of ``PIECE_BYTES``; :meth:`write` blocks
    while the queue is full (constant memory whatever the export's size). An error of the
    thread (the artifact writer's storage error, a deadline) is raised by the next
    :meth:`write` or by :meth:`close`. Use :meth:`close` to finish the file (then ``out``
    holds all of it), or :meth:`abort` to stop; ``out`` is committed or aborted by the
    caller, after one of those.
    """

    def __init__(self, out: _Writer, recipients: Sequence[str]) -> None:
        if not recipients:
            raise InvalidRecipient("an encrypted export needs at least one recipient")
        self._recipients = [x25519.Recipient.from_str(r) for r in recipients]
        self._out = out
        self._queue: queue.Queue[memoryview | None] = queue.Queue(QUEUE_PIECES)
        self._buf = _EOF
        self._size = 0
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._finished = False
        self._thread = threading.Thread(target=self._run, name="age-encrypt", daemon=True)
        self._thread.start()

    # --- the renderer's side ---------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview, /) -> int:
        """Hand ``data`` (plaintext) to the encryption; returns its length in bytes."""
        if not isinstance(data, bytes):
            data = bytes(data)  # the caller may reuse its buffer
        view = memoryview(data)
        for start in range(0, len(view), PIECE_BYTES):
            self._put(view[start : start + PIECE_BYTES])
        self._size += len(view)
        return len(view)

    def tell(self) -> int:
        """Plaintext bytes written so far (zipfile streams by it)."""
        return self._size

    def flush(self) -> None:
        """No-op (zipfile flushes): the ciphertext is complete only after :meth:`close`."""

    def close(self) -> None:
        """End the plaintext: the thread writes the last STREAM chunk and returns. Raises
        the thread's error, if it had one."""
        self._put(None)
        self._thread.join()
        self._finished = True
        self._raise()

    def abort(self) -> None:
        """Stop the encryption, whatever it was doing (never raises)."""
        self._stop.set()
        while True:  # make room for the abort mark, which wakes a waiting read
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)
        self._thread.join(timeout=10)
        self._finished = True

    def _put(self, item: memoryview | None) -> None:
        if self._finished:
            raise ValueError("the encrypted sink is closed")
        while True:
            self._raise()
            try:
                self._queue.put(item, timeout=_POLL_SECONDS)
                return
            except queue.Full:
                if not self._thread.is_alive():
                    self._raise()
                    raise RuntimeError("the age encryption thread ended early") from None

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    # --- the encrypting thread's side ------------------------------------------------------

    def read(self, n: int = -1, /) -> bytes:
        """For pyrage: at most ``n`` plaintext bytes (``b""`` at the end)."""
        while not self._buf:
            item = self._queue.get()
            if self._stop.is_set():
                raise _Aborted("aborted")
            if item is None:
                return b""
            self._buf = item
        out = self._buf if n < 0 else self._buf[:n]
        self._buf = self._buf[len(out) :]
        return bytes(out)

    def _write_out(self, data: bytes) -> int:
        """For pyrage: append ciphertext to the artifact writer. Its error is kept as it is
        (pyrage would wrap it in an EncryptError of its own text): the caller classifies a
        storage error or a deadline by its type."""
        try:
            return self._out.write(data)
        except BaseException as exc:
            self._error = exc
            raise

    def _run(self) -> None:
        try:
            pyrage.encrypt_io(self, _Proxy(self._write_out), self._recipients)
        except BaseException as exc:
            if not self._stop.is_set() and self._error is None:
                self._error = exc
            self._stop.set()
            # unblock a writer waiting for room: nobody reads the queue any more
            while True:
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    break


class _Proxy:
    """A ``write``/``flush`` object for pyrage around a write function."""

    def __init__(self, write: Any) -> None:
        self.write = write

    def flush(self) -> None:
        """Nothing to flush: the artifact writer makes its bytes durable at commit."""


def decrypt(src: BinaryIO, dst: BinaryIO, identities: Sequence[Any]) -> None:
    """Decrypt the age file ``src`` into ``dst``, streaming (the STREAM construction
    authenticates every 64 KiB chunk and the end). Raises DecryptionFailed: no identity
    matches, a truncated or altered file, not an age file. ``dst`` may hold part of the
    plaintext then: write to a temporary file and keep it only when this returns."""
    head = src.read(len(AGE_MAGIC))
    if head != AGE_MAGIC:
        raise DecryptionFailed("not an age file (it does not start with age-encryption.org/v1)")
    src.seek(0)
    try:
        pyrage.decrypt_io(src, dst, list(identities))
    except pyrage.DecryptError as exc:
        text = str(exc).lower()
        if "no matching keys" in text or "no identity matched" in text:
            raise DecryptionFailed(
                "none of the given identities is a recipient of this file (wrong key?)"
            ) from None
        if "header" in text:
            raise DecryptionFailed(f"the age header is malformed ({exc})") from None
        raise DecryptionFailed(
            f"the ciphertext is truncated or was altered: it does not authenticate ({exc})"
        ) from None
    except OSError as exc:
        # pyrage reports a STREAM chunk that fails to authenticate (a truncated or altered
        # body) as an I/O error of the reader; a failing ``dst`` is an OSError of its own
        if "decrypt" not in str(exc).lower():
            raise
        raise DecryptionFailed(
            "the ciphertext is truncated or was altered: a chunk or its end does not authenticate"
        ) from None


def age_recipient_stanzas(src: BinaryIO) -> int:
    """The number of X25519 recipient stanzas of the age file ``src`` (read from its start:
    the header only). Raises DecryptionFailed when it is not an age v1 header."""
    if src.read(len(AGE_MAGIC)) != AGE_MAGIC:
        raise DecryptionFailed("not an age file (it does not start with age-encryption.org/v1)")
    count = 0
    for _ in range(4 * MAX_RECIPIENTS + 64):
        line = src.readline(4096)
        if not line.endswith(b"\n"):
            break
        if line.startswith(b"---"):
            return count
        count += line.startswith(b"-> X25519 ")
    raise DecryptionFailed("the age header is truncated or malformed")


def envelope_header(
    *,
    export_id: str,
    tenant: str,
    fmt: str,
    recipients: Sequence[str],
    ciphertext_sha256: str,
    ciphertext_size: int,
    manifest: dict[str, Any],
    manifest_sha256: str,
) -> dict[str, Any]:
    """The envelope of an encrypted artifact (signed as :mod:`exportcore.manifests` signs a
    manifest header, with ``ENVELOPE_CONTEXT``): the ciphertext's SHA-256 (hex) and size in
    bytes, the recipients (sorted), and the inner manifest's ``manifest_sha256``,
    ``entries_sha256`` (each note's plaintext hash, in order), counts and key id."""
    return {
        "envelope_version": ENVELOPE_VERSION,
        "export_id": export_id,
        "tenant": tenant,
        "format": fmt,
        "encryption": ENCRYPTION,
        "recipients": sorted(recipients),
        "ciphertext_sha256": ciphertext_sha256,
        "ciphertext_size": int(ciphertext_size),
        "manifest_sha256": manifest_sha256,
        "entries_sha256": manifest["entries_sha256"],
        "notes": manifest["notes"],
        "tombstones": manifest["tombstones"],
        "key_id": manifest["key_id"],
    }


def file_sha256(src: BinaryIO, chunk: int = 1 << 20) -> tuple[str, int]:
    """``(SHA-256 hex, size in bytes)`` of ``src`` read from where it stands to its end."""
    h = hashlib.sha256()
    size = 0
    while block := src.read(chunk):
        h.update(block)
        size += len(block)
    return h.hexdigest(), size
