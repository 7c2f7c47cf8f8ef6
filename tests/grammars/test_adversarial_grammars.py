"""Grammars with no finite text are refused up front; grammars whose forced text may run away get none.

No model: :mod:`grammars.emptiness` reads xgrammar's EBNF of a spec.
"""

from __future__ import annotations

import pytest

from grammars import GrammarError, grammar_spec
from grammars.emptiness import LARGE_REPEAT, LONG_SHORTEST, analyse, check_finite, forced_text_bounded, xgrammar_ebnf

SELF = {"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]}
CYCLE = {
    "$defs": {
        "a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}, "required": ["b"]},
        "b": {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}, "required": ["a"]},
    },
    "$ref": "#/$defs/a",
}


@pytest.mark.parametrize("schema", [SELF, CYCLE], ids=["self", "a-b-a"])
def test_a_schema_with_no_finite_value_is_refused_saying_why(schema):
    with pytest.raises(GrammarError, match="accepts no finite value.*refers back to its own schema") as e:
        check_finite(grammar_spec(schema=schema))
    assert "optional" in str(e.value)  # what to do


def test_a_dead_branch_is_refused_and_a_recursion_with_a_way_out_is_kept():
    dead = {
        "anyOf": [{"type": "string"}, {"type": "object", "properties": {"x": {"$ref": "#/anyOf/1"}}, "required": ["x"]}]
    }
    with pytest.raises(GrammarError, match="part of the JSON schema"):
        check_finite(grammar_spec(schema=dead))
    tree = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}, "required": ["kids"]}
    optional = {"type": "object", "properties": {"x": {"$ref": "#"}}}
    for schema in (tree, optional, {"enum": [f"v{i}" for i in range(20000)]}):
        check_finite(grammar_spec(schema=schema))


def test_ebnf_and_regex_grammars_are_checked_too():
    with pytest.raises(GrammarError, match="the grammar accepts no finite value"):
        check_finite(grammar_spec(grammar='root ::= "a" root'))
    check_finite(grammar_spec(grammar='root ::= "a" root | "b"'))
    check_finite(grammar_spec(regex="(ab)+c{3}"))


def test_the_analysis_finds_shortest_lengths_and_open_repetitions():
    language = analyse('root ::= (("[" x{3, -1} "]"))\nx ::= (("ab") | ("c" y))\ny ::= (("" | "d"))')
    assert language.shortest == {"root": 5, "x": 1, "y": 0} and language.never_ends == ()
    assert language.open_repeat == 3
    assert analyse('root ::= (("a" root))').empty


def test_jump_forward_is_off_only_where_the_forced_text_search_may_run_away():
    def bounded(schema):
        return forced_text_bounded(xgrammar_ebnf(grammar_spec(schema=schema)))

    many = {"type": "array", "items": {"const": 1}, "minItems": LARGE_REPEAT * 10}
    assert not bounded(many)
    assert bounded({**many, "minItems": 20, "maxItems": 25}) and bounded({**many, "minItems": 20})
    assert not bounded({"const": "a" * (LONG_SHORTEST + 1)})  # once entered, the text is forced for long
    assert bounded({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]})


def test_a_runaway_forced_text_is_not_searched(smol_tokenizer):
    from grammars import compile_grammar

    spec = grammar_spec(schema={"type": "array", "items": {"const": 1}, "minItems": 100_000})
    matcher = compile_grammar(spec, smol_tokenizer).matcher()
    assert matcher.forced_text() == ""  # xgrammar's own search runs out of memory here
    closed = compile_grammar(
        grammar_spec(schema={"type": "array", "items": {"const": 1}, "minItems": 3, "maxItems": 3}), smol_tokenizer
    )
    assert closed.matcher().forced_text() == "[1,1,1]"


def test_a_draft_tokenizes_forced_text_only_up_to_its_budget(smol_tokenizer, monkeypatch):
    import proposers.jump_forward as jump_forward

    read: list[int] = []
    real = jump_forward.continuation_tokens

    def spy(tokenizer, context, text):
        read.append(len(text))
        return real(tokenizer, context, text)

    monkeypatch.setattr(jump_forward, "continuation_tokens", spy)
    tokens = jump_forward.forced_tokens(smol_tokenizer, [], "1," * 1_000_000, None, 4)
    assert read == [jump_forward.forced_limit(4)] == [4 * jump_forward.FORCED_CHARS_PER_TOKEN]
    assert 0 < len(tokens) <= 4 and ("1," * 64).startswith(smol_tokenizer.decode(tokens))
