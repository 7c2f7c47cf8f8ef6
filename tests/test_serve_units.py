"""The server's pure parts: request checking, the prefix cache, the CLI flags (no real model)."""

from __future__ import annotations

import pytest
import torch
from toy import toy_vocab_size
from toy_models import tiny_llama

from grammarspec.cli import build_parser, main
from grammarspec.kv import BatchKV
from grammarspec.serve.prefix import PrefixCache, row_cache
from grammarspec.serve.protocol import RequestError, parse_request

MESSAGES = [{"role": "user", "content": "hi"}]


def test_a_full_request_is_read_field_by_field():
    r = parse_request({
        "model": "m", "messages": [{"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
                                   *MESSAGES],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
        "temperature": 0, "top_p": 0.5, "max_completion_tokens": 7, "stop": "END", "seed": 3, "n": 2,
        "stream": True, "stream_options": {"include_usage": True}, "frequency_penalty": 0,
        "grammarspec": {"assistant": "prompt_lookup", "max_draft_tokens": 4},
    }, "m")  # fmt: skip
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
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages[0].content", 400),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", 400),
        ({"grammarspec": {"assistant": "draft_model"}}, "grammarspec.assistant", 400),
        ({"model": "other"}, "model", 404),
        ({"tools": [{"type": "function", "function": {"name": "f"}}], "response_format": {"type": "json_object"}},
         "response_format", 400),
    ],
)  # fmt: skip
def test_what_cannot_be_honoured_is_refused_by_name(extra, param, status):
    with pytest.raises(RequestError) as e:
        parse_request({"model": "m", "messages": MESSAGES, **extra}, "m")
    assert e.value.param == param and e.value.status == status
    body = e.value.body()["error"]
    assert set(body) == {"message", "type", "param", "code"} and body["message"]


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
