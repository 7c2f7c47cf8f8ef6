"""proposers/tree.py: the DraftTree value type and the tree builders (split alternatives, schema candidates)."""

from __future__ import annotations

import pytest

from grammars import compile_grammar, grammar_spec
from proposers.base import Draft, GrammarView, Request
from proposers.presets import resolve_assistant
from proposers.schema_ngram import SchemaNgramProposer
from proposers.text import SplitPreferences, continuation_tokens, token_text
from proposers.tree import DraftTree, TreeProposer, split_paths

SCHEMA = {
    "type": "object",
    "properties": {"unit": {"type": "string", "enum": ["celsius", "fahrenheit", "kelvin"]}, "city": {"type": "string"}},
    "required": ["unit", "city"],
    "additionalProperties": False,
}


def test_from_paths_shares_prefixes_in_depth_first_order():
    tree = DraftTree.from_paths([[1, 2, 3], [1, 2, 4], [5], [1, 6]], sources=["a", "b", "c", "d"])
    assert tree.tokens == (1, 2, 3, 4, 6, 5)
    assert tree.parents == (-1, 0, 1, 1, 0, -1)
    assert tree.sources == ("a", "a", "a", "b", "d", "c")
    assert tree.depths() == [0, 1, 2, 2, 1, 0]
    assert tree.path(3) == [0, 1, 3] and tree.children(-1) == {1: 0, 5: 5}
    assert tree.width() == 4 and not tree.is_chain
    assert DraftTree.from_paths([[1, 2, 3]]).is_chain
    # cut to a size: the first path stays whole, alternatives go first
    assert DraftTree.from_paths([[1, 2, 3], [1, 9], [7]], size=4).tokens == (1, 2, 3, 9)


def test_a_tree_refuses_bad_structure():
    with pytest.raises(ValueError, match="parent must come before"):
        DraftTree((1, 2), (1, -1))
    with pytest.raises(ValueError, match="siblings must differ"):
        DraftTree((1, 1), (-1, -1))
    with pytest.raises(ValueError, match="parents"):
        DraftTree((1, 2), (-1,))
    with pytest.raises(ValueError, match="branches"):
        DraftTree.from_paths([[1], [2]]).as_draft()


def test_keep_drops_a_node_with_its_subtree_and_reindexes():
    tree = DraftTree.from_paths([[1, 2, 3], [1, 4], [5, 6]])  # 1 2 3 4 5 6
    kept = tree.keep([True, False, True, True, True, True])
    assert kept.tokens == (1, 4, 5, 6) and kept.parents == (-1, 0, -1, 2)


def test_chain_round_trip():
    draft = Draft(tokens=(4, 5, 6), sources=("x",) * 3, kind="prompt")
    tree = DraftTree.from_draft(draft)
    assert tree.is_chain and tree.as_draft() == draft


def test_split_paths_offers_the_other_split_of_the_same_text(smol_tokenizer):
    tok = smol_tokenizer
    helper = token_text(tok)
    context = tok.encode('{"a":"x","b":"y', add_special_tokens=False)
    canonical = continuation_tokens(tok, context, '","c":"z')
    splits = SplitPreferences(tok)
    assert split_paths(splits, context, canonical) == [canonical]  # nothing learned: no branch
    # The target was seen writing '",' + '"' where the canonical split has '","'.
    sep = tok.convert_tokens_to_ids('","')
    written = tok.convert_tokens_to_ids('",')
    assert canonical[0] == sep
    splits.by_token[sep] = written
    chain = splits.resplit(context, canonical)  # what a chain drafter bets on: the learned split
    paths = split_paths(splits, context, chain)
    assert paths[0] == chain and len(paths) == 2
    assert paths[1][0] == sep  # the alternative is the canonical split again
    assert all(helper.bytes_of(p) == helper.bytes_of(canonical) for p in paths)


def test_alternative_drafts_are_the_other_enum_values(smol_tokenizer):
    tok = smol_tokenizer
    prompt = list(tok.encode("Weather in Oslo, please.", add_special_tokens=False))
    compiled = compile_grammar(grammar_spec(schema=SCHEMA), tok)
    ngram = SchemaNgramProposer()
    ngram.start(Request(prompt_ids=tuple(prompt), tokenizer=tok, schema=SCHEMA))
    ids = list(tok.encode('{"unit":', add_special_tokens=False))
    matcher = compiled.matcher()
    assert all(matcher.accept(t) for t in ids)
    view = GrammarView(matcher)
    before = dict(ngram.stats)
    alts = ngram.alternatives(prompt + ids, view, 8, n=3)
    texts = [tok.decode(a) for a in alts]
    assert len(alts) >= 2 and len(set(texts)) == len(texts)
    assert (
        all(t.startswith('"') for t in texts)
        and sum("celsius" in t or "kelvin" in t or "fahrenheit" in t for t in texts) >= 2
    )
    assert all(view.validate(a) == len(a) for a in alts)  # legal
    assert ngram.stats == before  # remembers nothing


def test_tree_proposer_branches_over_schema_candidates_and_passes_chains_through(smol_tokenizer):
    tok = smol_tokenizer
    prompt = list(tok.encode("Weather in Oslo, please.", add_special_tokens=False))
    compiled = compile_grammar(grammar_spec(schema=SCHEMA), tok)
    proposer = TreeProposer(resolve_assistant("auto"), width=3, size=32)
    proposer.start(Request(prompt_ids=tuple(prompt), tokenizer=tok, schema=SCHEMA))
    ids = list(tok.encode('{"unit":', add_special_tokens=False))
    matcher = compiled.matcher()
    assert all(matcher.accept(t) for t in ids)
    drafted = proposer.propose_tree(prompt + ids, GrammarView(matcher), 8)
    assert isinstance(drafted, DraftTree) and not drafted.is_chain and len(drafted) <= 32
    assert drafted.width() >= 2
    leaves = [
        tok.decode([drafted.tokens[j] for j in drafted.path(i)])
        for i in range(len(drafted))
        if i not in drafted.parents
    ]
    assert sum(any(u in leaf for u in ("celsius", "fahrenheit", "kelvin")) for leaf in leaves) >= 2, leaves
    proposer.commit_tree(drafted, list(drafted.tokens[:2]))
    # width 1: the inner chain draft itself
    chain = TreeProposer(resolve_assistant("auto"), width=1)
    chain.start(Request(prompt_ids=tuple(prompt), tokenizer=tok, schema=SCHEMA))
    assert isinstance(chain.propose_tree(prompt + ids, GrammarView(matcher), 8), Draft)
    with pytest.raises(ValueError, match="width"):
        TreeProposer(resolve_assistant("auto"), width=0)


def test_the_sizer_adds_alternatives_only_where_their_measured_yield_pays_for_the_rows():
    from proposers.tree import MEASURED_PASS_COST, TreeSizer, interpolated_cost

    cost = interpolated_cost(MEASURED_PASS_COST)
    sizer = TreeSizer(size=32)
    assert sizer.extra(12) > 0  # the prior yield (0.15 tokens per node) is worth trying
    assert TreeSizer(size=32, prior_yield=0.02).extra(12) == 0  # a low one is not worth 4+ more rows
    for _ in range(10):  # alternatives that were taken: about one token per node
        sizer.update(alt_nodes=4, alt_tokens=4, rows=16, committed=8)
    n = sizer.extra(12)
    assert 0 < n <= 32 - 12
    value = sizer.yield_rate * sizer.spent / sizer.committed
    assert value * n - (cost(13 + n) - cost(13)) > 0  # the rule in the docstring
    for _ in range(200):  # alternatives never taken: back to chains
        sizer.update(alt_nodes=8, alt_tokens=0, rows=24, committed=4)
    assert sizer.extra(12) == 0 and sizer.extra(3) == 0
    assert TreeSizer(size=16).extra(16) == 0  # no room


def test_a_tree_proposer_with_a_sizer_drafts_chains_until_alternatives_pay(smol_tokenizer):
    from proposers.tree import TreeSizer

    tok = smol_tokenizer
    prompt = list(tok.encode("Weather in Oslo, please.", add_special_tokens=False))
    compiled = compile_grammar(grammar_spec(schema=SCHEMA), tok)
    ids = list(tok.encode('{"unit":', add_special_tokens=False))
    matcher = compiled.matcher()
    assert all(matcher.accept(t) for t in ids)
    proposer = TreeProposer(resolve_assistant("auto"), width=3, size=32, sizer=TreeSizer(size=32))
    proposer.start(Request(prompt_ids=tuple(prompt), tokenizer=tok, schema=SCHEMA))
    proposer.sizer.alt_nodes, proposer.sizer.alt_tokens = 1.0, 0.0  # measured: alternatives never pay
    assert isinstance(proposer.propose_tree(prompt + ids, GrammarView(matcher), 8), Draft)
    proposer.sizer.alt_tokens = 5.0  # measured: they pay well
    assert isinstance(proposer.propose_tree(prompt + ids, GrammarView(matcher), 8), DraftTree)
    proposer.start(Request(prompt_ids=tuple(prompt), tokenizer=tok, schema=SCHEMA))
    assert proposer.sizer.alt_tokens < 5.0  # a new request starts from the prior
