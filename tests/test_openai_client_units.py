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
