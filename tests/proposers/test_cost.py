"""The one cost model: a verification pass of n rows against a 1-row step, learned online."""

from __future__ import annotations

import pytest

from proposers.base import Draft, GrammarView, Request
from proposers.compose import CompositeProposer
from proposers.cost import PassCost, flat_until
from proposers.track import Calibration
from tests.proposer_fakes import RuleMatcher, fixed
from tests.toy import toy_tokenizer


def test_prior_is_the_measured_cpu_model():
    c = PassCost()
    assert c.cost(0) == c.cost(1) == 1.0
    assert c.cost(2) == c.cost(4) == pytest.approx(1.42)  # fewer than 4 rows cost as much as 4
    assert c.cost(17) == pytest.approx(1.81)
    assert c.break_even(10) == pytest.approx(0.6) and c.share(17) == pytest.approx(0.81 / 16)


def test_update_learns_the_unit_then_the_line():
    c = PassCost()
    assert c.update(8, 0.2)  # no 1-row pass yet: the unit is inferred from the prior's shape, the line kept
    assert c.cost(8) == pytest.approx(1.54) and c.unit_seconds == pytest.approx(0.2 / 1.54)
    assert c.update(1, 0.1) and c.unit_seconds == pytest.approx(0.1)  # a measured 1-row pass replaces it
    for _ in range(200):  # here a pass costs 1 + 0.25 per row: much dearer rows than the prior
        c.update(4, 0.1 * (1 + 0.25 * 4))
        c.update(16, 0.1 * (1 + 0.25 * 16))
    assert c.per_row > 0.15 and c.cost(16) > 4.0
    assert c.cost(16) > c.cost(4) > 1.0


def test_one_width_only_keeps_the_line_defined():
    c = PassCost()
    c.update(1, 0.05)
    for _ in range(100):
        c.update(17, 0.1)
    assert c.cost(17) == pytest.approx(2.0, abs=0.2) and c.cost(2) >= 1.0


def test_bad_measurements_and_settings_are_refused():
    with pytest.raises(ValueError, match="seconds > 0"):
        PassCost().update(3, 0.0)
    with pytest.raises(ValueError, match="base > 0"):
        PassCost(base=0.0)


def test_a_record_is_worth_its_pass_by_the_cost_model():
    cheap, dear = PassCost(), PassCost(base=3.0)
    draft = Draft(tokens=tuple(range(8)), sources=("guess",) * 8)
    expected = Calibration(default_open=0.5).expected(draft)  # about 2 accepted tokens
    assert cheap.break_even(9) < expected < dear.break_even(9)  # 0.57 beyond a plain step; 2.27 beyond one


def test_the_composite_holds_back_drafts_when_passes_turn_out_dear():
    """The composite reads the cost model the loop feeds: a measured dear pass raises the bar."""
    tok = toy_tokenizer()
    view = GrammarView(RuleMatcher(legal=lambda h, t: True))
    cost = PassCost()
    composite = CompositeProposer([fixed("guess", [4, 5, 6])], cost_model=cost)
    assert composite.cost_model is cost
    composite.start(Request(prompt_ids=(2,), tokenizer=tok))
    assert composite.propose([2], view, 8)  # the prior: expected 1.5 tokens > 0.6
    cost.update(1, 0.01)
    for _ in range(100):
        cost.update(10, 0.04)  # a 10-row pass costs 4 plain steps
    assert not composite.propose([2], view, 8)  # 1.5 expected tokens no longer pay for it
    fixed_bar = CompositeProposer([fixed("guess", [4, 5, 6])], cost_model=cost, min_expected=0.6)
    fixed_bar.start(Request(prompt_ids=(2,), tokenizer=tok))
    assert fixed_bar.propose([2], view, 8)  # an explicit min_expected wins


@pytest.mark.parametrize(
    "module", ["proposers.cost", "proposers.track", "proposers.json_document", "proposers.json_cursor"]
)
def test_docstring_examples_hold(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0


def test_a_batch_without_one_row_passes_still_learns_its_line():
    """At batch 16 no pass has one row: the first pass sets the unit, the rest move the line."""
    c = PassCost()
    truth = PassCost(1.5, 0.05, 4)  # dearer rows than the prior: 16 rows = 2.3 plain steps
    unit = 0.08
    for rows in [16, 24, 40, 16, 32, 48, 20, 60] * 30:
        c.update(rows, unit * truth.cost(rows))
    ratio = c.cost(48) / c.cost(16)
    assert ratio == pytest.approx(truth.cost(48) / truth.cost(16), rel=0.05)
    assert ratio > PassCost().cost(48) / PassCost().cost(16) + 0.1  # it moved away from the prior


def test_flat_until_models_a_gpu():
    gpu = flat_until(64)
    assert gpu.cost(2) == gpu.cost(64) == 1.0 and gpu.cost(65) > 1.0
    with pytest.raises(ValueError, match="flat_until"):
        flat_until(64, per_row=0.02)
