"""One doubling back-off: the proposers' hold-back, the controller's rest and the learner's exploring steps."""

from __future__ import annotations

import doctest

import pytest

import proposers.backoff
from grammarspec.policy.adaptive import AdaptiveController
from grammarspec.policy.step_cost import StepCostLearner
from proposers.backoff import Backoff
from proposers.base import Draft
from proposers.cost import PassCost
from proposers.track import HoldBack


def test_docstring_examples_hold():
    assert doctest.testmod(proposers.backoff).failed == 0


def test_a_backoff_needs_a_first_wait_within_its_ceiling():
    with pytest.raises(ValueError, match="0 <= first <= most"):
        Backoff(9, 8)
    with pytest.raises(ValueError, match="0 <= first <= most"):
        Backoff(-1, 8)


def waits(admit, fail, count):
    """The steps between the admitted ones, over ``count`` admissions, each followed by ``fail()``."""
    gaps, gap = [], 0
    while len(gaps) < count:
        if admit():
            gaps.append(gap)
            gap = 0
            fail()
        else:
            gap += 1
    return gaps


def test_the_hold_back_the_rest_and_the_exploring_steps_double_alike():
    """Each schedule waits 2, 4, 8, 8 ... while its probes fail: the same back-off under three names."""
    hold = HoldBack(wait=2, max_wait=8)
    assert waits(hold.admit, lambda: hold.verified(accepted=False), 5) == [2, 4, 8, 8, 8]

    rest = AdaptiveController(k_min=16, k_max=16, max_rest=8)
    rest.allocated(0, offered=16)  # cut to nothing: rests 1, then 2, 4, 8, 8
    rest.record(Draft(), 0)

    def asked() -> bool:
        if rest.ask():
            return True
        rest.record(Draft(), 0)
        return False

    def cut() -> None:
        rest.allocated(0, offered=16)
        rest.record(Draft(), 0)

    assert waits(asked, cut, 5) == [1, 2, 4, 8, 8]

    learner = StepCostLearner(PassCost(), explore_every=2, explore_most=8, min_outcomes=1.0, refusals=1.0)
    learner.observe(rows=2, batch=2, tokens=0, drafting=0, seconds=1.0, committed=2, refused=True)  # cut: held
    exploring = [learner.drafting_pays(2) for _ in range(30)]
    gaps = [i for i, explored in enumerate(exploring) if explored]
    assert [b - a - 1 for a, b in zip([-1, *gaps], gaps)] == [1, 3, 7, 7, 7]  # held steps before each exploring one
    assert learner.holds == 30 - len(gaps)


def test_a_success_starts_each_schedule_again():
    hold = HoldBack(wait=2, max_wait=8)
    waits(hold.admit, lambda: hold.verified(accepted=False), 2)
    assert hold.wait == 8 and [hold.admit() for _ in range(9)][-1] is True
    hold.verified(accepted=True)
    assert hold.wait == 2
    rest = AdaptiveController(k_min=16, k_max=16, max_rest=8)
    for _ in range(3):
        rest.allocated(0, offered=16)
    assert rest.rest == 8
    rest.allocated(3, offered=16)
    assert rest.rest == 1
