"""Streaming renderers (json, ndjson, markdown_zip) and archive file names."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import re
import zipfile
import zlib
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exportcore.domain import ExportFormat
from exportcore.manifests import entries_sha256
from exportcore.render import ExportHeader, NoteRecord, make_renderer
from exportcore.render.base import _dumps
from exportcore.render.jsonfmt import JsonRenderer, NdjsonRenderer
from exportcore.render.markdown_zip import (
    MarkdownZipRenderer,
    note_filename,
    note_markdown,
    slugify,
)
from tests.unit.helpers import Sink, note_records, unique_notes


def note_sha(note: NoteRecord) -> str:
    """The manifest hash of a note in the json and ndjson formats: of its record's bytes."""
    return hashlib.sha256(_dumps(note.as_json())).hexdigest()


HEADER = ExportHeader(
    id="7d4f3b0e-0000-4000-8000-000000000001",
    tenant="acme",
    created_at=datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC),
    format="json",
    count=2,
)
NOTES = [
    NoteRecord(1, "Groceries", "milk\neggs", True, datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)),
    NoteRecord(5, "Ünïcødé ✓", "# heading\n\n— done", False, datetime(2023, 12, 31, tzinfo=UTC)),
]
NAME = re.compile(r"^notes/[a-z0-9-]+-\d+\.md$")


def render(fmt: ExportFormat, notes: list[NoteRecord], chunks: list[int] | None = None) -> bytes:
    """Render ``notes`` split at the cut points ``chunks`` (one chunk when None)."""
    out = Sink()
    renderer = make_renderer(fmt, out)
    renderer.begin(HEADER)
    cuts = [0, *sorted(chunks or []), len(notes)]
    for lo, hi in itertools.pairwise(cuts):
        renderer.add(notes[lo:hi])
    renderer.end()
    assert renderer.rows == len(notes)
    return bytes(out.data)


def chunked(draw_notes: st.SearchStrategy[list[NoteRecord]]) -> st.SearchStrategy[Any]:
    @st.composite
    def strategy(draw: st.DrawFn) -> tuple[list[NoteRecord], list[int]]:
        notes = draw(draw_notes)
        cuts = draw(st.lists(st.integers(min_value=0, max_value=len(notes)), max_size=8))
        return notes, cuts

    return strategy()


def test_make_renderer_picks_the_format() -> None:
    assert type(make_renderer(ExportFormat.JSON, io.BytesIO())) is JsonRenderer
    assert type(make_renderer(ExportFormat.NDJSON, io.BytesIO())) is NdjsonRenderer
    assert type(make_renderer(ExportFormat.MARKDOWN_ZIP, io.BytesIO())) is MarkdownZipRenderer


def test_note_record_from_row() -> None:
    row = {
        "note_id": "9",
        "title": "t",
        "content": "c",
        "pinned": 1,
        "updated_at": HEADER.created_at,
    }
    assert NoteRecord.from_row(row) == NoteRecord(9, "t", "c", True, HEADER.created_at)


# --- json ---------------------------------------------------------------------------------


def test_json_document_has_exact_fields() -> None:
    doc = json.loads(render(ExportFormat.JSON, NOTES))
    assert doc.pop("tombstones") == []
    entries, manifest = doc.pop("entries"), doc.pop("manifest")
    assert doc.pop("signature") is None
    assert entries == [[n.id, n.version, note_sha(n)] for n in NOTES]
    assert manifest["notes"] == 2 and manifest["tombstones"] == 0
    assert manifest["entries_sha256"] == entries_sha256(entries)
    assert doc == {
        "export": {
            "id": HEADER.id,
            "tenant": "acme",
            "created_at": "2024-05-06T07:08:09+00:00",
            "format": "json",
            "count": 2,
        },
        "notes": [
            {
                "id": 1,
                "title": "Groceries",
                "content": "milk\neggs",
                "pinned": True,
                "updated_at": "2024-01-02T03:04:05+00:00",
                "version": 1,
            },
            {
                "id": 5,
                "title": "Ünïcødé ✓",
                "content": "# heading\n\n— done",
                "pinned": False,
                "updated_at": "2023-12-31T00:00:00+00:00",
                "version": 1,
            },
        ],
    }


def test_json_is_utf8_without_ascii_escapes_and_ends_with_newline() -> None:
    out = render(ExportFormat.JSON, NOTES)
    assert "Ünïcødé ✓".encode() in out
    assert out.endswith(b',"signature":null}\n')


def test_json_with_no_notes_is_an_empty_array() -> None:
    assert json.loads(render(ExportFormat.JSON, []))["notes"] == []


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(case=chunked(unique_notes()))
def test_json_chunking_does_not_change_a_byte(case: tuple[list[NoteRecord], list[int]]) -> None:
    notes, cuts = case
    whole = render(ExportFormat.JSON, notes)
    assert render(ExportFormat.JSON, notes, cuts) == whole
    doc = json.loads(whole)
    assert doc["export"] == HEADER.as_json()
    assert doc["notes"] == [n.as_json() for n in notes]
    assert doc["entries"] == [[n.id, n.version, note_sha(n)] for n in notes]


# --- ndjson ------------------------------------------------------------------------------


def test_ndjson_has_one_object_per_line_and_no_header() -> None:
    out = render(ExportFormat.NDJSON, NOTES)
    lines = out.split(b"\n")
    assert lines[-1] == b""
    assert [json.loads(line) for line in lines[:-2]] == [n.as_json() for n in NOTES]
    assert set(json.loads(lines[-2])) == {"entries", "manifest", "signature"}


def test_ndjson_with_no_notes_has_only_its_manifest_line() -> None:
    [line] = render(ExportFormat.NDJSON, []).splitlines()
    assert json.loads(line)["entries"] == []


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(case=chunked(unique_notes()))
def test_ndjson_lines_match_notes_for_any_chunking(
    case: tuple[list[NoteRecord], list[int]],
) -> None:
    notes, cuts = case
    out = render(ExportFormat.NDJSON, notes, cuts)
    assert out == render(ExportFormat.NDJSON, notes)
    lines = out.split(b"\n")
    assert len(lines) == len(notes) + 2
    assert [json.loads(line) for line in lines[:-2]] == [n.as_json() for n in notes]


# --- markdown zip ------------------------------------------------------------------------


def split_markdown(text: str) -> tuple[dict[str, Any], str]:
    assert text.startswith("---\n")
    front, sep, body = text[4:].partition("\n---\n\n")
    assert sep
    return yaml.safe_load(front), body


def check_archive(data: bytes, notes: list[NoteRecord]) -> None:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert zf.testzip() is None
        names = zf.namelist()
        assert names == [note_filename(n) for n in notes] + [
            "manifest.json",
            "signed-manifest.json",
        ]
        signed = json.loads(zf.read("signed-manifest.json"))
        assert signed["entries"] == [
            [n.id, n.version, hashlib.sha256(note_markdown(n)).hexdigest()] for n in notes
        ]
        manifest = json.loads(zf.read("manifest.json"))
        assert manifest == {
            "export": HEADER.as_json(),
            "files": [
                {
                    "id": n.id,
                    "path": note_filename(n),
                    "title": n.title,
                    "size": len(note_markdown(n)),
                }
                for n in notes
            ],
        }
        for note in notes:
            front, body = split_markdown(zf.read(note_filename(note)).decode("utf-8"))
            assert front == {
                "id": note.id,
                "title": note.title,
                "pinned": note.pinned,
                "updated_at": note.updated_at.isoformat(),
                "version": note.version,
            }
            assert body in (note.content, note.content + "\n")
            assert body.endswith("\n")


def test_markdown_zip_has_one_file_per_note_and_a_manifest(sink: Sink) -> None:
    renderer = MarkdownZipRenderer(sink)
    renderer.begin(HEADER)
    renderer.add(NOTES[:1])
    renderer.add(NOTES[1:])
    renderer.end()
    data = bytes(sink.data)
    check_archive(data, NOTES)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert zf.namelist()[:2] == ["notes/groceries-1.md", "notes/unicde-5.md"]
        assert zf.read("notes/groceries-1.md").decode() == (
            '---\nid: 1\ntitle: "Groceries"\npinned: true\n'
            'updated_at: "2024-01-02T03:04:05+00:00"\nversion: 1\n---\n\nmilk\neggs\n'
        )


def test_markdown_zip_streams_entries_as_chunks_arrive(sink: Sink) -> None:
    renderer = MarkdownZipRenderer(sink)
    renderer.begin(HEADER)
    renderer.add(NOTES[:1])
    after_first = sink.tell()
    assert after_first > 0
    renderer.add(NOTES[1:])
    assert sink.tell() > after_first


def test_markdown_zip_requires_begin(sink: Sink) -> None:
    renderer = MarkdownZipRenderer(sink)
    with pytest.raises(AssertionError, match="begin"):
        renderer.end()


@settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(case=chunked(unique_notes(max_size=8)))
def test_markdown_zip_round_trips_any_notes(case: tuple[list[NoteRecord], list[int]]) -> None:
    notes, cuts = case
    check_archive(render(ExportFormat.MARKDOWN_ZIP, notes, cuts), notes)


@given(note=note_records())
def test_note_markdown_front_matter_parses_back(note: NoteRecord) -> None:
    front, body = split_markdown(note_markdown(note).decode("utf-8"))
    assert front["title"] == note.title
    assert front["id"] == note.id
    assert front["pinned"] is note.pinned
    assert front["updated_at"] == note.updated_at.isoformat()
    assert body.removesuffix("\n") == note.content.removesuffix("\n")


def test_front_matter_keeps_a_title_with_a_next_line_character() -> None:
    note = NoteRecord(1, "a\x85b", "", False, HEADER.created_at)
    front, _ = split_markdown(note_markdown(note).decode("utf-8"))
    assert front["title"] == "a\x85b"


# --- checkpoint segments ------------------------------------------------------------------


def segment(state: object) -> bytes:
    """A checkpoint segment holding ``state`` as a renderer stores one (zlib of JSON)."""
    return zlib.compress(json.dumps(state).encode())


@pytest.mark.parametrize("fmt", list(ExportFormat))
def test_a_render_resumed_from_its_segments_writes_the_same_bytes(fmt: ExportFormat) -> None:
    first = Sink()
    renderer = make_renderer(fmt, first)
    renderer.begin(HEADER)
    renderer.add(NOTES[:1])
    state = renderer.checkpoint_state()
    carried = Sink()  # the durable prefix, copied under the next claim's key
    carried.write(bytes(first.data))
    resumed = make_renderer(fmt, carried)
    resumed.resume(HEADER, [state])
    assert resumed.rows == 1
    resumed.add(NOTES[1:])
    resumed.end()
    assert bytes(carried.data) == render(fmt, NOTES)


def test_a_markdown_zip_checkpoint_of_an_older_release_resumes_with_the_sizes() -> None:
    """A checkpoint written before manifest.json carried sizes (no ``size`` in its file
    entries) resumes to the same bytes: the size comes from the member itself."""
    fmt = ExportFormat.MARKDOWN_ZIP
    first = Sink()
    renderer = make_renderer(fmt, first)
    renderer.begin(HEADER)
    renderer.add(NOTES[:1])
    state = json.loads(zlib.decompress(renderer.checkpoint_state()))
    for entry, *_ in state["zip"]:
        del entry["size"]
    carried = Sink()
    carried.write(bytes(first.data))
    resumed = make_renderer(fmt, carried)
    resumed.resume(HEADER, [segment(state)])
    resumed.add(NOTES[1:])
    resumed.end()
    assert bytes(carried.data) == render(fmt, NOTES)


@pytest.mark.parametrize("fmt", list(ExportFormat))
@pytest.mark.parametrize(
    "state",
    [
        pytest.param([], id="not an object"),
        pytest.param({"notes": []}, id="no entries"),
        pytest.param({"entries": [[1]]}, id="an entry too short"),
        pytest.param({"entries": [["one", 1, None]]}, id="an entry of other types"),
        pytest.param({"entries": {"1": 1}}, id="entries not a list"),
    ],
)
def test_a_segment_of_another_shape_is_unreadable(fmt: ExportFormat, state: object) -> None:
    """A segment that decompresses and parses but is not what this version stores raises
    ValueError, the refusal the checkpoint's takeover turns into a discarded checkpoint
    (reason ``segments``) instead of an attempt that fails the same way every time."""
    with pytest.raises(ValueError, match="unreadable checkpoint segment"):
        make_renderer(fmt, Sink()).resume(HEADER, [segment(state)])


@pytest.mark.parametrize(
    "zip_state",
    [
        pytest.param(None, id="no zip member"),
        pytest.param([["x"]], id="a zip entry too short"),
        pytest.param([[[1, 1, None], "notes/a.md", "not base64!", "", 1]], id="bad base64"),
    ],
)
def test_a_markdown_zip_segment_of_another_shape_is_unreadable(zip_state: object) -> None:
    state = {"entries": []} if zip_state is None else {"entries": [], "zip": zip_state}
    with pytest.raises(ValueError, match="unreadable checkpoint segment"):
        MarkdownZipRenderer(Sink()).resume(HEADER, [segment(state)])


# --- file names -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("title", "slug"),
    [
        ("Hello, World!", "hello-world"),
        ("Crème brûlée", "creme-brulee"),
        ("../../etc/passwd", "etc-passwd"),
        ("C:\\Windows\\system32", "c-windows-system32"),
        ("日本語のノート", "note"),
        ("", "note"),
        ("---", "note"),
        ("\uff26\uff35\uff2c\uff2c\u3000\uff57\uff49\uff44\uff54\uff48", "full-width"),
    ],
)
def test_slugify_examples(title: str, slug: str) -> None:
    assert slugify(title) == slug


def test_slugify_truncates_without_a_trailing_dash() -> None:
    title = "a" * 59 + " bcdef"
    assert slugify(title) == "a" * 59
    assert len(slugify("x" * 500)) == 60


@given(title=st.text())
def test_slug_is_short_and_safe(title: str) -> None:
    slug = slugify(title)
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", slug)
    assert len(slug) <= 60


@given(note=note_records(ids=st.integers(min_value=0, max_value=2**63 - 1)))
def test_note_filename_stays_in_the_notes_folder(note: NoteRecord) -> None:
    name = note_filename(note)
    assert NAME.fullmatch(name)
    assert ".." not in name
    assert "/" not in name.removeprefix("notes/")
    assert name.endswith(f"-{note.id}.md")


@given(a=note_records(), b=note_records())
def test_distinct_note_ids_give_distinct_names(a: NoteRecord, b: NoteRecord) -> None:
    if a.id != b.id:
        assert note_filename(a) != note_filename(b)


@given(titles=st.lists(st.text(max_size=20), min_size=2, max_size=20))
def test_same_titles_never_collide(titles: list[str]) -> None:
    ts = datetime(2024, 1, 1, tzinfo=UTC)
    names = [note_filename(NoteRecord(i, t, "", False, ts)) for i, t in enumerate(titles, 1)]
    assert len(set(names)) == len(names)


class MinimalSink:
    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> int:
        self.data += data
        return len(data)

    def tell(self) -> int:
        return len(self.data)

    def flush(self) -> None:
        pass


@pytest.mark.parametrize("fmt", [ExportFormat.JSON, ExportFormat.NDJSON])
def test_text_formats_need_only_write_and_tell(fmt: ExportFormat) -> None:
    out = MinimalSink()
    renderer = make_renderer(fmt, out)
    renderer.begin(HEADER)
    renderer.add(NOTES)
    renderer.end()
    assert bytes(out.data) == render(fmt, NOTES)


def test_markdown_zip_needs_only_write_tell_and_flush() -> None:
    out = MinimalSink()
    renderer = make_renderer(ExportFormat.MARKDOWN_ZIP, out)
    renderer.begin(HEADER)
    renderer.add(NOTES)
    renderer.end()
    check_archive(bytes(out.data), NOTES)


@given(st.text(st.characters(codec="utf-8")))
def test_yaml_string_round_trips_any_text(text: str) -> None:
    from exportcore.render.markdown_zip import yaml_string

    assert yaml.safe_load(f"k: {yaml_string(text)}\n") == {"k": text}
