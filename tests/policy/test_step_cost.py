"""The server's step cost, learned from the steps it runs (grammarspec/policy/step_cost.py).

The learner must recover what steps really cost, hand the policy a cost on
which it drafts nothing that does not pay (drafted steps far dearer than the
profile says) and still drafts long where drafted steps are cheap (a flat
curve), fall back to the profile once its evidence of drafted steps has
faded, and change nothing but draft lengths in the loop.

The loop's steps are timed by a fake clock (tests/clocks.py: ``StepCostLearner(clock=...)``), so what the learner
hears, and so what it decides, never depends on the machine's speed or load.
"""

from __future__ import annotations

import doctest
import random

import numpy as np
import pytest

import grammarspec.policy.step_cost
from grammarspec.engine.decoding import DecodeConfig, RowRequest, decode, decode_batch, sampling_processing
from grammarspec.policy.adaptive import AdaptiveController
from grammarspec.policy.step_cost import StepCost, StepCostLearner, priced_rows
from proposers.base import Request
from proposers.cost import PassCost, flat_until
from tests.clocks import FakeClock
from tests.helpers import batch_row, load_tool
from tests.proposer_fakes import ScriptFollower
from tests.toy import toy_vocab_size
from tests.toy_models import ToyCausalLM

UNIT = 0.02  # seconds of a plain 1-row step in the simulated machines
#: Clock reads per step of the loop (the lap timer's start and its six phases): a clock that ticks ``t`` a read
#: times every step at ``LAPS * t`` seconds.
LAPS = 6


def step_clock(seconds: float) -> FakeClock:
    """A clock by which every step of the loop takes ``seconds``."""
    return FakeClock(tick=seconds / LAPS)


def test_docstring_examples_hold():
    assert doctest.testmod(grammarspec.policy.step_cost).failed == 0


def true_seconds(u, h, s, p, q, curve, rows, batch, tokens, drafting):
    switched = tokens > 0 and batch > 1
    spread = max(0, drafting - 1) if switched else 0
    return u * curve.cost(rows) + h * batch + s * switched + p * tokens + q * spread


def drafted_excess(cost, batch, tokens, drafting):
    """What a packed step of ``batch`` rows verifying ``tokens`` draft tokens on ``drafting`` rows costs beyond
    the plain step, on ``cost`` (the policy's reading of it)."""
    spread = cost.per_draft_row * (drafting - 1)
    return cost.cost(batch + tokens) + cost.switch + cost.per_token * tokens + spread - cost.cost(batch)


def test_the_learner_recovers_every_term_from_mixed_steps():
    curve = PassCost(1.2, 0.04, 2)
    truth = (UNIT, 0.001, 0.05, 0.002, 0.004)  # seconds: unit, per stepping row, switch, per token, per drafting row
    learner = StepCostLearner(PassCost(1.2, 0.04, 2, switch=0.5, per_token=0.01, per_draft_row=0.02))
    rng = random.Random(0)
    for _ in range(400):
        batch = rng.randint(1, 16)
        drafting = rng.choice([0, 0, 1, 2, min(batch, 4)]) if batch > 1 else rng.choice([0, 1])
        tokens = sum(rng.randint(1, 6) for _ in range(drafting))
        seconds = true_seconds(*truth, curve, batch + tokens, batch, tokens, drafting)
        seconds += 0.003 * tokens if batch == 1 else 0.0  # a lone row's chain: 5 ms a token, not 2
        learner.observe(rows=batch + tokens, batch=batch, tokens=tokens, drafting=drafting, seconds=seconds)
    terms = learner.terms()
    assert terms["learned"] and terms["steps"] == 400
    expected = {"unit_ms": 20.0, "per_batch_row": 0.05, "switch": 2.5, "per_token": 0.1, "per_draft_row": 0.2}
    expected["per_token_alone"] = 0.25
    for name, value in expected.items():
        assert terms[name] == pytest.approx(value, rel=0.1), (name, terms)
    assert terms["profile"] == {"switch": 0.5, "per_token": 0.01, "per_draft_row": 0.02}


def test_before_its_warm_up_the_learner_is_the_profile_and_it_calls_a_profile_factory_once():
    calls = []
    profile = PassCost(switch=0.3)

    def factory():
        calls.append(1)
        return profile

    learner = StepCostLearner(factory, warmup=4)
    assert calls == []  # nothing is profiled before a step needs it
    assert learner.cost(4) is profile and calls == [1]
    for _ in range(3):
        learner.observe(rows=4, batch=4, tokens=0, drafting=0, seconds=0.05)
    assert learner.cost(4) is profile and not learner.terms()["learned"]
    learner.observe(rows=4, batch=4, tokens=0, drafting=0, seconds=0.05)
    assert isinstance(learner.cost(4), StepCost) and learner.terms()["learned"] and calls == [1]
    with pytest.raises(ValueError, match="decay"):
        StepCostLearner(profile, decay=0.0)


def test_a_fit_solved_every_few_steps_prices_as_one_solved_every_step():
    """Steps are folded into the normal equations in blocks and the fit is solved when read and due: the
    same terms as solving after every step (the folded sums equal the step-by-step ones), and between refits
    ``cost`` reads the last fit."""
    rng = random.Random(1)
    steps = []
    for _ in range(300):
        batch = rng.randint(1, 16)
        drafting = rng.choice([0, 1, min(batch, 3)]) if batch > 1 else rng.choice([0, 1])
        tokens = sum(rng.randint(1, 5) for _ in range(drafting))
        steps.append((batch, tokens, drafting, 0.02 * (1 + 0.05 * batch + 0.3 * (tokens > 0)) + 0.001 * tokens))
    eager, lazy = StepCostLearner(PassCost(), refit_every=1), StepCostLearner(PassCost(), refit_every=8)
    for i, (batch, tokens, drafting, seconds) in enumerate(steps):
        for learner in (eager, lazy):
            learner.observe(rows=batch + tokens, batch=batch, tokens=tokens, drafting=drafting, seconds=seconds)
        eager.cost(4)
        if i == 100:
            held = lazy.cost(4)  # solved now ...
        elif 100 < i < 107:
            assert lazy.cost(4) == held  # ... and read again until 8 steps came in
    for name, value in eager.terms().items():
        if isinstance(value, float):
            assert lazy.terms()[name] == pytest.approx(value, rel=1e-6, abs=1e-9), name
    read_lazily, read_eagerly = lazy.cost(8), eager.cost(8)  # terms() solved both on every step in
    for name in ("batch_share", "switch", "per_token", "per_draft_row"):
        assert getattr(read_lazily, name) == pytest.approx(getattr(read_eagerly, name), rel=1e-6, abs=1e-12), name
    with pytest.raises(ValueError, match="refit_every"):
        StepCostLearner(PassCost(), refit_every=0)


def test_priced_rows_counts_the_rows_the_policy_prices():
    assert priced_rows([1, 1, 1, 1], packed=True) == priced_rows([1, 1, 1, 1], packed=False) == 4
    assert priced_rows([1, 5, 1], packed=True) == 7 and priced_rows([1, 5, 1], packed=False) == 15
    assert priced_rows([6], packed=True) == 6


def simulated(machine, profile, policy, batch, survival, steps):
    """tools/step_cost_replay.py's modelled server: the policy plans packed drafts every step as the loop does
    (probes included), the rows' drafts survive token by token, the learner hears the machine's seconds."""
    return replay_tool().simulate(machine, profile, policy, batch, survival, steps)


def replay_tool():
    return load_tool("step_cost_replay")


def test_drafted_steps_dearer_than_the_profile_says_are_learned_and_drafting_stops():
    """The profile says a drafted step of 8 rows costs about 1.3 plain steps; this machine's cost 7 (a server
    whose drafted ragged pass costs several plain ones).  Drafts that survive at 0.8 pay on the profile, not here."""
    profile = flat_until(64, switch=0.2, per_token=0.01)

    def machine(batch, tokens, drafting):
        return UNIT * (1 + (6 if tokens and batch > 1 else 0) + 0.01 * tokens)

    on_profile = simulated(machine, profile, "profile", 8, 0.8, 100)
    assert min(on_profile["admitted"][20:]) > 8  # the profile's policy drafts at every step
    learned = simulated(machine, profile, "learned", 8, 0.8, 300)
    learner = learned["learner"]
    assert learner.probes >= 1  # every step drafted: the learner asked for a plain one to tell the unit apart
    assert sum(learned["admitted"][:8]) > 0  # the warm-up drafted on the profile: the evidence it needed
    assert sum(learned["admitted"][50:]) == 0  # once learned, no step drafts
    assert drafted_excess(profile, 8, 24, 8) < 0.5 and drafted_excess(learner.cost(8), 8, 24, 8) > 3
    none = simulated(machine, profile, "none", 8, 0.8, 300)
    assert learned["tokens"] / learned["seconds"] > 1.5 * on_profile["tokens"] / on_profile["seconds"]
    rate = replay_tool()._rate  # tokens per modelled second from a step on
    assert rate(learned, 150) >= 0.99 * rate(none, 150)  # once learned, as fast as no drafting
    assert learned["tokens"] / learned["seconds"] > 0.85 * none["tokens"] / none["seconds"]  # the warm-up's price


def test_on_a_flat_curve_with_cheap_drafted_steps_the_learned_policy_still_drafts_long():
    profile = flat_until(64, switch=0.05, per_token=0.01)

    def machine(batch, tokens, drafting):  # a GPU: drafted steps near a plain one
        return UNIT * (1 + 0.01 * batch + (0.1 if tokens and batch > 1 else 0) + 0.005 * tokens + 0.002 * drafting)

    learned = simulated(machine, profile, "learned", 3, 1.0, 200)  # drafts that always survive; 3 rows of 17 fit
    assert set(learned["admitted"][-100:]) == {0, 48} and learned["admitted"][-100:].count(0) <= 2  # rare probes
    assert learned["learner"].terms()["switch"] == pytest.approx(0.1, abs=0.05)


def test_evidence_of_dear_drafted_steps_fades_and_the_profile_returns():
    profile = flat_until(64, switch=0.2, per_token=0.01)
    learner = StepCostLearner(profile)
    for _ in range(100):
        learner.observe(rows=8, batch=8, tokens=0, drafting=0, seconds=UNIT)
        learner.observe(rows=12, batch=8, tokens=4, drafting=2, seconds=7 * UNIT)
    assert drafted_excess(learner.cost(8), 8, 4, 2) == pytest.approx(6.0, rel=0.1)
    for _ in range(1500):  # no row drafts: only plain steps come
        learner.observe(rows=8, batch=8, tokens=0, drafting=0, seconds=UNIT)
    assert drafted_excess(learner.cost(8), 8, 4, 2) < 1.0  # back near the profile's: the server tries drafting again


def test_the_loop_with_a_learner_changes_no_output_and_learns_only_from_steps_that_could_draft(grammars):
    model = ToyCausalLM(toy_vocab_size(), seed=3)
    config = DecodeConfig(max_new_tokens=30, eos_token_ids=(0,))
    prompts = [[2, 3], [2, 5, 9, 4, 7], [6]]
    alone = [decode(model, p, config, matcher=g.matcher())[0] for p, g in zip(prompts, grammars)]
    requests = [
        batch_row(p, g.matcher(), ScriptFollower(out, 3), 4, config) for p, g, out in zip(prompts, grammars, alone)
    ]
    seen = []
    learner = StepCostLearner(PassCost(), warmup=1, clock=step_clock(0.01))
    rows = decode_batch(model, requests, config, cost_learner=learner, on_step=lambda rows, kv: seen.append(1))
    assert [row.generated for row in rows] == alone
    assert learner.steps == len(seen) >= 1 and learner.terms()["learned"]
    assert learner.clock.reads >= (LAPS + 1) * learner.steps  # the loop timed its steps by the learner's clock
    calls = []
    plain = StepCostLearner(lambda: calls.append(1) or PassCost(), clock=step_clock(0.01))
    requests = [batch_row(p, g.matcher(), None, 0, config) for p, g in zip(prompts, grammars)]
    rows = decode_batch(model, requests, config, cost_learner=plain)
    assert [row.generated for row in rows] == alone
    assert plain.steps == 0 and calls == []  # no row could draft: nothing to price, nothing profiled


def test_the_engine_and_the_cli_refuse_an_unknown_step_cost(capsys):
    from grammarspec.cli.main import main
    from grammarspec.serve import Engine

    with pytest.raises(ValueError, match="learned, profile"):
        Engine(None, None, step_cost="measured")
    with pytest.raises(SystemExit):
        main(["serve", "--step-cost", "measured"])
    assert "--step-cost" in capsys.readouterr().err


def test_the_replay_tool_prints_its_modelled_table(capsys):
    module = replay_tool()
    assert module.main(["--steps", "60", "--batch", "4", "--survival", "0.8"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Modelled") and "| h200 | 4 | 0.8 |" in out and "| gpu-flat | 4 | 0.8 |" in out
    with pytest.raises(ValueError, match="none, profile, learned"):
        module.simulate(module.h200, module.H200_PROFILE, "fixed", 4, 0.8, 10)


class CountingFollower(ScriptFollower):
    """A scripted proposer that counts the tokens it was asked for."""

    asked = 0

    def propose(self, context, grammar, k):
        self.asked += k
        return super().propose(context, grammar, k)


def adaptive_row(prompt, matcher, proposer, config) -> RowRequest:
    """A decode_batch row whose controller adapts (the policy, and the learner's hold, may cut its drafts)."""
    proposer.start(Request(prompt_ids=tuple(prompt), tokenizer=None))
    controller = AdaptiveController(k_min=4, k_max=4)
    return RowRequest(prompt, matcher, proposer, controller, sampling_processing(config, (), len(prompt)))


@pytest.mark.parametrize("cost, proposes", [(PassCost(1.2, 0.1, 1, per_token=2.0), False), (flat_until(64), True)])
def test_where_not_even_certain_drafts_could_pay_no_proposer_is_asked(grammars, cost, proposes):
    """Host work a token dearer than the batch's share of a pass: the loop asks no proposer (their drafts would be
    cut whole); on a flat curve the same rows draft.  Outputs are the same either way."""
    model = ToyCausalLM(toy_vocab_size(), seed=3)
    config = DecodeConfig(max_new_tokens=30, eos_token_ids=(0,))
    prompts = [[2, 3], [2, 5, 9, 4, 7], [6]]
    alone = [decode(model, p, config, matcher=g.matcher())[0] for p, g in zip(prompts, grammars)]
    proposers = [CountingFollower(out) for out in alone]
    requests = [adaptive_row(p, g.matcher(), proposer, config) for p, g, proposer in zip(prompts, grammars, proposers)]
    rows = decode_batch(model, requests, config, step_cost=cost)
    assert [row.generated for row in rows] == alone
    asked = sum(p.asked for p in proposers)
    accepted = sum(sum(row.stats.accepted.values()) for row in rows)
    if proposes:
        assert asked > 0 and accepted > 0
    else:
        assert asked == 0 and accepted == 0


@pytest.mark.parametrize("max_rest", [32, 0])
def test_rows_whose_drafts_are_cut_to_nothing_rest_their_proposers(max_rest):
    """Drafts that never survive: once the records say so, the policy cuts them to nothing, and each row's
    proposer is asked ever more rarely (1, 2, 4, ... steps of rest).  Outputs are unchanged."""
    model = ToyCausalLM(toy_vocab_size(), seed=3)
    config = DecodeConfig(max_new_tokens=30, eos_token_ids=(0,))
    prompts = [[2, 3], [2, 5, 9, 4, 7], [6]]
    alone = [decode(model, p, config)[0] for p in prompts]  # free text: every token a target pass
    never = next(t for t in range(1, toy_vocab_size()) if not any(t in out for out in alone))
    proposers = [CountingFollower([never] * 64) for _ in prompts]  # a token the target never writes here
    requests = []
    for prompt, proposer in zip(prompts, proposers):
        proposer.start(Request(prompt_ids=tuple(prompt), tokenizer=None))
        requests.append(
            RowRequest(
                prompt,
                None,
                proposer,
                AdaptiveController(k_min=4, k_max=4, max_rest=max_rest),
                sampling_processing(config, (), len(prompt)),
            )
        )
    rows = decode_batch(model, requests, config, step_cost=PassCost(1.2, 0.1, 1))  # a long shot does not pay
    assert [row.generated for row in rows] == alone
    steps = sum(row.stats.target_forwards for row in rows)
    calls = sum(p.calls for p in proposers)
    assert steps >= 60
    if max_rest:
        assert 0 < calls < steps / 2, (calls, steps)  # asked at first, then rested
    else:
        assert calls >= steps - len(prompts)  # asked at every step but each row's first (its prompt's pass)


def test_drafting_is_held_off_at_a_batch_size_where_drafted_steps_committed_fewer_tokens_a_second():
    """However the model prices it, a drafted step that commits fewer tokens a second than a plain one at the
    same batch size loses: the learner holds drafting off there, save an exploring step after ``explore_every``
    held steps, then after twice as many each time, up to ``explore_most``."""
    learner = StepCostLearner(PassCost(), explore_every=4, explore_most=8)
    for _ in range(20):
        learner.observe(rows=8, batch=8, tokens=0, drafting=0, seconds=0.07, committed=8)  # 114 tokens a second
        learner.observe(rows=12, batch=8, tokens=4, drafting=1, seconds=0.09, committed=9)  # 100
        learner.observe(rows=2, batch=2, tokens=0, drafting=0, seconds=0.04, committed=2)  # 50
        learner.observe(rows=6, batch=2, tokens=4, drafting=1, seconds=0.06, committed=5)  # 83
    explored = [learner.drafting_pays(8) for _ in range(28)]
    assert [i for i, pays in enumerate(explored) if pays] == [3, 11, 19, 27]  # after 4 held steps, then 8 (most)
    assert learner.holds == 24 and learner.terms()["holds"] == 24
    assert all(learner.drafting_pays(2) for _ in range(8))  # at batch 2 drafting wins
    assert learner.drafting_pays(4)  # no outcome at batch 4 yet: drafting is allowed
    outcomes = learner.outcomes()
    assert outcomes[(8, "")]["plain"] == pytest.approx(8 / 0.07)
    assert outcomes[(8, "")]["drafted"] == pytest.approx(100.0)
    for _ in range(60):  # drafted steps at batch 8 now win: the hold lifts
        learner.observe(rows=12, batch=8, tokens=4, drafting=1, seconds=0.06, committed=10)
    assert all(learner.drafting_pays(8) for _ in range(8))
    fresh = StepCostLearner(PassCost())
    fresh.observe(rows=8, batch=8, tokens=4, drafting=1, seconds=1.0, committed=8)
    assert fresh.drafting_pays(8)  # one step of each is not evidence
    with pytest.raises(ValueError, match="explore_every"):
        StepCostLearner(PassCost(), explore_every=0)
    with pytest.raises(ValueError, match="explore_most"):
        StepCostLearner(PassCost(), explore_every=16, explore_most=8)


def test_a_hold_explores_ever_more_rarely_while_it_stands_and_each_kind_of_rows_has_its_own_record():
    """While drafted steps keep losing, the hold's exploring steps come after 16, 32, then ``explore_most`` held
    steps: traffic that no draft survives pays for about one drafted step in ``explore_most``, not one in 16.
    Rows of another kind at the same batch size have a record of their own, so a hold on free text does not
    hold constrained rows."""
    learner = StepCostLearner(PassCost(), explore_every=16, explore_most=64, min_outcomes=8.0)
    for _ in range(12):  # free rows: drafted steps lose
        learner.observe(rows=16, batch=16, tokens=0, drafting=0, seconds=0.10, committed=16, kind="free")
        learner.observe(rows=20, batch=16, tokens=4, drafting=2, seconds=0.13, committed=17, kind="free")
    drafted = 0
    for _ in range(2000):  # every step asks; drafted only where allowed (with the same loss)
        if learner.drafting_pays(16, "free"):
            drafted += 1
            learner.observe(rows=20, batch=16, tokens=4, drafting=2, seconds=0.13, committed=17, kind="free")
        else:
            learner.observe(rows=16, batch=16, tokens=0, drafting=0, seconds=0.10, committed=16, kind="free")
    assert 2000 / 64 <= drafted <= 2000 / 64 + 4  # exploring at the widest interval, not one step in 16
    assert learner.drafting_pays(16, "constrained")  # another kind of rows: no record, drafting allowed
    assert learner.drafting_pays(16, "mixed")


def test_drafted_steps_that_only_break_even_are_held_and_a_gain_beyond_the_noise_is_not():
    """Drafting must show a gain: drafted steps whose tokens a second tie the plain steps' (within noise) are
    held, at any batch size; drafted steps that beat them by more than the noise keep drafting."""
    rng = np.random.default_rng(0)
    tie, gain = StepCostLearner(PassCost()), StepCostLearner(PassCost())
    for _ in range(40):
        for learner, committed in ((tie, 5), (gain, 6)):  # 80 tokens a second plain, 80 or 96 drafted (mean)
            plain_s, drafted_s = 0.05 * rng.uniform(0.9, 1.1), 0.0625 * rng.uniform(0.9, 1.1)
            learner.observe(rows=4, batch=4, tokens=0, drafting=0, seconds=plain_s, committed=4)
            learner.observe(rows=8, batch=4, tokens=4, drafting=2, seconds=drafted_s, committed=committed)
    assert [tie.drafting_pays(4) for _ in range(16)] == [False] * 15 + [True]  # a tie: held, save an exploring step
    assert all(gain.drafting_pays(4) for _ in range(15))  # a gain of a fifth, beyond the noise


def test_in_the_loop_a_hold_on_free_rows_keeps_them_plain_and_leaves_constrained_rows_drafting(grammars):
    """The loop asks the learner about the rows that step together by their kind: with drafted steps of free rows
    held (their record shows a tie), free rows whose drafts would all survive draft nothing, while constrained
    rows at the same batch sizes, with no record of their own, draft and accept.  Outputs are unchanged."""
    model = ToyCausalLM(toy_vocab_size(), seed=3)
    config = DecodeConfig(max_new_tokens=30, eos_token_ids=(0,))
    prompts = [[2, 3], [2, 5, 9, 4, 7], [6]]
    learner = StepCostLearner(PassCost(), warmup=1, explore_every=1000, explore_most=1000, clock=step_clock(0.01))
    for batch in (1, 2, 3):  # free rows: drafted steps cost what plain ones do and commit no more
        for _ in range(20):
            learner.observe(rows=batch, batch=batch, tokens=0, drafting=0, seconds=0.01, committed=batch, kind="free")
            learner.observe(
                rows=batch + 4, batch=batch, tokens=4, drafting=1, seconds=0.01, committed=batch, kind="free"
            )
    free_alone = [decode(model, p, config)[0] for p in prompts]
    free = decode_batch(
        model,
        [adaptive_row(p, None, ScriptFollower(out, 3), config) for p, out in zip(prompts, free_alone)],
        config,
        cost_learner=learner,
    )
    assert [row.generated for row in free] == free_alone
    assert sum(sum(row.stats.accepted.values()) for row in free) == 0  # held: certain drafts never verified
    alone = [decode(model, p, config, matcher=g.matcher())[0] for p, g in zip(prompts, grammars)]
    constrained = decode_batch(
        model,
        [adaptive_row(p, g.matcher(), ScriptFollower(out, 3), config) for p, g, out in zip(prompts, grammars, alone)],
        config,
        cost_learner=learner,
    )
    assert [row.generated for row in constrained] == alone
    assert sum(sum(row.stats.accepted.values()) for row in constrained) > 0  # their own kind: no hold
    assert learner.holds > 0
    assert learner.outcomes()[(3, "free")]["plain"] == pytest.approx(300.0)  # the loop's steps: 10 ms by the clock


def test_where_the_policy_cuts_every_offered_draft_the_learner_holds_without_a_drafted_record():
    """Drafted steps too rare to judge, but the policy keeps cutting what the rows offer: once those steps number
    ``min_outcomes`` and ``refusals`` times the drafted ones, drafting is held at that batch size and kind (its
    exploring steps kept); not where the policy admits drafts often enough, nor for another kind.  Plain
    steps that offered nothing (held ones) leave the refusals where they are; drafted steps fade them, and the
    hold lifts."""
    learner = StepCostLearner(PassCost(), explore_every=4, explore_most=8, min_outcomes=8.0, refusals=8.0)

    def refused(learner, n):
        for _ in range(n):
            learner.observe(
                rows=16, batch=16, tokens=0, drafting=0, seconds=0.1, committed=16, kind="free", refused=True
            )

    refused(learner, 7)
    assert learner.drafting_pays(16, "free")  # seven refusals, faded: not yet evidence
    refused(learner, 3)
    held = [learner.drafting_pays(16, "free") for _ in range(12)]
    assert [i for i, pays in enumerate(held) if pays] == [3, 11]  # exploring after 4 held steps, then 8
    assert learner.holds == 10
    assert learner.drafting_pays(16, "constrained")
    assert learner.outcomes()[(16, "free")]["refused_steps"] == pytest.approx(sum(0.99**k for k in range(10)))
    for _ in range(200):  # plain steps that offered nothing: no evidence either way, the hold stays
        learner.observe(rows=16, batch=16, tokens=0, drafting=0, seconds=0.1, committed=16, kind="free")
    assert learner.outcomes()[(16, "free")]["refused_steps"] == pytest.approx(sum(0.99**k for k in range(10)))
    assert not all(learner.drafting_pays(16, "free") for _ in range(8))
    for _ in range(2):  # exploring steps whose drafts the policy admitted: drafting is let go
        learner.observe(rows=20, batch=16, tokens=4, drafting=1, seconds=0.11, committed=18, kind="free")
    assert all(learner.drafting_pays(16, "free") for _ in range(8))

    often = StepCostLearner(PassCost(), min_outcomes=8.0, refusals=8.0)
    for _ in range(5):  # the policy admits drafts on one step in four: too few drafted steps to judge, not held
        refused(often, 3)
        often.observe(rows=20, batch=16, tokens=4, drafting=1, seconds=0.11, committed=18, kind="free")
    assert often.outcomes()[(16, "free")]["refused_steps"] >= 8.0
    assert all(often.drafting_pays(16, "free") for _ in range(8)) and often.holds == 0
    with pytest.raises(ValueError, match="refusals"):
        StepCostLearner(PassCost(), refusals=0.5)


def test_a_size_too_thin_to_judge_takes_the_nearest_judged_size_s_verdict():
    """A batch size the learner has no verdict for (no record, or too few steps) borrows the verdict of the nearest
    size of the same kind whose record judges, the larger on a tie, and explores on its own schedule; a size whose
    own record judges keeps its own verdict; with nothing judged anywhere, drafting is allowed."""
    learner = StepCostLearner(PassCost(), explore_every=4, explore_most=8, min_outcomes=8.0, refusals=8.0)
    assert learner.drafting_pays(12, "free")  # nothing judged anywhere: drafting allowed
    for _ in range(10):  # at 16 rows the policy cuts every offered draft: held there
        learner.observe(rows=16, batch=16, tokens=0, drafting=0, seconds=0.1, committed=16, kind="free", refused=True)
    for _ in range(3):  # at 15 a few plain steps: too thin to judge
        learner.observe(rows=15, batch=15, tokens=0, drafting=0, seconds=0.1, committed=15, kind="free")
    for batch in (15, 9):  # both borrow 16's hold, each exploring on its own schedule (after 4 held steps)
        assert [learner.drafting_pays(batch, "free") for _ in range(5)] == [False, False, False, True, False]
    assert learner.drafting_pays(15, "constrained")  # another kind: its own (empty) record
    for i in range(10):  # at 4 rows drafted steps commit twice the tokens a second of plain ones: it drafts
        learner.observe(rows=4, batch=4, tokens=0, drafting=0, seconds=0.1, committed=4, kind="free")
        learner.observe(rows=12, batch=4, tokens=8, drafting=4, seconds=0.1, committed=8 + i % 2, kind="free")
    assert all(learner.drafting_pays(4, "free") for _ in range(8))
    assert [learner.drafting_pays(6, "free") for _ in range(4)] == [True] * 4  # nearer 4 than 16
    assert not learner.drafting_pays(10, "free")  # as near to 4 as to 16: the larger, held
    assert not learner.drafting_pays(16, "free")


def test_in_the_loop_rows_whose_offered_drafts_the_policy_always_cuts_stop_being_asked():
    """No row rests (``max_rest=0``) and every draft is a token the target never writes: once the learner's record
    shows the policy cutting them, the step is held, neither priced nor proposed for, save its exploring steps.
    A learner that never holds asks at every step.  Outputs are unchanged either way."""
    model = ToyCausalLM(toy_vocab_size(), seed=3)
    config = DecodeConfig(max_new_tokens=60, eos_token_ids=(0,))
    prompts = [[2, 3], [2, 5, 9, 4, 7], [6]]
    alone = [decode(model, p, config)[0] for p in prompts]
    never = next(t for t in range(1, toy_vocab_size()) if not any(t in out for out in alone))
    calls = {}
    for name, learner in (
        (
            "holds",
            StepCostLearner(PassCost(1.2, 0.1, 1), warmup=10**6, clock=step_clock(0.01)),
        ),  # priced by the profile
        ("never holds", StepCostLearner(PassCost(1.2, 0.1, 1), warmup=10**6, min_outcomes=1e9, clock=step_clock(0.01))),
    ):
        proposers = [CountingFollower([never] * 128) for _ in prompts]
        requests = []
        for prompt, proposer in zip(prompts, proposers):
            proposer.start(Request(prompt_ids=tuple(prompt), tokenizer=None))
            controller = AdaptiveController(k_min=4, k_max=4, max_rest=0)
            requests.append(
                RowRequest(prompt, None, proposer, controller, sampling_processing(config, (), len(prompt)))
            )
        rows = decode_batch(model, requests, config, cost_learner=learner)
        assert [row.generated for row in rows] == alone
        steps = sum(row.stats.target_forwards for row in rows)
        calls[name] = sum(p.calls for p in proposers)
        if name == "holds":
            assert learner.holds > 0
        else:
            assert learner.holds == 0
        assert sum(sum(row.stats.accepted.values()) for row in rows) == 0
    assert steps >= 60
    assert calls["never holds"] >= steps - len(prompts)  # every step but each row's first (its prompt's pass)
    assert 0 < calls["holds"] < calls["never holds"] / 2, calls


def test_on_a_flat_curve_the_learner_that_holds_on_refusals_lets_drafts_that_survive_run_long():
    """A GPU's flat pass cost and drafts that survive: the policy admits them, so no refusals pile up, nothing is
    held and the rows draft long, the same learner as the one that holds where every draft is cut."""
    model = ToyCausalLM(toy_vocab_size(), seed=3)
    config = DecodeConfig(max_new_tokens=60, eos_token_ids=(0,))
    prompts = [[2, 3], [2, 5, 9, 4, 7], [6]]
    alone = [decode(model, p, config)[0] for p in prompts]
    learner = StepCostLearner(flat_until(64), warmup=10**6, clock=step_clock(0.01))  # priced by the flat profile
    requests = [adaptive_row(p, None, ScriptFollower(out), config) for p, out in zip(prompts, alone)]
    rows = decode_batch(model, requests, config, cost_learner=learner)
    assert [row.generated for row in rows] == alone
    generated = sum(len(row.generated) for row in rows)
    passes = sum(row.stats.target_forwards for row in rows)
    assert learner.holds == 0
    assert all(o["refused_steps"] < 1 for o in learner.outcomes().values())
    assert generated / passes >= 3.0, (generated, passes)  # about four tokens a pass: drafts of k_max=4 survive
