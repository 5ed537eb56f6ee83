"""Shared helpers of the unit tests: a minimal binary sink and note strategies."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from hypothesis import strategies as st

from exportcore.render import NoteRecord


class Sink:
    """The least a renderer may rely on: ``write``, ``tell`` and (for zipfile) ``flush``."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.writes = 0

    def write(self, data: bytes) -> int:
        self.data += data
        self.writes += 1
        return len(data)

    def tell(self) -> int:
        return len(self.data)

    def flush(self) -> None:
        pass


tzinfos = st.one_of(
    st.just(UTC),
    st.builds(
        timezone,
        st.timedeltas(
            min_value=timedelta(hours=-23, minutes=-59), max_value=timedelta(hours=23, minutes=59)
        ),
    ),
)
datetimes = st.datetimes(
    min_value=datetime(1970, 1, 2), max_value=datetime(2200, 1, 1), timezones=tzinfos
)


def note_records(ids: st.SearchStrategy[int] | None = None) -> st.SearchStrategy[NoteRecord]:
    return st.builds(
        NoteRecord,
        id=ids if ids is not None else st.integers(min_value=1, max_value=2**63 - 1),
        title=st.text(st.characters(codec="utf-8"), max_size=80),
        content=st.text(max_size=300),
        pinned=st.booleans(),
        updated_at=datetimes,
    )


def unique_notes(max_size: int = 12) -> st.SearchStrategy[list[NoteRecord]]:
    return st.lists(note_records(), max_size=max_size, unique_by=lambda n: n.id)
