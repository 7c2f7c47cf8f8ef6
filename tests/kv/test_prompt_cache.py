"""generate(..., past_key_values=prompt_cache): the transformers "re-use a prompt cache" recipe, on a tiny Llama."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import DynamicCache

import grammarspec
from grammarspec.kv.cache import cache_length, forward_with_cache

SCHEMA = {
    "type": "object",
    "properties": {
        "a": {"type": "array", "items": {"enum": ["x", "yy", "z"]}, "maxItems": 5},
        "b": {"type": "boolean"},
    },
    "required": ["a", "b"],
    "additionalProperties": False,
}


def prefix_cache(model, ids: list[int]) -> DynamicCache:
    """The recipe: run the model over a prefix with a fresh DynamicCache."""
    cache = DynamicCache(config=model.config)
    forward_with_cache(model, ids, cache, 1)  # model(input_ids, past_key_values=cache) under either argument name
    return cache


@pytest.mark.parametrize("assistant", [None, "auto"])
def test_a_prompt_cache_gives_the_same_output_and_is_left_alone(model, tok, assistant):
    ids = tok("{b:1}{a:[x,yy]}", add_special_tokens=False)["input_ids"]
    cache = prefix_cache(model, ids[:5])
    before = [layer.keys.clone() for layer in cache.layers]
    kwargs = {
        "tokenizer": tok,
        "schema": SCHEMA,
        "assistant": assistant,
        "max_new_tokens": 40,
        "return_dict_in_generate": True,
    }
    fresh = grammarspec.generate(model, torch.tensor([ids]), **kwargs)
    cached = grammarspec.generate(model, torch.tensor([ids]), past_key_values=cache, **kwargs)
    assert cached.sequences.tolist() == fresh.sequences.tolist()
    assert cache_length(cache) == 5 and all(torch.equal(a, layer.keys) for a, layer in zip(before, cache.layers))
    # The same cache serves the next request too (the recipe's copy.deepcopy is built in).
    again = grammarspec.generate(model, torch.tensor([ids]), past_key_values=cache, **kwargs)
    assert again.sequences.tolist() == fresh.sequences.tolist()


def test_a_prompt_cache_skips_the_cached_tokens(model, tok):
    ids = tok("{b:1}{a:[x,yy]}", add_special_tokens=False)["input_ids"]
    cache = prefix_cache(model, ids[:6])
    seen: list[int] = []
    original = model.forward

    def spy(*args, **kwargs):
        seen.append(int(kwargs["input_ids"].shape[1]))
        return original(*args, **kwargs)

    model.forward = spy
    try:
        grammarspec.generate(
            model, torch.tensor([ids]), tokenizer=tok, schema=SCHEMA, max_new_tokens=3, past_key_values=cache
        )
    finally:
        del model.forward
    assert seen[0] == len(ids) - 6  # only the uncached prompt tokens are prefilled


def test_update_cache_extends_the_users_cache(model, tok):
    ids = tok("{b:1}{a:[x,yy]}", add_special_tokens=False)["input_ids"]
    cache = prefix_cache(model, ids[:5])
    out = grammarspec.generate(
        model,
        torch.tensor([ids]),
        tokenizer=tok,
        schema=SCHEMA,
        max_new_tokens=20,
        past_key_values=cache,
        update_cache=True,
        return_dict_in_generate=True,
    )
    total = len(ids) + out.stats[0].new_tokens
    assert len(ids) <= cache_length(cache) <= total  # prompt + committed tokens (the last one not yet read)


def test_a_cache_that_covers_the_whole_prompt_is_refused(model, tok):
    ids = tok("{b:1}", add_special_tokens=False)["input_ids"]
    cache = prefix_cache(model, ids)
    with pytest.raises(ValueError, match="must read at least the last prompt token"):
        grammarspec.generate(model, torch.tensor([ids]), tokenizer=tok, schema=SCHEMA, past_key_values=cache)
    with pytest.raises(ValueError, match="batch size 1"):
        grammarspec.generate(
            model, torch.tensor([ids, ids]), tokenizer=tok, schema=SCHEMA, past_key_values=copy.deepcopy(cache)
        )
