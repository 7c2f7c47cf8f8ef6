"""Every shipped tokenizer family: canonical drafting, greedy parity and the user paths.

The vocabularies are llama.cpp's vocabulary-only GGUF files shipped in
``data/tokenizers`` (Llama 2 / Mistral SentencePiece with byte fallback, and
Phi-3's SentencePiece with its template that renders only user and assistant
turns).  The models are 1-layer random Llamas with the family's vocabulary.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
import torch
import xgrammar as xgr
from transformers import LlamaConfig, LlamaForCausalLM
from xgrammar.contrib.hf import LogitsProcessor

import grammarspec
from grammars import compile_grammar, grammar_spec
from grammars.base import allocate_bitmask
from grammarspec.bench.families import ScriptedLlama, canonical_answer, load_family_tokenizer, run_family
from grammarspec.bench.tasks import default_tasks_path, load_tasks
from grammarspec.engine.sampling import apply_bitmask
from grammarspec.templates import dropped_roles, fit_messages
from grammarspec.vocabulary import VocabularyMismatch, check_vocabulary
from proposers.text import continuation_tokens
from tests.scipy_free_stats import chi_square_pvalue

DATA = Path(__file__).resolve().parents[2] / "data" / "tokenizers"
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


def hf_greedy_text(model, tok, prompt: list[int], schema, max_new_tokens: int) -> str:
    """HF ``generate`` + xgrammar's logits processor, greedy, on ``prompt``: the text before the first EOS."""
    _, processor = xgrammar_processor(tok, len(tok), schema)
    out = model.generate(
        torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False, logits_processor=[processor]
    )[0, len(prompt) :].tolist()
    return tok.decode(out[: out.index(tok.eos_token_id)] if tok.eos_token_id in out else out)


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


#: One enum: a few documents, each with a handful of splits the grammar allows (byte fallback included).
PICK = {"type": "object", "properties": {"s": {"enum": ["ab", "b"]}}, "required": ["s"]}
SAMPLES = 200
P_THRESHOLD = 1e-4
#: Sequences below this probability are not walked one by one: their mass is one pooled bin.
TAIL = 1e-4


def sharp_llama(tok) -> LlamaForCausalLM:
    """A tiny random Llama with logits sharp enough (std about 3) that a few outputs carry most of the mass."""
    model = tiny_llama(len(tok), tok.eos_token_id, seed=0)
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)
    return model


def _pick_grammar(tok):
    return compile_grammar(grammar_spec(schema=PICK), tok, vocab_size=len(tok), stop_token_ids=(tok.eos_token_id,))


def _masked_probs(model, tok, context, matcher) -> torch.Tensor:
    """Plain constrained sampling's next-token distribution at ``context`` (T=1, no top-k/top-p)."""
    mask = allocate_bitmask(1, len(tok))
    matcher.fill_mask(mask, 0)
    with torch.no_grad():
        logits = model(torch.tensor([context])).logits[0, -1].float()
    return apply_bitmask(logits[None], mask).softmax(-1)[0]


def output_probability(model, tok, prompt: list[int], output: tuple[int, ...]) -> float:
    """The probability of one whole output under plain constrained sampling (0 when the grammar refuses it)."""
    matcher, prob = _pick_grammar(tok).matcher(), 1.0
    for i, token in enumerate(output):
        prob *= float(_masked_probs(model, tok, list(prompt) + list(output[:i]), matcher)[token])
        if prob == 0.0 or not matcher.accept(token):
            return 0.0
    return prob if matcher.is_terminated() else 0.0


def exact_outputs(model, tok, prompt: list[int]) -> dict[tuple[int, ...] | None, float]:
    """Every output of plain constrained sampling (T=1) -> its probability; ``None``: the pooled tail under TAIL."""
    out: dict[tuple[int, ...] | None, float] = {None: 0.0}

    def walk(context, matcher, prob):
        if matcher.is_terminated():
            out[tuple(context[len(prompt) :])] = prob
            return
        probs = _masked_probs(model, tok, context, matcher)
        for token in probs.nonzero().flatten().tolist():
            child = matcher.fork()
            assert child.accept(token)
            if prob * float(probs[token]) < TAIL:
                out[None] += prob * float(probs[token])
            else:
                walk(context + [token], child, prob * float(probs[token]))

    walk(list(prompt), _pick_grammar(tok).matcher(), 1.0)
    assert abs(sum(out.values()) - 1.0) < 1e-5
    return out


def sampled_pvalue(family) -> float:
    """Sample SAMPLES outputs with ``assistant="auto"``; the chi-square p-value against the exact distribution."""
    _, tok = family
    model = sharp_llama(tok)
    prompt = tok.encode("Pick one.\n", add_special_tokens=False)
    exact = exact_outputs(model, tok, prompt)
    assert sum(p > 0.01 for p in exact.values()) >= 6, "the grammar and model must leave room for chance"
    out = grammarspec.generate(
        model,
        torch.tensor([prompt]),
        tokenizer=tok,
        schema=PICK,
        assistant="auto",
        do_sample=True,
        temperature=1.0,
        top_k=0,
        num_return_sequences=SAMPLES,
        max_new_tokens=20,
        return_dict_in_generate=True,
        generator=torch.Generator().manual_seed(1),
    )
    proposed = sum(sum(s.proposed.values()) for s in out.stats)
    accepted = sum(sum(s.accepted.values()) for s in out.stats)
    assert proposed > SAMPLES and 0 < accepted < proposed, (proposed, accepted)  # drafts made, some rejected
    seen = Counter(
        tuple(out.sequences[i, len(prompt) : len(prompt) + s.new_tokens].tolist()) for i, s in enumerate(out.stats)
    )
    assert all(s.finish_reason == "stop" for s in out.stats)
    tail = [key for key in seen if key not in exact]  # outputs the walk pooled: each must have a probability < TAIL
    assert all(0.0 < output_probability(model, tok, prompt, key) < TAIL for key in tail), tail
    keys = sorted(key for key in exact if key is not None)
    observed = torch.tensor([seen.get(key, 0) for key in keys] + [sum(seen[key] for key in tail)], dtype=torch.float64)
    expected = torch.tensor([exact[key] * SAMPLES for key in keys] + [exact[None] * SAMPLES], dtype=torch.float64)
    return chi_square_pvalue(observed, expected)


@pytest.fixture
def one_thread():
    """Tiny tensors: OpenMP hand-offs would cost more than the work."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_sampled_drafting_follows_the_constrained_distribution(family, one_thread):
    """Sampling with drafts in the family's split has plain constrained sampling's distribution (chi-square)."""
    p = sampled_pvalue(family)
    assert p > P_THRESHOLD, f"chi-square p = {p:.2e}"


def test_a_verifier_biased_towards_drafts_is_detected(family, one_thread, monkeypatch):
    """Sanity of the method: keep the first draft token half the times the target refuses it, and the test fails."""
    import grammarspec.engine.step as step

    coin = random.Random(0)
    descend = step.descend

    def biased(tree, ends, choices):
        if len(tree) and coin.random() < 0.5:
            choices = [tree.tokens[0], *choices[1:]]
        return descend(tree, ends, choices)

    monkeypatch.setattr(step, "descend", biased)
    p = sampled_pvalue(family)
    assert p < P_THRESHOLD, f"chi-square p = {p:.2e}: a biased verifier went unnoticed"


# --- the user paths --------------------------------------------------------------------------


#: Llama 2's chat format ([INST] turns); this short form renders no system message, as Phi-3's does not.
LLAMA2_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% elif m['role'] == 'assistant' %} {{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)


def test_complete_and_conversation(family):
    """complete() and Conversation answer as HF generate + xgrammar do (greedy); the system text reaches Phi-3 too."""
    name, tok = family
    model = tiny_llama(len(tok), tok.eos_token_id, seed=3)
    ask = "Ana Lee wants an extra large shirt."
    done = grammarspec.complete(model, tok, ask, schema=SHORT, max_new_tokens=60)
    assert done.stats.finish_reason == "stop" and set(json.loads(done.text)) == {"name", "size"}
    assert done.text == hf_greedy_text(model, tok, grammarspec.build_prompt(tok, ask, schema=SHORT), SHORT, 60)
    template = tok.chat_template
    tok.chat_template = template or LLAMA2_TEMPLATE  # the GGUF file has none: Llama 2's [INST] turns
    try:
        chat = grammarspec.Conversation(model, tok, system="Answer as JSON. SYSTEM-MARK")
        chat.add_user(ask)
        prompt = chat.prompt_ids()
        reply = chat.reply(schema=SHORT, max_new_tokens=60)
        assert set(json.loads(reply.message["content"])) == {"name", "size"}
        assert reply.message["content"] == hf_greedy_text(model, tok, prompt, SHORT, 60)
        assert "SYSTEM-MARK" in tok.decode(chat.prompt_ids())
    finally:
        tok.chat_template = template


def test_server_response_format(family):
    """The server's response_format on an in-process engine: HF generate + xgrammar's greedy answer."""
    from starlette.testclient import TestClient

    from grammarspec.serve import Engine, create_app
    from grammarspec.serve.engine import prompt_ids

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
                "temperature": 0,
            }
            reply = client.post("/v1/chat/completions", json=body)
        prompt = prompt_ids(tok, body["messages"], None, "json")
    finally:
        tok.chat_template = template
    assert reply.status_code == 200, reply.text
    content = reply.json()["choices"][0]["message"]["content"]
    assert set(json.loads(content)) == {"name", "size"}
    assert content == hf_greedy_text(model, tok, prompt, SHORT, 60)  # greedy: HF generate + xgrammar's answer


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


# --- tool calls in each family's own format --------------------------------------------------


#: Qwen2.5's tool-use chat template (ChatML; tools in the system turn, calls as <tool_call> JSON), shortened
#: from the format Qwen documents: the GGUF files store ChatML without tools.
QWEN_TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}"
    "{% else %}You are a helpful assistant.{% endif %}\n\n# Tools\n\nYou may call one or more functions to assist "
    "with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n\nFor each function call, return a json "
    "object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    "{%- elif messages[0]['role'] == 'system' %}<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{%- elif message.role == 'assistant' %}<|im_start|>assistant"
    "{% for call in message.tool_calls %}\n<tool_call>\n"
    '{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments }}}\n</tool_call>{% endfor %}'
    "<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n"
    "</tool_response><|im_end|>\n"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: Llama 3.1's JSON tool calling (tools in the first user turn, a call is {"name": ..., "parameters": ...},
#: results in the ipython role; <|python_tag|> opens built-in tool calls), shortened from Meta's documented format.
LLAMA3_TOOLS_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system = messages[0]['content'] %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system = '' %}{%- endif %}"
    "<|start_header_id|>system<|end_header_id|>\n\n{% if tools %}Environment: ipython\n{% endif %}"
    "{{ system }}<|eot_id|>"
    "{%- for message in messages %}"
    "{%- if tools and loop.first and message.role == 'user' %}<|start_header_id|>user<|end_header_id|>\n\n"
    "Given the following functions, please respond with a JSON for a function call with its proper arguments "
    'that best answers the given prompt.\n\nRespond in the format {"name": function name, "parameters": '
    "dictionary of argument name and its value}. Do not use variables.\n\n"
    "{% for tool in tools %}{{ tool | tojson(indent=4) }}\n\n{% endfor %}{{ message.content }}<|eot_id|>"
    "{%- elif message.role == 'assistant' and message.tool_calls %}"
    "{%- set call = message.tool_calls[0].function %}<|start_header_id|>assistant<|end_header_id|>\n\n"
    "{%- if builtin_tools is defined and call.name in builtin_tools %}<|python_tag|>{% endif %}"
    '{"name": "{{ call.name }}", "parameters": {{ call.arguments }}}<|eot_id|>'
    "{%- elif message.role in ('tool', 'ipython') %}<|start_header_id|>ipython<|end_header_id|>\n\n"
    "{{ message.content }}<|eot_id|>"
    "{%- else %}<|start_header_id|>{{ message.role }}<|end_header_id|>\n\n{{ message.content }}<|eot_id|>"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The forecast for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Lisbon", "Porto"]}, "days": {"type": "integer", "enum": [1, 3]}},
            "required": ["city", "days"],
        },
    },
}


@pytest.mark.parametrize(
    ("template", "tool_format", "opening"),
    [
        (QWEN_TOOLS_TEMPLATE, "qwen_3", '<tool_call>\n{"name": "get_weather", "arguments": {'),
        (LLAMA3_TOOLS_TEMPLATE, "llama", '{"name": "get_weather", "parameters": {'),
    ],
    ids=["qwen-tool_call", "llama3-json"],
)
def test_tool_call_in_the_family_format(family, template, tool_format, opening):
    """A required call in the template's own format (xgrammar's structural tag): it parses, its arguments fit the
    schema, and the greedy text is HF generate + xgrammar's processor over the same structural tag."""
    import jsonschema

    from grammarspec.tool_calls import tool_constraint, tool_format_for

    _, tok = family
    model = tiny_llama(len(tok), tok.eos_token_id, seed=5)
    saved = tok.chat_template
    tok.chat_template = template
    try:
        assert tool_format_for(tok) == tool_format  # read from the template's markers
        chat = grammarspec.Conversation(model, tok, tools=[WEATHER], system="You forecast the weather.")
        chat.add_user("Will it rain in Porto in the next three days?")
        prompt = chat.prompt_ids(tool_choice="required")
        assert "get_weather" in tok.decode(prompt)  # the template rendered the tools
        reply = chat.reply(tool_choice="required", max_new_tokens=80)
    finally:
        tok.chat_template = saved
    assert reply.finish_reason == "tool_calls", reply.message
    text = tok.decode(reply.tokens, skip_special_tokens=True)
    assert text.startswith(opening), text
    for call in reply.tool_calls:
        assert call["function"]["name"] == "get_weather"
        jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER["function"]["parameters"])
    grammar = tool_constraint([WEATHER], "required", False, tool_format)["grammar"]
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok), stop_token_ids=[tok.eos_token_id])
    processor = LogitsProcessor(xgr.GrammarCompiler(info).compile_grammar(grammar))
    hf = model.generate(torch.tensor([prompt]), max_new_tokens=80, do_sample=False, logits_processor=[processor])
    hf_new = hf[0, len(prompt) :].tolist()
    assert reply.tokens == hf_new[: len(reply.tokens)], (text, tok.decode(hf_new))
