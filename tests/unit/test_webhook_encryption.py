"""The keys that encrypt webhook signing secrets at rest (``WEBHOOK_SECRET_KEYS``,
:mod:`exportcore.webhooks.encryption`): parsing with errors that never echo a key,
encryption with the first key, decryption with any, re-encryption."""

from __future__ import annotations

import base64

import pytest
from cryptography.fernet import Fernet
from pydantic import ValidationError

from exportcore.settings import Settings
from exportcore.webhooks.encryption import (
    SecretBox,
    SecretKeysMissing,
    SecretUndecryptable,
    key_id,
    new_key,
    require,
)
from exportcore.webhooks.signing import new_secret

# fixed keys (parametrised test ids must be the same in every xdist worker)
A, B = (base64.urlsafe_b64encode(c * 32).decode() for c in (b"a", b"b"))


def box(text: str) -> SecretBox:
    b = SecretBox.from_text(text)
    assert b is not None
    return b


def test_the_first_key_encrypts_and_every_key_decrypts() -> None:
    secret = new_secret()
    old = box(A).seal(secret)
    assert old.key_id == key_id(A.encode()) and old.ciphertext.startswith("gAAAAA")
    assert secret not in old.ciphertext
    assert box(A).seal(secret).ciphertext != old.ciphertext  # a fresh IV each time
    both = box(f"{B}, {A}")
    assert both.current_key_id == key_id(B.encode())
    assert both.key_ids == (key_id(B.encode()), key_id(A.encode()))
    assert both.open(old.ciphertext) == secret
    moved = both.reseal(old.ciphertext, old.key_id)
    assert moved.key_id == both.current_key_id and box(B).open(moved.ciphertext) == secret
    assert both.reseal(moved.ciphertext, moved.key_id) == moved  # already current: unchanged


def test_a_key_not_held_is_named_by_its_id_never_its_value() -> None:
    sealed = box(A).seal(new_secret())
    with pytest.raises(SecretUndecryptable) as err:
        box(B).open(sealed.ciphertext, sealed.key_id)
    assert sealed.key_id in err.value.detail and key_id(B.encode()) in err.value.detail
    assert A not in err.value.detail and B not in err.value.detail
    with pytest.raises(SecretUndecryptable):
        box(B).reseal(sealed.ciphertext, sealed.key_id)
    assert A not in repr(box(A)) and key_id(A.encode()) in repr(box(A))


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (f"{A},not-a-key", "key 2 of 2 is not a Fernet key"),
        ("x" * 44, "key 1 of 1 is not a Fernet key"),
        (f"{A},{A}", "names the same key twice"),
        ("é" * 44, "key 1 of 1 is not a Fernet key"),
    ],
    ids=["second-malformed", "not-base64-of-32-bytes", "repeated", "not-ascii"],
)
def test_a_malformed_key_list_fails_at_start_naming_the_position(text: str, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        SecretBox.from_text(text)
    with pytest.raises(ValidationError) as err:
        Settings(webhook_secret_keys=text)
    assert said in str(err.value) and text not in str(err.value) and A not in str(err.value)


def test_no_key_is_none_and_required_says_what_to_set() -> None:
    assert SecretBox.from_text(None) is None and SecretBox.from_text(" , ") is None
    assert Settings(webhook_secret_keys="").webhook_secret_box() is None
    with pytest.raises(SecretKeysMissing, match="WEBHOOK_SECRET_KEYS is not set"):
        require(None)
    assert Fernet(new_key())  # what `exportctl webhook new-secret-key` prints is a Fernet key
