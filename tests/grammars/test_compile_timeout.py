"""Compile deadlines stop the work; caches are bounded by bytes; nothing is compiled twice.

Behaviour only: no wall-clock speed is asserted.  "No CPU is spent" is
checked with the process's own CPU time (``os.times``) while it sleeps.
"""

from __future__ import annotations

import os
import re
import threading
import time
import warnings

import psutil
import pytest

import grammars.deadline as deadline
from grammars import (
    BACKENDS,
    CompileTimeout,
    GrammarError,
    GrammarWarning,
    cache_info,
    clear_grammar_cache,
    compile_grammar,
    grammar_spec,
    set_cache_limits,
)
from tests.toy import toy_tokenizer


@pytest.fixture
def toy():
    return toy_tokenizer()


@pytest.fixture(autouse=True)
def fresh_cache():
    clear_grammar_cache()
    previous = set_cache_limits()
    yield
    set_cache_limits(
        grammar_mb=previous.grammar_bytes / 2**20,
        grammar_count=previous.grammar_count,
        tokenizer_mb=previous.tokenizer_bytes / 2**20,
        tokenizer_count=previous.tokenizer_count,
    )
    clear_grammar_cache()


def slow_schema(tag: str, n: int = 30) -> dict:
    """outlines-core needs far longer than 0.05 s for this (n patterned strings), even on the toy vocabulary."""
    return {
        "type": "object",
        "properties": {f"{tag}{i}": {"type": "string", "pattern": "^[a-z]{2,9}$"} for i in range(n)},
    }


class Spy:
    """Counts the compiles that reach a backend (cache and remembered errors answer the rest)."""

    def __init__(self, monkeypatch):
        self.calls: list[tuple[str, float | None]] = []
        real = deadline.compile_within

        def run(backend, prepared, spec, vocab_size, stops, timeout, **kwargs):
            self.calls.append((backend.name, timeout))
            started = time.monotonic()
            try:
                return real(backend, prepared, spec, vocab_size, stops, timeout, **kwargs)
            finally:
                self.seconds.append(time.monotonic() - started)

        self.seconds: list[float] = []  # how long each compile ran

        monkeypatch.setattr(deadline, "compile_within", run)


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def test_a_timed_out_compile_leaves_no_process_or_thread_and_spends_no_cpu(toy):
    me = psutil.Process()
    threads_before = threading.active_count()
    with pytest.raises(CompileTimeout, match=r"outlines did not compile the grammar within compile_timeout=0.05 s"):
        compile_grammar(grammar_spec(schema=slow_schema("a", 300)), toy, backend="outlines", compile_timeout=0.05)
    assert me.children(recursive=True) == []  # the worker was killed and reaped
    assert threading.active_count() == threads_before  # no compile thread left behind
    cpu = _cpu_seconds()
    time.sleep(1.0)
    assert _cpu_seconds() - cpu < 0.2  # nothing is still compiling (the old thread kept a core busy)
    assert isinstance(CompileTimeout("x"), GrammarError)


def test_a_timed_out_grammar_is_not_compiled_again_within_the_same_deadline(toy, monkeypatch):
    spy = Spy(monkeypatch)
    spec = grammar_spec(schema=slow_schema("b", 300))  # slow enough that a quiet machine misses both deadlines
    for _ in range(3):
        with pytest.raises(CompileTimeout):
            compile_grammar(spec, toy, backend="outlines", compile_timeout=0.05)
    assert spy.calls == [("outlines", 0.05)]
    with pytest.raises(CompileTimeout):  # a longer deadline tries again
        compile_grammar(spec, toy, backend="outlines", compile_timeout=0.1)
    assert spy.calls == [("outlines", 0.05), ("outlines", 0.1)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_grammar_compiled_under_a_deadline_behaves_as_one_compiled_without(toy, backend):
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", "yz"]}},
        "required": ["a", "b"],
        "additionalProperties": False,
    }
    timed = compile_grammar(grammar_spec(schema=schema), toy, backend=backend, compile_timeout=60)
    clear_grammar_cache()
    plain = compile_grammar(grammar_spec(schema=schema), toy, backend=backend)
    assert timed is not plain and type(timed) is type(plain)
    text = '{"a":12,"b":"yz"}'
    left, right = timed.matcher(), plain.matcher()
    for token in toy.encode(text, add_special_tokens=False):
        assert left.allowed_tokens().tolist() == right.allowed_tokens().tolist()
        assert left.forced_text() == right.forced_text()
        assert left.accept(token) and right.accept(token)
    assert left.accept(toy.eos_token_id) and right.accept(toy.eos_token_id)


def test_a_refused_grammar_is_not_compiled_twice(toy, monkeypatch):
    spy = Spy(monkeypatch)
    spec = grammar_spec(schema={"type": "string", "format": "ipv4"})  # outlines-core refuses the format
    messages = set()
    for _ in range(3):
        with pytest.raises(GrammarError) as info:
            compile_grammar(spec, toy, backend="outlines")
        messages.add(str(info.value))
    assert len(messages) == 1 and "ipv4" in messages.pop()
    assert [name for name, _ in spy.calls].count("outlines") == 1  # then the remembered error


def test_auto_decides_from_the_tables_and_compiles_nothing_twice(toy, monkeypatch):
    spy = Spy(monkeypatch)
    unique = grammar_spec(schema={"type": "array", "items": {"type": "integer"}, "uniqueItems": True})
    first = compile_grammar(unique, toy, backend="auto")
    # llguidance refuses uniqueItems by its table: not compiled; xgrammar leaves it unenforced and wins
    assert first.backend == "xgrammar" and spy.calls == [("xgrammar", None)]
    assert compile_grammar(unique, toy, backend="auto").chosen is first.chosen
    plain = grammar_spec(schema={"type": "object", "properties": {"n": {"type": "integer"}}})
    compile_grammar(plain, toy, backend="auto")
    compile_grammar(plain, toy, backend="auto")
    assert spy.calls[1:] == [("llguidance", None)]  # the first backend that enforces everything; once


def test_the_grammar_cache_is_bounded_by_bytes(toy):
    set_cache_limits(grammar_mb=0.1, grammar_count=1000)
    for i in range(40):
        schema = {"type": "object", "properties": {f"k{i}_{j}": {"type": "string"} for j in range(8)}}
        compile_grammar(grammar_spec(schema=schema), toy, backend="outlines")
        info = cache_info()
        assert info["grammar_bytes"] <= 0.1 * 2**20, info
    assert 0 < info["grammars"] < 40
    set_cache_limits(grammar_mb=0)  # nothing fits: compiled and returned, never kept
    spec = grammar_spec(schema={"type": "integer"})
    assert compile_grammar(spec, toy) is not compile_grammar(spec, toy)
    assert cache_info()["grammars"] == 0


def test_the_grammar_cache_is_bounded_by_count_and_clear_empties_it(toy):
    set_cache_limits(grammar_count=3)
    for i in range(6):
        compile_grammar(grammar_spec(schema={"enum": [f"v{i}"]}), toy)
    assert cache_info()["grammars"] == 3
    clear_grammar_cache()
    assert cache_info() == {"grammars": 0, "grammar_bytes": 0, "tokenizers": 0, "tokenizer_bytes": 0, "failures": 0}


def test_the_tokenizer_cache_is_bounded_by_bytes(toy):
    set_cache_limits(tokenizer_mb=0)
    compile_grammar(grammar_spec(schema={"type": "integer"}), toy)
    assert cache_info()["tokenizers"] == 0
    set_cache_limits(tokenizer_mb=256)
    compile_grammar(grammar_spec(schema={"type": "boolean"}), toy)
    assert cache_info()["tokenizers"] == 1 and cache_info()["tokenizer_bytes"] > 0


@pytest.mark.parametrize("kwargs", [dict(grammar_mb=-1), dict(grammar_count="8"), dict(tokenizer_mb=True)])
def test_bad_cache_limits_say_what_is_wrong(kwargs):
    with pytest.raises(GrammarError, match=f"set_cache_limits\\({next(iter(kwargs))}=...\\) must be a number"):
        set_cache_limits(**kwargs)


def test_a_large_enum_on_xgrammar_points_to_compile_timeout(toy):
    """xgrammar takes a minute on a 100k-value enum: the timeout says why, and points to compile_timeout."""
    schema = {"enum": [f"v{i}" for i in range(deadline.LARGE_ENUM)]}
    spec = grammar_spec(schema=schema)
    with pytest.warns(GrammarWarning) as caught:
        compile_grammar(spec, toy, backend="xgrammar")
    said = [str(w.message) for w in caught if issubclass(w.category, GrammarWarning)]
    assert len(said) == 1 and re.search(r"enum of 10,000 values.*compile_timeout=", said[0]), said
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a deadline given, or a small enum: no warning
        compile_grammar(grammar_spec(schema={"enum": schema["enum"][1:]}), toy, compile_timeout=600)
        compile_grammar(grammar_spec(schema={"enum": ["a", "b"]}), toy)


def test_a_timeout_on_a_large_enum_says_why(monkeypatch):
    spec = grammar_spec(schema={"enum": [f"v{i}" for i in range(20_000)]})
    message = deadline._timeout_message("xgrammar", spec, 5.0, "its worker process was killed")
    assert (
        "enum of 20,000 values" in message and "compile_timeout=5 s" in message and "Raise compile_timeout" in message
    )


def test_one_deadline_covers_every_backend_a_call_compiles(toy, monkeypatch):
    """After a refusal, the backends tried to suggest one share the one compile_timeout (none gets it afresh).

    llguidance refuses uniqueItems at once; xgrammar and outlines-core (slow: 300 patterned strings) are then
    compiled to suggest one, each with only what the ones before left of the same deadline.
    """
    spy = Spy(monkeypatch)
    schema = slow_schema("d", 300)
    schema["properties"]["tags"] = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
    deadline = 0.5
    with pytest.raises(GrammarError, match=r"llguidance cannot compile .*uniqueItems") as info:
        compile_grammar(grammar_spec(schema=schema), toy, backend="llguidance", compile_timeout=deadline)
    assert [name for name, _ in spy.calls][:1] == ["llguidance"] and spy.calls[0][1] == deadline
    spent = 0.0
    for (name, given), took in zip(spy.calls, spy.seconds):
        assert given is not None and given <= deadline - spent + 1e-9, (name, given, spent, spy.calls)
        spent += took
    if [name for name, _ in spy.calls] != ["llguidance", "xgrammar", "outlines"]:  # the deadline was spent first
        assert "not tried: compile_timeout=0.5 s was spent" in str(info.value)
    else:
        assert "outlines did not finish within" in str(info.value)  # it got the rest, not 0.5 s again
    assert psutil.Process().children(recursive=True) == []
