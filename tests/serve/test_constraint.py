"""The server's request preparation: its constraint is the library's :class:`Constraint`, its prompt is
:class:`Conversation`'s, and its grammars live in the one grammar cache (``grammars.compile_cache``).

Toy tokenizer with a chat template and a tiny random Llama; nothing is decoded
(a prepared job is never submitted).
"""

from __future__ import annotations

import warnings

import pytest

from grammars import cache_info, clear_grammar_cache, set_cache_limits
from grammars.compile_cache import limits
from grammarspec.constraint import Constraint
from grammarspec.conversation import Conversation
from grammarspec.serve import Engine, RequestError
from grammarspec.serve.engine import prompt_ids
from grammarspec.serve.protocol import ChatRequest
from tests.toy import toy_tokenizer, toy_vocab_size
from tests.toy_models import tiny_llama

TEMPLATE = "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}a:{% endif %}"


def _tool(name: str) -> dict:
    properties = {"city": {"type": "string"}}
    parameters = {"type": "object", "properties": properties, "required": ["city"], "additionalProperties": False}
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


TOOLS = [_tool("get_weather"), _tool("get_time")]
MESSAGES = [{"role": "system", "content": "s"}, {"role": "user", "content": "weather in oslo?"}]


@pytest.fixture(scope="module")
def chat():
    tok = toy_tokenizer()
    tok.chat_template = TEMPLATE
    return tok


@pytest.fixture(scope="module")
def model(chat):
    return tiny_llama(toy_vocab_size(chat), seed=3)


@pytest.fixture
def engine(model, chat):
    engine = Engine(model, chat, max_tokens=16, prefix_cache_bytes=0, tool_format="json")
    yield engine
    engine.close()


@pytest.fixture
def bounds():
    """The grammar cache's bounds as they were, restored after the test (an Engine may change them)."""
    previous = limits()
    yield previous
    set_cache_limits(
        grammar_mb=previous.grammar_bytes / 2**20,
        grammar_count=previous.grammar_count,
        tokenizer_mb=previous.tokenizer_bytes / 2**20,
        tokenizer_count=previous.tokenizer_count,
    )
    clear_grammar_cache()


def _prepare(engine, **fields):
    return engine.prepare(ChatRequest(messages=list(MESSAGES), temperature=0.0, **fields), lambda event: None)


@pytest.mark.parametrize(
    ("tool_choice", "offered"),
    [
        ("required", ["get_weather", "get_time"]),
        ({"type": "function", "function": {"name": "get_time"}}, ["get_time"]),  # the call schema names one
        ("auto", ["get_weather", "get_time"]),
        ("none", None),
    ],
)
def test_a_tool_request_is_constrained_as_the_library_constrains_it(engine, tool_choice, offered):
    job = _prepare(engine, tools=TOOLS, tool_choice=tool_choice, parallel_tool_calls=True)
    (choice,) = job.choices
    (expected,) = Constraint(tools=TOOLS, tool_choice=tool_choice, parallel_tool_calls=True).resolve().specs(1)
    assert choice.spec == expected
    assert (choice.compiled is None) == (expected is None)
    names = [t["function"]["name"] for t in job.offered] if job.offered is not None else None
    assert names == offered
    assert choice.kind == ("tools" if offered else "text")


def test_a_schema_request_and_parallel_tool_calls_without_tools(engine):
    """``parallel_tool_calls`` without tools is ignored, as OpenAI does (grammar_spec alone would refuse it)."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    (choice,) = _prepare(engine, schema=schema, parallel_tool_calls=True).choices
    assert choice.spec == Constraint(schema=schema).resolve().specs(1)[0] and choice.kind == "schema"
    (plain,) = _prepare(engine, parallel_tool_calls=True).choices
    assert plain.spec is None and plain.compiled is None and plain.kind == "text"


def test_a_constraint_that_does_not_compile_is_a_400_naming_its_field(engine):
    with pytest.raises(RequestError, match="the constraint does not compile") as info:
        _prepare(engine, schema={"type": "object", "properties": {"a": {"type": 5}}})
    assert info.value.param == "response_format" and info.value.code == "invalid_schema"


def test_the_server_keeps_its_grammars_in_the_one_grammar_cache(model, chat, bounds):
    """``grammar_cache_size`` bounds the process's grammar cache: the server keeps no cache of its own."""
    clear_grammar_cache()
    engine = Engine(model, chat, max_tokens=16, prefix_cache_bytes=0, tool_format="json", grammar_cache_size=2)
    try:
        assert limits().grammar_count == 2 and limits().grammar_bytes == bounds.grammar_bytes
        schemas = [{"type": "object", "properties": {f"k{i}": {"type": "integer"}}} for i in range(3)]
        first = [_prepare(engine, schema=s).choices[0].compiled for s in schemas]
        assert cache_info()["grammars"] == 2
        again = _prepare(engine, schema=schemas[2]).choices[0].compiled
        assert again is first[2]  # the cached grammar, not a recompile
        assert _prepare(engine, schema=schemas[0]).choices[0].compiled is not first[0]  # evicted: compiled anew
    finally:
        engine.close()


def test_the_servers_prompt_is_the_conversations_prompt(model, chat):
    """Token for token, with tools described in the system message (a model format the template drops)."""
    for fmt, choice in (("json", "auto"), ("json", "none"), ("qwen_3", "auto"), ("qwen_3", "none")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the template ignores tools=: they are described
            conversation = Conversation(model, chat, tools=TOOLS, tool_format=fmt)
        conversation.messages = list(MESSAGES)
        served = prompt_ids(chat, MESSAGES, TOOLS, fmt, choice)
        assert served == conversation.prompt_ids(tool_choice=choice), (fmt, choice)
    described = chat.decode(prompt_ids(chat, MESSAGES, TOOLS, "qwen_3", "auto"))
    assert "get_weather" in described  # the template drops tools=, so the prompt describes them
