"""tools/plot_glance.py reads BENCHMARKS.md's own tables and draws the README's plot from them."""

from __future__ import annotations

from tools.plot_glance import ROOT, main, number, table_after


def test_the_plot_reads_the_batched_table_and_the_server_rows_of_benchmarks():
    text = (ROOT / "BENCHMARKS.md").read_text()
    batched = table_after(text, "## Batched `generate` against HF batched `generate` + xgrammar")
    assert [int(row[0]) for row in batched] == [1, 4, 8, 16]
    assert all(number(row[c]) is not None for row in batched for c in (1, 2, 3))  # tok/s of the three arms
    glance = {row[0]: row[1:] for row in table_after(text, "## At a glance")}
    assert number(glance["`grammarspec serve`, JSON, `auto` / `none`"][0]) is not None
    assert number("**2.18x**") == 2.18 and number("") is None


def test_the_plot_is_written(tmp_path, monkeypatch):
    out = tmp_path / "glance.png"
    monkeypatch.setattr("sys.argv", ["plot_glance.py", "--out", str(out)])
    main()
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
