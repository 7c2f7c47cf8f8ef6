"""OpenAI-style tool calls: constraints per tool_choice, replies parsed into tool_calls, messages rendered."""

from __future__ import annotations

import json

import pytest

from grammars import compile_grammar, grammar_spec
from grammarspec.tool_calls import (
    ToolCallError,
    call_json,
    chat_messages,
    parse_tool_reply,
    tool_constraint,
    tool_format_for,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    },
]
IDS = ["call_0", "call_1", "call_2"]


def accepts(tokenizer, constraint, text):
    compiled = compile_grammar(grammar_spec(**constraint), tokenizer, vocab_size=len(tokenizer))
    matcher = compiled.matcher(max_rollback=4)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return all(matcher.accept(t) for t in ids) and matcher.is_terminated()


def test_tool_choice_picks_the_constraint():
    assert tool_constraint(TOOLS, "none") == {} and tool_constraint(None, "auto") == {}
    assert tool_constraint(TOOLS, "required") == {"tools": TOOLS, "parallel_tool_calls": False}
    named = tool_constraint(TOOLS, {"type": "function", "function": {"name": "calculator"}}, parallel_tool_calls=True)
    assert named == {"tools": [TOOLS[1]], "parallel_tool_calls": True}
    assert set(tool_constraint(TOOLS, "auto")) == {"grammar"}


def test_auto_allows_text_or_one_compact_call(smol_tokenizer):
    auto = tool_constraint(TOOLS, "auto")
    assert accepts(smol_tokenizer, auto, '{"name":"get_weather","arguments":{"city":"Oslo"}}')
    assert accepts(smol_tokenizer, auto, "It is sunny in Oslo.")
    assert not accepts(smol_tokenizer, auto, '{"name": "get_weather", "arguments": {"city": "Oslo"}}')  # compact only
    assert not accepts(smol_tokenizer, auto, '{"name":"search","arguments":{}}')  # an unknown tool
    parallel = tool_constraint(TOOLS, "auto", parallel_tool_calls=True)
    two = '[{"name":"get_weather","arguments":{"city":"Oslo"}},{"name":"calculator","arguments":{"expression":"1+1"}}]'
    assert accepts(smol_tokenizer, parallel, two) and accepts(smol_tokenizer, parallel, "No call needed.")


def test_bad_tool_choices_are_refused():
    with pytest.raises(ToolCallError, match="not found|cannot be used"):
        tool_constraint(TOOLS, {"type": "function", "function": {"name": "nope"}})
    with pytest.raises(ToolCallError, match="needs tools"):
        tool_constraint(None, "required")
    with pytest.raises(ToolCallError, match="cannot be used"):
        tool_constraint(TOOLS, "sometimes")


def test_replies_become_openai_messages():
    text = parse_tool_reply("It is sunny.", TOOLS, "json", IDS)
    assert text == {"role": "assistant", "content": "It is sunny."}
    call = parse_tool_reply('{"name":"get_weather","arguments":{"city":"Oslo"}}', TOOLS, "json", IDS)
    assert call["content"] is None
    assert call["tool_calls"] == [
        {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    ]
    two = parse_tool_reply(
        '[{"name":"calculator","arguments":{"expression":"2*3"}},{"name":"get_weather","arguments":{"city":"Lima"}}]',
        TOOLS,
        "json",
        IDS,
    )
    assert [c["id"] for c in two["tool_calls"]] == ["call_0", "call_1"]
    assert json.loads(two["tool_calls"][1]["function"]["arguments"]) == {"city": "Lima"}
    with pytest.raises(ToolCallError, match="not complete JSON"):
        parse_tool_reply('{"name":"calc', TOOLS, "json", IDS)


def test_a_native_format_comes_from_xgrammar_and_parses_back(smol_tokenizer):
    """qwen_3 (Hermes) calls: xgrammar's structural tag is the grammar, its tags read the calls back."""
    constraint = tool_constraint(TOOLS, "auto", tool_format="qwen_3")
    written = 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    assert accepts(smol_tokenizer, constraint, written)
    message = parse_tool_reply(written, TOOLS, "qwen_3", IDS)
    assert message["content"] == "Let me check."
    assert message["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    assert parse_tool_reply("No tools needed.", TOOLS, "qwen_3", IDS) == {
        "role": "assistant",
        "content": "No tools needed.",
    }
    forced = tool_constraint(TOOLS, {"type": "function", "function": {"name": "calculator"}}, tool_format="llama")
    assert accepts(smol_tokenizer, forced, '{"name": "calculator", "parameters": {"expression": "1+2"}}')


def test_the_format_follows_the_chat_template(smol_tokenizer):
    assert tool_format_for(smol_tokenizer) == "json"  # SmolLM2's template has no tools

    class Hermes:
        chat_template = "{% if tools %}...<tool_call>{{ tools }}</tool_call>{% endif %}"

    assert tool_format_for(Hermes()) == "qwen_3"
    with pytest.raises(ToolCallError, match="unknown tool_format"):
        tool_format_for(smol_tokenizer, "smoke_signals")


def test_messages_are_rendered_for_a_template_without_tools():
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": "calculator", "arguments": '{"expression": "2*3"}'},
    }
    messages = [
        {"role": "user", "content": "2*3?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": {"result": 6}},
    ]
    rendered = chat_messages(messages, TOOLS, "json")
    assert rendered[0]["role"] == "system" and '"name":"calculator"' in rendered[0]["content"]
    assert rendered[2] == {"role": "assistant", "content": call_json([call])}
    assert rendered[2]["content"] == '{"name":"calculator","arguments":{"expression":"2*3"}}'
    assert rendered[3] == {"role": "tool", "content": '{"result": 6}'}
    assert messages[1]["tool_calls"] == [call]  # the caller's messages are not changed
    with pytest.raises(ToolCallError, match="role"):
        chat_messages([{"role": "robot", "content": "x"}], TOOLS, "json")


def test_messages_for_a_native_template_keep_tool_calls_with_parsed_arguments():
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": "calculator", "arguments": '{"expression": "2*3"}'},
    }
    rendered = chat_messages([{"role": "assistant", "content": None, "tool_calls": [call]}], TOOLS, "qwen_3")
    assert rendered == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{**call, "function": {"name": "calculator", "arguments": {"expression": "2*3"}}}],
        }
    ]
