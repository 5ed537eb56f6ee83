"""Metadata and tags (docs/api.md "Metadata and tags"): their bounds and charset, their place
in the canonical request (and so in the Idempotency-Key's hash), and the list filter."""

from __future__ import annotations

from typing import Any

import pytest

from exportcore.domain import (
    METADATA_KEY_MAX,
    METADATA_MAX_KEYS,
    METADATA_VALUE_MAX,
    TAG_MAX,
    TAGS_MAX,
    ExportFormat,
    ExportRequest,
    InvalidLabels,
    Labels,
    labels_filter,
)


def _request(labels: Labels | None = None) -> ExportRequest:
    return ExportRequest.build(ExportFormat.JSON, [3, 1, 2], False, labels=labels)


def test_a_request_without_labels_keeps_its_payload_and_hash() -> None:
    """No ``labels`` member at all: the payload (and so the hash every stored
    Idempotency-Key was compared with) is what it was before labels existed, and the
    partial index's predicate is false for it."""
    plain = _request()
    assert "labels" not in plain.canonical()
    assert _request(Labels.build({}, [])).request_hash() == plain.request_hash()
    assert plain.canonical() == {
        "selection": {"note_ids": [1, 2, 3]},
        "format": "json",
        "options": {},
    }


def test_labels_are_normalised_and_part_of_the_hash() -> None:
    a = _request(Labels.build({"b": "2", "a": "1"}, ["y", "x", "x"]))
    b = _request(Labels.build({"a": "1", "b": "2"}, ["x", "y"]))
    assert a.canonical()["labels"] == {"metadata": {"a": "1", "b": "2"}, "tags": ["x", "y"]}
    assert a.request_hash() == b.request_hash()
    other = _request(Labels.build({"a": "1", "b": "3"}, ["x", "y"]))
    assert other.request_hash() != a.request_hash()
    assert _request(Labels.build({"a": "1", "b": "2"}, ["x"])).request_hash() != a.request_hash()


def test_labels_read_back_from_a_payload() -> None:
    labels = Labels.build({"order_id": "ord_1"}, ["nightly"])
    payload = _request(labels).canonical()
    assert Labels.from_payload(payload) == labels
    assert Labels.from_payload({"selection": {"all": True}}) == Labels()
    assert not Labels.from_payload(None)


def test_the_bounds_are_accepted_at_their_limit() -> None:
    metadata = {
        f"k{i:02d}" + "x" * (METADATA_KEY_MAX - 3): "v" * METADATA_VALUE_MAX
        for i in range(METADATA_MAX_KEYS)
    }
    tags = [f"t{i:02d}" + "y" * (TAG_MAX - 3) for i in range(TAGS_MAX)]
    labels = Labels.build(metadata, tags)
    assert len(labels.metadata) == METADATA_MAX_KEYS and len(labels.tags) == TAGS_MAX


@pytest.mark.parametrize(
    ("metadata", "tags", "loc", "words"),
    [
        ({f"k{i}": "v" for i in range(METADATA_MAX_KEYS + 1)}, None, ["metadata"], "51 keys"),
        ({"k" * (METADATA_KEY_MAX + 1): "v"}, None, ["metadata", "k" * 41], "1-40 letters"),
        ({"a[b]": "v"}, None, ["metadata", "a[b]"], "a key is"),
        ({"": "v"}, None, ["metadata", ""], "a key is"),
        ({"k": "v" * (METADATA_VALUE_MAX + 1)}, None, ["metadata", "k"], "501 characters"),
        ({"k": "line\nbreak"}, None, ["metadata", "k"], "control characters"),
        ({"k": "nul\x00"}, None, ["metadata", "k"], "control characters"),
        ({"k": 5}, None, ["metadata", "k"], "a value is a string"),
        (None, [f"t{i}" for i in range(TAGS_MAX + 1)], ["tags"], "21 tags"),
        (None, ["has space"], ["tags", "has space"], "a tag is"),
        (None, ["-leading"], ["tags", "-leading"], "starting with a letter or digit"),
        (None, ["t" * (TAG_MAX + 1)], ["tags", "t" * 41], "a tag is 1-40"),
        (None, ["ünïcode"], ["tags", "ünïcode"], "a tag is"),
    ],
)
def test_what_breaks_a_bound_is_named(
    metadata: dict[str, Any] | None, tags: list[Any] | None, loc: list[str], words: str
) -> None:
    with pytest.raises(InvalidLabels) as caught:
        Labels.build(metadata, tags)
    exc = caught.value
    assert exc.kind == "invalid" and exc.code == "invalid_labels"
    assert words in exc.detail
    assert exc.extra["errors"][0]["loc"] == loc


def test_the_list_filter_is_one_containment() -> None:
    assert labels_filter(None, None) is None
    assert labels_filter({}, []) is None
    assert labels_filter({"k": "v"}, ["b", "a", "a"]) == {
        "metadata": {"k": "v"},
        "tags": ["a", "b"],
    }
    assert labels_filter(None, ["a"]) == {"tags": ["a"]}
    with pytest.raises(InvalidLabels, match=r"tag\[a b\]"):
        labels_filter(None, ["a b"])
    with pytest.raises(InvalidLabels, match=r"metadata\[x\]x\]"):
        labels_filter({"x]x": "v"}, None)


def test_a_filter_is_checked_like_stored_labels() -> None:
    """A NUL could not even be sent to PostgreSQL in jsonb: refused before, like a value
    over its bound or more pairs than an export can hold."""
    with pytest.raises(InvalidLabels, match=r"metadata\[k\]: a value has no control"):
        labels_filter({"k": "a\x00b"}, None)
    with pytest.raises(InvalidLabels, match="501 characters"):
        labels_filter({"k": "v" * (METADATA_VALUE_MAX + 1)}, None)
    with pytest.raises(InvalidLabels, match="51 keys") as caught:
        labels_filter({f"k{i}": "v" for i in range(METADATA_MAX_KEYS + 1)}, None)
    assert caught.value.extra["errors"][0]["loc"] == ["metadata"]
    with pytest.raises(InvalidLabels) as tag:
        labels_filter(None, ["bad tag"])
    assert tag.value.extra["errors"][0]["loc"] == ["tag", "bad tag"]
