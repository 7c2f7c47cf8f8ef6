"""Issue 26: what a new user trips on -- checks at the door, no silent no-ops, no raw errors.

Tiny random models and the toy tokenizer (no real model needed).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from toy import toy_tokenizer
from toy_models import tiny_llama
from transformers import DynamicCache, GenerationConfig

import grammarspec


@pytest.fixture(scope="module")
def tok():
    return toy_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return tiny_llama(len(tok), seed=0)


@pytest.fixture(scope="module")
def prompt(tok):
    return torch.tensor([tok("{b:1}", add_special_tokens=False)["input_ids"]])


def gen(model, tok, prompt, **kwargs):
    kwargs.setdefault("max_new_tokens", 4)
    return grammarspec.generate(model, prompt, tokenizer=tok, **kwargs)


# --- arguments checked at the door, naming the argument and what it accepts ------------------------


@pytest.mark.parametrize(
    "kwargs, names",
    [
        ({"num_return_sequences": 0, "do_sample": True}, ["num_return_sequences", ">= 1"]),
        ({"max_new_tokens": 2.5}, ["max_new_tokens", "int", "2.5"]),
        ({"max_new_tokens": "8"}, ["max_new_tokens", "int", "'8'"]),
        ({"temperature": "hot", "do_sample": True}, ["temperature", "number", "'hot'"]),
        ({"strict": "yes"}, ["strict", "True or False", "'yes'"]),
        ({"max_batch_size": True}, ["max_batch_size", "int >= 1", "True"]),
        ({"max_batch_size": 1.5}, ["max_batch_size", "int >= 1", "1.5"]),
        ({"max_draft_tokens": 2.5}, ["max_draft_tokens", "int >= 1", "2.5"]),
        ({"generator": 42, "do_sample": True}, ["generator", "torch.Generator", "manual_seed"]),
        ({"use_cache": False}, ["use_cache=False", "KV cache"]),
        ({"generation_config": GenerationConfig(top_k=2.5)}, ["top_k", "2.5"]),
        ({"regex": "[a-z]+", "any_whitespace": True}, ["any_whitespace", "regex"]),
        ({"past_key_values": ((torch.zeros(1), torch.zeros(1)),)}, ["past_key_values", "Cache", "tuple"]),
        ({"compile_timeout": -1}, ["compile_timeout", "> 0"]),
    ],
)
def test_a_bad_argument_is_named_with_what_it_accepts(model, tok, prompt, kwargs, names):
    with pytest.raises(ValueError) as info:
        gen(model, tok, prompt, **kwargs)
    for part in names:
        assert part in str(info.value), (part, str(info.value))


def test_a_prompt_cache_that_is_a_cache_is_still_accepted(model, tok, prompt):
    out = gen(model, tok, prompt, past_key_values=DynamicCache(), max_new_tokens=2)
    assert out.shape[1] == prompt.shape[1] + 2


def test_an_attention_mask_of_the_wrong_shape_is_named(model, tok, prompt):
    with pytest.raises(ValueError, match=r"attention_mask must have the shape of input_ids \(1, \d+\), got \(1, 2\)"):
        gen(model, tok, prompt, attention_mask=torch.ones(1, 2, dtype=torch.long))


def test_an_attention_mask_with_a_hole_inside_the_prompt_is_refused(model, tok, prompt):
    mask = torch.ones_like(prompt)
    mask[0, 2] = 0
    with pytest.raises(ValueError, match="attention_mask row 0 has a 0 between prompt tokens"):
        gen(model, tok, prompt, attention_mask=mask)
    left = torch.ones_like(prompt)
    left[0, 0] = 0  # left padding is what tokenizers produce: still fine
    assert gen(model, tok, prompt, attention_mask=left, max_new_tokens=1).shape[1] == prompt.shape[1] + 1


def test_a_ragged_list_prompt_says_to_pad(model, tok):
    with pytest.raises(ValueError, match=r"input_ids rows have different lengths \(2, 3\).*attention_mask"):
        gen(model, tok, [[5, 6, 7], [5, 6]])


def test_three_dimensional_input_ids_are_not_called_empty(model, tok, prompt):
    with pytest.raises(ValueError, match="2-D.*got 3-D") as info:
        gen(model, tok, prompt.unsqueeze(0))
    assert "empty" not in str(info.value)


def test_a_padded_batch_without_attention_mask_warns(model, tok):
    pad = tok.pad_token_id
    ids = torch.tensor([[pad, pad, 5, 6], [5, 6, 7, 8]])
    with pytest.warns(UserWarning, match="starts with the pad token.*attention_mask"):
        gen(model, tok, ids, max_new_tokens=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gen(model, tok, ids, attention_mask=(ids != pad).long(), max_new_tokens=1)


def test_a_draft_model_with_a_much_bigger_vocabulary_warns(model, tok, prompt):
    with pytest.warns(UserWarning, match="more than the target's 56 padded to 128.*another tokenizer"):
        gen(model, tok, prompt, assistant_model=tiny_llama(len(tok) + 200, seed=1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a padded vocabulary is the same tokenizer
        gen(model, tok, prompt, assistant_model=tiny_llama(len(tok) + 8, seed=1))


def test_output_scores_with_return_dict_gives_no_spurious_transformers_warning(model, tok, prompt):
    import logging

    from transformers.utils import logging as hf_logging

    seen: list[str] = []

    class Record(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Record()
    hf_logging.get_logger("transformers").addHandler(handler)
    hf_logging.get_logger("transformers").warning_once.cache_clear()
    try:
        out = gen(model, tok, prompt, max_new_tokens=3, return_dict_in_generate=True, output_scores=True)
    finally:
        hf_logging.get_logger("transformers").removeHandler(handler)
    assert len(out.scores) == 3
    assert not [m for m in seen if "not valid" in m], seen
