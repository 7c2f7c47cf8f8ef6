"""The per-request holder of the drafting policy: what it asks for, what it learns."""

from __future__ import annotations

import doctest

import pytest

import grammarspec.policy.adaptive
from grammarspec.policy.adaptive import AdaptiveController
from proposers.base import Draft


def test_docstring_examples_hold():
    assert doctest.testmod(grammarspec.policy.adaptive).failed == 0


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


def test_a_cheap_drafter_cut_inside_is_asked_for_twice_the_cut_plus_two():
    c = AdaptiveController(k_min=16, k_max=16)
    asked = []
    for admitted, offered in [(3, 16), (8, 8), (0, 16), (5, 9), (16, 16)]:
        asked.append(c.ask())
        c.allocated(admitted, offered)
        c.record(Draft(), 0)
        if not admitted:
            asked.append(c.ask())  # the step after a cut to nothing: rested
            c.record(Draft(), 0)
    # after 3 of 16: 8; all 8 admitted: the cap; cut to nothing (the estimates' doing): a rest, then the cap;
    # 5 of 9: 12
    assert asked == [16, 8, 16, 0, 16, 12] and c.ask() == 16
    c.allocated(4)  # a tree: verified whole, never a cut
    assert c.ask() == 16


def _lookup(*tokens):
    return Draft(tokens=tokens, sources=("prompt_lookup",) * len(tokens))


def test_the_first_cut_token_is_judged_by_the_targets_own_token():
    offered = _lookup(7, 8, 9)
    fresh = AdaptiveController().estimates(offered)[0]
    right, wrong, blind = AdaptiveController(), AdaptiveController(), AdaptiveController()
    for _ in range(10):  # the policy cut the draft to nothing each time
        right.record(Draft(), 0, offered, next_token=7)
        wrong.record(Draft(), 0, offered, next_token=5)
        blind.record(Draft(), 0)  # without the observation nothing is learned
    assert right.estimates(offered)[0] > fresh + 0.3
    assert wrong.estimates(offered)[0] < fresh / 4  # the prior expects little; ten misses expect less
    assert blind.estimates(offered) == AdaptiveController().estimates(offered)
    assert right.plain_steps == 10 and right.speculative_steps == 0  # still plain steps in the statistics


def test_the_cut_token_is_judged_only_after_every_verified_token_was_accepted():
    offered = Draft(tokens=(7, 8, 9), sources=("prompt_lookup", "prompt_lookup", "schema"))  # the 3rd: its own record
    after_rejection, after_two = AdaptiveController(), AdaptiveController()
    for _ in range(10):
        after_rejection.record(offered.truncate(2), 1, offered, next_token=9)  # token 2 rejected: 3rd not reached
        after_two.record(offered.truncate(2), 2, offered, next_token=9)  # both accepted: the 3rd is judged
    third = AdaptiveController().estimates(offered)[2]
    assert after_rejection.estimates(offered)[2] == pytest.approx(third)
    assert after_two.estimates(offered)[2] > third + 0.3


def test_a_draft_models_cut_token_is_not_judged_by_equality():
    import torch

    offered = Draft(tokens=(7, 8), sources=("draft_model",) * 2, probs=torch.full((2, 10), 0.1))
    c = AdaptiveController()
    for _ in range(10):
        c.record(Draft(), 0, offered, next_token=7)
    assert c.estimates(offered) == AdaptiveController().estimates(offered)


def test_in_the_loop_a_source_cut_to_nothing_is_judged_and_comes_back():
    """A right but under-confident drafter: cut to nothing at first, admitted once the target keeps agreeing.

    Without judging the cut token (``record``'s ``offered``/``next_token``) it is never verified at all.
    """
    from grammarspec.engine.decoding import DecodeConfig, decode
    from tests.proposer_fakes import ScriptedProposer
    from tests.toy import toy_vocab_size
    from tests.toy_models import ToyCausalLM

    model = ToyCausalLM(toy_vocab_size(), seed=3)
    config = DecodeConfig(max_new_tokens=40, eos_token_ids=())
    prompt = [2, 3]
    alone, _ = decode(model, prompt, config)

    def oracle(context, grammar, k):  # the target's own continuation, with a low confidence of its own
        done = len(context) - len(prompt)
        tokens = tuple(alone[done : done + k])
        return Draft(tokens=tokens, sources=("guess",) * len(tokens), confidence=(0.05,) * len(tokens))

    controller = AdaptiveController(k_min=4, k_max=4)
    out, stats = decode(model, prompt, config, proposer=ScriptedProposer("guess", oracle), controller=controller)
    assert out == alone
    assert stats.target_forwards < len(alone) * 0.6  # the drafts came back and were accepted
    assert controller.estimates(oracle(prompt, None, 1))[0] > 0.5


def test_a_row_whose_drafts_are_cut_to_nothing_rests_twice_as_long_each_time_until_one_is_admitted():
    c = AdaptiveController(k_min=16, k_max=16, max_rest=8)
    asked = []
    for step in range(40):
        k = c.ask()
        asked.append(k)
        if k:
            c.allocated(4 if step >= 30 else 0, offered=k)  # cut to nothing until step 30
        c.record(Draft(), 0)
    rests = [len(run) for run in "".join("x" if k else "." for k in asked[:30]).split("x")[1:-1]]
    assert rests == [1, 2, 4, 8, 8]  # 1, 2, 4, then max_rest
    first = next(i for i in range(30, 40) if asked[i])
    assert asked[first + 1 :] == [10] * (39 - first)  # admitted again: asked every step (cut inside: 2 * 4 + 2)
    never = AdaptiveController(k_min=16, k_max=16, max_rest=0)
    never.allocated(0, offered=16)
    never.record(Draft(), 0)
    assert never.ask() == 16  # max_rest 0: no rest
    fixed = AdaptiveController(k_min=4, k_max=4, adaptive=False)
    fixed.allocated(0, offered=4)
    assert fixed.ask() == 4  # a fixed length is verified whole, never rested
    with pytest.raises(ValueError, match="max_rest"):
        AdaptiveController(max_rest=-1)


def test_a_row_can_start_from_the_rest_another_row_ended_with():
    c = AdaptiveController(k_min=16, k_max=16, max_rest=8)
    assert c.rest == 1
    c.rest_from(32)  # capped at max_rest
    asked = []
    for _ in range(12):
        k = c.ask()
        asked.append(k)
        if k:
            c.allocated(0, offered=k)  # every draft cut to nothing
        c.record(Draft(), 0)
    assert asked[:7] == [0] * 7 and asked[7] == 16  # rested 7 steps, then asked
    assert asked[8:] == [0] * 4 and c.rest == 8  # cut again: a rest of max_rest
    for start in (0, 1):  # no evidence of cuts: asks at once
        fresh = AdaptiveController(k_min=16, k_max=16)
        fresh.rest_from(start)
        assert fresh.ask() == 16 and not fresh.resting
    fixed = AdaptiveController(k_min=4, k_max=4, adaptive=False)
    fixed.rest_from(8)
    assert fixed.ask() == 4  # a fixed length never rests


def test_a_resting_row_wakes_where_its_grammar_forces_text():
    """Forced text (jump-forward) is near-certain drafting: a rest after cut drafts must not skip it."""
    from types import SimpleNamespace

    from grammarspec.engine.step import _ask

    class Forcing:
        def __init__(self, text):
            self.text = text

        def forced_text(self):
            return self.text

    def row(text):
        controller = AdaptiveController(k_min=16, k_max=16)
        controller.allocated(0, offered=16)
        controller.record(Draft(), 0)
        assert controller.resting
        settings = SimpleNamespace(max_new_tokens=100)
        return SimpleNamespace(controller=controller, matcher=Forcing(text), settings=settings, generated=[])

    free, forced = row(""), row('"}')
    assert _ask(free) == 0 and free.controller.resting  # nothing forced: the rest holds
    assert _ask(forced) == 16 and not forced.controller.resting  # forced text: awake, asked for the cap
    unconstrained = row("")
    unconstrained.matcher = None
    assert _ask(unconstrained) == 0
