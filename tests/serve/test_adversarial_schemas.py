"""Schemas a client may send by mistake, against a real ``grammarspec serve`` process under a memory cap.

Each schema goes through ``response_format`` and through ``tools``; each gets an
answer or a clear 400 (never a 500, never a backend's internal error) within
the client's timeout.  After each, a normal request is served, and the
server's resident memory stays below :data:`RSS_BOUND` over what it was after
a warm-up request.  One server process for the whole module.
"""

from __future__ import annotations

import httpx2 as httpx
import pytest

pytest.importorskip("uvicorn")
import psutil

from tests.serve_process import MODEL, serve_process

pytestmark = pytest.mark.slow

#: Resident-memory growth allowed over the warm server (grammars cached, the allocator's slack).
RSS_BOUND = 1536 << 20
#: Seconds a request may take, compile included (the server's own compile limit is 60 s).
REQUEST_TIMEOUT = 180


def _deep(levels: int) -> dict:
    node: dict = {"type": "integer"}
    for _ in range(levels):
        node = {"type": "object", "properties": {"a": node}, "required": ["a"]}
    return node


_CYCLE = {
    "$defs": {
        "a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}, "required": ["b"]},
        "b": {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}, "required": ["a"]},
    },
    "$ref": "#/$defs/a",
}
_LONG_NAME = "n" * 1000  # through tools it is in the prompt too: 1,000 prompt tokens

#: name -> (schema, what it must get: "400" for a schema with no finite value, else "either")
CASES = {
    "self_reference": ({"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]}, "400"),
    "mutual_cycle": (_CYCLE, "400"),
    "allof_conflicting_types": ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "400"),
    "min_items_over_max_items": ({"type": "array", "items": {"type": "integer"}, "minItems": 5, "maxItems": 2}, "400"),
    "enum_of_20000": (
        {"type": "object", "properties": {"v": {"enum": [f"v{i}" for i in range(20000)]}}, "required": ["v"]},
        "either",
    ),
    "nesting_200_deep": (_deep(200), "either"),
    "giant_pattern": (
        {
            "type": "object",
            "properties": {"s": {"type": "string", "pattern": "^(" + "|".join(f"word{i}" for i in range(3000)) + ")$"}},
            "required": ["s"],
        },
        "either",
    ),
    "long_property_name": (
        {"type": "object", "properties": {_LONG_NAME: {"type": "integer"}}, "required": [_LONG_NAME]},
        "either",
    ),
    "min_items_5000_open": (
        {
            "type": "object",
            "properties": {"a": {"type": "array", "items": {"const": 1}, "minItems": 5000}},
            "required": ["a"],
        },
        "either",
    ),
}

#: The cases no value satisfies at all -> words of the conflict the refusal names.
NO_VALUE = {"allof_conflicting_types": "excludes the type", "min_items_over_max_items": "minItems 5"}


@pytest.fixture(scope="module")
def server():
    with serve_process("--max-tokens", "64") as (url, pid):
        process = psutil.Process(pid)
        assert _normal(url).status_code == 200  # warm: the model has run once
        yield url, process, process.memory_info().rss


def _post(url: str, **body) -> httpx.Response:
    request = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Answer in JSON."}],
        "temperature": 0,
        "max_tokens": 8,
        **body,
    }
    return httpx.post(url + "/v1/chat/completions", json=request, timeout=REQUEST_TIMEOUT)


def _normal(url: str) -> httpx.Response:
    return _post(url, messages=[{"role": "user", "content": "Say hi."}], max_tokens=4)


def _through(via: str, schema: dict) -> dict:
    if via == "response_format":
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}
    parameters = (
        schema
        if schema.get("type") == "object" or "$ref" in schema
        else {"type": "object", "properties": {"v": schema}, "required": ["v"]}
    )
    return {
        "tools": [{"type": "function", "function": {"name": "f", "parameters": parameters}}],
        "tool_choice": "required",
    }


@pytest.mark.parametrize("via", ["response_format", "tools"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_schema_gets_an_answer_or_a_clear_400_and_the_server_stays_healthy(server, case, via):
    url, process, warm_rss = server
    schema, expected = CASES[case]
    r = _post(url, **_through(via, schema))
    assert r.status_code in (200, 400), r.text[:500]
    body = r.json()
    if r.status_code == 400:
        error = body["error"]
        assert error["type"] == "invalid_request_error" and error["param"], error
        assert len(error["message"]) > 40 and "internal error" not in error["message"], error
    else:
        assert expected != "400", f"{case} was answered: {body['choices'][0]}"
        (choice,) = body["choices"]
        assert choice["finish_reason"] in ("stop", "length", "tool_calls")
        ours = body["grammarspec"]["choices"][0]
        assert ours["valid"] is not None  # JSON was asked: never "unknown"
        if ours["valid"]:
            assert choice["finish_reason"] in ("stop", "tool_calls")
    if expected == "400":  # through tools too: refs in a tool's parameters name those parameters
        assert r.status_code == 400
        message = body["error"]["message"]
        if case in NO_VALUE:  # refused up front, naming the conflict, on the server's default backend
            assert "accepts no value" in message and NO_VALUE[case] in message, message
        else:
            assert "no finite value" in message, message
    after = _normal(url)
    assert after.status_code == 200 and after.json()["choices"][0]["message"]["content"] is not None
    health = httpx.get(url + "/health", timeout=30).json()
    assert health["status"] == "ok" and health["counters"]["failed"] == 0
    grown = process.memory_info().rss - warm_rss
    assert grown < RSS_BOUND, f"resident memory grew by {grown >> 20} MiB after {case} through {via}"


def test_the_self_referencing_schema_is_refused_in_python_too(smol_tokenizer):
    from grammars import GrammarError, compile_grammar, grammar_spec

    for schema in (CASES["self_reference"][0], _CYCLE):
        with pytest.raises(GrammarError, match="no finite value"):
            compile_grammar(grammar_spec(schema=schema), smol_tokenizer, backend="llguidance")
    dead_branch = {
        "anyOf": [{"type": "string"}, {"type": "object", "properties": {"x": {"$ref": "#/anyOf/1"}}, "required": ["x"]}]
    }
    with pytest.raises(GrammarError, match="part of the JSON schema accepts no finite value"):
        compile_grammar(grammar_spec(schema=dead_branch), smol_tokenizer)
    tree = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}, "required": ["kids"]}
    assert compile_grammar(grammar_spec(schema=tree), smol_tokenizer).backend == "xgrammar"  # it has a way out
