"""``grammarspec serve`` as a public endpoint: the API key, the body-size cap, the prompt-length check before
tokenizing, OpenAI's message rules (each malformed field a 400 naming it) and advice a client can act on.

Through a real server process and the real ``openai`` client where they apply; the check that refuses a long
prompt before the tokenizer sees it runs in process, with a tokenizer that counts its calls.
"""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
import httpx2 as httpx

from grammars import grammar_spec
from grammars.deadline import _timeout_message
from grammarspec.serve.advice import client_words
from grammarspec.serve.limits import derived_max_prompt_chars
from tests.serve_process import MODEL, serve_process

pytestmark = pytest.mark.slow

KEY = "sk-test-endpoint-key"
#: The server's body cap: 64 KiB, so a body just past it is cheap to send.
MAX_BODY_MB = "0.0625"
HI = [{"role": "user", "content": "hi"}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
        },
    }
]


@pytest.fixture(scope="module")
def server():
    with serve_process("--max-tokens", "16", "--api-key", KEY, "--max-body-mb", MAX_BODY_MB) as (url, _pid):
        yield url


def _client(url, key=KEY):
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=300)


def _post(url, body=None, *, content=None, headers=None):
    headers = {"Authorization": f"Bearer {KEY}", **(headers or {})}
    if content is not None:
        return httpx.post(url + "/v1/chat/completions", content=content, headers=headers, timeout=120)
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=120)


def _requests_served(url):
    return httpx.get(url + "/health", headers={"Authorization": f"Bearer {KEY}"}, timeout=30).json()["counters"][
        "requests"
    ]


# --- the API key ----------------------------------------------------------------------------------------------


def test_a_missing_or_wrong_key_is_a_401_in_openais_shape_on_every_v1_route(server):
    with pytest.raises(openai.AuthenticationError) as e:
        _client(server, "sk-wrong").chat.completions.create(model=MODEL, messages=HI, max_tokens=1)
    assert e.value.status_code == 401 and e.value.code == "invalid_api_key"
    assert "incorrect API key" in e.value.message
    with pytest.raises(openai.AuthenticationError):
        _client(server, "sk-wrong").models.list()
    for route, method in (("/v1/chat/completions", "POST"), ("/v1/models", "GET")):
        r = httpx.request(method, server + route, json={"model": MODEL, "messages": HI}, timeout=30)
        error = r.json()["error"]
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", r.text
        assert error["type"] == "invalid_request_error" and error["code"] == "invalid_api_key"
        assert "Authorization: Bearer" in error["message"]
    r = httpx.get(server + "/v1/models", headers={"Authorization": f"Basic {KEY}"}, timeout=30)
    assert r.status_code == 401  # the key, but not as a bearer token


def test_the_right_key_is_served_and_health_stays_open_with_only_its_status(server):
    client = _client(server)
    assert [m.id for m in client.models.list()] == [MODEL]
    reply = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=2, temperature=0)
    assert reply.choices[0].message.content is not None
    open_health = httpx.get(server + "/health", timeout=30)
    assert open_health.status_code == 200 and open_health.json() == {"status": "ok"}
    keyed = httpx.get(server + "/health", headers={"Authorization": f"Bearer {KEY}"}, timeout=30).json()
    assert keyed["status"] == "ok" and keyed["counters"]["requests"] >= 1 and "prefix_cache" in keyed


def test_the_key_can_come_from_the_environment():
    env = {**os.environ, "GRAMMARSPEC_API_KEY": "sk-from-env"}
    with serve_process("--max-tokens", "4", env=env) as (url, _pid):
        with pytest.raises(openai.AuthenticationError):
            _client(url, "sk-wrong").models.list()
        assert httpx.get(url + "/v1/models", timeout=30).status_code == 401
        reply = _client(url, "sk-from-env").chat.completions.create(
            model=MODEL, messages=HI, max_tokens=1, temperature=0
        )
        assert reply.choices[0].finish_reason in ("length", "stop")


# --- the body-size cap ----------------------------------------------------------------------------------------


def test_an_oversized_body_is_a_413_and_never_reaches_the_engine(server):
    served = _requests_served(server)
    with pytest.raises(openai.APIStatusError) as e:
        _client(server).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x" * 100_000}], max_tokens=1
        )
    assert e.value.status_code == 413 and e.value.code == "request_too_large"
    assert "0.0625 MiB" in e.value.message and "--max-body-mb" in e.value.message

    def chunks():  # no Content-Length: the cap counts what arrives
        yield b'{"model": "' + MODEL.encode() + b'", "messages": [{"role": "user", "content": "'
        for _ in range(40):
            yield b"y" * 4096
        yield b'"}]}'

    r = _post(server, content=chunks())
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large", r.text
    assert _requests_served(server) == served
    fits = _client(server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x" * 1000}], max_tokens=1
    )
    assert fits.choices[0].finish_reason in ("length", "stop")


# --- OpenAI's message rules -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, param, says",
    [
        (
            {"messages": [*HI, {"role": "assistant", "tool_calls": [{"id": "c", "type": "function"}]}]},
            "messages[1].tool_calls[0].function",
            "messages[1].tool_calls[0].function: field required",
        ),
        (
            {
                "messages": [
                    *HI,
                    {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": 7, "arguments": "{}"}}]},
                ]
            },
            "messages[1].tool_calls[0].function.name",
            "valid string",
        ),
        (
            {
                "messages": [
                    *HI,
                    {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "add", "arguments": {"a": 1}}}]},
                ]
            },
            "messages[1].tool_calls[0].function.arguments",
            "valid string (got dict)",
        ),
        (
            {"messages": [*HI, {"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "content": "3"}]},
            "messages[2].tool_call_id",
            "messages[2].tool_call_id: field required",
        ),
        (
            {"messages": [*HI, {"role": "assistant", "tool_calls": "abc"}]},
            "messages[1].tool_calls",
            "valid list (got str)",
        ),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function"}},
            "tool_choice.function",
            "tool_choice.function: field required",
        ),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "sub"}}},
            "tool_choice.function.name",
            "'sub' is not one of the tools ('add')",
        ),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "'none', 'auto' or 'required'"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", "system, developer, user"),
        ({"messages": [{"role": "user", "content": "x", "tool_call_id": "c"}]}, "messages[0].tool_call_id", "unknown"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema.schema",
            "field required",
        ),
        ({"max_tokens": "5"}, "max_tokens", "valid integer"),
    ],
)
def test_each_malformed_field_is_a_400_naming_it(server, extra, param, says):
    with pytest.raises(openai.BadRequestError) as e:
        _client(server).chat.completions.create(model=MODEL, **{"messages": HI, "max_tokens": 1, **extra})
    assert e.value.param == param and says in e.value.message, e.value.message
    assert e.value.body["type"] == "invalid_request_error"


def test_a_number_json_cannot_hold_names_its_field_not_a_decoder_position(server):
    schema = '{"type": "object", "properties": {"a": {"const": 1e400}}}'
    body = (
        f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "hi"}}], "max_tokens": 1, '
        f'"response_format": {{"type": "json_schema", "json_schema": {{"name": "x", "schema": {schema}}}}}}}'
    )
    r = _post(server, content=body, headers={"Content-Type": "application/json"})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "response_format.json_schema.schema.properties.a.const"
    assert "out of range" in error["message"] and "line 1 column" not in error["message"], error
    r = _post(server, content=body.replace("1e400", "NaN"), headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"].endswith("properties.a.const"), r.text


# --- advice a client can act on ---------------------------------------------------------------------------------


def test_a_refused_schemas_advice_names_what_the_client_sends_and_following_it_works(server):
    schema = {"type": "object", "properties": {"a": {"enum": []}}}  # xgrammar refuses; "a" may be left out
    response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    client = _client(server)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=HI, max_tokens=4, response_format=response_format)
    message = e.value.message
    assert "grammar_backend='" not in message and "compile_timeout" not in message, message
    advised = json.loads("{" + message.split("Try ", 1)[1].split(" in the request", 1)[0] + "}")
    backend = advised["grammarspec"]["grammar_backend"]
    reply = client.chat.completions.create(
        model=MODEL, messages=HI, max_tokens=8, temperature=0, response_format=response_format, extra_body=advised
    )
    assert reply.model_extra["grammarspec"]["choices"][0]["grammar_backend"] == backend


def test_compile_time_advice_names_the_servers_flag_not_a_python_keyword():
    spec = grammar_spec(schema={"type": "object"})
    for message in (
        _timeout_message("xgrammar", spec, 2.0, "stopped"),
        _timeout_message("outlines", spec, 0.5, "stopped", total=2.0),
        "xgrammar could not read the tokenizer: pass a Hugging Face tokenizer, or try backend='llguidance'",
        "llguidance not tried: compile_timeout=2 s was spent; raise it to find out whether it compiles this grammar",
        "use grammar_backend='llguidance' (it enforces them), or rely on post-validation: every finished result "
        "carries stats.valid and stats.schema_errors (grammars.validation.output_errors)",
    ):
        words = client_words(message)
        assert "compile_timeout" not in words and "backend='" not in words and "stats." not in words, words
        assert "--compile-timeout" in words or '"grammar_backend": "llguidance"' in words, words


# --- the prompt length, checked before tokenizing ---------------------------------------------------------------


def count_tokenizer_calls(tokenizer, monkeypatch) -> list[str]:
    """The calls that render or tokenize text on ``tokenizer`` from now on (their names, in order)."""
    calls: list[str] = []
    render, encode = tokenizer.apply_chat_template, type(tokenizer).__call__

    def counted_render(*args, **kwargs):
        calls.append("apply_chat_template")
        return render(*args, **kwargs)

    def counted_encode(self, *args, **kwargs):
        if self is tokenizer:
            calls.append("__call__")
        return encode(self, *args, **kwargs)

    monkeypatch.setattr(tokenizer, "apply_chat_template", counted_render)
    monkeypatch.setattr(type(tokenizer), "__call__", counted_encode)
    return calls


@pytest.fixture(scope="module")
def engine(smol):
    from grammarspec.serve import Engine

    model, tokenizer = smol
    engine = Engine(model, tokenizer, max_batch_size=2, max_tokens=4)
    yield engine
    engine.close()


def test_a_prompt_too_long_to_fit_is_refused_before_the_tokenizer_sees_it(engine, monkeypatch):
    from starlette.testclient import TestClient

    from grammarspec.serve import create_app

    limit = derived_max_prompt_chars(engine.tokenizer, engine.context)
    longest = max(len(entry) for entry in engine.tokenizer.get_vocab())
    assert limit == engine.context * longest  # no prompt of more characters fits the context
    calls = count_tokenizer_calls(engine.tokenizer, monkeypatch)
    app = TestClient(create_app(engine, MODEL))
    body = {"model": MODEL, "max_tokens": 1, "temperature": 0}
    long = [{"role": "system", "content": "s" * (limit // 2)}, {"role": "user", "content": "u" * (limit // 2 + 1)}]
    r = app.post("/v1/chat/completions", json={**body, "messages": long})
    error = r.json()["error"]
    assert r.status_code == 400 and error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert f"{limit + 1:,} characters" in error["message"] and "--max-prompt-chars" in error["message"]
    assert calls == []
    small = TestClient(create_app(engine, MODEL, max_prompt_chars=10))
    r = small.post("/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": "x" * 11}]})
    assert r.status_code == 400 and calls == [], r.text
    r = small.post("/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": " hello  "}]})
    assert r.status_code == 200 and "__call__" in calls, r.text  # outer whitespace does not count
