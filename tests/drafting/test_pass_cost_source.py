"""The loop prices passes by the cost its caller hands it, reads it only where a step is priced, and never measures.

``generate`` and the server hand the loop the profiled cost
(:class:`grammarspec.drafting.cost_model.ProfiledCost`); a direct caller of the
loop that hands nothing gets the CPU prior (:class:`grammarspec.policy.cost.FixedCost`).
"""

from __future__ import annotations

import doctest

import pytest
import torch

import grammarspec
import grammarspec.drafting.cost_model
import grammarspec.drafting.profile_fit
import grammarspec.policy.cost
from grammarspec.engine.decoding import DecodeConfig, decode
from grammarspec.policy.adaptive import AdaptiveController
from grammarspec.policy.cost import FixedCost, prior_cost
from proposers.base import Request
from proposers.cost import PassCost
from tests.proposer_fakes import ScriptFollower
from tests.toy import toy_tokenizer, toy_vocab_size
from tests.toy_models import ToyCausalLM, tiny_llama

V = toy_vocab_size()
PROMPT = [2, 5, 9, 4, 7]
CONFIG = DecodeConfig(max_new_tokens=40, eos_token_ids=(0,))


@pytest.mark.parametrize("module", [grammarspec.policy.cost, grammarspec.drafting.profile_fit])
def test_docstring_examples_hold(module):
    assert doctest.testmod(module).failed == 0


class CountingCost:
    """A pass cost source that counts what the loop asks of it."""

    def __init__(self, cost: PassCost) -> None:
        self.pass_cost, self.asked, self.checks = cost, 0, 0

    def cost(self) -> PassCost:
        self.asked += 1
        return self.pass_cost

    def checked(self, clock):
        self.checks += 1
        return None


def drafting(model, alone, pass_cost):
    """One ``decode`` call whose proposer knows the text (every draft token survives)."""
    proposer = ScriptFollower(alone)
    proposer.start(Request(prompt_ids=tuple(PROMPT), tokenizer=None))
    controller = AdaptiveController(k_min=1, k_max=8)
    return decode(model, PROMPT, CONFIG, proposer=proposer, controller=controller, pass_cost=pass_cost)


def test_the_loop_reads_the_cost_it_is_handed_only_where_a_step_is_priced():
    model = ToyCausalLM(V, seed=3)
    plain = CountingCost(prior_cost())
    alone, _ = decode(model, PROMPT, CONFIG, pass_cost=plain)
    assert plain.asked == 0 and plain.checks == 0  # nothing drafts: nothing priced or checked, so nothing profiled
    handed = CountingCost(prior_cost())
    out, stats = drafting(model, alone, handed)
    assert out == alone and handed.checks == 1 and 0 < handed.asked <= stats.target_forwards  # priced steps only
    assert stats.target_forwards < len(alone)  # on the prior, certain drafts pay


def test_the_draft_lengths_follow_the_cost_handed_and_the_default_is_the_prior():
    model = ToyCausalLM(V, seed=3)
    alone, _ = decode(model, PROMPT, CONFIG)
    _, prior = drafting(model, alone, None)
    _, fixed = drafting(model, alone, FixedCost())
    steep = PassCost(base=40.0, per_row=10.0, min_rows=1, per_token=5.0)  # a wider pass seldom pays
    out, dear = drafting(model, alone, FixedCost(steep))
    assert out == alone  # drafting policy only: the output never changes
    assert prior.target_forwards == fixed.target_forwards < dear.target_forwards


def test_generate_hands_the_loop_the_profiled_cost_of_its_model(monkeypatch):
    """``generate`` resolves the cost once for the call (:class:`ProfiledCost`); the loop asks it when it drafts."""
    asked = []
    real = grammarspec.drafting.cost_model.batch_cost_model
    monkeypatch.setattr(
        grammarspec.drafting.cost_model, "batch_cost_model", lambda model: asked.append(model) or real(model)
    )
    tok, model = toy_tokenizer(), tiny_llama(V, seed=0)
    prompt = torch.tensor([tok('{"a": ["x"], "b": true} {"a": [', add_special_tokens=False)["input_ids"]])
    grammarspec.generate(model, prompt, tokenizer=tok, max_new_tokens=12, assistant="prompt_lookup")
    assert asked and all(seen is model for seen in asked)
