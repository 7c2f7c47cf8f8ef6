"""After a backend refuses a grammar, the error suggests only backends that were tried and that compile *and* decode it.

Suggestions name the keyword users pass (``grammar_backend='...'``), and a
suggested backend really generates from the grammar.  Toy tokenizer and a tiny
random model: no real model needed.
"""

from __future__ import annotations

import json
import re
import warnings

import pytest
import torch

import grammarspec
from grammars import BACKENDS, GrammarError, compile_grammar, grammar_spec
from grammars.suggest import decodes

#: ``a -> b -> a`` with no base case: it describes no value.
REF_CYCLE = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}


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


def test_a_ref_cycle_is_refused_before_any_backend_naming_the_chain(tok):
    """a -> b -> a describes no value: refused the same way whatever the backend, so nothing is suggested."""
    for backend in BACKENDS:
        message = refusal(REF_CYCLE, tok, backend)
        assert "circular $ref chain" in message and "#/$defs/a -> #/$defs/b -> #/$defs/a" in message, message
        assert suggested(message) == [], message


def raw_llguidance(schema: dict, tok):
    """llguidance's own grammar for ``schema``, without the schema check and the adapter's first-mask check."""
    import llguidance

    from grammars.llguidance_backend import LLGuidanceCompiled, grammar_text, prepare
    from grammars.spec import GrammarSpec

    prepared = prepare(tok, len(tok), (tok.eos_token_id,))
    text = grammar_text(GrammarSpec("json_schema", json.dumps(schema)))
    return LLGuidanceCompiled(llguidance.LLMatcher(prepared.tokenizer, text, log_level=0), prepared, ())


def test_decodes_tells_a_grammar_that_accepts_a_first_token(tok):
    assert decodes(compile_grammar(grammar_spec(schema={"type": "integer"}), tok, backend="llguidance"))
    cycle = raw_llguidance(REF_CYCLE, tok)  # llguidance compiles it and stops with an error at the first mask
    with pytest.raises(GrammarError, match="llguidance stopped with an error"):  # not a mask of EOS alone
        cycle.matcher().allowed_tokens()
    assert not decodes(cycle)


def test_llguidance_refuses_a_grammar_that_allows_no_first_token(tok):
    """The adapter's own check, for a spec that did not come through grammar_spec's schema check."""
    from grammars.llguidance_backend import compile_spec, prepare
    from grammars.spec import GrammarSpec

    prepared = prepare(tok, len(tok), (tok.eos_token_id,))
    with pytest.raises(
        GrammarError, match="llguidance compiles the JSON schema, but its grammar allows no first token"
    ):
        compile_spec(prepared, GrammarSpec("json_schema", json.dumps(REF_CYCLE)), len(tok), (tok.eos_token_id,))
