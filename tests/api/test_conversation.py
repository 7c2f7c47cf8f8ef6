"""Conversation: the kept KV cache gives a fresh call's greedy output, turn after turn (embedded model)."""

from __future__ import annotations

import copy

import pytest
import torch

import grammarspec
from grammarspec.conversation import common_prefix_length
from grammarspec.kv.cache import cache_length
from grammarspec.tool_calls import tool_constraint

pytestmark = pytest.mark.slow

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate arithmetic.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    },
]
RESULTS = {"get_weather": {"temperature": 4, "conditions": "light rain"}, "calculator": {"result": 391}}


def fresh(model, tok, conv, reply_kwargs, max_new_tokens):
    """A fresh generate on the full conversation (no cache, no speculation): the reference."""
    choice = reply_kwargs.get("tool_choice", "auto")
    ids = conv.prompt_ids(tool_choice=choice)  # "none": the tools are not described
    constraint = tool_constraint(conv.tools, choice, False, conv.tool_format)
    out = grammarspec.generate(
        model,
        torch.tensor([ids]),
        tokenizer=tok,
        assistant=None,
        max_new_tokens=max_new_tokens,
        return_dict_in_generate=True,
        **constraint,
    )
    return out.sequences[0, len(ids) : len(ids) + out.stats[0].new_tokens].tolist()


def play(model, tok, conv, script, max_new_tokens=40):
    """Run ``script`` (user text or a tool_choice per model turn); check every turn against a fresh call."""
    replies = []
    for step in script:
        if isinstance(step, str):
            conv.add_user(step)
            continue
        expected = fresh(model, tok, conv, step, max_new_tokens)
        keep = common_prefix_length(conv._cached, conv.prompt_ids(tool_choice=step.get("tool_choice", "auto")))
        reply = conv.reply(max_new_tokens=max_new_tokens, **step)
        assert reply.tokens == expected, f"turn {len(replies)}: the kept cache changed the greedy output"
        # Everything the new prompt repeats was reused (the model's own tokens may split text
        # differently from the tokenizer: from there on the prompt is read again).
        assert reply.reused_tokens == min(keep, reply.prompt_tokens - 1)
        assert cache_length(conv._cache) == conv.cached_tokens
        for call in reply.tool_calls:
            conv.add_tool_result(call["id"], RESULTS[call["function"]["name"]])
        replies.append(reply)
    return replies


def test_greedy_output_equals_a_fresh_call_over_four_turns(smol):
    model, tok = smol
    conv = grammarspec.Conversation(model, tok, tools=TOOLS, system="You are a helpful assistant.")
    script = [
        "What is the weather in Oslo?",
        {"tool_choice": "required"},
        {"tool_choice": "auto"},
        "And what is 17 * 23?",
        {"tool_choice": {"type": "function", "function": {"name": "calculator"}}},
        {"tool_choice": "none"},
    ]
    replies = play(model, tok, conv, script)
    assert [r.finish_reason for r in replies][::2] == ["tool_calls", "tool_calls"]
    assert replies[2].tool_calls[0]["function"]["name"] == "calculator"
    # only the new turn is prefilled; the "none" turn renders no tools (no call format), so it reads its
    # prompt from the system message on
    later = replies[1:3]
    assert all(r.reused_tokens > 0.6 * r.prompt_tokens for r in later)
    assert [m["role"] for m in conv.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]


def test_editing_an_earlier_message_invalidates_exactly_the_suffix(smol):
    model, tok = smol
    conv = grammarspec.Conversation(model, tok, tools=TOOLS)
    play(model, tok, conv, ["What is the weather in Oslo?", {"tool_choice": "required"}, {"tool_choice": "none"}])
    cached = list(conv._cached)
    edited = copy.deepcopy(conv.messages)
    edited[0]["content"] = "What is the weather in Paris?"
    conv.messages[:] = edited[:1]  # edit the question, drop what followed
    new_ids = conv.prompt_ids()
    keep = common_prefix_length(cached, new_ids)
    assert 0 < keep < len(cached) - 10  # the edit sits inside the cached part
    expected = fresh(model, tok, conv, {"tool_choice": "required"}, 40)
    reply = conv.reply(tool_choice="required", max_new_tokens=40)
    assert reply.reused_tokens == keep and reply.tokens == expected


def test_a_template_that_rewrites_earlier_turns_is_handled(smol):
    """Templates that render earlier turns differently once later ones exist (Qwen3 drops old reasoning)."""
    model, tok = smol
    tok = copy.copy(tok)
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if m['role'] == 'assistant' and not loop.last %}{{ m['content'] | upper }}{% else %}{{ m['content'] }}{% endif %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    conv = grammarspec.Conversation(model, tok, system="Answer briefly.")
    replies = play(
        model,
        tok,
        conv,
        [
            "Name a colour.",
            {"tool_choice": "none"},
            "Name a fruit.",
            {"tool_choice": "none"},
            "Name a city.",
            {"tool_choice": "none"},
        ],
        max_new_tokens=12,
    )
    first, second = replies[0], replies[1]  # the first answer, rewritten in upper case, was read again
    assert first.content != first.content.upper() and second.reused_tokens < first.prompt_tokens + 3


def test_the_context_limit_is_a_clear_error_before_any_work(smol):
    model, tok = smol
    conv = grammarspec.Conversation(model, tok, tools=TOOLS, max_context=300)
    conv.add_user("What is the weather in Oslo? " * 20)
    with pytest.raises(grammarspec.ContextLimitError, match="max_context=300"):
        conv.reply(max_new_tokens=64)
    assert conv.cached_tokens == 0 and len(conv.messages) == 1
    conv.messages[-1]["content"] = "Weather in Oslo?"  # shorten it and go on
    assert conv.reply(tool_choice="required", max_new_tokens=40).finish_reason == "tool_calls"


def test_an_unknown_tool_call_id_is_refused(smol):
    model, tok = smol
    conv = grammarspec.Conversation(model, tok, tools=TOOLS)
    with pytest.raises(grammarspec.ToolCallError, match="no tool call has id"):
        conv.add_tool_result("call_9", "x")


def test_a_draft_model_keeps_its_cache_across_turns(smol):
    model, tok = smol
    conv = grammarspec.Conversation(model, tok, tools=TOOLS, assistant=model)  # the model drafts for itself
    fed: list[int] = []
    drafter = conv._proposer
    original = drafter._forward
    drafter._forward = lambda ids: (fed.append(len(ids)), original(ids))[1]
    first = play(
        model,
        tok,
        conv,
        ["What is the weather in Oslo?", {"tool_choice": "required"}, {"tool_choice": "auto"}],
        max_new_tokens=16,
    )
    assert fed and sum(fed) > 0 and len(first) == 2
    fed.clear()
    third = play(model, tok, conv, ["Thanks. And in Lima?", {"tool_choice": "required"}], max_new_tokens=16)[0]
    # Only the new part of the conversation went through the draft model, not the whole prompt again: what the
    # target reads again too.
    assert third.reused_tokens > 0.6 * third.prompt_tokens
    assert 0 < sum(fed) < third.prompt_tokens - third.reused_tokens + 2 * len(third.tokens)


def test_a_call_cut_by_max_new_tokens_stays_a_call_and_the_next_turn_reads_it(smol):
    """OpenAI's rule at every cut: a complete name keeps the call (arguments so far, finish "length"); a call cut
    inside its name is neither a call nor text."""
    model, tok = smol
    conv = grammarspec.Conversation(model, tok, tools=TOOLS, assistant=None)
    conv.add_user("What is the weather in Oslo?")
    full = conv.reply(tool_choice="required", max_new_tokens=64, append=False)
    assert full.finish_reason == "tool_calls"
    ((final,),) = [full.tool_calls]
    text = tok.decode(full.tokens, skip_special_tokens=True)
    for n in range(1, len(full.tokens)):
        cut = conv.reply(tool_choice="required", max_new_tokens=n, append=False)
        assert cut.tokens == full.tokens[:n] and cut.finish_reason == "length" and cut.content is None, (n, cut)
        named = '"name":"get_weather"' in tok.decode(cut.tokens, skip_special_tokens=True)
        assert len(cut.tool_calls) == named, (n, cut.message)
        if named:
            arguments = cut.tool_calls[0]["function"]["arguments"]
            assert cut.tool_calls[0]["function"]["name"] == "get_weather"
            assert final["function"]["arguments"].startswith(arguments) and text.startswith('{"name":"get_weather"')
    cut = conv.reply(tool_choice="required", max_new_tokens=len(full.tokens) - 3)
    assert cut.tool_calls and cut.finish_reason == "length"
    conv.add_tool_result(cut.tool_calls[0]["id"], "the call was cut short")
    conv.add_user("Try again.")
    assert tok.decode(full.tokens[: len(full.tokens) - 3]).strip() in tok.decode(conv.prompt_ids())  # as written
    assert conv.reply(tool_choice="required", max_new_tokens=64).finish_reason == "tool_calls"
