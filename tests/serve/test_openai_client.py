"""Conformance with the official ``openai`` Python client, against a real ``grammarspec serve`` process.

Each test uses the client as its documentation shows: plain answers, JSON
answers (``json_schema``, ``json_object``, ``parse`` with a pydantic model),
tool calls (forced, optional, parallel), streaming with the usual loop and
with the client's own accumulator, ``n``, ``stop``, the token limits,
``seed``, ``metadata``, typed errors, and a client timeout mid-stream.  One
server process for the module (the embedded SmolLM2-135M); greedy, few tokens.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
import httpx2 as httpx
import pydantic

from tests.helpers import TOOLS, TRIP_SCHEMA
from tests.serve_process import MODEL, readme_block, serve_process

pytestmark = pytest.mark.slow

PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


class Plan(pydantic.BaseModel):
    city: str
    days: int


@pytest.fixture(scope="module")
def server():
    with serve_process("--max-tokens", "128") as (url, _pid):
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=300)


def _ask(client, content, **kwargs):
    kwargs.setdefault("temperature", 0)
    kwargs.setdefault("max_tokens", 40)
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], **kwargs)


def _schema_format(schema=TRIP_SCHEMA):
    return {"type": "json_schema", "json_schema": {"name": "plan", "schema": schema}}


def _calls(message):
    return [(c.function.name, c.function.arguments) for c in message.tool_calls or []]


def test_plain_json_schema_and_json_object(client):
    plain = _ask(client, "Name three colours.", max_tokens=12)
    assert isinstance(plain.choices[0].message.content, str) and plain.choices[0].message.content
    assert plain.choices[0].finish_reason in ("stop", "length") and plain.object == "chat.completion"
    planned = _ask(client, "Plan 3 days in Lisbon. Reply in JSON.", response_format=_schema_format())
    assert planned.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(planned.choices[0].message.content), TRIP_SCHEMA)
    anything = _ask(client, "Give me a JSON object about a cat.", response_format={"type": "json_object"})
    ours = anything.model_extra["grammarspec"]["choices"][0]
    if anything.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(anything.choices[0].message.content), dict) and ours["valid"] is True
    else:
        assert anything.choices[0].finish_reason == "length" and ours["valid"] is False


def test_parse_with_a_pydantic_model(client):
    parsed = client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "Plan 3 days in Lisbon."}],
        response_format=Plan,
        temperature=0,
        max_tokens=40,
    )
    plan = parsed.choices[0].message.parsed
    assert isinstance(plan, Plan) and plan.city


def test_forced_optional_and_parallel_tool_calls(client):
    forced = _ask(
        client,
        "What is the weather in Oslo?",
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    assert forced.choices[0].finish_reason == "tool_calls"
    ((name, arguments),) = _calls(forced.choices[0].message)
    assert name == "get_weather"
    jsonschema.validate(json.loads(arguments), PARAMETERS[name])

    optional = _ask(client, "Say hello.", tools=TOOLS, tool_choice="auto", max_tokens=24)
    message = optional.choices[0].message
    if optional.choices[0].finish_reason == "tool_calls":
        for name, arguments in _calls(message):
            jsonschema.validate(json.loads(arguments), PARAMETERS[name])
    else:
        assert message.content and not message.tool_calls

    parallel = _ask(
        client,
        "Weather in Oslo and in Paris?",
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=True,
        max_tokens=64,
    )
    calls = _calls(parallel.choices[0].message)
    assert parallel.choices[0].finish_reason == "tool_calls" and calls
    for name, arguments in calls:
        jsonschema.validate(json.loads(arguments), PARAMETERS[name])
    assert len({c.id for c in parallel.choices[0].message.tool_calls}) == len(calls)


def test_the_usual_streaming_loop_works_and_usage_comes_only_when_asked(client):
    pieces, chunks = [], []
    for chunk in _ask(client, "Name three colours.", stream=True, max_tokens=12):
        chunks.append(chunk)
        pieces.append(chunk.choices[0].delta.content or "")  # the loop from the openai README
    whole = _ask(client, "Name three colours.", max_tokens=12)
    assert "".join(pieces) == whole.choices[0].message.content
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].model_extra["grammarspec"]["choices"][0]["target_forwards"] > 0  # ours: on the last chunk

    chunks = list(
        _ask(client, "Name three colours.", stream=True, max_tokens=12, stream_options={"include_usage": True})
    )
    *body, last = chunks
    assert last.choices == [] and last.usage.completion_tokens == whole.usage.completion_tokens
    assert last.model_extra["grammarspec"]["choices"][0]["target_forwards"] > 0
    assert all(c.usage is None and c.choices for c in body)


def test_streamed_tool_calls_accumulate_to_the_non_streamed_call(client):
    for kwargs in (
        {"tool_choice": "required"},
        {"tool_choice": "required", "parallel_tool_calls": True},
        {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    ):
        whole = _ask(client, "What is the weather in Oslo?", tools=TOOLS, max_tokens=128, **kwargs)
        assert whole.choices[0].finish_reason == "tool_calls"  # complete (the stream helper refuses a cut reply)
        argument_deltas = 0
        with client.chat.completions.stream(
            model=MODEL,
            messages=[{"role": "user", "content": "What is the weather in Oslo?"}],
            tools=TOOLS,
            temperature=0,
            max_tokens=128,
            **kwargs,
        ) as stream:
            for event in stream:
                if event.type == "tool_calls.function.arguments.delta":
                    argument_deltas += 1
            final = stream.get_final_completion()
        assert final.choices[0].finish_reason == whole.choices[0].finish_reason == "tool_calls"
        assert _calls(final.choices[0].message) == _calls(whole.choices[0].message)
        assert argument_deltas > len(_calls(whole.choices[0].message))  # arguments arrive as they are generated


def _streamed(client, **kwargs):
    """What a client that concatenates the deltas gets: ``(content or None, [(name, arguments)], finish_reason)``."""
    content, calls, finish = [], {}, None
    for chunk in client.chat.completions.create(model=MODEL, stream=True, **kwargs):
        for choice in chunk.choices:
            content.append(choice.delta.content or "")
            for delta in choice.delta.tool_calls or []:
                name, arguments = calls.get(delta.index, (None, ""))
                calls[delta.index] = (
                    name or (delta.function.name if delta.function else None),
                    arguments + ((delta.function.arguments or "") if delta.function else ""),
                )
            finish = choice.finish_reason or finish
    return "".join(content) or None, [calls[i] for i in sorted(calls)], finish


def test_a_call_cut_by_max_tokens_stays_a_call_streamed_and_whole(client):
    """OpenAI's rule for every cut: a call whose name is complete is a call with the arguments so far and
    ``finish_reason="length"``; a call cut inside its name is neither a call nor text.  Streamed == whole.
    (Parallel calls cut at every character: tests/serve/test_openai_client_units.py.)"""
    ask = dict(
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=TOOLS,
        tool_choice="required",
        temperature=0,
    )
    full = client.chat.completions.create(model=MODEL, max_tokens=128, **ask)
    assert full.choices[0].finish_reason == "tool_calls"
    final_calls = _calls(full.choices[0].message)
    seen: list[tuple[str, str]] = []
    named = False
    for n in range(1, full.usage.completion_tokens + 1):
        whole = client.chat.completions.create(model=MODEL, max_tokens=n, **ask).choices[0]
        calls = _calls(whole.message)
        assert _streamed(client, max_tokens=n, **ask) == (whole.message.content, calls, whole.finish_reason), n
        if whole.finish_reason == "tool_calls":  # the whole call fitted
            assert calls == final_calls and whole.message.content is None
            break
        assert whole.finish_reason == "length" and whole.message.content is None, (n, whole)  # never call text
        assert not calls or n > 1, calls  # the first token does not finish the name
        named = named or bool(calls)
        assert bool(calls) == named, n  # once a name is complete, the call stays
        assert len(calls) >= len(seen) and calls[: len(seen) - 1] == seen[:-1], (n, calls, seen)
        for i, (name, arguments) in enumerate(calls):
            assert name == final_calls[i][0] and final_calls[i][1].startswith(arguments), (n, calls)
            if seen[i:]:
                assert arguments.startswith(seen[i][1]), (n, calls, seen)  # the arguments only grow
        seen = calls
    else:
        raise AssertionError("the call never finished within its own token count")
    assert named


def test_n_stop_token_limits_seed_and_metadata(client):
    many = _ask(client, "Name an animal.", temperature=1.0, n=3, max_tokens=6, seed=7)
    assert [c.index for c in many.choices] == [0, 1, 2]
    again = _ask(client, "Name an animal.", temperature=1.0, n=3, max_tokens=6, seed=7)
    assert [c.message.content for c in again.choices] == [c.message.content for c in many.choices]
    whole = _ask(client, "Count: one, two, three, four, five.", max_tokens=24)
    text = whole.choices[0].message.content
    word = text.split()[2] if len(text.split()) > 3 else text[-2:]
    stopped = _ask(client, "Count: one, two, three, four, five.", max_tokens=24, stop=[word])
    assert stopped.choices[0].finish_reason == "stop" and stopped.choices[0].message.content == text[: text.index(word)]
    for limit in ({"max_tokens": 5}, {"max_completion_tokens": 5}):
        cut = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "A long story."}], temperature=0, **limit
        )
        assert cut.choices[0].finish_reason == "length" and cut.usage.completion_tokens == 5
    tagged = _ask(client, "Say hi.", max_tokens=4, metadata={"team": "search", "run": "1"})
    assert tagged.choices[0].message.content is not None


def test_a_json_answer_cut_by_stop_reports_valid_false_like_a_length_cut(client):
    full = _ask(client, "Plan 3 days in Lisbon.", response_format=_schema_format())
    cut_at = full.choices[0].message.content[:12][-3:]  # a stop string met inside the JSON
    stopped = _ask(client, "Plan 3 days in Lisbon.", response_format=_schema_format(), stop=[cut_at])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.model_extra["grammarspec"]["choices"][0]["valid"] is False
    short = _ask(client, "Plan 3 days in Lisbon.", response_format=_schema_format(), max_tokens=3)
    assert short.choices[0].finish_reason == "length"
    assert short.model_extra["grammarspec"]["choices"][0]["valid"] is False


def test_errors_are_typed_with_our_message_and_param(client):
    with pytest.raises(openai.BadRequestError) as e:
        _ask(client, "hi", logprobs=True)
    assert e.value.param == "logprobs" and "log-probabilities are not returned" in e.value.message
    loop = {"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]}
    with pytest.raises(openai.BadRequestError) as e:
        _ask(client, "hi", response_format=_schema_format(loop))
    assert e.value.param == "response_format" and "no finite value" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        _ask(client, "hi", metadata={"k": 5})
    assert e.value.param == "metadata.k"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])


def test_refs_inside_a_tools_parameters_name_that_tools_parameters(client):
    """'#' in a tool's parameters is those parameters (a place near places), '#/$defs/...' their own $defs."""
    place = {
        "type": "object",
        "$defs": {"name": {"type": "string", "maxLength": 20}},
        "properties": {"city": {"$ref": "#/$defs/name"}, "near": {"anyOf": [{"type": "null"}, {"$ref": "#"}]}},
        "required": ["city", "near"],
        "additionalProperties": False,
    }
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": place}}]
    reply = _ask(client, "What is the weather in Oslo?", tools=tools, tool_choice="required", max_tokens=40)
    choice = reply.choices[0]
    if choice.finish_reason == "tool_calls":
        [(name, arguments)] = _calls(choice.message)
        assert name == "get_weather"
        jsonschema.validate(json.loads(arguments), place)
    else:  # greedy SmolLM2 nests places until the token limit: each nested level is a place, not a tool call
        # a call cut by max_tokens stays a call, with the arguments written so far
        assert choice.finish_reason == "length" and choice.message.content is None
        [(name, arguments)] = _calls(choice.message)
        compact = re.sub(r"\s", "", arguments)
        assert name == "get_weather" and '"near":{"city":"' in compact
        assert '"near":{"name"' not in compact
    broken = {"type": "object", "properties": {"at": {"$ref": "#/$defs/nope"}}}
    with pytest.raises(openai.BadRequestError) as e:
        _ask(client, "hi", tools=[{"type": "function", "function": {"name": "mark", "parameters": broken}}])
    assert e.value.param == "tools" and "('mark') parameters has a $ref '#/$defs/nope'" in e.value.message
    empty_cycle = {
        "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
        "properties": {"x": {"$ref": "#/$defs/a"}},
    }
    with pytest.raises(openai.BadRequestError) as e:  # tool_choice "auto": the text-or-call grammar says why too
        _ask(client, "hi", tools=[{"type": "function", "function": {"name": "loop", "parameters": empty_cycle}}])
    assert e.value.param == "tools" and "circular $ref chain" in e.value.message, e.value.message


def test_a_client_timeout_mid_stream_leaves_the_server_serving(client, server):
    hasty = client.with_options(timeout=httpx.Timeout(60.0, read=0.01))
    received = 0
    with pytest.raises((openai.APITimeoutError, httpx.ReadTimeout)):
        for _ in _ask(hasty, "Write a very long story about a dragon.", stream=True, max_tokens=120):
            received += 1
    after = _ask(client, "Say hi.", max_tokens=4)
    assert after.choices[0].finish_reason in ("stop", "length") and after.choices[0].message.content
    assert httpx.get(server + "/health", timeout=30).json()["status"] == "ok"


def test_the_readme_serving_snippet_runs_as_written(server, capsys):
    code = readme_block("## Serving", "import openai")
    exec(compile(code.replace("http://127.0.0.1:8000/v1", server + "/v1"), "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert '"city"' in printed and "tokens_per_target_pass" in printed


def test_the_readme_conversation_snippet_runs_as_written(smol, monkeypatch, capsys):
    import grammarspec

    monkeypatch.setattr(grammarspec, "load_model", lambda *args, **kwargs: smol)  # the session's model, loaded once
    code = readme_block("## Conversations", "import grammarspec")
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["call"]["function"]["name"] == "get_weather"
    json.loads(namespace["call"]["function"]["arguments"])
    last = namespace["conv"].replies[-1]  # the snippet prints its last turn: the answer and what the cache saved
    assert isinstance(last.content, str) and last.content.strip() and not last.tool_calls, last.message
    assert not last.content.lstrip().startswith("{"), last.content  # an answer, not a call written as text
    assert last.reused_tokens > 0 and last.prefilled_tokens > 0
    assert capsys.readouterr().out.strip() == f"{last.content} {last.reused_tokens} {last.prefilled_tokens}"


def test_the_readme_quick_start_snippet_runs_as_written(smol, monkeypatch, capsys):
    import copy

    import grammarspec

    model, tokenizer = smol
    own = copy.copy(model)  # enable() patches generate on this copy; the session's model stays as it is
    monkeypatch.setattr(grammarspec, "load_model", lambda *args, **kwargs: (own, tokenizer))
    namespace: dict = {}
    exec(compile(readme_block("## Quick start", "import grammarspec"), "README.md", "exec"), namespace)
    result, out = namespace["result"], namespace["out"]
    assert result.valid and set(result.value) == {"city", "days"}
    assert out.stats[0].accepted_per_forward >= 1 and not hasattr(model, "_grammarspec_original_generate")
    assert capsys.readouterr().out.count("\n") == 2  # the snippet's two prints
