"""Drafts from earlier outputs leave the output distribution exact: chains and trees, sampled and greedy.

The method of tests/engine/test_exactness.py and tests/engine/test_tree_exactness.py (toy
grammar, every sequence's exact probability enumerated, chi-square at p > 1e-4
with fixed seeds).  Every sample's drafter reads and writes one index shared by
all the samples, so each request drafts from what the earlier ones wrote --
including trees where they went different ways.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from grammars import compile_grammar, grammar_spec
from grammarspec.engine.decoding import DecodeConfig, decode
from grammarspec.engine.sampling import SamplingParams
from grammarspec.policy.adaptive import AdaptiveController
from proposers import SuffixIndex, SuffixProposer
from proposers.base import Request
from proposers.tree import DraftTree
from tests.engine.test_exactness import speculative_counts
from tests.helpers import PROMPT, SCHEMA, TARGET, assert_matches, exact_distribution, single_thread

one_thread = pytest.fixture(autouse=True)(single_thread)


@pytest.fixture(scope="module")
def compiled():
    from tests.toy import toy_tokenizer

    tok = toy_tokenizer()
    return compile_grammar(grammar_spec(schema=SCHEMA), tok, vocab_size=len(tok), stop_token_ids=(0,))


class RecordingSuffix(SuffixProposer):
    """A suffix drafter that keeps every tree it drafted."""

    trees: list[DraftTree]

    def propose_tree(self, context, grammar, k):
        drafted = super().propose_tree(context, grammar, k)
        if isinstance(drafted, DraftTree):
            type(self).trees.append(drafted)
        return drafted


@pytest.mark.parametrize(
    "params", [SamplingParams(True, 1.0, top_p=0.9), SamplingParams(True, 1.5, top_k=5)], ids=["T1.0-topp", "T1.5"]
)
def test_chain_drafts_from_earlier_samples_follow_the_constrained_target(compiled, params):
    index = SuffixIndex(1 << 20)
    samples = 3000
    counts, acceptance = speculative_counts(
        TARGET, compiled, params, lambda p, g: SuffixProposer(index), seed=11, samples=samples
    )
    assert index.as_dict()["ngrams"] > 0 and acceptance > 0.2  # it drafted, and drafts were taken
    assert_matches(counts, exact_distribution(TARGET, compiled, params), samples=samples)


def test_tree_drafts_from_earlier_samples_follow_the_constrained_target(compiled):
    params = SamplingParams(True, 1.0)
    index = SuffixIndex(1 << 20)
    RecordingSuffix.trees = []
    generator = torch.Generator().manual_seed(5)
    config = DecodeConfig(max_new_tokens=20, sampling=params, eos_token_ids=(0,))
    counts: Counter = Counter()
    samples = accepted = 0
    for _ in range(3000):
        proposer = RecordingSuffix(index, width=3)
        proposer.start(Request(prompt_ids=tuple(PROMPT), tokenizer=None))
        new, stats = decode(
            TARGET,
            PROMPT,
            config,
            matcher=compiled.matcher(max_rollback=8),
            proposer=proposer,
            controller=AdaptiveController(k_min=3, k_max=3, adaptive=False),
            generator=generator,
        )
        assert stats.finish_reason == "stop"
        counts[tuple(new)] += 1
        samples += 1
        accepted += sum(n for _, n in stats.steps)
    branched = sum(not t.is_chain for t in RecordingSuffix.trees)
    assert branched > 1000 and accepted > 1000  # trees that branch were verified, and their tokens taken
    assert_matches(counts, exact_distribution(TARGET, compiled, params), samples=samples)


def test_greedy_output_is_unchanged_by_drafts_from_earlier_outputs(compiled):
    config = DecodeConfig(max_new_tokens=20, eos_token_ids=(0,))
    plain, _ = decode(TARGET, PROMPT, config, matcher=compiled.matcher())
    index = SuffixIndex(1 << 20)
    sampled = DecodeConfig(max_new_tokens=20, sampling=SamplingParams(True, 1.5), eos_token_ids=(0,))
    generator = torch.Generator().manual_seed(0)
    for _ in range(40):  # earlier outputs that mostly differ from the greedy one
        writer = SuffixProposer(index)
        writer.start(Request(prompt_ids=tuple(PROMPT), tokenizer=None))
        decode(TARGET, PROMPT, sampled, matcher=compiled.matcher(), proposer=writer, generator=generator)
    for width in (1, 3):
        proposer = SuffixProposer(index, width=width)
        proposer.start(Request(prompt_ids=tuple(PROMPT), tokenizer=None))
        new, stats = decode(
            TARGET,
            PROMPT,
            config,
            matcher=compiled.matcher(max_rollback=8),
            proposer=proposer,
            controller=AdaptiveController(k_min=3, k_max=3, adaptive=False),
        )
        assert new == plain
        assert stats.proposed.get("suffix", 0) > 0
