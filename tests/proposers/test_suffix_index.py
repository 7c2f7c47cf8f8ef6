"""The index of earlier outputs (proposers.suffix_index) and its drafter (proposers.suffix).

Continuations, branching into a tree, eviction, scoping by kind, the memory
cap under a 10,000-request soak (by the index's own accounting, itself
checked against ``tracemalloc``), and the drafter's place in ``"auto"``.
"""

from __future__ import annotations

import random
import tracemalloc

import pytest

from proposers import SuffixIndex, SuffixProposer, resolve_assistant
from proposers.base import GrammarView, Request, members
from proposers.compose import CompositeProposer
from proposers.suffix_index import resolve_index, scope_of
from proposers.tree import DraftTree, TreeProposer
from tests.proposer_fakes import RuleMatcher

HEAD = [90, 91, 92]  # the prompt's last tokens: the chat template's assistant opener, say


def _add(index: SuffixIndex, scope: str, tokens, head=HEAD):
    out = index.open(scope, head)
    return index.extend(out, tokens)


def test_a_later_request_continues_as_an_earlier_output_did():
    index = SuffixIndex(1 << 20)
    _add(index, "s", [1, 2, 3, 4, 5, 6, 7])
    tokens, probs, order = index.walk("s", HEAD, 5)
    assert tokens == [1, 2, 3, 4, 5] and probs == [1.0] * 5  # from the prompt's tail on: the whole answer
    assert order == 2  # the longest n-gram the 3-token context has (orders 8, 4, 2)
    assert index.walk("s", [40, 41, 3, 4], 10)[0] == [5, 6, 7]  # mid-answer, from a 2-gram
    assert index.walk("s", [40, 41, 42], 10)[0] == []  # nothing known


def test_the_most_frequent_continuation_wins_and_rare_ones_are_not_drafted():
    index = SuffixIndex(1 << 20)
    for _ in range(3):
        _add(index, "s", [1, 2, 3, 4])
    _add(index, "s", [1, 2, 9, 9])
    n, ranked = index.candidates("s", HEAD + [1, 2])
    assert n == 4 and [t for t, _ in ranked] == [3, 9]  # the 4-gram (91, 92, 1, 2), most frequent first
    assert ranked[0][1] == pytest.approx(0.75)
    assert index.walk("s", HEAD, 4)[0] == [1, 2, 3, 4]
    rare = SuffixIndex(1 << 20, min_prob=0.5)
    _add(rare, "s", [1, 2, 3])
    _add(rare, "s", [1, 2, 4])
    _add(rare, "s", [1, 2, 5])
    assert rare.walk("s", HEAD, 4)[0] == [1, 2]  # each of 3, 4, 5 at 1/3: below min_prob, the walk stops


def test_where_earlier_outputs_branch_the_drafter_drafts_a_tree():
    index = SuffixIndex(1 << 20)
    _add(index, "s", [1, 2, 3, 4, 5])
    _add(index, "s", [1, 2, 3, 4, 5])
    _add(index, "s", [1, 2, 7, 8])
    paths = index.paths("s", HEAD, 6, width=3)
    assert paths[0] == [1, 2, 3, 4, 5] and [1, 2, 7, 8] in paths
    proposer = SuffixProposer(index, scope="s")
    proposer.start(Request(prompt_ids=tuple(HEAD), tokenizer=None))
    tree = proposer.propose_tree(HEAD, None, 6)
    assert isinstance(tree, DraftTree) and not tree.is_chain
    assert tree.tokens == (1, 2, 3, 4, 5, 7, 8) and tree.parents == (-1, 0, 1, 2, 3, 1, 5)
    # The grammar cuts each branch: with 7 illegal, the tree is the chain.
    grammar = GrammarView(RuleMatcher(lambda prefix, token: token != 7, vocab_size=100))
    chain = proposer.propose_tree(HEAD, grammar, 6)
    assert not isinstance(chain, DraftTree) and chain.tokens == (1, 2, 3, 4, 5)
    # A tree proposer around a chain proposer holding it takes the index's branches as alternatives.
    wrapped = TreeProposer(proposer, width=3)
    tree = wrapped.propose_tree(HEAD, None, 6)
    assert isinstance(tree, DraftTree) and tree.tokens == (1, 2, 3, 4, 5, 7, 8)


def test_scopes_never_share_drafts():
    index = SuffixIndex(1 << 20)
    _add(index, scope_of({"type": "object", "required": ["a"]}), [1, 2, 3])
    same = scope_of({"required": ["a"], "type": "object"})  # key order does not matter
    assert index.walk(same, HEAD, 3)[0] == [1, 2, 3]
    assert index.walk(scope_of({"type": "array"}), HEAD, 3)[0] == []
    assert index.walk("text", HEAD, 3)[0] == [] and scope_of(None) == "text"


def test_eviction_takes_the_oldest_outputs_counts_back_out_exactly():
    empty = SuffixIndex(1 << 20).bytes
    index = SuffixIndex(1 << 20)
    first = _add(index, "a", [1, 2, 3, 4])
    _add(index, "b", [5, 6, 7, 8])
    held = index.bytes
    index.max_bytes = held - 1  # one output too many: the oldest goes
    index._fit()
    assert first.evicted and index.evictions == 1 and index.bytes < held
    assert index.walk("a", HEAD, 4)[0] == [] and index.walk("b", HEAD, 4)[0] == [5, 6, 7, 8]
    assert index.as_dict()["scopes"] == 1
    # A request whose output was evicted goes on writing: a new output continues from its last tokens.
    again = index.extend(first, [9])
    assert again is not first and not again.evicted and index.walk("a", [3, 4], 1)[0] == [9]
    index.max_bytes = 0
    index._fit()
    assert index.as_dict() == {"bytes": empty, "max_bytes": 0, "outputs": 0, "ngrams": 0, "scopes": 0, "evictions": 3}
    assert index._held == 0  # every byte charged was given back


def _structured_output(rng: random.Random) -> list[int]:
    """A JSON-like answer: a fixed skeleton with variable values (token ids 1000.. keys, 30000.. values)."""
    out: list[int] = []
    for key in range(4):
        out += [1000 + 10 * key + i for i in range(3)] + [rng.randrange(30000, 30400) for _ in range(rng.randint(1, 4))]
    return out


def test_the_index_never_exceeds_its_cap_under_a_10000_request_soak():
    rng = random.Random(0)
    cap = 64 << 10
    index = SuffixIndex(cap)
    scopes = [f"schema:{i}" for i in range(5)] + ["text"]
    live: list = []
    peak = 0
    for request in range(10_000):
        scope = rng.choice(scopes)
        out = index.open(scope, HEAD)
        tokens = _structured_output(rng)
        for start in range(0, len(tokens), 3):  # committed a few tokens a step, as a loop tells them
            out = index.extend(out, tokens[start : start + 3])
            peak = max(peak, index.bytes)
        if request % 7 == 0:
            live.append(out)  # some requests are still open when others finish
        assert index.bytes <= cap
    assert peak <= cap and index.evictions > 9000  # it was full, and stayed within its cap throughout
    assert index.walk(scope, HEAD, 3)[0] == [1000, 1001, 1002]  # and the last request's kind still drafts


def test_the_accounting_is_an_upper_bound_on_the_memory_it_holds():
    rng = random.Random(1)
    outputs = [_structured_output(rng) for _ in range(300)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        index = SuffixIndex(1 << 30)
        for tokens in outputs:
            _add(index, "s", tokens)
        held = tracemalloc.get_traced_memory()[0] - before
        # Churn: evict half, add again; the live memory still stays under the accounting.
        index.max_bytes = index.bytes // 2
        index._fit()
        for tokens in outputs[:100]:
            _add(index, "t", tokens)
        churned = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert index.evictions > 0
    accounted = _accounted(outputs)
    assert 0.5 * accounted <= held <= accounted  # an upper bound, and not a wild one
    assert churned <= index.bytes  # after evictions too: what is live is within what it counts


def _accounted(outputs) -> int:
    index = SuffixIndex(1 << 30)
    for tokens in outputs:
        _add(index, "s", tokens)
    return index.bytes


def test_the_drafter_writes_what_its_request_commits_and_the_next_request_drafts_it():
    index = SuffixIndex(1 << 20)
    schema = {"type": "object"}
    first = SuffixProposer(index)
    first.start(Request(prompt_ids=(5, 6) + tuple(HEAD), tokenizer=None, schema=schema))
    assert first.scope == scope_of(schema)
    assert not first.propose(HEAD, None, 4)  # nothing written yet
    first.commit(first.propose(HEAD, None, 4), 0, [1, 2])
    first.commit(first.propose(HEAD + [1, 2], None, 4), 0, [3, 4, 0])
    second = SuffixProposer(index)
    second.start(Request(prompt_ids=(7,) + tuple(HEAD), tokenizer=None, schema=schema))
    draft = second.propose(HEAD, None, 8)
    assert draft.tokens == (1, 2, 3, 4, 0) and set(draft.sources) == {"suffix"} and draft.kind == "o2"
    grammar = GrammarView(RuleMatcher(lambda prefix, token: token != 3, vocab_size=100))
    assert second.propose(HEAD, grammar, 8).tokens == (1, 2)  # cut at the first illegal token
    other = SuffixProposer(index)
    other.start(Request(prompt_ids=tuple(HEAD), tokenizer=None, schema={"type": "array"}))
    assert not other.propose(HEAD, None, 8)  # another schema: another scope


def test_auto_drafts_from_an_index_only_when_given_one():
    assert not any(isinstance(m, SuffixProposer) for m in members(resolve_assistant("auto")))
    index = SuffixIndex(1 << 20)
    auto = resolve_assistant("auto", suffix_index=index)
    assert isinstance(auto, CompositeProposer)
    (suffix,) = [m for m in auto.followers if isinstance(m, SuffixProposer)]
    assert suffix.index is index  # a follower: the composite keeps its record like any other's
    assert not any(
        isinstance(m, SuffixProposer) for m in members(resolve_assistant("auto", suffix_index=SuffixIndex(0)))
    )


def test_resolve_index_shares_makes_or_refuses():
    shared = SuffixIndex(1 << 10)
    assert resolve_index(shared, 5, "f()") is shared
    assert resolve_index(None, 1 << 10, "f()").max_bytes == 1 << 10
    assert resolve_index(None, 0, "f()") is None and resolve_index(False, 1 << 10, "f()") is None
    with pytest.raises(TypeError, match="draft_index=.*SuffixIndex"):
        resolve_index("yes", 1, "f()")


def test_bad_settings_are_refused_with_what_to_pass():
    with pytest.raises(ValueError, match="max_bytes >= 0"):
        SuffixIndex(-1)
    with pytest.raises(ValueError, match="n-gram orders"):
        SuffixIndex(1, orders=(0,))
    with pytest.raises(ValueError, match="branches >= 1"):
        SuffixIndex(1, branches=0)
