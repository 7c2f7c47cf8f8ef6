"""grammarspec.bench.records.source_totals: the per-source draft counts the reports sum."""

from __future__ import annotations

from grammarspec.bench.records import source_totals


def test_source_totals_sums_each_sources_counts_over_the_records():
    records = [
        {"proposed": {"lookup": 3, "schema": 0}, "accepted": {"lookup": 2, "schema": 0}},
        {"proposed": {"suffix": 4, "lookup": 1}, "accepted": {"suffix": 1, "lookup": 1}},
        {"proposed": {}, "accepted": {}},
    ]
    assert source_totals(records, "proposed") == {"lookup": 4, "schema": 0, "suffix": 4}
    assert list(source_totals(records, "proposed")) == ["lookup", "schema", "suffix"]  # the order first met
    assert source_totals(records, "accepted") == {"lookup": 3, "schema": 0, "suffix": 1}
    assert source_totals([], "accepted") == {}
