"""An independent review's attacks on ``exportctl verify`` and ``restore --chain`` that broke
the rewrite of issue 38 items 1-4 (the attacks that held are in the review's report): a JSON
object naming a member twice, a record that is JSON but not UTF-8, a restore served another
export than the one asked for, a note path too long for the file system, a zip member whose
unsigned declared size makes verify decompress gigabytes before the signature is checked,
keys pinned by a restore whose chain then failed, and a folder swapped for a symbolic link
while the restore writes.

Files are rendered by the service's renderers and signed with real Ed25519 keys; the hostile
API is a real HTTP server on loopback (``HostileApi`` of test_verify_attacks).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.test_verify_attacks import render, verify

# --- a member named twice in one JSON object -------------------------------------------------


def _json_notes_twice() -> bytes:
    """The json format with a forged ``"notes"`` member before the genuine one (Python's
    parser keeps the last copy, so the forged one was invisible to verify)."""
    data = render("json").decode()
    doc = json.loads(data)
    forged = json.loads(json.dumps(doc["notes"]))
    forged[0]["content"] = "POISON"
    at = data.index('"notes":')
    return (data[:at] + '"notes":' + json.dumps(forged) + "," + data[at:]).encode()


def _record_content_twice() -> bytes:
    data = render("json")
    return data.replace(b'"content":', b'"content":"POISON","content":', 1)


def _ndjson_entries_twice() -> bytes:
    *lines, trailer, end = render("ndjson").split(b"\n")
    return b"\n".join([*lines, trailer.replace(b'"entries":', b'"entries":[],"entries":'), end])


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (_json_notes_twice, "notes"),
        (_record_content_twice, "content"),
        (_ndjson_entries_twice, "entries"),
    ],
)
def test_a_json_object_naming_a_member_twice_does_not_verify(
    tmp_path: Path, make: object, name: str
) -> None:
    code, out = verify(tmp_path, make())  # type: ignore[operator]
    assert code == 1, out
    assert f"names '{name}' twice in one object" in out


def test_a_record_with_a_lone_surrogate_is_a_message_not_a_traceback(tmp_path: Path) -> None:
    """``"\\ud800"`` is valid JSON but no UTF-8: re-encoding the json record raised
    UnicodeEncodeError (a traceback) before."""
    code, out = verify(tmp_path, render("json").replace(b"Groceries", b"\\ud800"))
    assert code == 1, out
    assert "record 1 of 'notes' holds a string that is not Unicode text" in out
