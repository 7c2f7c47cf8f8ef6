"""Hugging Face compatibility of grammarspec.generate / enable, on tiny random Llamas."""

from __future__ import annotations

import json
import threading

import jsonschema
import pytest
import torch

from tests.toy import toy_vocab_size

V = toy_vocab_size()
from transformers import TextIteratorStreamer

import grammarspec
from grammars import compile_grammar, grammar_spec
from grammarspec import GenerationOutput
from tests.toy_models import tiny_llama

SCHEMA = {
    "type": "object",
    "properties": {
        "a": {"type": "array", "items": {"enum": ["x", "yy", "z"]}, "maxItems": 5},
        "b": {"type": "boolean"},
    },
    "required": ["a", "b"],
    "additionalProperties": False,
}


def new_tokens(out, prompt):
    return out[0, prompt.shape[1] :].tolist()


def test_constrained_output_is_valid_json(model, tok, prompt):
    out = grammarspec.generate(
        model, prompt, tokenizer=tok, schema=SCHEMA, max_new_tokens=60, return_dict_in_generate=True
    )
    assert isinstance(out, GenerationOutput) and out.sequences.dtype == torch.long
    stats = out.stats[0]
    text = tok.decode(new_tokens(out.sequences, prompt), skip_special_tokens=True)
    if stats.finish_reason == "stop":
        value = json.loads(text)
        assert set(value) == {"a", "b"}
        jsonschema.validate(value, SCHEMA)
    else:
        assert stats.finish_reason == "length" and stats.new_tokens == 60


@pytest.mark.parametrize("assistant", [None, "auto"])
def test_finished_outputs_validate_and_cut_ones_are_legal_prefixes(model, tok, prompt, assistant):
    """Greedy and sampled, long enough to finish: a finished output validates against the schema; an
    output cut by the token limit is a prefix the grammar accepts (it never leaves the schema)."""
    compiled = compile_grammar(grammar_spec(schema=SCHEMA), tok, vocab_size=V, stop_token_ids=(tok.eos_token_id,))
    finished = 0
    for seed in range(6):
        sampling = {"do_sample": False} if seed == 0 else {"do_sample": True, "temperature": 1.0}
        out = grammarspec.generate(
            model,
            prompt,
            tokenizer=tok,
            schema=SCHEMA,
            max_new_tokens=60,
            assistant=assistant,
            generator=torch.Generator().manual_seed(seed),
            return_dict_in_generate=True,
            **sampling,
        )
        stats = out.stats[0]
        tokens = new_tokens(out.sequences, prompt)[: stats.new_tokens]
        matcher = compiled.matcher(max_rollback=1)
        assert all(matcher.accept(t) for t in tokens), (seed, tok.decode(tokens))
        if stats.finish_reason == "stop":
            finished += 1
            assert matcher.is_terminated()
            jsonschema.validate(json.loads(tok.decode(tokens, skip_special_tokens=True)), SCHEMA)
        else:
            assert stats.finish_reason == "length" and stats.new_tokens == 60
    assert finished >= 3  # most runs finish within 60 tokens: the validity check above is exercised


@pytest.mark.parametrize("assistant", ["auto", "prompt_lookup", "schema_ngram", "jump_forward"])
def test_every_preset_gives_the_greedy_output(model, tok, prompt, assistant):
    plain = grammarspec.generate(model, prompt, tokenizer=tok, schema=SCHEMA, max_new_tokens=40)
    spec = grammarspec.generate(model, prompt, tokenizer=tok, schema=SCHEMA, max_new_tokens=40, assistant=assistant)
    assert torch.equal(plain, spec)


def test_assistant_model_and_padded_draft_vocabulary(model, tok, prompt):
    plain = grammarspec.generate(model, prompt, tokenizer=tok, schema=SCHEMA, max_new_tokens=40)
    for draft in (tiny_llama(V, seed=3), tiny_llama(V + 8, seed=4)):  # same tokenizer, padded vocabulary
        out = grammarspec.generate(
            model,
            prompt,
            tokenizer=tok,
            schema=SCHEMA,
            max_new_tokens=40,
            assistant_model=draft,
            return_dict_in_generate=True,
        )
        assert torch.equal(out.sequences, plain)
        assert out.stats[0].proposed.get("draft_model", 0) > 0


def test_draft_model_with_another_tokenizer_is_refused(model, tok, prompt):
    with pytest.raises(ValueError, match="does not share the target's tokenizer"):
        grammarspec.generate(model, prompt, tokenizer=tok, schema=SCHEMA, assistant=tiny_llama(V - 10, seed=1))


def test_enable_routes_only_grammarspec_calls(model, tok, prompt):
    enabled = grammarspec.enable(tiny_llama(V, seed=0))  # a copy of `model`: the shared one stays as it is
    ours = enabled.generate(prompt, tokenizer=tok, schema=SCHEMA, assistant="auto", max_new_tokens=30)
    direct = grammarspec.generate(model, prompt, tokenizer=tok, schema=SCHEMA, max_new_tokens=30)
    assert torch.equal(ours, direct)
    # no grammarspec argument: Hugging Face's own generate
    hf = enabled.generate(prompt, max_new_tokens=6, do_sample=False)
    plain = grammarspec.generate(model, prompt, max_new_tokens=6)
    assert torch.equal(hf, plain)  # and unconstrained greedy agrees with it
    # unconstrained speculative decoding through assistant= alone
    spec = enabled.generate(prompt, assistant="prompt_lookup", max_new_tokens=6)
    assert torch.equal(spec, hf)


def test_streamer_receives_committed_tokens(model, tok, prompt):
    streamer = TextIteratorStreamer(tok, skip_prompt=True)
    result = {}

    def work():
        result["out"] = grammarspec.generate(
            model, prompt, tokenizer=tok, schema=SCHEMA, assistant="auto", max_new_tokens=40, streamer=streamer
        )

    thread = threading.Thread(target=work)
    thread.start()
    pieces = list(streamer)
    thread.join()
    assert "".join(pieces) == tok.decode(new_tokens(result["out"], prompt))


def test_batch_rows_decode_independently(model, tok):
    a = tok("{a:1}", add_special_tokens=False)["input_ids"]
    b = tok("[1]", add_special_tokens=False)["input_ids"]
    width = max(len(a), len(b))
    pad = tok.pad_token_id
    ids = torch.tensor([[pad] * (width - len(a)) + a, [pad] * (width - len(b)) + b])
    mask = (ids != pad).long()
    batch = grammarspec.generate(
        model,
        ids,
        attention_mask=mask,
        tokenizer=tok,
        schema=SCHEMA,
        max_new_tokens=25,
        assistant="auto",
        return_dict_in_generate=True,
    )
    for row, single in enumerate((a, b)):
        alone = grammarspec.generate(model, torch.tensor([single]), tokenizer=tok, schema=SCHEMA, max_new_tokens=25)
        n = batch.stats[row].new_tokens
        assert batch.sequences[row, width : width + n].tolist() == alone[0, len(single) :].tolist()
        assert (batch.sequences[row, width + n :] == tok.pad_token_id).all()


def test_sampling_settings_are_honoured(model, tok, prompt):
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    kw = dict(tokenizer=tok, schema=SCHEMA, max_new_tokens=30, do_sample=True, temperature=0.8, top_k=5, top_p=0.9)
    a = grammarspec.generate(model, prompt, generator=g1, **kw)
    b = grammarspec.generate(model, prompt, generator=g2, **kw)
    assert torch.equal(a, b)  # same seed, same sample


@pytest.mark.parametrize("constrained", [True, False], ids=["schema", "free"])
@pytest.mark.parametrize("assistant", [None, "auto"])
def test_top_k_1_sampling_is_greedy(model, tok, prompt, assistant, constrained):
    """top-k comes after the grammar mask: the one token left is the greedy one, whatever the temperature."""
    kw = dict(tokenizer=tok, schema=SCHEMA if constrained else None, max_new_tokens=30, assistant=assistant)
    greedy = grammarspec.generate(model, prompt, do_sample=False, **kw)

    def sample(seed, top_k):
        return grammarspec.generate(
            model,
            prompt,
            do_sample=True,
            temperature=1.7,
            top_k=top_k,
            generator=torch.Generator().manual_seed(seed),
            **kw,
        )

    assert all(torch.equal(sample(seed, 1), greedy) for seed in range(3))
    assert not all(torch.equal(sample(seed, 0), greedy) for seed in range(3))  # without top-k these seeds differ


@pytest.mark.parametrize("assistant", [None, "prompt_lookup"])
def test_top_k_samples_only_the_k_most_probable_tokens(model, tok, assistant):
    """Unconstrained, top_k=3 at a high temperature: every new token is one of the 3 best of its step."""
    k = 3
    prompt = torch.tensor([tok("[1,2,1,2,1,2", add_special_tokens=False)["input_ids"]])
    ranks = []
    for seed in range(4):
        out = grammarspec.generate(
            model,
            prompt,
            max_new_tokens=24,
            do_sample=True,
            temperature=3.0,
            top_k=k,
            assistant=assistant,
            generator=torch.Generator().manual_seed(seed),
            return_dict_in_generate=True,
        )
        n = out.stats[0].new_tokens
        sequence = out.sequences[:, : prompt.shape[1] + n]
        with torch.no_grad():
            logits = model(sequence).logits[0, prompt.shape[1] - 1 : -1]  # the step that chose each new token
        new = sequence[0, prompt.shape[1] :]
        ranks += (logits > logits.gather(1, new[:, None])).sum(1).tolist()  # tokens more probable than the one chosen
    assert max(ranks) < k, ranks
    assert len(set(ranks)) > 1  # a high temperature: not always the most probable token (it samples)


def test_min_new_tokens_and_stop_strings(model, tok, prompt):
    out = grammarspec.generate(
        model, prompt, max_new_tokens=12, min_new_tokens=12, eos_token_id=0, return_dict_in_generate=True
    )
    assert out.stats[0].new_tokens == 12
    text = tok.decode(new_tokens(out.sequences, prompt))
    stop = text[5:7]
    cut = grammarspec.generate(
        model,
        prompt,
        tokenizer=tok,
        max_new_tokens=12,
        stop_strings=[stop],
        assistant="prompt_lookup",
        return_dict_in_generate=True,
    )
    assert cut.stats[0].finish_reason == "stop_string"
    assert tok.decode(new_tokens(cut.sequences, prompt)).endswith(stop)


def test_unknown_argument_names_itself(model, tok, prompt):
    with pytest.raises(TypeError, match="temprature"):
        grammarspec.generate(model, prompt, tokenizer=tok, schema=SCHEMA, temprature=0.5)


def test_constraint_without_tokenizer_is_explained(model, prompt):
    with pytest.raises(ValueError, match="tokenizer="):
        grammarspec.generate(model, prompt, schema=SCHEMA)


def test_empty_prompt_is_explained(model, tok):
    with pytest.raises(ValueError, match="empty"):
        grammarspec.generate(model, torch.zeros((1, 0), dtype=torch.long), tokenizer=tok, schema=SCHEMA)


def test_max_new_tokens_zero_returns_the_prompt(model, tok, prompt):
    out = grammarspec.generate(
        model, prompt, tokenizer=tok, schema=SCHEMA, max_new_tokens=0, return_dict_in_generate=True
    )
    assert torch.equal(out.sequences, prompt) and out.stats[0].finish_reason == "length"


# --- complete() with every constraint kind; up-front checks; streamers always ended -------------------


@pytest.mark.parametrize("kind", ["grammar", "regex", "json_object"])
def test_complete_marks_finished_answers_of_every_kind_valid(tok, kind):
    model = tiny_llama(V, seed=0)
    kwargs = {
        "grammar": {"grammar": 'root ::= "yes" | "no"'},
        "regex": {"regex": "[a-c]{2,4}"},
        "json_object": {"json_object": True},
    }[kind]
    result = grammarspec.complete(model, tok, "answer", max_new_tokens=60, **kwargs)
    assert result.finish_reason == "stop", result.text
    assert result.valid, (result.text, result.errors)
    if kind == "json_object":
        assert isinstance(result.value, dict) and result.value == json.loads(result.text)
    else:
        assert result.value == result.text and result.text in ("yes", "no") or len(result.text) in (2, 3, 4)


def test_prompt_longer_than_the_context_is_refused_up_front(model, tok):
    too_long = torch.full((1, model.config.max_position_embeddings + 1), 5, dtype=torch.long)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        grammarspec.generate(model, too_long, tokenizer=tok, schema=SCHEMA, max_new_tokens=5)


def test_prompt_id_outside_the_vocabulary_is_refused(model, tok):
    for bad in (V + 3, -1):
        with pytest.raises(ValueError, match="outside the model's vocabulary"):
            grammarspec.generate(model, torch.tensor([[2, bad]]), tokenizer=tok, schema=SCHEMA, max_new_tokens=5)


@pytest.mark.parametrize("assistant", ["auto", "schema_ngram", ["jump_forward", "prompt_lookup"]])
def test_text_drafters_without_tokenizer_are_explained(model, prompt, assistant):
    with pytest.raises(ValueError, match="tokenizer="):
        grammarspec.generate(model, prompt, max_new_tokens=5, assistant=assistant)


def test_streamer_is_ended_when_generation_raises(model, tok, prompt):
    streamer = TextIteratorStreamer(tok, skip_prompt=True, timeout=10)
    failed = {}

    def work():
        try:
            grammarspec.generate(
                model, prompt, tokenizer=tok, schema=SCHEMA, max_new_tokens=5, streamer=streamer, num_beams=2
            )
        except ValueError as exc:
            failed["error"] = exc

    thread = threading.Thread(target=work)
    thread.start()
    assert "".join(streamer) == ""  # ends instead of blocking (the timeout would raise queue.Empty)
    thread.join()
    assert "num_beams" in str(failed["error"])
