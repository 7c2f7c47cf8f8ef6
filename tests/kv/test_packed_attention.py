"""Packed forwards: a ragged step as one sequence of its real tokens, the same logits and cache as the masked path."""

from __future__ import annotations

import random

import pytest
import torch
from torch.nn import functional

from grammarspec.engine.tree_layout import tree_allowed
from grammarspec.kv.batch import BatchKV
from grammarspec.kv.packed_attention import (
    BATCHED,
    ROWS,
    attention_path,
    batched,
    batched_arrays,
    row_mask,
    supports_packing,
)
from tests.toy_models import tiny_llama

V = 64


def _filled(model, lengths, packed, path=ROWS):
    """A batch whose rows hold random prompts of ``lengths`` (the same tokens whatever the path)."""
    rng = random.Random(5)
    kv = BatchKV(model, 0, slots=len(lengths))
    kv.add_rows(len(lengths))
    kv.packed = packed
    kv.attention_path = path
    prompts = [[rng.randrange(2, V) for _ in range(n)] for n in lengths]
    kv.forward(prompts, [()] * len(prompts), scored=[False] * len(prompts))
    kv.keep([list(range(n)) for n in lengths])
    return kv


def _step(kv, chunks, parents, scored, kept):
    shapes = []
    original = kv.model.forward
    kv.model.forward = lambda *a, **k: (shapes.append(tuple(k["input_ids"].shape)), original(*a, **k))[1]
    try:
        logits = kv.forward(chunks, parents, width=3, scored=scored)  # rows wider than the folded pieces
    finally:
        del kv.model.forward
    kv.keep(kept)
    return logits, shapes[0]


@pytest.mark.parametrize("path", [ROWS, BATCHED])
def test_a_ragged_step_runs_packed_and_equals_the_masked_path(path):
    """Rows of different lengths feeding one token, a chain, a branching tree and an unscored prompt chunk:
    one packed sequence of exactly their tokens (the masked path pads and folds them), the same logits, and
    the same cache afterwards (the next step's logits agree too), on either attention path."""
    model = tiny_llama(V, seed=4)
    assert supports_packing(model)
    lengths = [5, 9, 2, 14]
    packed, masked = _filled(model, lengths, True, path), _filled(model, lengths, False)
    chunks = [[7], [3, 11, 12, 13], [9, 20, 21, 22], [30, 31, 32, 33, 34, 35, 36]]
    parents = [(), (-1, 0, 1), (-1, -1, 1), ()]
    scored = [True, True, True, False]
    kept = [[0], [0, 1], [0, 2, 3], list(range(7))]
    got, shape = _step(packed, chunks, parents, scored, kept)
    want, masked_shape = _step(masked, chunks, parents, scored, kept)
    assert shape == (1, sum(map(len, chunks)))  # nothing padded
    assert masked_shape[0] > 4  # the masked path folded the chunk into extra rows and padded every row
    assert got.shape == want.shape == (1 + 4 + 4, V)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert packed.lengths == masked.lengths == [6, 11, 5, 21]
    nxt = [[8], [14, 15], [16], [40, 41]]
    got, _ = _step(packed, nxt, [()] * 4, [True] * 4, [[0], [0, 1], [0], [0, 1]])
    want, _ = _step(masked, nxt, [()] * 4, [True] * 4, [[0], [0, 1], [0], [0, 1]])
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_a_packed_row_equals_the_row_run_alone_by_hugging_face():
    """A row of a packed step scores its tokens as ``model(ids)`` over its whole sequence does."""
    model = tiny_llama(V, seed=6)
    kv = _filled(model, [3, 10], True)
    rng = random.Random(5)
    prompts = [[rng.randrange(2, V) for _ in range(n)] for n in (3, 10)]
    chunks = [[4, 5, 6], [7]]
    logits, _ = _step(kv, chunks, [(), ()], [True, True], [[0, 1, 2], [0]])
    with torch.inference_mode():
        alone = [model(torch.tensor([p + c])).logits[0, -1].float() for p, c in zip(prompts, chunks)]
    torch.testing.assert_close(logits, torch.stack(alone), atol=1e-4, rtol=1e-4)


def test_the_model_keeps_its_attention_implementation():
    """A packed forward sets its attention implementation for its own call only."""
    model = tiny_llama(V, seed=4)
    before = model.config._attn_implementation
    kv = _filled(model, [2, 6], True)
    _step(kv, [[3, 4], [5]], [(), ()], [True, True], [[0, 1], [0]])
    assert model.config._attn_implementation == before
    with torch.inference_mode():
        model(torch.tensor([[3, 4, 5]]))  # an ordinary call still runs its own attention


def test_row_mask_matches_the_tree_layout():
    """The packed row's mask is the tree layout's, after every cached column, repeated per query group."""
    parents, pending, start = (-1, 0, -1, 2), 2, 3
    allowed, _ = tree_allowed(list(parents), pending)
    mask = row_mask(start, pending, parents, groups=2, device=torch.device("cpu"))
    q = pending + len(parents)
    want = torch.cat([torch.ones((q, start), dtype=torch.bool), torch.tensor(allowed)], dim=1)
    assert torch.equal(mask, torch.cat([want, want]))
    assert row_mask(start, 1, (), groups=2, device=torch.device("cpu")) is None


@pytest.mark.parametrize(("attention", "window"), [("eager", None), ("sdpa", 4)])
def test_models_packing_cannot_serve_keep_the_masked_path(attention, window):
    """Eager attention and sliding windows are not packed (their ragged steps keep the 4-D masked forward)."""
    from transformers import LlamaForCausalLM

    from grammarspec.bench.tiny_llama import tiny_llama_config

    config = tiny_llama_config(V, **({"sliding_window": window} if window else {}))
    config._attn_implementation = attention
    assert not supports_packing(LlamaForCausalLM(config))
    config.sliding_window, config._attn_implementation = None, "sdpa"
    assert supports_packing(LlamaForCausalLM(config))  # the same model otherwise packs


def test_each_device_has_one_attention_path():
    """The CPU attends row by row; every accelerator in one call per layer.  No setting chooses it."""
    assert attention_path("cpu") == attention_path(torch.device("cpu")) == ROWS
    assert attention_path("cuda") == attention_path("cuda:1") == attention_path("mps") == BATCHED
    assert BatchKV(tiny_llama(V, seed=4), 1).attention_path == ROWS


def _ragged(rows, seed, *, tree=False, prompt=False):
    """A step of ``rows`` rows of different lengths drafting chains of 1-4 tokens (a branching tree and an unscored
    prompt chunk among them when asked): ``(lengths, chunks, parents, scored, kept)``."""
    rng = random.Random(seed)
    lengths = [rng.randrange(1, 12) for _ in range(rows)]
    chunks, parents, scored, kept = [], [], [], []
    for r in range(rows):
        if prompt and r == rows - 1:
            chunks.append([rng.randrange(2, V) for _ in range(9)])
            parents.append(())
            scored.append(False)
            kept.append(list(range(9)))
            continue
        nodes = (-1, 0, -1, 2, 1) if tree and r == 0 else tuple(range(-1, rng.randrange(1, 5) - 1))
        chunks.append([rng.randrange(2, V) for _ in range(1 + len(nodes))])
        parents.append(nodes)
        scored.append(True)
        kept.append([0, 1] if nodes else [0])
    return lengths, chunks, parents, scored, kept


@pytest.mark.parametrize("rows", [1, 4, 16])
@pytest.mark.parametrize("extra", ["chains", "tree and prompt"])
def test_the_one_call_path_equals_the_row_path(rows, extra):
    """Drafting rows of different lengths, a branching tree and a joining prompt chunk: the same logits row for
    row on both paths, and the same cache (the next step's logits agree too)."""
    model = tiny_llama(V, seed=7)
    lengths, chunks, parents, scored, kept = _ragged(rows, rows, tree=extra != "chains", prompt=extra != "chains")
    by_rows, one_call = _filled(model, lengths, True, ROWS), _filled(model, lengths, True, BATCHED)
    want, _ = _step(by_rows, chunks, parents, scored, kept)
    got, _ = _step(one_call, chunks, parents, scored, kept)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    nxt = [[5 + r, 6] for r in range(rows)]
    want, _ = _step(by_rows, nxt, [()] * rows, [True] * rows, [[0, 1]] * rows)
    got, _ = _step(one_call, nxt, [()] * rows, [True] * rows, [[0, 1]] * rows)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def _attention_calls(path, rows, extra):
    """SDPA calls in one drafted step of ``rows`` rows on ``path`` (the model's layers: 2)."""
    model = tiny_llama(V, seed=7)
    lengths, chunks, parents, scored, kept = _ragged(rows, rows, tree=extra, prompt=extra)
    kv = _filled(model, lengths, True, path)
    calls = []
    original = functional.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return original(*args, **kwargs)

    functional.scaled_dot_product_attention = counted
    try:
        _step(kv, chunks, parents, scored, kept)
    finally:
        functional.scaled_dot_product_attention = original
    return len(calls)


@pytest.mark.parametrize("extra", [False, True])
def test_the_one_call_path_launches_one_attention_per_layer_whatever_the_rows(extra):
    """1, 4 and 16 drafting rows (with a tree and a joining prompt chunk, or without): one attention call per
    layer on the accelerator path; the CPU's row path makes more as rows grow (the count sees them)."""
    layers = tiny_llama(V, seed=7).config.num_hidden_layers
    assert [_attention_calls(BATCHED, rows, extra) for rows in (1, 4, 16)] == [layers] * 3
    row_path = [_attention_calls(ROWS, rows, extra) for rows in (1, 4, 16)]
    assert row_path[0] == layers and row_path[2] > row_path[1] > layers


def test_the_one_call_mask_is_each_row_s_tree_layout():
    """Query ``j`` of row ``r`` sees the row's cached columns and what the tree layout allows among its new ones;
    nothing of the columns past its new tokens; the query heads sharing a key head see alike."""
    starts, parents, pendings = [3, 0, 5], [(-1, 0, -1, 2), (), (-1, 0)], [2, 4, 1]
    sizes = [p + len(n) for p, n in zip(pendings, parents)]
    width = max(s + n for s, n in zip(starts, sizes)) + 2  # two stale columns past every row
    arrays, queries, nodes = batched_arrays(starts, sizes, pendings, parents)
    plan = batched([torch.tensor(a, dtype=torch.long) for a in arrays], queries, nodes, width, 2, torch.float32)
    seen = plan.mask[:, 0] == 0  # [R, 2 * Q, W]
    assert seen.shape == (3, 2 * queries, width)
    for r, (start, size) in enumerate(zip(starts, sizes)):
        allowed, _ = tree_allowed(list(parents[r]), pendings[r])
        want = torch.zeros((size, width), dtype=torch.bool)
        want[:, :start] = True
        want[:, start : start + size] = torch.tensor(allowed)
        assert torch.equal(seen[r, :size], want) and torch.equal(seen[r, queries : queries + size], want)
