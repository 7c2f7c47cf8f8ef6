"""grammarspec/engine/tree_layout.py: tree attention equals chain attention, the cache keeps only the path,
the grammar prunes node by node."""

from __future__ import annotations

import pytest
import torch

from grammars import compile_grammar, grammar_spec
from grammars.base import allocate_bitmask
from grammarspec.engine.masking import prune_and_fill_masks
from grammarspec.engine.tree_layout import descend, tree_attention_inputs
from grammarspec.kv.batch import BatchKV
from grammarspec.kv.cache import cache_length, forward_with_cache, new_cache
from proposers.tree import DraftTree
from tests.toy import toy_tokenizer
from tests.toy_models import tiny_llama

# A tree with three branches of different depths, in depth-first order.
PATHS = [[5, 6, 7, 8], [5, 9], [10, 11, 12], [5, 6, 13]]


def chain_logits(model, tokens):
    """Next-token logits ``[V]`` after ``tokens``, from a plain causal forward (no cache, no tree)."""
    with torch.inference_mode():
        return model(input_ids=torch.tensor([tokens])).logits[0, -1].float()


def cache_tensors(cache):
    return [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]


def tree_pass(model, prompts, trees, cached):
    """A BatchKV holding ``prompt[:cached]`` per row, then one tree pass; returns (kv, logits per row)."""
    kv = BatchKV(model, len(prompts))
    if cached:
        kv.forward([p[:cached] for p in prompts], [()] * len(prompts))
        kv.keep([list(range(cached))] * len(prompts))
    logits = kv.forward([p[cached:] + list(t.tokens) for p, t in zip(prompts, trees)], [t.parents for t in trees])
    out, start = [], 0
    for tree in trees:
        out.append(logits[start : start + 1 + len(tree)])
        start += 1 + len(tree)
    assert start == logits.shape[0]
    return kv, out


def check_tree_pass(model, prompt, tree, cached, atol):
    """Every node's row equals a chain forward over its path; returns the kv for the commit checks."""
    kv, (logits,) = tree_pass(model, [prompt], [tree], cached)
    assert_rows_equal_chains(model, prompt, tree, logits, atol)
    return kv


def assert_rows_equal_chains(model, prompt, tree, logits, atol):
    worst = float((logits[0] - chain_logits(model, prompt)).abs().max())
    for i in range(len(tree)):
        path = [tree.tokens[j] for j in tree.path(i)]
        worst = max(worst, float((logits[1 + i] - chain_logits(model, prompt + path)).abs().max()))
    assert worst < atol, f"largest difference between tree and chain logits: {worst:.2e}"


@pytest.fixture(scope="module")
def llama():
    return tiny_llama(64, seed=3)


def test_the_tree_mask_lets_each_node_see_its_ancestors_only():
    tree = DraftTree.from_paths([[1, 2], [3]])  # nodes 1, 2 (under 1), 3
    mask, positions = tree_attention_inputs(tree.parents, pending=2, past=3)
    allowed = (mask[0, 0] == 0).int()
    assert allowed.tolist() == [
        [1, 1, 1, 1, 0, 0, 0, 0],  # pending 0: causal
        [1, 1, 1, 1, 1, 0, 0, 0],  # pending 1
        [1, 1, 1, 1, 1, 1, 0, 0],  # node 0
        [1, 1, 1, 1, 1, 1, 1, 0],  # node 1: sees node 0
        [1, 1, 1, 1, 1, 0, 0, 1],  # node 2: not nodes 0, 1
    ]
    assert positions.tolist() == [[3, 4, 5, 6, 5]]
    with pytest.raises(ValueError, match="pending token"):
        tree_attention_inputs(tree.parents, pending=0, past=3)


@pytest.mark.parametrize("cached", [0, 4, 7])  # pending = whole prompt, several tokens, the last one
def test_tree_logits_equal_chain_logits_on_a_tiny_llama(llama, cached):
    tree = DraftTree.from_paths(PATHS)
    check_tree_pass(llama, [3, 1, 4, 1, 5, 9, 2, 6], tree, cached, atol=1e-4)


def test_tree_logits_equal_chain_logits_on_the_embedded_model(smol):
    model, tok = smol
    prompt = tok.encode('Extract: {"name":"Ann","age":31}. Answer: {"name":"', add_special_tokens=False)
    ann = tok.encode("Ann", add_special_tokens=False)
    paths = [
        ann + tok.encode('","', add_special_tokens=False),
        ann + tok.encode('",', add_special_tokens=False),
        tok.encode("Bob", add_special_tokens=False),
    ]
    tree = DraftTree.from_paths(paths)
    assert not tree.is_chain
    check_tree_pass(model, prompt, tree, len(prompt) - 1, atol=1e-3)  # float32 over 30 layers


def test_a_batch_of_trees_and_chains_scores_every_node_as_its_own_chain(llama):
    """Rows of different lengths (one padded), one branching tree, one chain, one empty draft: one pass."""
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1], [8, 8, 4, 7, 2]]
    trees = [DraftTree.from_paths(PATHS), DraftTree.from_paths([[4, 4, 9]]), DraftTree()]
    kv, logits = tree_pass(llama, prompts, trees, cached=2)
    for prompt, tree, rows in zip(prompts, trees, logits):
        assert_rows_equal_chains(llama, prompt, tree, rows, atol=1e-4)


@pytest.mark.parametrize("branch", range(len(PATHS)))
def test_keep_leaves_the_cache_a_chain_pass_over_the_path_would_leave(llama, branch):
    prompt = [3, 1, 4, 1, 5]
    tree = DraftTree.from_paths(PATHS)
    leaf = max(i for i in range(len(tree)) if [tree.tokens[j] for j in tree.path(i)] == PATHS[branch])
    path = tree.path(leaf)
    kv = check_tree_pass(llama, prompt, tree, cached=4, atol=1e-4)
    kv.keep([[0] + [1 + i for i in path]])  # the pending token, then the path
    cache = kv.cache
    chain = new_cache(llama)
    forward_with_cache(llama, prompt + PATHS[branch], chain, 1)
    assert cache_length(cache) == cache_length(chain) == len(prompt) + len(path)
    for (k, v), (k2, v2) in zip(cache_tensors(cache), cache_tensors(chain)):
        torch.testing.assert_close(k, k2, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(v, v2, atol=1e-5, rtol=1e-4)
    # and the next pass from the committed cache sees only the path
    after = forward_with_cache(llama, [7], cache, 1)[0]
    torch.testing.assert_close(after, chain_logits(llama, prompt + PATHS[branch] + [7]), atol=1e-4, rtol=1e-4)


def test_descend_follows_the_target_while_it_picks_a_child():
    tree = DraftTree.from_paths([[5, 6, 7], [5, 8], [9]])  # nodes 5, 6, 7, 8, 9
    choices = [5, 8, 0, 0, 3, 0]  # root -> 5 -> 8 -> target says 3
    assert descend(tree, [False] * 5, choices) == ([0, 3], 3)
    assert descend(tree, [False, False, False, True, False], choices) == ([0, 3], None)
    assert descend(tree, [False] * 5, [11, 0, 0, 0, 0, 0]) == ([], 11)  # no child: the root's own token


@pytest.fixture(scope="module")
def toy_grammar():
    tok = toy_tokenizer()
    schema = {"type": "object", "properties": {"a": {"enum": ["x", "yy"]}}, "required": ["a"]}
    compiled = compile_grammar(grammar_spec(schema=schema), tok, vocab_size=len(tok), stop_token_ids=(0,))
    return tok, compiled


def test_the_grammar_prunes_illegal_nodes_and_their_subtrees(toy_grammar):
    tok, compiled = toy_grammar

    def ids(text):
        return tok.encode(text, add_special_tokens=False)

    prefix = ids('{"a":')
    matcher = compiled.matcher(max_rollback=16)
    for t in prefix:
        assert matcher.accept(t)
    good, other, bad = ids('"x"}') + [0], ids('"yy"}'), ids('"z"}')
    tree = DraftTree.from_paths([good, bad, other])
    masks = allocate_bitmask(len(tree) + 3, len(tok))
    before = matcher.allowed_tokens().tolist()
    pruned, ends = prune_and_fill_masks(matcher, masks, 2, tree, frozenset({0}))  # its block starts at mask row 2
    assert matcher.allowed_tokens().tolist() == before  # the matcher ends as it began
    paths = {tuple(pruned.tokens[j] for j in pruned.path(i)) for i in range(len(pruned))}
    assert tuple(good) in paths and tuple(other) in paths
    assert not any(bad[1] in p for p in paths)  # "z" and everything under it is gone
    assert ends == [t == 0 for t in pruned.tokens]  # EOS after "}" ends the document
    # each kept node's mask is the grammar's mask after its path
    for i in range(len(pruned)):
        if ends[i]:
            continue
        check = compiled.matcher()
        for t in prefix + [pruned.tokens[j] for j in pruned.path(i)]:
            assert check.accept(t)
        expected = allocate_bitmask(1, len(tok))
        check.fill_mask(expected, 0)
        assert torch.equal(masks[2 + 1 + i], expected[0])


def test_the_greedy_step_takes_the_branch_the_target_would_write(llama):
    """With every branch legal and no grammar, the accepted path is the target's own greedy continuation."""
    prompt = [3, 1, 4, 1, 5]
    greedy, context = [], list(prompt)
    for _ in range(3):
        greedy.append(int(chain_logits(llama, context).argmax()))
        context.append(greedy[-1])
    wrong = [(t + 1) % 64 for t in greedy]
    tree = DraftTree.from_paths([wrong, greedy[:1] + wrong[1:], greedy[:2], [greedy[0], wrong[1]]])
    kv, (logits,) = tree_pass(llama, [prompt], [tree], cached=len(prompt) - 1)
    path, next_token = descend(tree, [False] * len(tree), logits.argmax(-1).tolist())
    assert [tree.tokens[i] for i in path] + [next_token] == greedy
    kv.keep([[0] + [1 + i for i in path]])
    assert cache_length(kv.cache) == len(prompt) + 2
