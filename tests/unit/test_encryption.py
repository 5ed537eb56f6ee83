"""Age encryption of exports (exportcore.encryption), its pure parts: recipients, the
streaming sink (round trip, constant memory, errors of the artifact writer, abort),
decryption errors, the age header's recipients, the envelope's signature context, and
the request's recipients in the idempotency hash."""

from __future__ import annotations

import io
import threading
import tracemalloc
from datetime import UTC, datetime
from typing import Any

import pytest
from pyrage import x25519

from exportcore import encryption, manifests
from exportcore.domain import ExportFormat, ExportRequest, InvalidRecipients
from exportcore.encryption import (
    AgeSink,
    DecryptionFailed,
    InvalidRecipient,
    age_recipient_stanzas,
    decrypt,
    load_identities,
    parse_recipients,
)
from exportcore.render import ExportHeader, NoteRecord, make_renderer
from exportctl.verify import read_artifact

MiB = 1 << 20


def keypair() -> tuple[Any, str]:
    identity = x25519.Identity.generate()
    return identity, str(identity.to_public())


def sealed(data: bytes, *recipients: str) -> bytes:
    out = io.BytesIO()
    sink = AgeSink(out, list(recipients))
    sink.write(data)
    sink.close()
    return out.getvalue()


# --- recipients ---------------------------------------------------------------------------


def test_recipients_are_checked_sorted_and_unique() -> None:
    _, a = keypair()
    _, b = keypair()
    assert parse_recipients([b, f" {a} ", b]) == tuple(sorted([a, b]))


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("age1short", "not an age X25519 recipient"),
        ("AGE1" + "q" * 58, "not an age X25519 recipient"),  # uppercase is not Bech32 here
        ("ssh-ed25519 AAAA", "not an age X25519 recipient"),
    ],
)
def test_a_recipient_of_another_shape_is_refused_by_position(value: str, words: str) -> None:
    _, good = keypair()
    with pytest.raises(InvalidRecipient, match=words) as info:
        parse_recipients([good, value])
    assert "recipient 2" in str(info.value)


def test_a_recipient_whose_checksum_fails_is_refused() -> None:
    _, good = keypair()
    last = "q" if good[-1] != "q" else "p"
    with pytest.raises(InvalidRecipient, match="checksum or key"):
        parse_recipients([good[:-1] + last])


def test_a_secret_key_given_as_a_recipient_is_refused_without_echoing_it() -> None:
    identity, _ = keypair()
    secret = str(identity)
    with pytest.raises(InvalidRecipient) as info:
        parse_recipients([secret])
    assert "secret key" in str(info.value) and secret not in str(info.value)
    assert secret[15:] not in str(info.value)


def test_at_most_sixteen_recipients() -> None:
    keys = [keypair()[1] for _ in range(encryption.MAX_RECIPIENTS + 1)]
    assert len(parse_recipients(keys[:-1])) == encryption.MAX_RECIPIENTS
    with pytest.raises(InvalidRecipient, match="at most 16"):
        parse_recipients(keys)


def test_identity_files_as_age_keygen_writes_them() -> None:
    identity, public = keypair()
    text = f"# created: now\n# public key: {public}\n\n{identity}\n"
    [loaded] = load_identities(text)
    assert str(loaded.to_public()) == public
    with pytest.raises(ValueError, match="line 2") as info:
        load_identities("# c\nAGE-SECRET-KEY-1BROKENKEYMATERIAL\n")
    assert "BROKENKEYMATERIAL" not in str(info.value)
    with pytest.raises(ValueError, match="holds no age identity"):
        load_identities("# only a comment\n")


# --- the streaming sink --------------------------------------------------------------------


def test_the_sink_round_trips_pieces_of_every_size_to_each_recipient() -> None:
    alice, a = keypair()
    bob, b = keypair()
    out = io.BytesIO()
    sink = AgeSink(out, [a, b])
    parts = [b"", b"x", bytes(range(256)) * 300, bytearray(b"y" * (3 * MiB + 17)), b"end"]
    for part in parts:
        assert sink.write(part) == len(part)
    assert sink.tell() == sum(len(p) for p in parts)
    sink.close()
    data = out.getvalue()
    assert data.startswith(encryption.AGE_MAGIC)
    assert age_recipient_stanzas(io.BytesIO(data)) == 2
    for identity in (alice, bob):
        plain = io.BytesIO()
        decrypt(io.BytesIO(data), plain, [identity])
        assert plain.getvalue() == b"".join(parts)


def test_the_sink_holds_constant_memory_whatever_the_size() -> None:
    """64 MiB written in 1 MiB pieces to a writer that only counts: Python's peak
    allocation while streaming stays a few MiB (the queue of 16 x 64 KiB pieces, one
    piece being written), nowhere near the export's size."""
    _, a = keypair()

    class Counting:
        size = 0

        def write(self, data: bytes) -> int:
            self.size += len(data)
            return len(data)

    out = Counting()
    piece = b"z" * MiB
    tracemalloc.start()
    try:
        sink = AgeSink(out, [a])
        tracemalloc.reset_peak()
        for _ in range(64):
            sink.write(piece)
        sink.close()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out.size > 64 * MiB  # the ciphertext: the plaintext, tags and header
    assert peak < 8 * MiB, f"peak {peak / MiB:.1f} MiB while encrypting 64 MiB"


class Failing:
    """An artifact writer whose storage fails after ``after`` writes."""

    def __init__(self, after: int, error: Exception) -> None:
        self.after, self.error, self.calls = after, error, 0

    def write(self, data: bytes) -> int:
        self.calls += 1
        if self.calls > self.after:
            raise self.error
        return len(data)


def test_an_error_of_the_artifact_writer_comes_back_as_itself() -> None:
    """A storage error (or a deadline) of the writer is raised by the renderer's next write
    or by close, with its own type: the runner classifies it as it would unencrypted."""
    _, a = keypair()

    class StorageDown(OSError):
        pass

    sink = AgeSink(Failing(2, StorageDown("the bucket is gone")), [a])
    with pytest.raises(StorageDown, match="the bucket is gone"):
        for _ in range(200):
            sink.write(b"q" * (256 * 1024))
        sink.close()


def test_abort_stops_the_thread_and_unblocks_a_writer_waiting_on_a_full_queue() -> None:
    """The artifact writer is slow (its write waits), the renderer fills the queue and
    waits for room; an abort (a lost lease) ends both: the thread once its write
    returns, the renderer's write with an error, and the sink takes no more."""
    _, a = keypair()
    gate = threading.Event()

    class Slow:
        def write(self, data: bytes) -> int:
            gate.wait(10)
            return len(data)

    sink = AgeSink(Slow(), [a])
    ended: list[BaseException | None] = []

    def fill() -> None:
        try:
            for _ in range(4 * encryption.QUEUE_PIECES):
                sink.write(b"w" * encryption.PIECE_BYTES)
            ended.append(None)
        except Exception as exc:
            ended.append(exc)

    filler = threading.Thread(target=fill, daemon=True)
    filler.start()
    threading.Timer(0.3, gate.set).start()
    sink.abort()
    filler.join(10)
    assert not sink._thread.is_alive() and not filler.is_alive()
    assert ended and ended[0] is not None  # the waiting write did not pretend to succeed
    with pytest.raises(ValueError, match="closed"):
        sink.write(b"more")


# --- decryption errors -----------------------------------------------------------------------


def test_a_wrong_identity_a_truncated_file_and_not_an_age_file_say_which() -> None:
    alice, a = keypair()
    other, _ = keypair()
    data = sealed(b"n" * 200_000, a)
    cases = {
        "none of the given identities": (data, other),
        "truncated or was altered": (data[:-30], alice),
        "not an age file": (b'{"export":1}', alice),
        "header is malformed": (data[:40], alice),
    }
    for words, (src, identity) in cases.items():
        with pytest.raises(DecryptionFailed, match=words):
            decrypt(io.BytesIO(src), io.BytesIO(), [identity])
    altered = bytearray(data)
    altered[len(data) // 2] ^= 1
    with pytest.raises(DecryptionFailed, match="truncated or was altered"):
        decrypt(io.BytesIO(bytes(altered)), io.BytesIO(), [alice])


# --- the envelope ----------------------------------------------------------------------------


def test_an_envelope_signature_is_not_a_manifest_signature() -> None:
    private, _ = manifests.new_private_key_text()
    signer = manifests.Signer.from_texts(private)
    assert signer is not None
    manifest = {"entries_sha256": "e" * 64, "notes": 2, "tombstones": 0, "key_id": signer.key_id}
    env = encryption.envelope_header(
        export_id="x",
        tenant="t",
        fmt="json",
        recipients=["b", "a"],
        ciphertext_sha256="c" * 64,
        ciphertext_size=10,
        manifest=manifest,
        manifest_sha256="m" * 64,
    )
    assert env["recipients"] == ["a", "b"] and env["key_id"] == signer.key_id
    keys = {signer.key_id: signer.private.public_key()}
    sig = signer.sign(env, encryption.ENVELOPE_CONTEXT)
    assert manifests.check_signature(env, sig, keys, encryption.ENVELOPE_CONTEXT) is None
    assert manifests.check_signature(env, sig, keys) is not None  # not as a manifest
    tampered = {**env, "ciphertext_size": 11}
    assert manifests.check_signature(tampered, sig, keys, encryption.ENVELOPE_CONTEXT)


def test_a_render_through_the_sink_decrypts_to_the_same_bytes_as_a_plain_one() -> None:
    """The renderer writes the same plaintext whether or not it is sealed; the decrypted
    file reads as an export with one entry per note."""
    identity, a = keypair()
    header = ExportHeader("id-1", "t", datetime(2026, 1, 1, tzinfo=UTC), "json", 2)
    notes = [
        NoteRecord(i, f"title {i}", f"secret text {i}", False, datetime(2026, 1, 1, tzinfo=UTC))
        for i in (1, 2)
    ]
    plain = io.BytesIO()
    out = io.BytesIO()
    sink = AgeSink(out, [a])
    for dst in (plain, sink):
        r = make_renderer(ExportFormat.JSON, dst)
        r.begin(header)
        r.add(notes)
        r.end()
    sink.close()
    assert b"secret text" not in out.getvalue()
    back = io.BytesIO()
    decrypt(io.BytesIO(out.getvalue()), back, [identity])
    assert back.getvalue() == plain.getvalue()
    assert [i.id for i in read_artifact(back.getvalue()).items] == [1, 2]


# --- the request -----------------------------------------------------------------------------


def test_recipients_are_part_of_the_request_and_of_its_hash() -> None:
    _, a = keypair()
    _, b = keypair()
    plain = ExportRequest.build(ExportFormat.JSON, None, True)
    one = ExportRequest.build(ExportFormat.JSON, None, True, recipients=[a])
    two = ExportRequest.build(ExportFormat.JSON, None, True, recipients=[b, a])
    same = ExportRequest.build(ExportFormat.JSON, None, True, recipients=[a, b, a])
    assert "recipients" not in plain.canonical()
    assert two.canonical()["recipients"] == sorted([a, b])
    assert len({plain.request_hash(), one.request_hash(), two.request_hash()}) == 3
    assert two.request_hash() == same.request_hash()
    with pytest.raises(InvalidRecipients, match="recipient 1"):
        ExportRequest.build(ExportFormat.JSON, [1], False, recipients=["age1x"])
    with pytest.raises(InvalidRecipients, match="empty"):
        ExportRequest.build(ExportFormat.JSON, [1], False, recipients=[])


def test_a_replay_keeps_the_recipients_of_the_export_it_replays() -> None:
    """A replay (as it was, or with a corrected format or selection) is encrypted to the
    same recipients as the failed export: never less encrypted than the original."""
    from exportcore.replays import Correction, original_request

    _, a = keypair()
    payload = ExportRequest.build(ExportFormat.JSON, [3, 1], False, recipients=[a]).canonical()
    assert original_request(payload).recipients == (a,)
    corrected = Correction(format=ExportFormat.NDJSON, select_all=True).request(payload)
    assert corrected.recipients == (a,) and corrected.note_ids is None
    plain = ExportRequest.build(ExportFormat.JSON, [1], False).canonical()
    assert original_request(plain).recipients == ()
