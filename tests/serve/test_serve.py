"""``grammarspec serve`` end to end: a real server on a free localhost port, driven by the ``openai`` client.

One server per module (uvicorn in a thread, the embedded SmolLM2-135M); greedy
requests, small ``max_tokens``.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx2 as httpx  # what the openai client ships with
import jsonschema
import pytest
import torch

pytest.importorskip("openai")
pytest.importorskip("uvicorn")
import openai

import grammarspec
from grammarspec.serve import Engine, prompt_ids
from tests.helpers import TOOLS, TRIP_SCHEMA
from tests.serve_process import MODEL, engine_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(smol):
    model, tokenizer = smol
    engine = Engine(model, tokenizer, max_batch_size=8, max_tokens=256)
    with engine_server(engine) as url:
        yield url, engine


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=300)


def _ask(client, content, **kwargs):
    kwargs.setdefault("temperature", 0)
    kwargs.setdefault("max_tokens", 48)
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], **kwargs)


def _schema_format(schema=TRIP_SCHEMA):
    return {"type": "json_schema", "json_schema": {"name": "plan", "schema": schema}}


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list()] == [MODEL]
    health = httpx.get(server[0] + "/health").json()
    assert health["status"] == "ok"


def test_a_schema_answer_validates_and_reports_statistics(client):
    r = _ask(client, "Plan 3 days in Lisbon. Reply in JSON.", response_format=_schema_format())
    choice = r.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), TRIP_SCHEMA)
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    ours = r.model_extra["grammarspec"]["choices"][0]
    assert ours["valid"] is True and ours["grammar_backend"] == "xgrammar"
    assert ours["tokens_per_target_pass"] >= 1.0


def test_json_object_gives_json(client):
    r = _ask(client, "Give me a JSON object about a cat.", response_format={"type": "json_object"}, max_tokens=64)
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # cut by max_tokens: never claimed complete
        assert r.choices[0].finish_reason == "length"
        assert r.model_extra["grammarspec"]["choices"][0]["valid"] is False


def test_forced_and_auto_tool_calls_have_valid_arguments(client):
    forced = _ask(
        client,
        "What is the weather in Oslo?",
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    assert forced.choices[0].finish_reason == "tool_calls"
    (call,) = forced.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), TOOLS[0]["function"]["parameters"])
    assert forced.choices[0].message.content is None

    required = _ask(client, "Add 2 and 3 with the add tool.", tools=TOOLS, tool_choice="required")
    (call,) = required.choices[0].message.tool_calls
    spec = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), spec)

    # auto: after one worked exchange, the model (its own choice, constrained to text or a valid call) calls
    shot = [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c0", "content": "rain"},
        {"role": "assistant", "content": "It rains in Oslo."},
        {"role": "user", "content": "Weather in Paris?"},
    ]
    auto = client.chat.completions.create(
        model=MODEL, messages=shot, tools=TOOLS, tool_choice="auto", temperature=0, max_tokens=40
    )
    message = auto.choices[0].message
    assert auto.choices[0].finish_reason == "tool_calls", message.content
    for call in message.tool_calls:
        spec = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[call.function.name]
        jsonschema.validate(json.loads(call.function.arguments), spec)

    none = _ask(client, "Say hello.", tools=TOOLS, tool_choice="none", max_tokens=12)
    assert not none.choices[0].message.tool_calls


def test_streaming_reassembles_to_the_answer(client):
    for kwargs in ({}, {"response_format": _schema_format()}, {"tools": TOOLS, "tool_choice": "required"}):
        whole = _ask(client, "Plan 2 days in Rome.", **kwargs)
        stream = _ask(client, "Plan 2 days in Rome.", stream=True, stream_options={"include_usage": True}, **kwargs)
        text, calls, finish, usage = "", {}, None, None
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for c in chunk.choices:
                text += c.delta.content or ""
                for d in c.delta.tool_calls or []:
                    entry = calls.setdefault(d.index, {"name": "", "arguments": ""})
                    entry["name"] += d.function.name or ""
                    entry["arguments"] += d.function.arguments or ""
                finish = c.finish_reason or finish
        message = whole.choices[0].message
        assert finish == whole.choices[0].finish_reason
        assert (text or None) == message.content
        assert [(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == [
            (c.function.name, c.function.arguments) for c in message.tool_calls or []
        ]
        assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens


def test_greedy_output_equals_grammarspec_generate(smol, client):
    model, tokenizer = smol
    messages = [{"role": "system", "content": "Reply in JSON."}, {"role": "user", "content": "Two days in Porto."}]
    r = client.chat.completions.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=40, response_format=_schema_format()
    )
    ids = prompt_ids(tokenizer, messages, None, "json")
    out = grammarspec.generate(
        model,
        torch.tensor([ids]),
        tokenizer=tokenizer,
        schema=TRIP_SCHEMA,
        assistant="auto",
        max_new_tokens=40,
        do_sample=False,
    )
    expected = tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True)
    assert r.choices[0].message.content == expected
    plain = _ask(client, "Name three colours.", max_tokens=24)
    ids = prompt_ids(tokenizer, [{"role": "user", "content": "Name three colours."}], None, "json")
    out = grammarspec.generate(
        model, torch.tensor([ids]), tokenizer=tokenizer, assistant="auto", max_new_tokens=24, do_sample=False
    )
    assert plain.choices[0].message.content == tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True)


PROMPTS = [
    "Plan 3 days in Lisbon.",
    "Two days in Oslo.",
    "A week in Kyoto.",
    "Five days in Lima.",
    "A day in Bern.",
    "Four days in Cairo.",
    "Three days in Quito.",
    "Six days in Hanoi.",
]


def test_eight_concurrent_requests_each_equal_their_solo_answer(client, server):
    kinds = [{"response_format": _schema_format()}, {"tools": TOOLS, "tool_choice": "required"}, {}]
    jobs = [(p, kinds[i % 3]) for i, p in enumerate(PROMPTS)]

    def run(job):
        r = _ask(client, job[0], max_tokens=32, **job[1])
        m = r.choices[0].message
        return m.content, [(c.function.name, c.function.arguments) for c in m.tool_calls or []]

    solo = [run(job) for job in jobs]
    loops = server[1].counters["loops"]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(run, jobs))
    assert together == solo
    assert server[1].counters["loops"] - loops < len(jobs)  # they shared decode loops


def test_a_later_turn_hits_the_prefix_cache(client, server):
    messages = [
        {"role": "system", "content": "You are a travel agent. " * 8},
        {"role": "user", "content": "Plan 2 days in Madrid."},
    ]
    first = client.chat.completions.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=32, response_format=_schema_format()
    )
    hits = server[1].prefix.stats.hits
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Now one more day."},
    ]
    second = client.chat.completions.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=32, response_format=_schema_format()
    )
    assert server[1].prefix.stats.hits == hits + 1
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens  # the first prompt, and the re-rendered answer after it
    assert second.model_extra["grammarspec"]["prefix_reused_tokens"] == cached
    jsonschema.validate(json.loads(second.choices[0].message.content), TRIP_SCHEMA)


def test_max_tokens_stop_and_n(client):
    cut = _ask(client, "Write a long story about a dragon.", max_tokens=5)
    assert cut.choices[0].finish_reason == "length" and cut.usage.completion_tokens == 5
    whole = _ask(client, "Count: one, two, three, four, five.", max_tokens=24)
    text = whole.choices[0].message.content
    word = text.split()[2] if len(text.split()) > 3 else text[-2:]
    stopped = _ask(client, "Count: one, two, three, four, five.", max_tokens=24, stop=[word])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content == text[: text.index(word)]
    many = _ask(client, "Name an animal.", temperature=1.0, n=3, max_tokens=8, seed=1)
    assert [c.index for c in many.choices] == [0, 1, 2]
    assert 3 <= many.usage.completion_tokens <= 3 * 8  # counted over every choice


@pytest.mark.parametrize(
    "body, param",
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}},
            "response_format",
        ),
        ({"top_k": 3}, "top_k"),
        ({"temperature": "hot"}, "temperature"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"logprobs": True}, "logprobs"),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
                "tool_choice": {"type": "function", "function": {"name": "g"}},
            },
            "tool_choice.function.name",
        ),
        ({"messages": "hi"}, "messages"),
    ],
)
def test_bad_input_gets_a_400_in_openai_shape(server, body, param):
    request = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **body}
    r = httpx.post(server[0] + "/v1/chat/completions", json=request, timeout=120)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"].startswith(param) and error["message"]


def test_unknown_model_is_a_404_and_a_non_json_body_a_400(server):
    r = httpx.post(server[0] + "/v1/chat/completions", json={"model": "gpt-9", "messages": []}, timeout=60)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = httpx.post(server[0] + "/v1/chat/completions", content=b"{not json", timeout=60)
    assert r.status_code == 400 and "error" in r.json()


def test_a_disconnect_cancels_its_row_while_the_others_finish(server, client):
    url, engine = server
    cancelled = engine.counters["cancelled"]
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a very long story."}],
        "temperature": 0,
        "max_tokens": 200,
        "stream": True,
    }
    with ThreadPoolExecutor(2) as pool:
        other = pool.submit(_ask, client, "Plan 3 days in Lisbon.", response_format=_schema_format())
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
            assert r.status_code == 200
            for n, _ in enumerate(r.iter_lines()):
                if n >= 6:
                    break  # leave mid-stream
        answer = other.result(timeout=300)
    jsonschema.validate(json.loads(answer.choices[0].message.content), TRIP_SCHEMA)
    deadline = time.time() + 60
    while engine.counters["cancelled"] == cancelled:
        assert time.time() < deadline, "the abandoned stream was not cancelled"
        time.sleep(0.1)
    assert httpx.get(url + "/health").json()["status"] == "ok"
    assert _ask(client, "Say hi.", max_tokens=4).choices[0].finish_reason in ("stop", "length")


def test_the_openai_agent_example_runs_a_tool_loop(server):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "openai_agent.py"
    spec = importlib.util.spec_from_file_location("example_openai_agent", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    messages = example.main(
        ["What is the weather in Oslo, in celsius?", "--base-url", server[0] + "/v1", "--max-turns", "2"]
    )
    assert messages[-1]["role"] == "assistant"
    for message in messages:
        for call in message.get("tool_calls") or []:
            spec_ = {t["function"]["name"]: t["function"]["parameters"] for t in example.TOOLS}[
                call["function"]["name"]
            ]
            jsonschema.validate(json.loads(call["function"]["arguments"]), spec_)
