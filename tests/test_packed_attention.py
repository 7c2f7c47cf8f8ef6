"""Packed forwards: a ragged step as one sequence of its real tokens, the same logits and cache as the masked path."""

from __future__ import annotations

import random

import pytest
import torch
from toy_models import tiny_llama

from grammarspec.kv import BatchKV
from grammarspec.packed_attention import row_mask, supports_packing
from grammarspec.tree_layout import tree_allowed

V = 64


def _filled(model, lengths, packed):
    """A batch whose rows hold random prompts of ``lengths`` (the same tokens whatever the path)."""
    rng = random.Random(5)
    kv = BatchKV(model, 0, slots=len(lengths))
    kv.add_rows(len(lengths))
    kv.packed = packed
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


def test_a_ragged_step_runs_packed_and_equals_the_masked_path():
    """Rows of different lengths feeding one token, a chain, a branching tree and an unscored prompt chunk:
    one packed sequence of exactly their tokens (the masked path pads and folds them), the same logits, and
    the same cache afterwards (the next step's logits agree too)."""
    model = tiny_llama(V, seed=4)
    assert supports_packing(model)
    lengths = [5, 9, 2, 14]
    packed, masked = _filled(model, lengths, True), _filled(model, lengths, False)
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
