"""Every shipped tokenizer family: canonical drafting, greedy parity and the user paths.

The vocabularies are llama.cpp's vocabulary-only GGUF files shipped in
``data/tokenizers`` (Llama 2 / Mistral SentencePiece with byte fallback, and
Phi-3's SentencePiece with its template that renders only user and assistant
turns).  The models are 1-layer random Llamas with the family's vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import xgrammar as xgr
from transformers import LlamaConfig, LlamaForCausalLM
from xgrammar.contrib.hf import LogitsProcessor

import grammarspec
from grammarspec.bench.families import ScriptedLlama, canonical_answer, load_family_tokenizer, run_family
from grammarspec.bench.tasks import default_tasks_path, load_tasks
from grammarspec.templates import dropped_roles, fit_messages
from grammarspec.vocabulary import VocabularyMismatch, check_vocabulary
from proposers.text import continuation_tokens

DATA = Path(__file__).resolve().parents[1] / "data" / "tokenizers"
FAMILIES = ("llama-spm", "phi-3")
#: Enums only: a random model finishes it in a few tokens.
SHORT = {
    "type": "object",
    "properties": {"name": {"enum": ["Ana Lee", "Bo"]}, "size": {"enum": ["small", "extra large"]}},
    "required": ["name", "size"],
}
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "size": {"enum": ["small", "extra large"]}, "n": {"type": "integer"}},
    "required": ["name", "size", "n"],
}


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    return request.param, load_family_tokenizer(DATA / f"ggml-vocab-{request.param}.gguf")


def tiny_llama(vocab: int, eos: int, seed: int = 0) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


# --- text -> tokens in the family's own split -------------------------------------------------


TEXTS = [
    '{"name":"John Smith","size":"extra large","n":31}',
    '{"note":"line one\\nline two","tags":["a b","été €5"],"ok":true}',
    'From: Ana Lee\n  Total due: $508.80 (6%)\n{"total":508.8}',
]


@pytest.mark.parametrize("text", TEXTS)
def test_continuation_is_the_split_in_context(family, text):
    """Cut the canonical tokens of a text anywhere: the rest re-tokenized after the cut is the canonical rest."""
    _, tok = family
    prompt = tok.encode("Reply in JSON.\n", add_special_tokens=False)
    ids = prompt + continuation_tokens(tok, prompt, text, lookback=16)
    assert tok.decode(ids[len(prompt) :]) == text  # the whole text, spelled exactly (no dummy-prefix space)
    for cut in range(len(prompt) + 1, len(ids)):
        rest = tok.decode(ids[cut:])
        if tok.decode(ids[:cut]) + rest != tok.decode(ids):
            continue  # the cut splits a character's bytes
        assert continuation_tokens(tok, ids[:cut], rest) == ids[cut:], f"cut at {cut}: {rest!r}"


# --- the scripted canonical target -----------------------------------------------------------


def test_drafts_follow_the_family_split(family):
    """The scripted target writes the reference in the family's split; auto's drafts predict it."""
    name, tok = family
    result = run_family(name, tok, [t for t in load_tasks_file() if t.id in FEW])
    assert result.tasks == len(FEW) and result.followed == result.tasks, result.skipped
    assert result.accepted.get("jump_forward", 0) > 0 and result.accepted.get("schema_ngram", 0) > 0
    # a family whose drafters fall silent makes under two tokens per pass; SmolLM2 makes 5.9 here
    assert result.tokens_per_pass > 4.0, result.as_dict()


FEW = ("tc-weather-forecast-lisbon", "tc-sql-describe-orders")


def load_tasks_file():
    return load_tasks(default_tasks_path())


def test_scripted_target_writes_the_canonical_answer(family):
    """The benchmark's target: greedy decoding without drafts writes the reference, canonically split."""
    _, tok = family
    task = next(t for t in load_tasks_file() if t.id == FEW[1])
    prompt = grammarspec.build_prompt(tok, task.prompt, system=task.system, schema=task.schema, tools=task.tools)
    answer = canonical_answer(task)
    model = ScriptedLlama.tiny(len(tok), tok.eos_token_id)
    model.script = prompt + continuation_tokens(tok, prompt, answer, lookback=16)
    out = grammarspec.generate(model, torch.tensor([prompt]), tokenizer=tok, schema=task.schema, max_new_tokens=64)
    assert tok.decode(out[0, len(prompt) :], skip_special_tokens=True) == answer
    assert json.loads(answer) == {"name": "describe_table", "arguments": {"database": "analytics", "table": "orders"}}


# --- exactness -------------------------------------------------------------------------------


def xgrammar_processor(tok, vocab, schema):
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab, stop_token_ids=[tok.eos_token_id])
    compiled = xgr.GrammarCompiler(info).compile_json_schema(
        json.dumps(schema), any_whitespace=False, separators=(",", ":")
    )
    return compiled, LogitsProcessor(compiled)


def test_greedy_parity_with_hf_generate(family):
    """Greedy with every drafter equals HF generate + xgrammar's logits processor, token for token."""
    _, tok = family
    model = tiny_llama(len(tok), tok.eos_token_id, seed=1)
    prompt = grammarspec.build_prompt(tok, "Describe the item Ana Lee ordered: an extra large shirt.", schema=SCHEMA)
    ids = torch.tensor([prompt])
    kw = dict(tokenizer=tok, schema=SCHEMA, max_new_tokens=40, return_dict_in_generate=True)
    plain = grammarspec.generate(model, ids, assistant="none", **kw)
    spec = grammarspec.generate(model, ids, assistant="auto", **kw)
    _, processor = xgrammar_processor(tok, len(tok), SCHEMA)
    hf = model.generate(ids, max_new_tokens=40, do_sample=False, logits_processor=[processor])
    n = plain.stats[0].new_tokens
    reference = plain.sequences[0, len(prompt) : len(prompt) + n].tolist()
    assert spec.sequences[0, len(prompt) : len(prompt) + n].tolist() == reference
    assert hf[0, len(prompt) : len(prompt) + n].tolist() == reference
    assert spec.stats[0].target_forwards <= plain.stats[0].target_forwards


# --- the user paths --------------------------------------------------------------------------


#: Llama 2's chat format ([INST] turns); this short form renders no system message, as Phi-3's does not.
LLAMA2_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% elif m['role'] == 'assistant' %} {{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)


def test_complete_and_conversation(family):
    """complete() and Conversation make schema-valid JSON; the system text reaches the model on Phi-3 too."""
    name, tok = family
    model = tiny_llama(len(tok), tok.eos_token_id, seed=3)
    done = grammarspec.complete(model, tok, "Ana Lee wants an extra large shirt.", schema=SHORT, max_new_tokens=60)
    assert done.stats.finish_reason == "stop" and set(json.loads(done.text)) == {"name", "size"}
    template = tok.chat_template
    tok.chat_template = template or LLAMA2_TEMPLATE  # the GGUF file has none: Llama 2's [INST] turns
    try:
        chat = grammarspec.Conversation(model, tok, system="Answer as JSON. SYSTEM-MARK")
        chat.add_user("Ana Lee wants an extra large shirt.")
        reply = chat.reply(schema=SHORT, max_new_tokens=60)
        assert set(json.loads(reply.message["content"])) == {"name", "size"}
        assert "SYSTEM-MARK" in tok.decode(chat.prompt_ids())
    finally:
        tok.chat_template = template


def test_server_response_format(family):
    """The server's response_format on an in-process engine: a schema-valid answer."""
    from starlette.testclient import TestClient

    from grammarspec.serve import Engine, create_app

    _, tok = family
    model = tiny_llama(len(tok), tok.eos_token_id, seed=4)
    template = tok.chat_template
    tok.chat_template = template or LLAMA2_TEMPLATE  # the GGUF file has none: Llama 2's [INST] turns
    try:
        app = create_app(Engine(model, tok, max_batch_size=2, max_tokens=64), "tiny")
        with TestClient(app) as client:
            body = {
                "model": "tiny",
                "messages": [{"role": "system", "content": "JSON only."}, {"role": "user", "content": "A shirt."}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "item", "schema": SHORT}},
                "max_tokens": 60,
            }
            reply = client.post("/v1/chat/completions", json=body)
    finally:
        tok.chat_template = template
    assert reply.status_code == 200, reply.text
    assert set(json.loads(reply.json()["choices"][0]["message"]["content"])) == {"name", "size"}


# --- what a user of another family trips on --------------------------------------------------


def test_phi3_template_drops_system_and_tool_messages():
    tok = load_family_tokenizer(DATA / "ggml-vocab-phi-3.gguf")
    assert dropped_roles(tok) == {"system", "tool"}
    messages = [
        {"role": "system", "content": "Tools: f"},
        {"role": "user", "content": "Call f."},
        {"role": "assistant", "content": '{"name":"f","arguments":{}}'},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]
    fitted = fit_messages(tok, messages)
    assert [m["role"] for m in fitted] == ["user", "assistant", "user"]
    text = tok.apply_chat_template(fitted, tokenize=False, add_generation_prompt=True)
    assert "Tools: f\n\nCall f." in text and "Tool result (c1): 42" in text
    ids = grammarspec.build_prompt(tok, "Hi", system="SYSTEM-MARK", schema=SCHEMA)
    assert "SYSTEM-MARK" in tok.decode(ids) and '"extra large"' in tok.decode(ids)
    spm = load_family_tokenizer(DATA / "ggml-vocab-llama-spm.gguf")
    assert dropped_roles(spm) == frozenset()  # no template: build_prompt writes every message


def test_tokenizer_of_another_family_is_refused():
    spm = load_family_tokenizer(DATA / "ggml-vocab-llama-spm.gguf")
    phi = load_family_tokenizer(DATA / "ggml-vocab-phi-3.gguf")
    check_vocabulary(32064, spm)  # a padded vocabulary (Phi-3 pads 32,011 tokens to 32,064)
    check_vocabulary(32064, phi)
    with pytest.raises(VocabularyMismatch, match="1,000 tokens the model cannot emit"):
        check_vocabulary(31000, spm)
    with pytest.raises(VocabularyMismatch, match="119,936 ids the tokenizer does not know"):
        check_vocabulary(151936, spm)
    small = tiny_llama(31000, spm.eos_token_id)
    with pytest.raises(VocabularyMismatch, match="cannot emit"):
        grammarspec.generate(small, torch.tensor([[1, 2]]), tokenizer=spm, schema=SCHEMA, max_new_tokens=4)


def test_qwen3_tool_calls_are_compact_unless_asked():
    """tool_format="qwen_3": arguments in the template's own spacing, no free whitespace by default."""
    from grammarspec.tool_calls import tool_constraint

    tools = [{"type": "function", "function": {"name": "f", "parameters": SHORT}}]
    info = xgr.TokenizerInfo([chr(i) for i in range(32, 127)] + ["\n"])
    good = '<tool_call>\n{"name": "f", "arguments": {"name": "Bo", "size": "small"}}\n</tool_call>'
    loose = '<tool_call>\n{"name": "f", "arguments": {"name":   "Bo",\n "size": "small"}}\n</tool_call>'
    for any_whitespace, accepted in ((False, {good}), (True, {good, loose})):
        grammar = tool_constraint(tools, "required", False, "qwen_3", any_whitespace)["grammar"]
        compiled = xgr.GrammarCompiler(info).compile_grammar(xgr.Grammar.from_ebnf(grammar))
        found = {text for text in (good, loose) if xgr.GrammarMatcher(compiled).accept_string(text)}
        assert found == accepted, any_whitespace
