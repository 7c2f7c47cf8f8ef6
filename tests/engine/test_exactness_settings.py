"""Statistical exactness with Hugging Face settings that depend on the prefix (repetition penalty) or
reshape the distribution (min_p), at temperature 1, with speculative proposers.

Same method as test_exactness.py: enumerate every document the grammar allows with its exact probability
under plain constrained sampling through the SAME LogitsPipeline (each position processed with its own
prefix), then check 6,000 speculative samples against it with Pearson's chi-square test.  The draft model
drafts through the pipeline too (its rows get the penalty for their own prefixes).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from grammars import compile_grammar, grammar_spec
from grammarspec.drafting.draft_model import DraftModelProposer
from grammarspec.engine.decoding import DecodeConfig, decode
from grammarspec.engine.processing import build_pipeline
from grammarspec.engine.sampling import SamplingParams
from grammarspec.policy.adaptive import AdaptiveController
from grammarspec.settings import resolve_config
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

SAMPLES = 6000
SAMPLED = SamplingParams(do_sample=True)
CASES = {
    "repetition_penalty-draft": (
        {"do_sample": True, "top_k": 0, "repetition_penalty": 1.8},
        lambda pipeline, g: DraftModelProposer(OTHER, sampling=SAMPLED, processing=pipeline, generator=g),
    ),
    "repetition_penalty-matched-draft": (
        {"do_sample": True, "top_k": 0, "repetition_penalty": 0.4},
        lambda pipeline, g: DraftModelProposer(TARGET, sampling=SAMPLED, processing=pipeline, generator=g),
    ),
    "repetition_penalty-improbable": (
        {"do_sample": True, "top_k": 0, "repetition_penalty": 0.4},
        lambda pipeline, g: ImprobableProposer(),
    ),
    "min_p-draft": (
        {"do_sample": True, "top_k": 0, "min_p": 0.15},
        lambda pipeline, g: DraftModelProposer(OTHER, sampling=SAMPLED, processing=pipeline, generator=g),
    ),
    "min_p-improbable": ({"do_sample": True, "top_k": 0, "min_p": 0.15}, lambda pipeline, g: ImprobableProposer()),
}


@pytest.fixture(scope="module")
def compiled():
    tok = toy_tokenizer()
    return compile_grammar(grammar_spec(schema=SCHEMA), tok, vocab_size=len(tok), stop_token_ids=(0,))


one_thread = pytest.fixture(autouse=True)(single_thread)  # one torch thread per test: helpers.single_thread says why


def pipeline_for(settings):
    config, _, _ = resolve_config(TARGET, None, dict(settings, max_new_tokens=20))
    return build_pipeline(config, prompt_length=len(PROMPT), eos_token_ids=(0,))


@pytest.mark.parametrize("case", sorted(CASES))
def test_speculative_samples_follow_the_processed_target(compiled, case):
    settings, make_proposer = CASES[case]
    pipeline = pipeline_for(settings)
    exact = exact_distribution(TARGET, compiled, pipeline=pipeline, tolerance=1e-5)
    plain = exact_distribution(TARGET, compiled, pipeline=pipeline_for({"do_sample": True, "top_k": 0}), tolerance=1e-5)
    assert len(exact) > 5
    assert max(abs(exact.get(k, 0) - plain.get(k, 0)) for k in set(exact) | set(plain)) > 0.01, "setting had no effect"
    generator = torch.Generator().manual_seed(sum(map(ord, case)))
    config = DecodeConfig(max_new_tokens=20, sampling=SAMPLED, eos_token_ids=(0,))
    counts: Counter = Counter()
    drafted = 0
    for _ in range(SAMPLES):
        proposer = make_proposer(pipeline, generator)
        proposer.start(Request(prompt_ids=tuple(PROMPT), tokenizer=None))
        new, stats = decode(
            TARGET,
            PROMPT,
            config,
            matcher=compiled.matcher(),
            proposer=proposer,
            controller=AdaptiveController(k_min=3, k_max=3, adaptive=False),
            generator=generator,
            processing=pipeline,
        )
        assert stats.finish_reason == "stop"
        counts[tuple(new)] += 1
        drafted += sum(stats.proposed.values())
    assert drafted > SAMPLES  # speculation really happened
    assert_matches(counts, exact, samples=SAMPLES)


def test_wrong_prefix_for_draft_rows_is_detected(compiled, monkeypatch):
    """Sanity of the method: give every verification row the first row's prefix (as if the penalty ignored
    the draft tokens before it) and the test must fail."""
    from grammarspec.engine import processing

    run = processing.LogitsPipeline._run
    monkeypatch.setattr(
        processing.LogitsPipeline, "_run", staticmethod(lambda p, ids, s: run(p, [ids[0]] * len(ids), s))
    )
    with pytest.raises(AssertionError):
        test_speculative_samples_follow_the_processed_target(compiled, "repetition_penalty-matched-draft")
