"""The per-request holder of the drafting policy: what it asks for, what it learns."""

from __future__ import annotations

import doctest

import pytest

import grammarspec.adaptive
from grammarspec.adaptive import AdaptiveController
from proposers.base import Draft


def test_docstring_examples_hold():
    assert doctest.testmod(grammarspec.adaptive).failed == 0


def test_cheap_drafters_are_asked_for_the_cap_whatever_was_admitted():
    c = AdaptiveController(k_min=16, k_max=16)
    c.allocated(0)
    assert c.ask() == 16 and not c.speculate


def test_a_model_drafter_grows_by_one_while_admitted_and_shrinks_when_cut():
    c = AdaptiveController(k_min=1, k_max=4)
    asked = []
    for admitted in [1, 2, 3, 4, 4, 1]:
        asked.append(c.ask())
        c.allocated(admitted)
    assert asked == [1, 2, 3, 4, 4, 4] and c.ask() == 2


def test_fixed_length_when_not_adaptive():
    c = AdaptiveController(k_min=1, k_max=5, adaptive=False)
    assert c.ask() == 5 and c.k == 5


def test_record_calibrates_the_estimates():
    c = AdaptiveController()
    draft = Draft(tokens=(1, 2), sources=("prompt_lookup",) * 2, confidence=(0.9, 0.9))
    before = c.estimates(draft)
    for _ in range(30):
        c.record(draft, 0)
    after = c.estimates(draft)
    assert after[0] < before[0] - 0.5 and after[1] == pytest.approx(before[1])  # the second never reached the target
    c.record(Draft(), 0)
    assert c.plain_steps == 1 and c.speculative_steps == 30


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="k_min <= k_max"):
        AdaptiveController(k_min=5, k_max=2)
