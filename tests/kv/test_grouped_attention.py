"""Grouped-query attention under a mask: the keys read in place, the same logits bit for bit."""

from __future__ import annotations

import random
from contextlib import nullcontext

import torch

import grammarspec.kv.batch as kv_module
from grammarspec.kv.batch import BatchKV
from grammarspec.kv.grouped_attention import NAME, grouped_model
from tests.toy_models import tiny_llama

V = 64


class _Recorder:
    """Records the key heads and ``enable_gqa`` of every SDPA call with more than one query token."""

    def __init__(self, monkeypatch):
        self.calls = []
        original = torch.nn.functional.scaled_dot_product_attention

        def spy(query, key, value, *args, **kwargs):
            if query.shape[-2] > 1:
                self.calls.append((key.shape[1], bool(kwargs.get("enable_gqa", False))))
            return original(query, key, value, *args, **kwargs)

        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)


def _transformers_path(monkeypatch):
    """Later forwards run transformers' own SDPA attention (the keys repeated per query head)."""
    monkeypatch.setattr(kv_module, "grouped_model", lambda model: nullcontext())


def _chain_logits(model, prompt, chain):
    """Logits of a draft chain fed after ``prompt`` at batch 1 (the mask-free call, a mask built by transformers)."""
    kv = BatchKV(model, 1, columns=len(prompt) + len(chain) + 1)
    kv.packed = False
    kv.forward([prompt], [()])
    kv.keep([list(range(len(prompt)))])
    logits = kv.forward([chain], [tuple(range(-1, len(chain) - 2))])
    kv.keep([list(range(len(chain)))])
    return logits, kv


def test_a_masked_chain_reads_the_key_heads_in_place_and_gives_the_same_logits(monkeypatch):
    """A chain after a cached prefix on a grouped-query model: SDPA sees the 2 key heads (not 4 repeated
    ones) with ``enable_gqa``, and the logits equal transformers' repeat-the-keys path exactly."""
    model = tiny_llama(V, seed=3)
    rng = random.Random(1)
    prompt = [rng.randrange(2, V) for _ in range(23)]
    chain = [rng.randrange(2, V) for _ in range(5)]
    model.config._attn_implementation = "sdpa"

    recorder = _Recorder(monkeypatch)
    got, kv = _chain_logits(model, prompt, chain)
    assert (2, True) in recorder.calls  # the chain's masked call: key heads in place
    assert all(heads == 2 for heads, _ in recorder.calls)
    assert model.config._attn_implementation == "sdpa"  # restored after each forward

    recorder.calls.clear()
    _transformers_path(monkeypatch)
    want, _ = _chain_logits(model, prompt, chain)
    assert (4, False) in recorder.calls  # transformers repeated the key heads for the masked call
    assert torch.equal(got, want)


def test_a_padded_ragged_step_gives_the_same_logits_as_transformers_path(monkeypatch):
    """Rows of different lengths under the 4-D mask (the path without packing), each with several tokens."""
    model = tiny_llama(V, seed=5)
    model.config._attn_implementation = "sdpa"
    rng = random.Random(2)
    lengths = [4, 11, 7]
    prompts = [[rng.randrange(2, V) for _ in range(n)] for n in lengths]
    chunks = [[rng.randrange(2, V) for _ in range(size)] for size in (3, 1, 4)]
    parents = [(-1, 0), (), (-1, 0, 1)]

    def step():
        kv = BatchKV(model, 0, slots=len(lengths))
        kv.add_rows(len(lengths))
        kv.packed = False
        kv.forward(prompts, [()] * len(prompts), scored=[False] * len(prompts))
        kv.keep([list(range(n)) for n in lengths])
        return kv.forward(chunks, parents)

    got = step()
    _transformers_path(monkeypatch)
    assert torch.equal(got, step())


def test_only_sdpa_models_switch_and_each_is_restored():
    """An eager model keeps its implementation; an SDPA one runs :data:`NAME` inside the block only."""
    model = tiny_llama(V, seed=3)
    model.config._attn_implementation = "eager"
    with grouped_model(model):
        assert model.config._attn_implementation == "eager"
    model.config._attn_implementation = "sdpa"
    with grouped_model(model):
        assert model.config._attn_implementation == NAME
    assert model.config._attn_implementation == "sdpa"
