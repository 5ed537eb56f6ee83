"""Fixtures of the unit tests (pure logic: no database, Redis or network)."""

from __future__ import annotations

import pytest

from tests.unit.helpers import Sink


@pytest.fixture
def sink() -> Sink:
    """An empty in-memory sink with only write, tell and flush."""
    return Sink()
