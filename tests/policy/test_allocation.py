"""The batch drafting policy: one goodput allocation over every (row, position) slot."""

from __future__ import annotations

import doctest

import pytest

import grammarspec.policy.allocation
from grammarspec.policy.allocation import Calibration, allocate, plan_drafts, survival
from proposers.base import Draft
from proposers.cost import PassCost, flat_until


def goodput(estimates, lengths, cost, base_rows):
    tokens = len(estimates) + sum(sum(survival(e)[:k]) for e, k in zip(estimates, lengths))
    return tokens / cost(base_rows + sum(lengths))


def test_docstring_examples_hold():
    assert doctest.testmod(grammarspec.policy.allocation).failed == 0


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
    from grammarspec.policy.adaptive import AdaptiveController

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


# --- every cost a slot adds, and acceptance from evidence --------------------------------------------------

CPU = PassCost(1.2, 0.024, 16, switch=0.02, per_token=0.001)  # the shape profiled on a 2-thread CPU
GPU = flat_until(64, switch=0.05, per_token=0.01)  # a pass costs one step to 64 rows; host work per token remains
OFFERED = Draft(tokens=tuple(range(10, 26)), sources=("prompt_lookup",) * 16)


def run_rows(survives, curve, steps=40):
    """Steps of the allocation over rows whose drafts survive whole (True) or never (False); each row's controller
    learns as the loop teaches it (the verified prefix, and the first offered token judged when cut).  Returns the
    draft tokens admitted per row per step."""
    from grammarspec.policy.adaptive import AdaptiveController

    controllers = [AdaptiveController() for _ in survives]
    history = []
    for _ in range(steps):
        lengths = plan_drafts([OFFERED] * len(survives), controllers, None, curve, pending=[1] * len(survives))
        for controller, k, good in zip(controllers, lengths, survives):
            controller.allocated(k, len(OFFERED))
            accepted = k if good else 0
            next_token = OFFERED.tokens[k] if good and k < len(OFFERED) else -1
            controller.record(OFFERED.truncate(k), accepted, OFFERED, next_token=next_token)
        history.append(lengths)
    return history


@pytest.mark.parametrize("curve", [CPU, GPU], ids=["cpu", "gpu"])
@pytest.mark.parametrize("batch", [1, 2, 4, 8, 16])
def test_a_row_whose_drafts_never_survive_drafts_nothing_at_any_batch_size(curve, batch):
    alone = run_rows([False] * batch, curve)
    assert all(k == 0 for step in alone[5:] for k in step)  # a few misses are evidence enough, for good
    beside_good = run_rows([False] + [True] * (batch - 1), curve)
    assert all(step[0] == 0 for step in beside_good[5:])


def test_a_row_whose_drafts_survive_drafts_long_on_a_flat_gpu_curve_and_shorter_on_a_cpu():
    for batch in (1, 2, 3):  # 3 rows of 17 fit in the flat part
        assert run_rows([True] * batch, GPU)[-1] == [16] * batch
    for batch in (2, 3, 4):  # good but uncertain guesses: longer where wider passes cost nothing
        likely = [[0.9] * 16] * batch
        assert sum(allocate(likely, GPU, pending=[1] * batch)) > sum(allocate(likely, CPU, pending=[1] * batch)) > 0


def test_one_long_draft_widens_every_row_of_a_padded_pass():
    lone = [[0.9, 0.9]] + [[]] * 15
    assert allocate(lone, PassCost(), base_rows=16)[0] == 2  # packed: two rows for 1.7 tokens
    assert allocate(lone, PassCost(), pending=[1] * 16)[0] == 0  # padded: 16 rows a column
    assert allocate([[0.9, 0.9]] * 16, PassCost(), pending=[1] * 16) == [2] * 16  # every row fills the width
    # a tree's fixed width is room the chains fill for nothing but their host work
    assert allocate([[0.5, 0.5]] * 3, PassCost(), pending=[1] * 3, fixed=[5]) == [2, 2, 2]
    with pytest.raises(ValueError, match="base_rows .* or pending"):
        allocate([[0.5]], PassCost(), base_rows=1, pending=[1])


def test_the_switch_to_masked_rows_and_host_work_are_paid_by_what_drafts():
    row = [[0.3]]
    assert allocate(row * 4, PassCost(1.0, 0.001, 1), pending=[1] * 4) == [1] * 4
    assert allocate(row * 4, PassCost(1.0, 0.001, 1, switch=1.0), pending=[1] * 4) == [0] * 4  # 1.2 for 1 step
    assert allocate(row, PassCost(1.0, 0.001, 1, switch=1.0), pending=[1]) == [1]  # batch 1 keeps its path
    assert allocate(row, PassCost(1.0, 0.001, 1, per_token=0.5), pending=[1]) == [0]


def test_a_packed_pass_prices_each_further_drafting_row_so_drafts_gather_where_they_pay_most():
    spread = [[0.5]] * 4  # four rows with one likely token each
    flat = PassCost(1.0, 0.01, 1)
    assert allocate(spread, flat, base_rows=4) == [1] * 4
    per_row = PassCost(1.0, 0.01, 1, per_draft_row=0.2)
    assert allocate(spread, per_row, base_rows=4) == [1, 0, 0, 0]  # one row pays no further call: 4.5 / 1.05
    assert allocate(spread, per_row, pending=[1] * 4) == [1] * 4  # a padded pass has no call per row to pay
    chains = [[0.9] * 4, [0.5]] + [[]] * 2  # the second row's single token is not worth a call of its own
    assert allocate(chains, per_row, base_rows=4) == [4, 0, 0, 0]
    assert allocate(chains, flat, base_rows=4) == [4, 1, 0, 0]
    assert allocate([[0.5]], PassCost(1.0, 0.01, 1, per_draft_row=5.0), base_rows=1) == [1]  # batch 1: no call to add
    assert per_row.drafted(6, 2, batch=4, drafting=2) == pytest.approx(per_row.drafted(6, 2, batch=4) + 0.2)


def test_a_request_starts_from_its_traffics_evidence():
    from grammarspec.policy.adaptive import AdaptiveController

    recent = Calibration()
    for _ in range(50):
        recent.update(OFFERED.truncate(1), 0)  # this kind of traffic's lookups never survive
    seeded = AdaptiveController(calibration=Calibration.seeded_from(recent))
    assert plan_drafts([OFFERED], [seeded], None, GPU, pending=[1]) == [0]
    cold = AdaptiveController()  # no evidence: drafts only where a long shot pays
    assert plan_drafts([OFFERED], [cold], None, GPU, pending=[1])[0] >= 8
    assert (
        plan_drafts([OFFERED] * 16, [AdaptiveController() for _ in range(16)], None, CPU, pending=[1] * 16) == [0] * 16
    )
    forced = Draft(tokens=(1, 2) + OFFERED.tokens[:4], sources=("jump_forward",) * 2 + ("prompt_lookup",) * 4)
    assert (
        plan_drafts([forced] * 16, [AdaptiveController() for _ in range(16)], None, CPU, pending=[1] * 16) == [2] * 16
    )  # grammar-forced text is always tried, so a cold row gathers evidence


@pytest.mark.parametrize("seed", range(40))
def test_the_ceiling_says_drafts_could_pay_exactly_when_certain_drafts_would_be_admitted(seed):
    """``drafts_could_pay`` reads only the ends of the curve's linear pieces; ``allocate`` over drafts that all
    survive tries every slot.  Without ``per_draft_row`` (the one term the ceiling leaves out) they agree."""
    import random

    from grammarspec.policy.allocation import drafts_could_pay
    from grammarspec.policy.step_cost import StepCost

    rng = random.Random(seed)
    table = {1: 1.0}
    rows, value = 1, 1.0
    for _ in range(rng.randint(0, 6)):
        rows, value = rows + rng.randint(1, 12), value + rng.uniform(0.0, 1.5)
        table[rows] = value
    curve = PassCost(
        1.2,
        rng.uniform(0.0, 0.3),
        rng.randint(1, 6),
        switch=rng.uniform(0, 2),
        per_token=rng.uniform(0, 0.6),
        table=table if rng.random() < 0.7 else None,
    )
    batch = rng.randint(1, 12)
    cost = (
        curve if rng.random() < 0.5 else StepCost(curve, rng.uniform(0, 0.2), batch, curve.switch, curve.per_token, 0.0)
    )
    asks = [rng.choice([0, 1, 3, 8, 16]) for _ in range(batch)]
    pending = [rng.choice([1, 1, 2]) for _ in range(batch)]
    certain = [[1.0] * a for a in asks]
    for packed in (True, False):
        if packed and batch > 1:
            admitted = allocate(certain, cost, sum(pending))
        else:
            admitted = allocate(certain, cost, None, pending=pending)
        assert drafts_could_pay(cost, asks, pending, packed=packed) == (sum(admitted) > 0), (packed, asks, admitted)


def test_the_ceiling_refuses_dear_tokens_at_a_large_batch_and_not_on_a_flat_curve():
    from grammarspec.policy.allocation import drafts_could_pay

    dear = PassCost(1.47, 0.052, 4, per_token=0.3)  # a token's host work above a row's share of a 16-row pass
    assert not drafts_could_pay(dear, [16] * 16, [1] * 16, packed=True)
    assert drafts_could_pay(dear, [16], [1], packed=True)  # alone, certain tokens pay
    assert drafts_could_pay(flat_until(64, per_token=0.01), [16] * 16, [1] * 16, packed=True)
    assert not drafts_could_pay(PassCost(), [0] * 4, [1] * 4, packed=True)  # nothing asked for
    with pytest.raises(ValueError, match="one per row"):
        drafts_could_pay(PassCost(), [1], [1, 1], packed=True)


def test_admitted_tokens_that_survive_less_than_expected_lower_the_rows_estimates_and_never_raise_them():
    """The winner's curse: the tokens the policy chose by their estimates are audited against what survived
    (forced tokens and the judged token past the cut are not the policy's choice), and a row whose chosen tokens
    fell short drafts less; one whose tokens did better is left to its records."""
    from grammarspec.policy.adaptive import AdaptiveController

    forced = Draft(tokens=(1, 2) + OFFERED.tokens[:6], sources=("jump_forward",) * 2 + ("prompt_lookup",) * 6)
    c = AdaptiveController()
    c.record(forced.truncate(2), 2, forced, next_token=forced.tokens[2])  # forced only, then the judged token
    assert c.calibration.bias() == 1.0  # nothing the policy chose by the estimates
    first = c.calibration.estimate(forced)[2]
    c.record(forced, 2, forced, next_token=7)  # all six chosen tokens rejected
    assert c.calibration.bias() == pytest.approx(2.0 / (2.0 + first))  # prior_weight 2, the first did not survive

    def admitted(audits):
        controller = AdaptiveController()
        for _ in range(20):
            controller.calibration.update(OFFERED.truncate(4), 3)  # the same records for both rows
        for estimate, survived in audits:
            controller.calibration.audit(estimate, survived)
        return plan_drafts([OFFERED], [controller], None, CPU, pending=[1])[0]

    fair = admitted([])
    assert 0 < fair
    assert admitted([(0.9, False)] * 20) < fair  # the chosen tokens survived far below their estimates
    assert admitted([(0.5, True)] * 20) == fair  # above them: never raised
    with pytest.raises(ValueError, match="between 0 and 1"):
        c.calibration.audit(2.0, True)


def test_one_long_confident_draft_that_fails_at_once_does_not_stop_a_row_drafting():
    """A draft is one guess however long: a 15-token draft the records were sure of, rejected at its first
    token, lowers the row's bias as one wrong guess does, and the row's other source is still admitted."""
    from grammarspec.policy.adaptive import AdaptiveController

    lookup = OFFERED.truncate(4)
    c = AdaptiveController()
    c.record(lookup, 4)  # the row's prompt lookup was right once
    c.record(lookup, 0)  # and wrong once
    before = plan_drafts([lookup], [c], None, CPU, pending=[1])[0]
    assert before == 4
    wrong = Draft(tokens=tuple(range(100, 115)), sources=("suffix",) * 15, confidence=(0.99,) * 15)
    c.record(wrong, 0)  # then another source's confident guess, wrong from its first token
    assert c.calibration.bias() > 0.6  # three guesses and the prior's two, one of them wrong
    assert plan_drafts([lookup], [c], None, CPU, pending=[1])[0] == before


def test_a_static_batch_values_tokens_by_the_finishing_time_they_save():
    """Rows with one record share the batch's end (each token worth one); a row far ahead saves only its own
    row of the curve; batch 1 and a curve through the origin change nothing."""
    from grammarspec.policy.allocation import finishing_worth

    line = PassCost(1.0, 0.1, 1)  # cost(rows) = 1 + 0.1 * rows: beta 0.1, alpha 1
    assert finishing_worth([50] * 6, [3] * 6, [20] * 6, line) == [1.0] * 6
    assert finishing_worth([50], [0], [0], line) == [1.0]
    assert finishing_worth([50, 10, 10], [0] * 3, [5] * 3, lambda rows: 0.1 * rows) == [1.0] * 3
    ahead = finishing_worth([50, 10, 10, 10], [0] * 4, [5] * 4, line)  # no drafts so far: the first row ends it
    assert ahead[0] == pytest.approx(4 / 1.4 * (0.1 + 1.0)) and ahead[1:] == [pytest.approx(4 / 1.4 * 0.1)] * 3
    assert sum(ahead) == pytest.approx(4 / 1.4 * (4 * 0.1 + 1.0))  # the step's whole cost, shared out
    # the same lead is within reach of a row whose drafts have been parting it from the others
    assert finishing_worth([20, 17, 17, 17], [60] * 4, [20] * 4, line) == [1.0] * 4
    assert finishing_worth([20, 17, 17, 17], [0] * 4, [20] * 4, line)[1] < 1.0
    fast = finishing_worth([50, 50], [0, 40], [20, 20], line)  # the same tokens left, one row much faster
    assert fast[0] > 1.0 > fast[1]
    gpu = finishing_worth([50, 10], [0, 0], [5, 5], flat_until(64))  # flat: a row ahead saves nothing
    assert gpu[1] == 0.0 and gpu[0] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="one of each per row"):
        finishing_worth([50, 10], [0], [5, 5], line)


def test_the_allocation_weighs_each_rows_slots_by_their_worth():
    """Brute force on two rows with unequal worth: no choice of prefix lengths beats the allocation."""
    cost = PassCost().cost
    estimates, worth = [[0.95, 0.9, 0.4, 0.9], [0.6, 0.3, 0.9]], [0.3, 2.5]

    def value(lengths):
        tokens = 2 + sum(w * sum(survival(e)[:k]) for e, k, w in zip(estimates, lengths, worth))
        return tokens / cost(2 + sum(lengths))

    chosen = allocate(estimates, cost, base_rows=2, worth=worth)
    assert value(chosen) == pytest.approx(max(value([a, b]) for a in range(5) for b in range(4)))
    assert chosen != allocate(estimates, cost, base_rows=2)
    assert allocate(estimates, cost, base_rows=2, worth=[1.0, 1.0]) == allocate(estimates, cost, base_rows=2)
    rows = [[0.8, 0.8]] * 8
    assert allocate(rows, PassCost(), 8, worth=[6.9] + [0.16] * 7) == [2] + [0] * 7
    assert sum(allocate(rows, PassCost(), pending=[1] * 8, worth=[6.9] + [0.0] * 7)) == 2  # worthless rows take none
    with pytest.raises(ValueError, match="one worth"):
        allocate(rows, PassCost(), 8, worth=[1.0])
