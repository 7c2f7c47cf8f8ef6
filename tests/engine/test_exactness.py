"""Statistical exactness: speculative samples follow the constrained target distribution.

A tiny random model over the toy vocabulary, a small JSON grammar whose
documents are a few tokens long, and every token sequence the grammar allows
enumerated with its exact probability under non-speculative constrained
sampling (mask -> temperature -> top-k -> top-p, the shared pipeline).  Then
20,000 samples from the speculative loop per configuration must match it by
Pearson's chi-square test (bins with expected count < 5 pooled) at p > 1e-4,
with fixed seeds.  The toy model's logits depend on a hash of its whole KV
cache, so a rejected position that lingered in a cache would skew every later
distribution -- and a test with a deliberately leaky rollback shows the test
would notice (test_leaky_cache_is_detected).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from grammars import compile_grammar, grammar_spec
from grammarspec.drafting.draft_model import DraftModelProposer
from grammarspec.engine.decoding import DecodeConfig, decode
from grammarspec.engine.sampling import SamplingParams
from grammarspec.policy.adaptive import AdaptiveController
from proposers.base import Request
from tests.helpers import (
    OTHER,
    PROMPT,
    SCHEMA,
    TARGET,
    ImprobableProposer,
    assert_matches,
    exact_distribution,
    single_thread,
)
from tests.toy import toy_tokenizer

SAMPLES = 20_000


@pytest.fixture(scope="module")
def setup():
    tok = toy_tokenizer()
    compiled = compile_grammar(grammar_spec(schema=SCHEMA), tok, vocab_size=len(tok), stop_token_ids=(0,))
    return tok, compiled


def speculative_counts(model, compiled, params, make_proposer, seed, samples=SAMPLES, k=3):
    generator = torch.Generator().manual_seed(seed)
    config = DecodeConfig(max_new_tokens=20, sampling=params, eos_token_ids=(0,))
    counts: Counter = Counter()
    accepted = proposed = 0
    for _ in range(samples):
        proposer = make_proposer(params, generator)
        proposer.start(Request(prompt_ids=tuple(PROMPT), tokenizer=None))
        new, stats = decode(
            model,
            PROMPT,
            config,
            matcher=compiled.matcher(),
            proposer=proposer,
            controller=AdaptiveController(k_min=k, k_max=k, adaptive=False),
            generator=generator,
        )
        assert stats.finish_reason == "stop"
        counts[tuple(new)] += 1
        proposed += sum(stats.proposed.values())
        accepted += sum(stats.accepted.values())
    return counts, accepted / max(proposed, 1)


# The three headline configurations run 20,000 samples each and between them cover
# every draft kind, temperature 0.7 / 1.0 / 1.5, top-k and top-p; the cross terms
# run 3,000 each (still far more than the chi-square needs for ~30 sequences).
CASES = {
    "matched-draft-T1.0-topp": (
        SamplingParams(True, 1.0, top_p=0.9),
        lambda p, g: DraftModelProposer(TARGET, sampling=p, generator=g),
        SAMPLES,
    ),
    "random-draft-T0.7-topk": (
        SamplingParams(True, 0.7, top_k=4),
        lambda p, g: DraftModelProposer(OTHER, sampling=p, generator=g),
        SAMPLES,
    ),
    "improbable-T1.5": (SamplingParams(True, 1.5), lambda p, g: ImprobableProposer(), SAMPLES),
    "random-draft-T1.5-topk-topp": (
        SamplingParams(True, 1.5, top_k=5, top_p=0.95),
        lambda p, g: DraftModelProposer(OTHER, sampling=p, generator=g),
        3000,
    ),
    "improbable-T0.7-topp": (SamplingParams(True, 0.7, top_p=0.95), lambda p, g: ImprobableProposer(), 3000),
    "matched-draft-T1.5-topk": (
        SamplingParams(True, 1.5, top_k=3),
        lambda p, g: DraftModelProposer(TARGET, sampling=p, generator=g),
        3000,
    ),
}


one_thread = pytest.fixture(autouse=True)(single_thread)  # one torch thread per test: helpers.single_thread says why


@pytest.mark.parametrize("case", sorted(CASES))
def test_speculative_samples_follow_the_constrained_target(setup, case):
    _, compiled = setup
    params, make_proposer, samples = CASES[case]
    exact = exact_distribution(TARGET, compiled, params)
    assert len(exact) > 5, "the grammar must leave room for chance"
    seed = sum(map(ord, case))  # fixed per case (str hash is salted per process)
    counts, acceptance = speculative_counts(TARGET, compiled, params, make_proposer, seed=seed, samples=samples)
    assert_matches(counts, exact, samples=samples)
    if case.startswith("matched"):
        assert acceptance > 0.95  # a draft identical to the target is always accepted


def test_leaky_cache_is_detected(setup, monkeypatch):
    """Sanity of the method: skip the KV rollback and the test must fail."""
    import grammarspec.kv.batch as kv

    _, compiled = setup
    params = SamplingParams(True, 1.0)
    exact = exact_distribution(TARGET, compiled, params)
    keep = kv.BatchKV.keep

    def leaky(self, kept):  # every fed column stays, rejected draft tokens included
        keep(self, [list(range(fed)) for fed in self._appended])

    monkeypatch.setattr(kv.BatchKV, "keep", leaky)
    with pytest.raises(AssertionError):
        counts, _ = speculative_counts(
            TARGET, compiled, params, lambda p, g: ImprobableProposer(), seed=5, samples=4000
        )
        assert_matches(counts, exact, samples=4000)


@pytest.mark.parametrize("case", ["improbable-T1.5", "random-draft-T0.7-topk"])
def test_llguidance_backend_samples_follow_the_constrained_target(case):
    """The same check with the llguidance matcher driving the loop (3,000 samples per case)."""
    tok = toy_tokenizer()
    compiled = compile_grammar(
        grammar_spec(schema=SCHEMA), tok, vocab_size=len(tok), stop_token_ids=(0,), backend="llguidance"
    )
    params, make_proposer, _ = CASES[case]
    exact = exact_distribution(TARGET, compiled, params)
    assert len(exact) > 5
    counts, _ = speculative_counts(TARGET, compiled, params, make_proposer, seed=sum(map(ord, case)), samples=3000)
    assert_matches(counts, exact, samples=3000)
