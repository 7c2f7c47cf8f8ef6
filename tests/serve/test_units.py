"""The server's pure parts: request checking, the prefix cache, the CLI flags (no real model)."""

from __future__ import annotations

import pytest
import torch

from grammarspec.cli.main import build_parser, main
from grammarspec.kv.batch import BatchKV
from grammarspec.serve.prefix import PrefixCache, row_cache
from grammarspec.serve.protocol import RequestError, parse_request
from tests.toy import toy_vocab_size
from tests.toy_models import tiny_llama

MESSAGES = [{"role": "user", "content": "hi"}]


def test_a_full_request_is_read_field_by_field():
    r = parse_request(
        {
            "model": "m",
            "messages": [{"role": "developer", "content": [{"type": "text", "text": "be brief"}]}, *MESSAGES],
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
            "temperature": 0,
            "top_p": 0.5,
            "max_completion_tokens": 7,
            "stop": "END",
            "seed": 3,
            "n": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
            "frequency_penalty": 0,
            "grammarspec": {"assistant": "prompt_lookup", "max_draft_tokens": 4},
        },
        "m",
    )
    assert r.messages[0] == {"role": "system", "content": "be brief"}
    assert r.schema == {"type": "object"} and r.greedy and r.top_p == 0.5 and r.max_tokens == 7
    assert r.stop == ("END",) and r.seed == 3 and r.n == 2 and r.stream and r.include_usage
    assert r.assistant == "prompt_lookup" and r.max_draft_tokens == 4


@pytest.mark.parametrize(
    "extra, param, status",
    [
        ({"top_k": 1}, "top_k", 400),
        ({"presence_penalty": 0.5}, "presence_penalty", 400),
        ({"logit_bias": {"1": 5}}, "logit_bias", 400),
        ({"temperature": True}, "temperature", 400),
        ({"temperature": 3}, "temperature", 400),
        ({"n": 0}, "n", 400),
        ({"stop": ["a"] * 5}, "stop", 400),
        ({"stream_options": {"include_usage": True}}, "stream_options", 400),
        ({"tool_choice": "sometimes"}, "tool_choice", 400),
        ({"response_format": {"type": "yaml"}}, "response_format.type", 400),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content",
            400,
        ),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", 400),
        ({"grammarspec": {"assistant": "draft_model"}}, "grammarspec.assistant", 400),
        ({"model": "other"}, "model", 404),
        (
            {"tools": [{"type": "function", "function": {"name": "f"}}], "response_format": {"type": "json_object"}},
            "response_format",
            400,
        ),
    ],
)
def test_what_cannot_be_honoured_is_refused_by_name(extra, param, status):
    with pytest.raises(RequestError) as e:
        parse_request({"model": "m", "messages": MESSAGES, **extra}, "m")
    assert e.value.param == param and e.value.status == status
    body = e.value.body()["error"]
    assert set(body) == {"message", "type", "param", "code"} and body["message"]


@pytest.mark.parametrize(
    "extra, param, says",
    [
        (
            {"messages": [{"role": "user", "content": "x", "tool_calls": []}]},
            "messages[0].tool_calls",
            "messages[0] may hold role, content, name",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "mode": "x"}}},
            "response_format.json_schema.mode",
            "response_format.json_schema may hold name, description, schema, strict",
        ),
        ({"grammarspec": {"draft": 3}}, "grammarspec.draft", "grammarspec may hold assistant"),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"grammarspec": {"grammar_backend": "regex"}}, "grammarspec.grammar_backend", "'xgrammar'"),
        ({"messages": [{"role": "assistant"}]}, "messages[0]", "needs content or tool_calls"),
        ({"temperature": float("inf")}, "temperature", "out of range"),
    ],
)
def test_an_unknown_or_malformed_nested_field_is_named_with_what_its_place_holds(extra, param, says):
    with pytest.raises(RequestError) as e:
        parse_request({"model": "m", "messages": MESSAGES, **extra}, "m")
    assert e.value.param == param and says in e.value.message, e.value.message


def test_a_request_may_choose_its_grammar_backend():
    body = {"model": "m", "messages": MESSAGES}
    assert parse_request(body, "m").grammar_backend is None  # the server's --grammar-backend
    assert parse_request({**body, "grammarspec": {"grammar_backend": "llguidance"}}, "m").grammar_backend == (
        "llguidance"
    )


def _kv_of(model, tokens):
    kv = BatchKV(model, 1)
    kv.forward([tokens], [[]])  # the prompt pass: no draft tree
    kv.keep([list(range(len(tokens)))])
    return kv


def test_the_prefix_cache_finds_the_longest_prefix_and_evicts_under_its_budget():
    model = tiny_llama(toy_vocab_size(), seed=0)
    a = [2 + i % 30 for i in range(38)]
    layers = row_cache(_kv_of(model, a), 0, len(a))
    size = sum(k.nbytes + v.nbytes for k, v in layers)
    cache = PrefixCache(model, budget_bytes=int(size * 2.5), block=4)
    cache.store(a, layers)
    hit, length, _ = cache.lookup(a[:30] + [5, 5, 5])
    assert length == 30 and hit.get_seq_length() == 30
    # the copy's keys are the stored ones: a forward over the rest equals a fresh prefill
    fresh = _kv_of(model, a[:30])
    for (k, _), layer in zip(layers, fresh.cache.layers):
        torch.testing.assert_close(k[:, :, :30], layer.keys)
    assert cache.lookup([9, 9, 9, 9, 9])[1] == 0  # no block in common
    assert cache.lookup(a)[1] == len(a) - 1  # the model reads at least the last token
    v = toy_vocab_size()
    b, c = [(7 * i) % (v - 3) + 3 for i in range(40)], [(11 * i + 5) % (v - 3) + 3 for i in range(40)]
    cache.store(b, row_cache(_kv_of(model, b), 0, len(b)))
    cache.store(c, row_cache(_kv_of(model, c), 0, len(c)))
    assert len(cache) == 2 and cache.nbytes <= cache.budget  # the least recently used (a) went
    assert cache.lookup(a[:20])[1] == 0 and cache.lookup(c)[1] == len(c) - 1
    longer = c + [7, 7, 7, 7, 7]
    cache.store(longer, row_cache(_kv_of(model, longer), 0, len(longer)))
    assert len(cache) == 2  # an entry it extends is replaced


def test_serve_help_documents_every_flag(capsys):
    parser = build_parser()
    for command in ("serve", "bench-serve"):
        with pytest.raises(SystemExit):
            parser.parse_args([command, "--help"])
        text = capsys.readouterr().out
        sub = next(a for a in parser._subparsers._group_actions if a.dest == "command").choices[command]
        for action in sub._actions:
            for flag in action.option_strings:
                assert flag in text
    assert main(["bench-serve", "--arms", "nope"]) == 2


# --- bench-serve's pure parts -----------------------------------------------------------------------


def test_the_server_renders_tool_choice_none_as_conversation_does(smol_tokenizer):
    """The shopping mismatch: a ``tool_choice="none"`` turn's prompt carries Conversation's plain-text note."""
    from grammarspec.conversation import NO_TOOL_NOTE
    from grammarspec.serve.engine import prompt_ids

    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]
    none = smol_tokenizer.decode(prompt_ids(smol_tokenizer, messages, tools, "json", "none"))
    auto = smol_tokenizer.decode(prompt_ids(smol_tokenizer, messages, tools, "json", "auto"))
    assert NO_TOOL_NOTE in none and NO_TOOL_NOTE not in auto
    assert NO_TOOL_NOTE not in smol_tokenizer.decode(prompt_ids(smol_tokenizer, messages, None, "json", "none"))
    assert "reply with one JSON object" in auto and "JSON object" not in none and '"name":"f"' not in none


def test_tool_choice_none_renders_no_call_format_in_a_model_format(smol_tokenizer):
    """A template with its own tool section (Qwen's <tools>, "return a json object ... within <tool_call>") is the
    call format: under "none" the template gets no tools, and earlier calls stay in the history."""
    import copy

    from grammarspec.conversation import NO_TOOL_NOTE
    from grammarspec.serve.engine import prompt_ids
    from tests.api.test_tokenizer_families import QWEN_TOOLS_TEMPLATE

    tok = copy.copy(smol_tokenizer)
    tok.chat_template = QWEN_TOOLS_TEMPLATE
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]
    auto = tok.decode(prompt_ids(tok, messages, tools, "qwen_3", "auto"))
    none = tok.decode(prompt_ids(tok, messages, tools, "qwen_3", "none"))
    assert "<tools>" in auto and "For each function call" in auto
    assert "<tools>" not in none and "For each function call" not in none and "json object" not in none.lower()
    assert '<tool_call>\n{"name": "lookup"' in none and "42" in none and NO_TOOL_NOTE in none


def test_outputs_are_compared_call_by_call():
    from grammarspec.bench.serve import compare_outputs

    call = {"content": None, "tool_calls": [["f", '{"a": 1}']], "tokens": 9}
    text = {"content": "ok", "tool_calls": [], "tokens": 3}
    assert compare_outputs([call, text], [dict(call, tool_calls=[["f", '{"a":1}']]), text]) == (2, 2, None)
    assert compare_outputs([call, dict(text, tokens=4)], [call, text]) == (1, 2, 1)
    assert compare_outputs([call], [call, text]) == (1, 2, 1)  # a missing call is a difference
    assert compare_outputs([text], [call]) == (0, 1, 0)


def test_the_table_reports_identical_calls_and_the_first_difference():
    from grammarspec.bench.serve import serve_markdown

    a = {"content": "x", "tool_calls": [], "tokens": 2}
    b = {"content": "y", "tool_calls": [], "tokens": 2}
    run = {"turns": 2, "tokens": 4, "calls": 0, "invalid": 0, "ttft": [0.1], "seconds": 1.0}
    result = {
        "notes": [],
        "runs": [
            {"conversation": "c", "arm": "hf_resend", "repeat": 0, **run, "outputs": [a, a]},
            {"conversation": "c", "arm": "serve", "repeat": 0, **run, "outputs": [a, b]},
            {
                "conversation": "2 at once",
                "arm": "serve_concurrent",
                "repeat": 0,
                **run,
                "conversations": [{"conversation": "c", "outputs": [a, a]}, {"conversation": "c", "outputs": [a, a]}],
            },
        ],
    }
    table = serve_markdown(result, "cmd")
    assert "| 1/2 |" in table and "| 4/4 |" in table
    assert 'serve, c #0: 1/2 identical; first difference at call 2: "y" (2 tokens)' in table


def test_foreign_servers_get_grammarspecs_rendering_and_text_calls_are_read():
    from grammarspec.bench.agent_tasks import TOOLS
    from grammarspec.bench.serve import _text_calls, foreign_messages
    from grammarspec.conversation import NO_TOOL_NOTE

    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression": "1+1"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"result": 2}'},
    ]
    sent = foreign_messages(messages, TOOLS, "none")
    assert sent[0]["content"] == "s"  # "none": no tool described, so no call format asked for
    assert "calculator" in foreign_messages(messages, TOOLS, "auto")[0]["content"]
    assert sent[2] == {"role": "assistant", "content": '{"name":"calculator","arguments":{"expression":"1+1"}}'}
    assert sent[3]["tool_call_id"] == "c1" and NO_TOOL_NOTE in sent[1]["content"]
    assert NO_TOOL_NOTE not in foreign_messages(messages, TOOLS, "auto")[1]["content"]
    cut = dict(messages[2], tool_calls=[{"id": "c1", "function": {"name": "calculator", "arguments": '{"expr'}}])
    assert foreign_messages([messages[1], cut], TOOLS, "auto")[2]["content"].endswith('"arguments":{"expr}')
    assert _text_calls(' {"name": "calculator", "arguments": {"expression": "2*3"}}', TOOLS)[0]["name"] == "calculator"
    assert _text_calls("The lamp costs 39.90 EUR.", TOOLS) == []


def test_transformers_serve_gets_a_model_dir_naming_its_architecture(tmp_path):
    import json

    from grammarspec.bench.servers import servable_model_dir

    source = tmp_path / "src"
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"architectures": None, "model_type": "llama"}))
    (source / "model.safetensors").write_bytes(b"weights")
    copy = servable_model_dir(source, "LlamaForCausalLM", tmp_path / "dest")
    assert json.loads((copy / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert (copy / "model.safetensors").is_symlink() and (copy / "model.safetensors").read_bytes() == b"weights"
    assert json.loads((source / "config.json").read_text())["architectures"] is None  # the source is untouched


def test_the_vllm_serve_command_speculates_with_ngrams_and_parses_tool_calls():
    import json

    from grammarspec.bench.agent_tasks import ModelTurn
    from grammarspec.bench.serve import capped
    from grammarspec.bench.servers import vllm_serve_command

    cmd = vllm_serve_command("/v/python", "/m", 1234, "smol")
    assert cmd[:3] == ["/v/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--model") + 1] == "/m" and cmd[cmd.index("--port") + 1] == "1234"
    assert json.loads(cmd[cmd.index("--speculative-config") + 1])["method"] == "ngram"
    assert json.loads(cmd[cmd.index("--structured-outputs-config") + 1])["backend"] == "xgrammar"
    assert "--enable-auto-tool-choice" in cmd and cmd[cmd.index("--tool-call-parser") + 1] == "pythonic"
    assert capped(["u", ModelTurn("none", 40), ModelTurn("auto", 8)], 12) == [
        "u",
        ModelTurn("none", 12),
        ModelTurn("auto", 8),
    ]


def test_bench_serve_skips_vllm_without_its_environment(monkeypatch):
    from grammarspec.bench import servers

    monkeypatch.setenv("GRAMMARSPEC_VLLM_PYTHON", "/nonexistent/python")
    why = servers.start_vllm_serve("/m", "smol")
    assert isinstance(why, str) and "make vllm-env" in why
