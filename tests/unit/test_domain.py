"""The canonical export request, queue routing and formats."""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exportcore.domain import (
    ACTIVE_STATES,
    BULK_QUEUE,
    FAST_QUEUE,
    TERMINAL_STATES,
    ExportFormat,
    ExportRequest,
    InvalidIdempotencyKey,
    InvalidSelection,
    JobStatus,
    parse_idempotency_key,
    route_queue,
)

note_ids = st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), min_size=1)
formats = st.sampled_from(list(ExportFormat))


@given(ids=note_ids, fmt=formats, data=st.data())
def test_order_and_duplicates_do_not_change_the_canonical_request(
    ids: list[int], fmt: ExportFormat, data: st.DataObject
) -> None:
    shuffled = data.draw(st.permutations(ids))
    extra = data.draw(st.lists(st.sampled_from(ids)))
    a = ExportRequest.build(fmt, ids, select_all=False)
    b = ExportRequest.build(fmt, shuffled + extra, select_all=False)
    assert a.note_ids == b.note_ids == tuple(sorted(set(ids)))
    assert a.canonical() == b.canonical()
    assert a.request_hash() == b.request_hash()


@given(a=note_ids, b=note_ids, fmt=formats)
def test_different_selections_hash_differently(
    a: list[int], b: list[int], fmt: ExportFormat
) -> None:
    ra = ExportRequest.build(fmt, a, select_all=False)
    rb = ExportRequest.build(fmt, b, select_all=False)
    assert (ra.request_hash() == rb.request_hash()) == (set(a) == set(b))


def test_canonical_shapes() -> None:
    some = ExportRequest.build(ExportFormat.NDJSON, [3, 1, 3], select_all=False)
    assert some.canonical() == {
        "selection": {"note_ids": [1, 3]},
        "format": "ndjson",
        "options": {},
    }
    every = ExportRequest.build(ExportFormat.JSON, None, select_all=True)
    assert every.note_ids is None
    assert every.canonical() == {"selection": {"all": True}, "format": "json", "options": {}}


def test_request_hash_is_sha256_of_compact_sorted_json() -> None:
    req = ExportRequest.build(ExportFormat.MARKDOWN_ZIP, [2, 1], select_all=False)
    blob = '{"format":"markdown_zip","options":{},"selection":{"note_ids":[1,2]}}'
    assert json.dumps(req.canonical(), sort_keys=True, separators=(",", ":")) == blob
    assert req.request_hash() == hashlib.sha256(blob.encode()).hexdigest()


def test_format_and_selection_kind_are_part_of_the_hash() -> None:
    hashes = {
        ExportRequest.build(fmt, ids, select_all=all_).request_hash()
        for fmt in ExportFormat
        for ids, all_ in (([1], False), (None, True))
    }
    assert len(hashes) == 2 * len(ExportFormat)


@pytest.mark.parametrize(
    ("ids", "select_all"),
    [([1], True), ([1, 2], True), (None, False), ([], False)],
    ids=["ids-and-all", "many-ids-and-all", "neither", "empty-list"],
)
def test_empty_or_contradictory_selection_is_invalid(
    ids: list[int] | None, select_all: bool
) -> None:
    with pytest.raises(InvalidSelection) as info:
        ExportRequest.build(ExportFormat.JSON, ids, select_all=select_all)
    assert info.value.code == "invalid_selection"
    assert info.value.detail == str(info.value)


def test_select_all_with_an_empty_id_list_means_all() -> None:
    assert ExportRequest.build(ExportFormat.JSON, [], select_all=True).note_ids is None


@given(threshold=st.integers(min_value=0, max_value=10**6))
def test_route_queue_boundary(threshold: int) -> None:
    assert route_queue(threshold, threshold) == FAST_QUEUE
    assert route_queue(threshold + 1, threshold) == BULK_QUEUE
    assert route_queue(0, threshold) == FAST_QUEUE


def test_route_queue_default_threshold() -> None:
    assert route_queue(30, 30) == "exports.fast"
    assert route_queue(31, 30) == "exports.bulk"


@pytest.mark.parametrize(
    ("fmt", "extension", "media_type"),
    [
        (ExportFormat.JSON, "json", "application/json"),
        (ExportFormat.NDJSON, "ndjson", "application/x-ndjson"),
        (ExportFormat.MARKDOWN_ZIP, "zip", "application/zip"),
    ],
)
def test_format_extension_and_media_type(
    fmt: ExportFormat, extension: str, media_type: str
) -> None:
    assert fmt.extension == extension
    assert fmt.media_type == media_type
    assert ExportFormat(fmt.value) is fmt


def test_unknown_format_is_rejected() -> None:
    with pytest.raises(ValueError):
        ExportFormat("pdf")


def test_terminal_and_active_states_partition_the_statuses() -> None:
    assert set(JobStatus) == TERMINAL_STATES | ACTIVE_STATES
    assert not TERMINAL_STATES & ACTIVE_STATES
    assert [s for s in JobStatus if s.terminal] == [
        JobStatus.SUCCEEDED,
        JobStatus.FAILED,
        JobStatus.CANCELLED,
    ]


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ('"order-7"', "order-7"),  # RFC 8941 sf-string, as the IETF draft defines the header
        ("order-7", "order-7"),  # bare
        ("8e03978e-40d5-43e8-bc93-6894a57f9324", "8e03978e-40d5-43e8-bc93-6894a57f9324"),
        (r'"a\"b\\c"', 'a"b\\c'),  # the two escapes of an sf-string
        ('"with space"', "with space"),
        ("  padded\t", "padded"),  # optional whitespace around a field value
        ('"' + "x" * 255 + '"', "x" * 255),
    ],
)
def test_idempotency_keys_that_parse(raw: str, key: str) -> None:
    assert parse_idempotency_key(raw) == key


@pytest.mark.parametrize(
    "raw",
    [
        "",
        '""',
        "x" * 256,
        '"unterminated',
        'a"b',
        '"x";a=1',  # parameters are not part of the key: refused, not ignored
        '"x"y',
        "two words",
        r'"bad\q"',  # only \" and \\ are escapes
        "back\\slash",
        "caf\u00e9",
        '"caf\u00e9"',
        "tab\tinside",
    ],
)
def test_malformed_idempotency_keys_are_refused(raw: str) -> None:
    with pytest.raises(InvalidIdempotencyKey):
        parse_idempotency_key(raw)
