"""The proposer protocol as the one step uses it: one proposer state per row, state moving only in commit."""

from __future__ import annotations

import pytest

from grammars import compile_grammar, grammar_spec
from grammarspec.drafting.draft_model import DraftModelProposer
from grammarspec.engine.decoding import DecodeConfig, RowRequest, decode_batch, sampling_processing
from grammarspec.kv.batch import BatchKV
from grammarspec.kv.cache import cache_length
from grammarspec.policy.adaptive import AdaptiveController
from proposers.base import EMPTY_DRAFT, CostModelled, Draft, ModelDrafter, ProposerGroup, Request, TreeDrafter, members
from proposers.compose import CompositeProposer, is_model_proposer
from proposers.presets import resolve_assistant
from proposers.tree import TreeProposer
from tests.proposer_fakes import ScriptFollower
from tests.toy import toy_tokenizer, toy_vocab_size
from tests.toy_models import ToyCausalLM, tiny_llama

V = toy_vocab_size()


def _requests(proposers, config):
    out = []
    for i, proposer in enumerate(proposers):
        prompt = [2, 3 + i]
        proposer.start(Request(prompt_ids=tuple(prompt), tokenizer=toy_tokenizer()))
        controller = AdaptiveController(k_min=2, k_max=2, adaptive=False)
        out.append(RowRequest(prompt, None, proposer, controller, sampling_processing(config, (), len(prompt))))
    return out


def test_one_proposer_object_for_two_rows_is_refused():
    config = DecodeConfig(max_new_tokens=4, eos_token_ids=(0,))
    shared = ScriptFollower([5, 6, 7, 8], 0)
    with pytest.raises(ValueError, match="share one proposer object"):
        decode_batch(ToyCausalLM(V), _requests([shared, shared], config), config)


def test_a_member_shared_by_two_composites_is_refused():
    config = DecodeConfig(max_new_tokens=4, eos_token_ids=(0,))
    member = ScriptFollower([5, 6, 7, 8], 0)
    rows = [CompositeProposer([member, ScriptFollower([1], 0)]), CompositeProposer([member])]
    with pytest.raises(ValueError, match="requests 0 and 1 share"):
        decode_batch(ToyCausalLM(V), _requests(rows, config), config)


def test_own_proposers_per_row_decode():
    config = DecodeConfig(max_new_tokens=4, eos_token_ids=(0,))
    rows = decode_batch(ToyCausalLM(V), _requests([ScriptFollower([5, 6, 7, 8], 0) for _ in range(2)], config), config)
    assert all(len(row.generated) == 4 for row in rows)


def test_the_capabilities_are_declared_types():
    auto = resolve_assistant("auto")
    tree = TreeProposer(auto)
    assert isinstance(tree, TreeDrafter) and not isinstance(auto, TreeDrafter)
    assert isinstance(auto, ProposerGroup) and isinstance(auto, CostModelled)
    assert members(tree)[1:] == auto.proposers  # the tree shows the composite's members
    draft = DraftModelProposer(tiny_llama(V))
    assert isinstance(draft, ModelDrafter) and is_model_proposer(draft)
    assert not any(is_model_proposer(p) for p in auto.proposers)


def test_the_draft_model_crops_its_cache_in_commit_when_its_draft_was_not_verified():
    """The composite asked the draft model but verified another draft: the draft cache holds only the context."""
    draft = DraftModelProposer(tiny_llama(V))
    draft.start(Request(prompt_ids=(2, 3), tokenizer=None))
    context = [2, 3, 4, 5]
    proposed = draft.propose(context, None, 3)
    assert len(proposed) == 3
    assert cache_length(draft._cache) == len(context) + 2  # the draft's tokens but its last are cached
    committed = [proposed.tokens[0], (proposed.tokens[1] + 1) % V]  # its first token, then another
    draft.commit(EMPTY_DRAFT, 0, committed)  # not shown to the target: the composite chose another draft
    assert cache_length(draft._cache) == len(context) + 1  # the shared first token stays, the rest is gone
    assert draft._cached == context + committed[:1]
    draft.propose(context + committed, None, 1)  # and the next propose only feeds
    assert draft._cached[: len(context) + 2] == context + committed


def test_trees_are_routed_to_chains_where_the_attention_takes_no_additive_mask():
    model = ToyCausalLM(V)
    assert BatchKV(model, 1).supports_trees()
    for attention in ("flash_attention_2", "flex_attention"):
        model.config._attn_implementation = attention
        assert not BatchKV(model, 1).supports_trees()


def test_a_tree_drafter_under_flash_attention_verifies_chains():
    """The loop asks ``propose`` instead of ``propose_tree`` where trees cannot run, with the same output."""
    from tests.helpers import PROMPT, TARGET, BranchyTreeProposer, legal_walk

    tok = toy_tokenizer()
    compiled = compile_grammar(
        grammar_spec(schema={"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 2}),
        tok,
        vocab_size=len(tok),
        stop_token_ids=(0,),
    )
    config = DecodeConfig(max_new_tokens=20, eos_token_ids=(0,))

    class ChainToo(BranchyTreeProposer):
        chains = 0

        def propose(self, context, grammar, k):
            self.chains += 1
            return Draft(tokens=tuple(legal_walk(grammar, k, lambda a: a[-1])))

    def run(attention):
        TARGET.config._attn_implementation = attention
        try:
            proposer = ChainToo(0)
            request = RowRequest(
                PROMPT,
                compiled.matcher(max_rollback=8),
                proposer,
                AdaptiveController(k_min=3, k_max=3, adaptive=False),
                sampling_processing(config, (), len(PROMPT)),
            )
            (row,) = decode_batch(TARGET, [request], config)
            return row.generated, proposer
        finally:
            TARGET.config._attn_implementation = None

    plain, trees = run(None)
    flash, chains = run("flash_attention_2")
    assert flash == plain
    assert trees.trees and not trees.chains
    assert chains.chains and not chains.trees
