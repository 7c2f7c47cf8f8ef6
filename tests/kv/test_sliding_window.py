"""Sliding-window models (Mistral v0.1, Phi-3, Gemma 2/3...): a tiny random Mistral with an 8-token window.

grammarspec's own caches hold every column in every layer (:func:`grammarspec.kv.cache.new_cache`), so a
rejected draft is cut back exactly and a sliding layer's window is applied by the attention mask alone;
Hugging Face's own ``DynamicCache(config=...)`` keeps only the last ``window - 1`` columns of a sliding
layer, and cannot be cut back once the window is full.  These tests pin the behaviour: greedy output
equals Hugging Face ``generate`` (which uses the sliding cache) + xgrammar's processor, at batch 1 and
in a batch whose rows leave at different steps (each row's window in its own mask) and join late;
a caller's sliding prompt cache is refused with what to do; a ``Conversation`` on the sliding model
gives what a fresh call gives.  Every answer runs past the window.
"""

from __future__ import annotations

import json

import pytest
import torch
import xgrammar as xgr
from transformers import DynamicCache, LogitsProcessorList, MistralConfig, MistralForCausalLM
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer
from xgrammar.contrib.hf import LogitsProcessor

import grammarspec
from grammarspec.kv import batch as kv_module
from grammarspec.kv.cache import CacheError, forward_with_cache, new_cache
from tests.toy import toy_tokenizer, toy_vocab_size

WINDOW = 8
SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "a": {"type": "array", "items": {"enum": ["x", "yy", "z"]}, "maxItems": 6},
            "b": {"type": "boolean"},
        },
        "required": ["a", "b"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"enum": ["ab", "cd", "e"]}, "minItems": 2, "maxItems": 8},
    {
        "type": "object",
        "properties": {"k": {"type": "string", "maxLength": 12}},
        "required": ["k"],
        "additionalProperties": False,
    },
]
PROMPTS = ["{b:1}{a:[x,yy]}", "[ab,cd,ab,cd]", "{k:abc}"]


def sliding_mistral(vocab_size: int, seed: int = 0) -> MistralForCausalLM:
    """A random Mistral whose two layers attend to the last ``WINDOW`` tokens only (no download)."""
    torch.manual_seed(seed)
    config = MistralConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        sliding_window=WINDOW,
        bos_token_id=None,
        eos_token_id=0,
        pad_token_id=1,
        tie_word_embeddings=False,
    )
    model = MistralForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)  # decisive greedy choices, not near-ties
    return model.eval()


@pytest.fixture(scope="module")
def model():
    return sliding_mistral(toy_vocab_size(), seed=3)


def hf_reference(model, tok, prompt: str, schema: dict, max_new: int) -> list[int]:
    """Hugging Face generate (its sliding DynamicCache) + xgrammar's processor, greedy, batch 1."""
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=toy_vocab_size(tok), stop_token_ids=[0])
    grammar = xgr.GrammarCompiler(info).compile_json_schema(
        json.dumps(schema), any_whitespace=False, separators=(",", ":")
    )  # grammarspec's compact JSON
    ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new,
        do_sample=False,
        logits_processor=LogitsProcessorList([LogitsProcessor(grammar)]),
        eos_token_id=0,
        pad_token_id=1,
    )
    row = out[0, ids.shape[1] :].tolist()
    return row[: row.index(0) + 1] if 0 in row else row


def ours(model, tok, prompts: list[str], schemas: list[dict], max_new: int, **kwargs) -> list[list[int]]:
    rows = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    width = max(map(len, rows))
    ids = torch.tensor([[1] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    out = grammarspec.generate(
        model,
        ids,
        attention_mask=mask,
        tokenizer=tok,
        schema=schemas,
        max_new_tokens=max_new,
        do_sample=False,
        return_dict_in_generate=True,
        **kwargs,
    )
    return [out.sequences[i, width:].tolist()[: s.new_tokens] for i, s in enumerate(out.stats)]


@pytest.fixture(scope="module")
def reference(model, tok):
    return [hf_reference(model, tok, p, s, 40) for p, s in zip(PROMPTS, SCHEMAS)]


def test_hf_itself_keeps_only_the_window_and_ours_keeps_every_column(model):
    hf = DynamicCache(config=model.config)
    assert all(isinstance(layer, DynamicSlidingWindowLayer) for layer in hf.layers)
    ids = list(range(2, 2 + 3 * WINDOW))
    forward_with_cache(model, ids, hf, 1)
    assert hf.layers[0].keys.shape[2] == WINDOW - 1  # Hugging Face's sliding cache forgets
    with pytest.raises(RuntimeError, match="sliding window"):
        hf.crop(len(ids) - 2)  # ... and so cannot be rolled back
    ours_ = new_cache(model)
    assert all(type(layer) is DynamicLayer for layer in ours_.layers)
    forward_with_cache(model, ids, ours_, 1)
    assert ours_.layers[0].keys.shape[2] == len(ids)
    ours_.crop(-5)
    assert ours_.get_seq_length() == len(ids) - 5


@pytest.mark.parametrize("assistant", ["none", "auto", "prompt_lookup"])
def test_greedy_at_batch_one_equals_hf_past_the_window(model, tok, reference, assistant):
    got = [ours(model, tok, [p], [s], 40, assistant=assistant)[0] for p, s in zip(PROMPTS, SCHEMAS)]
    assert got == reference
    prompt_lengths = [len(tok(p, add_special_tokens=False)["input_ids"]) for p in PROMPTS]
    assert all(n + len(r) > 2 * WINDOW for n, r in zip(prompt_lengths, reference))  # every answer passes the window


def test_a_batch_whose_rows_leave_and_join_equals_hf(model, tok, reference, monkeypatch):
    windowed = []  # per masked pass: whether rows of different lengths attended through the window together
    original = kv_module.BatchKV._masks

    def spy(self, feeds, *args):
        windowed.append(self._window is not None and len({f.start for f in feeds}) > 1)
        return original(self, feeds, *args)

    monkeypatch.setattr(kv_module.BatchKV, "_masks", spy)
    assert ours(model, tok, PROMPTS, SCHEMAS, 40, assistant="auto") == reference
    assert any(windowed)  # rows of different lengths, each with its own window, in one pass
    assert len({len(r) for r in reference}) > 1
    assert ours(model, tok, PROMPTS, SCHEMAS, 40, assistant="auto", max_batch_size=2) == reference  # the third joins
    assert ours(model, tok, PROMPTS, SCHEMAS, 40, assistant="none") == reference


def test_a_caller_s_sliding_prompt_cache(model, tok, reference):
    """A ``DynamicCache(config=...)`` built by the caller: fine within the window, refused with the fix beyond it."""
    ids = tok(PROMPTS[0], add_special_tokens=False)["input_ids"]
    assert len(ids) > WINDOW
    short = DynamicCache(config=model.config)
    forward_with_cache(model, ids[:4], short, 1)  # within the window: every column is still there
    out = grammarspec.generate(
        model,
        torch.tensor([ids]),
        tokenizer=tok,
        schema=SCHEMAS[0],
        max_new_tokens=40,
        do_sample=False,
        past_key_values=short,
        return_dict_in_generate=True,
    )
    assert out.sequences[0, len(ids) :].tolist()[: out.stats[0].new_tokens] == reference[0]
    full = DynamicCache(config=model.config)
    forward_with_cache(model, ids[:-1], full, 1)  # past the window: the cache has forgotten columns
    with pytest.raises((CacheError, ValueError), match="sliding"):
        grammarspec.generate(
            model,
            torch.tensor([ids]),
            tokenizer=tok,
            schema=SCHEMAS[0],
            max_new_tokens=40,
            do_sample=False,
            past_key_values=full,
            assistant="auto",
        )


def test_a_conversation_on_a_sliding_model_equals_fresh_calls(model, tok):
    chat = toy_tokenizer()
    chat.chat_template = (
        "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}a:{% endif %}"
    )
    conversation = grammarspec.Conversation(model, chat, assistant="auto", do_sample=False)
    for turn, schema in zip(["ab", "cd e", "x yy z"], SCHEMAS):
        conversation.add_user(turn)
        reply = conversation.reply(schema=schema, max_new_tokens=30)
        ids = conversation.prompt_ids(conversation.messages[:-1])
        fresh = grammarspec.generate(
            model,
            torch.tensor([ids]),
            tokenizer=chat,
            schema=schema,
            max_new_tokens=30,
            do_sample=False,
            assistant="auto",
            return_dict_in_generate=True,
        )
        assert reply.tokens == fresh.sequences[0, len(ids) :].tolist()[: fresh.stats[0].new_tokens]
    assert (
        len(ids) > 2 * WINDOW and conversation.replies[-1].reused_tokens > WINDOW
    )  # the cache was reused past the window
