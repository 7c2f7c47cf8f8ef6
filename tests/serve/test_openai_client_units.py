"""Streamed tool-call arguments (grammarspec.serve.tool_stream) and OpenAI request fields, without a server."""

from __future__ import annotations

import json
import random

import pytest

from grammarspec.serve.protocol import RequestError, parse_request
from grammarspec.serve.tool_stream import ToolCallStream, call_prefixes, normalized_prefix


def _value(rng: random.Random, depth: int = 0):
    r = rng.random()
    if depth > 3 or r < 0.3:
        return rng.choice([0, -1, 12, 2.5, 1e5, -0.0, 1.25e-7, True, False, None, "", 'a"b\\c\n', "é😀\u0001", "x/y"])
    if r < 0.65:
        return {f"k{i}é": _value(rng, depth + 1) for i in range(rng.randrange(3))}
    return [_value(rng, depth + 1) for _ in range(rng.randrange(3))]


def test_every_prefix_of_compact_json_normalises_to_a_prefix_of_the_final_arguments():
    rng = random.Random(0)
    for _ in range(300):
        raw = json.dumps({"a": _value(rng), "b": _value(rng)}, separators=(",", ":"), ensure_ascii=rng.random() < 0.5)
        final = json.dumps(json.loads(raw), ensure_ascii=False)
        for k in range(len(raw) + 1):
            text, used = normalized_prefix(raw[:k])
            assert final.startswith(text) and used <= k, (raw[:k], text)
        assert normalized_prefix(raw)[0] == final


def test_an_unfinished_number_escape_or_surrogate_pair_is_held_back():
    assert normalized_prefix('{"a":1')[0] == '{"a": '
    assert normalized_prefix('{"a":"x\\u00')[0] == '{"a": "x'
    assert normalized_prefix('{"a":"\\ud83d')[0] == '{"a": "'
    assert normalized_prefix('{"a":"\\ud83d\\ude00"}')[0] == '{"a": "😀"}'
    assert normalized_prefix('{"a":1E2}')[0] == '{"a": 100.0}'


def test_calls_stream_name_first_then_arguments_and_accumulate_to_the_message():
    calls = [{"name": "f", "arguments": {"x": "é", "n": [1, 2.0]}}, {"name": 'g"', "arguments": {}}]
    text = json.dumps(calls, separators=(",", ":"), ensure_ascii=False)
    assert call_prefixes(text[: text.index('"n"')]) == [("f", '{"x":"é",')]
    stream = ToolCallStream()
    deltas = [d for k in range(len(text) + 1) for d in stream.feed(text[:k])]
    ids = stream.call_ids(2)
    final = [
        {
            "id": ids[i],
            "type": "function",
            "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)},
        }
        for i, c in enumerate(calls)
    ]
    deltas += stream.finish(final)
    got: dict[int, dict[str, str]] = {}
    for d in deltas:
        entry = got.setdefault(d["index"], {"id": "", "name": "", "arguments": ""})
        entry["id"] += d.get("id", "")
        entry["name"] += d["function"].get("name", "")
        entry["arguments"] += d["function"]["arguments"]
    assert [(g["id"], g["name"], g["arguments"]) for _, g in sorted(got.items())] == [
        (f["id"], f["function"]["name"], f["function"]["arguments"]) for f in final
    ]
    assert sum(1 for d in deltas if d["index"] == 0 and d["function"]["arguments"]) > 3  # as generated


def test_metadata_is_accepted_and_checked():
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert parse_request({**body, "metadata": {"team": "a"}}, "m").metadata == {"team": "a"}
    for bad in ({"k": 1}, "tag", {f"k{i}": "v" for i in range(17)}):
        with pytest.raises(RequestError) as e:
            parse_request({**body, "metadata": bad}, "m")
        assert e.value.param.startswith("metadata")


def test_include_usage_is_read_and_needs_a_stream():
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert parse_request({**body, "stream": True, "stream_options": {"include_usage": True}}, "m").include_usage
    assert not parse_request({**body, "stream": True}, "m").include_usage
    with pytest.raises(RequestError):
        parse_request({**body, "stream_options": {"include_usage": True}}, "m")


def _accumulated(deltas):
    got: dict[int, list[str]] = {}
    for d in deltas:
        entry = got.setdefault(d["index"], ["", ""])
        entry[0] += d.get("function", {}).get("name") or ""
        entry[1] += d.get("function", {}).get("arguments") or ""
    return [tuple(got[i]) for i in sorted(got)]


def test_every_cut_of_a_call_reply_keeps_named_calls_and_the_stream_adds_up_to_it():
    """For each prefix of a JSON-format reply: a call with a complete name is a call (arguments so far), a call
    cut inside its name is neither call nor content, and the stream's deltas add up to the cut message."""
    from grammarspec.tool_calls import parse_cut_reply

    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in ("f", "g")]
    replies = [
        [{"name": "f", "arguments": {"x": 'é\\n"', "n": [1, 2.5, -30], "t": True, "z": None}}],
        [{"name": "f", "arguments": {"a": 12}}, {"name": "g", "arguments": {"u": "\u00e9\ud83d\ude00"}}],
    ]
    for calls in replies:
        text = json.dumps(calls if len(calls) > 1 else calls[0], separators=(",", ":"), ensure_ascii=False)
        final = [(c["name"], json.dumps(c["arguments"], ensure_ascii=False)) for c in calls]
        for k in range(1, len(text) + 1):
            cut = text[:k]
            message = parse_cut_reply(cut, tools, "json", ["c0", "c1"])
            got = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
            named = [c["name"] for c in calls if f'"name":"{c["name"]}"' in cut]
            assert message["content"] is None and [name for name, _ in got] == named, (cut, message)
            for (_name, arguments), (_, whole) in zip(got, final):  # the finished arguments, up to an unfinished end
                assert whole.startswith(normalized_prefix(arguments)[0]), (cut, got)
            if k == len(text):
                assert got == final
            stream = ToolCallStream(["c0", "c1"])
            deltas = [d for j in range(1, k + 1) for d in stream.feed(text[:j])]
            deltas += stream.finish(message.get("tool_calls", []))
            assert _accumulated(deltas) == got, (cut, deltas, got)
        assert parse_cut_reply("Hello {", tools, "json", ["c0"]) == {"role": "assistant", "content": "Hello {"}
        assert parse_cut_reply(" {abc", tools, "json", ["c0"])["content"] == " {abc"  # text, not a call


def test_a_model_format_reply_cut_short_keeps_named_calls():
    from grammarspec.tool_calls import parse_cut_reply

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    text = 'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    begin = text.index("<tool_call>")
    head = begin + len('<tool_call>\n{"name": "get_weather", "arguments": ')
    for k in range(1, len(text)):
        message = parse_cut_reply(text[:k], tools, "qwen_3", ["c0"])
        calls = message.get("tool_calls", [])
        if k < begin:
            assert message["content"] == text[:k].rstrip("<") or text[:k] == "Sure.", message
        elif k < head:  # inside the begin tag, which holds the name: no call, no tag text
            assert not calls and message["content"] == "Sure.", (k, message)
        else:
            ((call),) = calls
            assert call["function"]["name"] == "get_weather" and message["content"] == "Sure."
            assert '{"city": "Oslo"}'.startswith(call["function"]["arguments"]), call
