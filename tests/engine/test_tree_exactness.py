"""Statistical exactness of token-tree verification, and the rollback invariants after every tree step.

Same method as tests/engine/test_exactness.py (toy grammar, every sequence's exact
probability enumerated, chi-square at p > 1e-4 with fixed seeds), with a
proposer that drafts deterministic TREES: an improbable branch, a probable
branch and a random branch that is mostly illegal (the grammar prunes it).
The toy model here reads a 4-D tree attention mask: each row's logits hash
the tokens that row can see, so a node of another branch left in the cache
after a tree step would skew every later distribution
(test_a_leaky_path_commit_is_detected shows the test notices).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from grammars import compile_grammar, grammar_spec
from grammarspec.engine.decoding import DecodeConfig, RowRequest, decode, decode_batch, sampling_processing
from grammarspec.engine.sampling import SamplingParams
from grammarspec.kv import batch as kv_module
from grammarspec.kv import packed_attention
from grammarspec.kv.cache import cache_length
from grammarspec.kv.packed_attention import BATCHED, ROWS
from grammarspec.policy.adaptive import AdaptiveController
from tests.helpers import PROMPT, SCHEMA, TARGET, BranchyTreeProposer, assert_matches, exact_distribution
from tests.toy import toy_tokenizer, toy_vocab_size
from tests.toy_models import tiny_llama

V = toy_vocab_size()


SAMPLES = 5000


@pytest.fixture(scope="module")
def compiled():
    tok = toy_tokenizer()
    return compile_grammar(grammar_spec(schema=SCHEMA), tok, vocab_size=len(tok), stop_token_ids=(0,))


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tree_counts(compiled, params, seed, samples, on_step=None):
    generator = torch.Generator().manual_seed(seed)
    config = DecodeConfig(max_new_tokens=20, sampling=params, eos_token_ids=(0,))
    counts: Counter = Counter()
    branched = accepted = 0
    for i in range(samples):
        proposer = BranchyTreeProposer(seed + i)
        new, stats = decode(
            TARGET,
            PROMPT,
            config,
            matcher=compiled.matcher(max_rollback=8),
            proposer=proposer,
            controller=AdaptiveController(k_min=3, k_max=3, adaptive=False),
            generator=generator,
            on_step=on_step,
        )
        assert stats.finish_reason == "stop"
        counts[tuple(new)] += 1
        branched += sum(not t.is_chain for t in proposer.trees)
        accepted += sum(n for _, n in stats.steps)
    return counts, branched, accepted


CASES = {
    "T1.0-topp0.9": (SamplingParams(True, 1.0, top_p=0.9), SAMPLES),
    "T0.7-topk4": (SamplingParams(True, 0.7, top_k=4), 2500),
    "T1.5": (SamplingParams(True, 1.5), 2500),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_tree_samples_follow_the_constrained_target(compiled, case):
    params, samples = CASES[case]
    exact = exact_distribution(TARGET, compiled, params)
    assert len(exact) > 5
    counts, branched, accepted = tree_counts(compiled, params, seed=sum(map(ord, case)), samples=samples)
    assert branched > samples  # trees, not chains, were verified
    assert accepted > 0  # and some of their tokens were taken
    assert_matches(counts, exact, samples=samples)


def test_greedy_tree_decoding_equals_plain_greedy(compiled):
    config = DecodeConfig(max_new_tokens=20, eos_token_ids=(0,))
    plain, _ = decode(TARGET, PROMPT, config, matcher=compiled.matcher())
    for seed in range(5):
        new, _ = decode(
            TARGET,
            PROMPT,
            config,
            matcher=compiled.matcher(max_rollback=8),
            proposer=BranchyTreeProposer(seed),
            controller=AdaptiveController(k_min=3, k_max=3, adaptive=False),
        )
        assert new == plain


def test_the_cache_holds_exactly_the_committed_tokens_after_every_tree_step(compiled):
    """Rollback invariant: after each tree step the toy cache spells the committed tokens (minus the pending one)."""
    seen = []

    def check(state):
        keys = state.cache.layers[0].keys[0, 0, :, 0].long().tolist()
        assert cache_length(state.cache) == state.cached
        assert keys == state.tokens[: state.cached]
        seen.append(state.cached)

    tree_counts(compiled, SamplingParams(True, 1.0), seed=3, samples=200, on_step=check)
    assert len(seen) > 200


def test_a_leaky_path_commit_is_detected(compiled, monkeypatch):
    """Sanity of the method: keep without gathering the path (other branches' nodes stay) and the test fails."""
    from grammarspec.kv import batch as kv

    params = SamplingParams(True, 1.0)
    exact = exact_distribution(TARGET, compiled, params)
    monkeypatch.setattr(kv, "_move_columns", lambda layer, slot, source, target: None)
    with pytest.raises(AssertionError):
        counts, _, _ = tree_counts(compiled, params, seed=11, samples=2500)
        assert_matches(counts, exact, samples=2500)


def test_user_processors_see_each_node_s_own_prefix(compiled):
    """A processor that reads its prefix: tree decoding must give it the node's path, as plain decoding does."""

    def favour_by_prefix(input_ids, scores):
        scores = scores.clone()
        legal = torch.isfinite(scores[0]).nonzero().flatten()
        scores[0, legal[int(input_ids[0].sum()) % len(legal)]] += 5.0  # a legal token chosen by the whole prefix
        return scores

    config = DecodeConfig(max_new_tokens=20, eos_token_ids=(0,))
    plain, _ = decode(TARGET, PROMPT, config, matcher=compiled.matcher(), processors=[favour_by_prefix])
    for seed in range(5):
        proposer = BranchyTreeProposer(seed)
        new, _ = decode(
            TARGET,
            PROMPT,
            config,
            matcher=compiled.matcher(max_rollback=8),
            proposer=proposer,
            controller=AdaptiveController(k_min=3, k_max=3, adaptive=False),
            processors=[favour_by_prefix],
        )
        assert new == plain
        assert any(not t.is_chain for t in proposer.trees)


# -- trees at batch > 1: the same step serves every row ----------------------------------------------------

PROMPTS = [PROMPT, [2] + list(PROMPT), list(PROMPT)[:-1] + [5, 3], [4, 4] + list(PROMPT)]


def batch_of_trees(compiled, config, prompts, seeds, generator=None, on_step=None, model=TARGET):
    requests = []
    for prompt, seed in zip(prompts, seeds):
        controller = AdaptiveController(k_min=3, k_max=3, adaptive=False)
        processing = sampling_processing(config, (), len(prompt))
        requests.append(
            RowRequest(prompt, compiled.matcher(max_rollback=8), BranchyTreeProposer(seed), controller, processing)
        )
    return decode_batch(model, requests, config, generator=generator, on_step=on_step)


def check_batch_cache(rows, kv):
    """Every row's valid columns spell its committed tokens: no node of another branch or row stays."""
    for slot, row in enumerate(rows):
        columns = kv.valid[slot].nonzero().flatten()
        assert kv.cache.layers[0].keys[slot, 0, columns, 0].long().tolist() == row.tokens[: row.cached]


def test_greedy_trees_at_batch_4_equal_each_row_alone(compiled):
    config = DecodeConfig(max_new_tokens=20, eos_token_ids=(0,))
    alone = [decode(TARGET, p, config, matcher=compiled.matcher())[0] for p in PROMPTS]
    for seed in range(3):
        rows = batch_of_trees(compiled, config, PROMPTS, [seed * 4 + i for i in range(4)], on_step=check_batch_cache)
        assert [row.generated for row in rows] == alone
        assert all(any(not t.is_chain for t in row.proposer.trees) for row in rows)


def test_sampled_trees_at_batch_4_follow_the_constrained_target(compiled):
    params = SamplingParams(True, 1.0, top_p=0.9)
    exact = exact_distribution(TARGET, compiled, params)
    config = DecodeConfig(max_new_tokens=20, sampling=params, eos_token_ids=(0,))
    generator = torch.Generator().manual_seed(5)
    counts: Counter = Counter()
    branched = 0
    batches = 600
    for b in range(batches):
        rows = batch_of_trees(
            compiled,
            config,
            [PROMPT] * 4,
            [4 * b + i for i in range(4)],
            generator,
            on_step=check_batch_cache if b < 20 else None,
        )
        for row in rows:
            assert row.finish_reason == "stop"
            counts[tuple(row.generated)] += 1
            branched += sum(not t.is_chain for t in row.proposer.trees)
    assert branched > batches * 4
    assert_matches(counts, exact, samples=batches * 4)


class NextLogits:
    """A Hugging Face model as :func:`helpers.exact_distribution` reads one: the logits after a context."""

    def __init__(self, model) -> None:
        self.model = model

    def next_logits(self, context):
        with torch.inference_mode():
            return self.model(torch.tensor([context])).logits[0, -1].float()


@pytest.mark.parametrize("path", [ROWS, BATCHED])
def test_sampled_trees_on_a_real_llama_follow_the_constrained_target_on_either_attention_path(
    compiled, path, monkeypatch
):
    """Batches of 4 rows verifying trees on a real (random) Llama, whose ragged steps run packed: the CPU's row
    path and the accelerator's one-call path (forced here) both sample the constrained target's distribution."""
    model = tiny_llama(V, seed=2)
    params = SamplingParams(True, 1.0, top_p=0.9)
    exact = exact_distribution(NextLogits(model), compiled, params)
    config = DecodeConfig(max_new_tokens=20, sampling=params, eos_token_ids=(0,))
    generator = torch.Generator().manual_seed(9)
    calls = []
    original = packed_attention._attend_batched
    monkeypatch.setattr(kv_module, "attention_path", lambda device: path)
    monkeypatch.setattr(packed_attention, "_attend_batched", lambda *a, **k: calls.append(1) or original(*a, **k))
    counts: Counter = Counter()
    batches = 400
    for b in range(batches):
        rows = batch_of_trees(compiled, config, [PROMPT] * 4, [4 * b + i for i in range(4)], generator, model=model)
        counts.update(tuple(row.generated) for row in rows)
    assert (len(calls) > batches) == (path == BATCHED)
    assert_matches(counts, exact, samples=batches * 4)
