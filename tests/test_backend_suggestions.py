"""After a backend refuses a grammar, the error suggests only backends that were tried and that compile *and* decode it.

Suggestions name the keyword users pass (``grammar_backend='...'``), and a
suggested backend really generates from the grammar.  Toy tokenizer and a tiny
random model: no real model needed.
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from toy import toy_tokenizer
from toy_models import tiny_llama

import grammarspec
from grammars import BACKENDS, GrammarError, compile_grammar, grammar_spec
from grammars.suggest import decodes

#: ``a -> b -> a`` with no base case: xgrammar refuses it ("Circular $ref chain").
REF_CYCLE = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}


@pytest.fixture(scope="module")
def tok():
    return toy_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return tiny_llama(len(tok), seed=0)


def refusal(schema: dict, tok, backend: str = "xgrammar") -> str:
    with pytest.raises(GrammarError) as info:
        compile_grammar(grammar_spec(schema=schema), tok, backend=backend)
    return str(info.value)


def suggested(message: str) -> list[str]:
    """The backends a message suggests; every suggestion is spelled with the keyword users pass."""
    named = re.findall(r"(\w*)backend='(\w+)'", message)
    assert all(prefix == "grammar_" for prefix, _ in named), message
    return [name for _, name in named]


def compiled_or_none(schema: dict, tok, backend: str):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return compile_grammar(grammar_spec(schema=schema), tok, backend=backend)
    except GrammarError:
        return None


def test_a_missing_ref_suggests_no_other_backend(tok):
    message = refusal({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, tok)
    assert "No other backend compiles it" in message and suggested(message) == [], message


def test_an_optional_empty_enum_suggests_backends_that_compile_and_generate_it(tok, model):
    schema = {"type": "object", "properties": {"a": {"enum": []}}}  # "a" may be left out: {} is valid
    message = refusal(schema, tok)
    assert "Try grammar_backend=" in message and "tried" in message, message
    names = suggested(message)
    assert names
    prompt = torch.tensor([tok("go", add_special_tokens=False)["input_ids"]])
    for backend in names:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = grammarspec.generate(
                model,
                prompt,
                tokenizer=tok,
                schema=schema,
                grammar_backend=backend,
                max_new_tokens=8,
                return_dict_in_generate=True,
            )
        (stats,) = out.stats
        assert stats.grammar_backend == backend and stats.new_tokens > 0  # it generated on the suggested backend


def test_a_ref_cycle_suggests_no_backend_whose_grammar_cannot_decode(tok):
    """xgrammar refuses a -> b -> a; a backend that compiles it but accepts no first token is not suggested."""
    message = refusal(REF_CYCLE, tok)
    named = suggested(message)
    for backend in BACKENDS:
        if backend == "xgrammar":
            continue
        compiled = compiled_or_none(REF_CYCLE, tok, backend)
        works = compiled is not None and decodes(compiled)
        assert (backend in named) == works, (backend, message)
        if compiled is not None and not works:  # llguidance today: it compiles, and only EOS is "legal" (and refused)
            assert f"{backend} compiles it, but its grammar accepts no first token" in message, message
    assert not named and "No other backend compiles it either into a grammar that can decode" in message, message


def test_decodes_tells_a_grammar_that_accepts_a_first_token(tok):
    assert decodes(compile_grammar(grammar_spec(schema={"type": "integer"}), tok, backend="llguidance"))
    cycle = compile_grammar(grammar_spec(schema=REF_CYCLE), tok, backend="llguidance")  # compiles, accepts nothing
    matcher = cycle.matcher()
    assert not any(matcher.fork().accept(token) for token in matcher.allowed_tokens().tolist())
    assert not decodes(cycle)
