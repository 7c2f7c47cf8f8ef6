"""tools/width_cost.py: one row's forward timed by width, as BENCHMARKS.md quotes it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.clocks import FakeClock
from tests.helpers import load_tool
from tests.toy import toy_vocab_size
from tests.toy_models import ToyCausalLM


def clocked(tool, monkeypatch) -> list[tuple[list[int], list[int]]]:
    """The tool's clock made fake, its forwards costing one second per token fed; returns the forwards seen, each
    as (tokens fed per row, cached tokens per row before it)."""
    clock = FakeClock()
    seen: list[tuple[list[int], list[int]]] = []

    class Clocked(tool.BatchKV):
        def forward(self, chunks, *args, **kwargs):
            seen.append(([len(c) for c in chunks], list(self.lengths)))
            logits = super().forward(chunks, *args, **kwargs)
            clock.advance(sum(len(c) for c in chunks))
            return logits

    monkeypatch.setattr(tool, "BatchKV", Clocked)
    monkeypatch.setattr(tool, "time", SimpleNamespace(perf_counter=clock))
    return seen


def test_every_width_is_timed_on_the_loops_own_forward_and_the_cache_keeps_its_context(monkeypatch):
    tool = load_tool("width_cost")
    seen = clocked(tool, monkeypatch)
    model = ToyCausalLM(toy_vocab_size(), seed=1)
    costs = tool.width_costs(model, context=12, widths=[1, 3, 5], repeats=2)
    assert costs == {1: 1.0, 3: 3.0, 5: 5.0}  # each width's own forward, and nothing else, between the readings
    assert seen[0] == ([12], [0])  # the context, read once
    # then two forwards a width, each after the context and the one pending token kept from each before it
    assert seen[1:] == [([w], [12 + i]) for i, w in enumerate([1, 1, 3, 3, 5, 5])]


def test_a_batch_step_is_timed_plain_and_with_each_case_of_drafting_rows(monkeypatch):
    tool = load_tool("width_cost")
    seen = clocked(tool, monkeypatch)
    model = ToyCausalLM(toy_vocab_size(), seed=1)
    costs = tool.batch_costs(model, rows=3, context=8, cases=[(1, 3), (3, 2)], repeats=2)
    assert costs == {(0, 1): 3.0, (1, 3): 5.0, (3, 2): 6.0}  # the tokens of each step's rows
    assert seen[0] == ([8, 10, 12], [0, 0, 0])  # ragged contexts: 8 to 12 tokens
    assert [fed for fed, _ in seen[1:]] == [[1, 1, 1]] * 2 + [[3, 1, 1]] * 2 + [[2, 2, 2]] * 2
    assert [cached for _, cached in seen[1:]] == [[8 + i, 10 + i, 12 + i] for i in range(6)]


def test_bad_arguments_are_refused(capsys):
    tool = load_tool("width_cost")
    with pytest.raises(SystemExit) as stop:  # --widths 0 is refused
        tool.main(["--widths", "0"])
    assert stop.value.code == 2
    assert "--widths" in capsys.readouterr().err
