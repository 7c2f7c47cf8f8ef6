"""tools/width_cost.py: one row's forward timed by width, as BENCHMARKS.md quotes it."""

from __future__ import annotations

import pytest

from tests.helpers import load_tool
from tests.toy import toy_vocab_size
from tests.toy_models import ToyCausalLM


def test_every_width_is_timed_on_the_loops_own_forward_and_the_cache_keeps_its_context():
    tool = load_tool("width_cost")
    model = ToyCausalLM(toy_vocab_size(), seed=1)
    costs = tool.width_costs(model, context=12, widths=[1, 3, 5], repeats=2)
    assert sorted(costs) == [1, 3, 5] and all(seconds > 0 for seconds in costs.values())


def test_a_batch_step_is_timed_plain_and_with_each_case_of_drafting_rows():
    tool = load_tool("width_cost")
    model = ToyCausalLM(toy_vocab_size(), seed=1)
    costs = tool.batch_costs(model, rows=3, context=8, cases=[(1, 3), (3, 2)], repeats=2)
    assert list(costs) == [(0, 1), (1, 3), (3, 2)] and all(seconds > 0 for seconds in costs.values())


def test_bad_arguments_are_refused(capsys):
    tool = load_tool("width_cost")
    with pytest.raises(SystemExit) as stop:  # --widths 0 is refused
        tool.main(["--widths", "0"])
    assert stop.value.code == 2
    assert "--widths" in capsys.readouterr().err
