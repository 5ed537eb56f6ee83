"""grafana/ is the source; the Helm chart keeps byte-identical copies under its files/
(Helm reads no file outside the chart). `make grafana-sync` refreshes them."""

from __future__ import annotations

import pytest

from devtools import grafana

pytestmark = pytest.mark.grafana


def test_chart_copies_equal_grafana_sources() -> None:
    pairs = grafana.chart_copies()
    assert len(pairs) >= 3
    stale = [
        str(copy.relative_to(grafana.ROOT))
        for source, copy in pairs
        if not copy.is_file() or copy.read_bytes() != source.read_bytes()
    ]
    assert stale == [], f"out of date: {stale}; run `make grafana-sync`"


def test_chart_has_no_copy_without_a_source() -> None:
    expected = {copy for _, copy in grafana.chart_copies()}
    present = set((grafana.CHART_FILES / "dashboards").glob("*.json"))
    present |= set((grafana.CHART_FILES / "alerts").glob("*.yaml"))
    extra = sorted(str(p.relative_to(grafana.ROOT)) for p in present - expected)
    assert extra == [], f"copies whose source is gone: {extra}; run `make grafana-sync`"
