"""The batch drafting policy: one goodput allocation over every (row, position) slot."""

from __future__ import annotations

import doctest

import pytest

import grammarspec.policy
from grammarspec.policy import Calibration, allocate, plan_drafts, survival
from proposers.base import Draft
from proposers.cost import PassCost, flat_until


def goodput(estimates, lengths, cost, base_rows):
    tokens = len(estimates) + sum(sum(survival(e)[:k]) for e, k in zip(estimates, lengths))
    return tokens / cost(base_rows + sum(lengths))


def test_docstring_examples_hold():
    assert doctest.testmod(grammarspec.policy).failed == 0


def test_allocation_is_the_best_over_every_prefix_allocation():
    """Brute force on two rows: no per-row choice of prefix lengths beats the allocation."""
    cost = PassCost().cost
    estimates = [[0.95, 0.9, 0.4, 0.9], [0.6, 0.3, 0.9]]
    chosen = allocate(estimates, cost, base_rows=2)
    best = max(goodput(estimates, [a, b], cost, 2) for a in range(5) for b in range(4))
    assert goodput(estimates, chosen, cost, 2) == pytest.approx(best)


def test_drafts_shrink_as_the_batch_grows_on_a_cpu_curve():
    cost = PassCost(1.47, 0.052, 4).cost  # 16 rows = 2.3 plain steps, 64 rows = 4.8 (BENCHMARKS.md)
    row = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3]
    per_row = [sum(allocate([row] * b, cost, base_rows=b)) / b for b in (1, 4, 16, 64)]
    assert per_row == sorted(per_row, reverse=True) and per_row[0] > per_row[-1]
    assert allocate([[0.3, 0.3]] * 64, cost, base_rows=64) == [0] * 64  # k = 0 is an ordinary outcome


def test_the_same_estimates_draft_longer_on_a_flat_gpu_curve():
    cpu, gpu = PassCost(1.47, 0.052, 4).cost, flat_until(64).cost
    row = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3]
    for b in (1, 4, 8):
        assert sum(allocate([row] * b, gpu, b)) > sum(allocate([row] * b, cpu, b))
    assert allocate([row] * 8, gpu, 8) == [7] * 8  # 64 rows fit in the flat part


def test_forced_tokens_are_always_taken():
    cost = PassCost().cost
    assert allocate([[0.1, 0.1, 0.1]], PassCost(1.0, 0.2, 1).cost, base_rows=1, forced=[2]) == [2]
    with pytest.raises(ValueError, match="one per row"):
        allocate([[0.5]], cost, 1, forced=[1, 1])


def test_plan_drafts_takes_jump_forward_text_and_fixed_rows_whole():
    from grammarspec.adaptive import AdaptiveController

    cost = PassCost().cost
    forced = Draft(tokens=(1, 2, 3), sources=("jump_forward", "jump_forward", "schema_ngram"))
    fixed = Draft(tokens=(4, 5, 6, 7), sources=("prompt_lookup",) * 4)
    c = AdaptiveController()
    for _ in range(40):
        c.record(forced, 0)  # the guess after the forced text never survives
    lengths = plan_drafts([forced, fixed], [c, AdaptiveController(adaptive=False)], base_rows=2, cost=cost)
    assert lengths == [2, 4]


def test_calibration_tells_openings_from_followers_and_uses_the_proposers_estimate():
    c = Calibration()
    hi = Draft(tokens=(1, 2), sources=("lookup",) * 2, confidence=(0.95, 0.95))
    lo = Draft(tokens=(1, 2), sources=("lookup",) * 2, confidence=(0.1, 0.95))
    assert c.estimate(hi)[0] > c.estimate(lo)[0]
    for _ in range(30):
        c.update(hi, 2)
        c.update(lo, 0)
    assert c.estimate(hi)[0] > 0.9 and c.estimate(lo)[0] < 0.1
    with pytest.raises(ValueError, match="between 0"):
        c.update(hi, 3)
