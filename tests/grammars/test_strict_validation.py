"""``valid: true`` is always true: repeated keys, dynamic references and ECMA-262 property escapes.

* A key written twice in one object (``{"k":1,"k":2}``) makes an output
  invalid, at any depth, with an error naming the key and where: ``json.loads``
  keeps the last value, so jsonschema alone judged a different document.
  Checked through the real :func:`grammarspec.generate` with a model scripted
  to write such an object (every backend's grammar lets it through).
* Every JSON Schema 2020-12 keyword is classified per backend; ``$dynamicRef``
  is reported as unenforced where a backend ignores it, and a refusal of it
  does not suggest a backend that ignores it.
* ``\\p{Lu}`` (ECMA-262, JSON Schema's regex dialect) is a valid pattern: the
  schema check accepts it, every backend compiles it (xgrammar through an
  exact character class), the grammar and the validator agree on it.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import grammarspec
from grammars import GrammarError, GrammarWarning, compile_grammar, grammar_spec
from grammars.capabilities import KEYWORDS_2020_12, NEUTRAL_2020_12, features_used, tables, unenforced
from grammars.validation import output_errors, parse_json
from tests.toy import toy_tokenizer, toy_vocab_size
from tests.toy_models import ToyCausalLM

BACKENDS = ("xgrammar", "outlines", "llguidance")


# -- repeated keys --------------------------------------------------------------------------------


def test_a_repeated_key_makes_the_output_invalid_and_is_named_with_its_path():
    assert output_errors({"type": "object"}, '{"k":1,"k":2}') == [
        "the key 'k' appears 2 times in the top-level object (a JSON parser keeps only the last value)"
    ]
    nested = '{"a":[{"x":1},{"k":1,"k":2,"k":3}],"b":{"c":{"d":0,"d":0}}}'
    errors = output_errors({"type": "object"}, nested)
    assert "at a/1: the key 'k' appears 3 times in one object" in errors[0] and len(errors) == 2
    assert errors[1].startswith("at b/c: the key 'd' appears 2 times")
    # a repeat inside a value the parser drops (the earlier "a") is found too
    assert output_errors({}, '{"a":{"k":1,"k":2},"a":1}')[1].startswith("at a: the key 'k' appears 2 times")
    assert output_errors({"type": "object"}, '{"k":1,"K":2,"n":{"k":1}}') == []  # no repeat: valid
    value, errors = parse_json('{"k":1,"k":2}')
    assert value == {"k": 2} and type(value) is dict and errors  # json.loads' value, as a plain dict


class Scripted(ToyCausalLM):
    """Puts all its probability on the next token of ``script`` (after the prompt), then on EOS (id 0)."""

    def __init__(self, script: list[int], prompt_length: int) -> None:
        super().__init__(toy_vocab_size())
        self.script, self.prompt_length = script, prompt_length

    def next_logits(self, context):
        at = len(context) - self.prompt_length
        logits = torch.full((toy_vocab_size(),), -30.0)
        logits[self.script[at] if 0 <= at < len(self.script) else 0] = 30.0
        return logits


#: Schemas users sent, and the output that came back marked valid: the grammar admits the repeat.
REPEATS = [
    pytest.param(
        {"type": "object", "patternProperties": {"^k$": {"type": "integer"}}, "maxProperties": 2},
        '{"k":1,"k":2}',
        "xgrammar",
        id="patternProperties+maxProperties",
    ),
    pytest.param(
        {"type": "object", "propertyNames": {"pattern": "^a$"}}, '{"a":1,"a":2,"a":3}', "xgrammar", id="propertyNames"
    ),
    pytest.param(
        {
            "type": "object",
            "patternProperties": {"^x[0-9]$": {"type": "integer"}},
            "additionalProperties": False,
        },
        "{" + ",".join(f'"x{i % 10}":{i % 10}' for i in range(11)) + "}",
        "llguidance",
        id="keys-x0-x9-only-yet-11-keys",
    ),
]


def scripted_generate(schema: dict, text: str, backend: str):
    """``(written text, stats)`` of :func:`grammarspec.generate` with a model that writes ``text`` greedily."""
    tok = toy_tokenizer()
    prompt = tok("go", add_special_tokens=False)["input_ids"]
    script = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(script) == text
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = grammarspec.generate(
            Scripted(script, len(prompt)),
            torch.tensor([prompt]),
            tokenizer=tok,
            schema=schema,
            grammar_backend=backend,
            do_sample=False,
            max_new_tokens=len(script) + 4,
            return_dict_in_generate=True,
        )
    (stats,) = out.stats
    return tok.decode(out.sequences[0, len(prompt) :].tolist(), skip_special_tokens=True), stats


@pytest.mark.parametrize("schema,text,backend", REPEATS)
def test_generate_marks_an_output_with_a_repeated_key_invalid(schema, text, backend):
    written, stats = scripted_generate(schema, text, backend)
    assert written == text and stats.finish_reason == "stop"  # the grammar let the repeat through
    assert stats.valid is False
    assert any("appears" in e and "a JSON parser keeps only the last value" in e for e in stats.schema_errors)


class Continuing(ToyCausalLM):
    """Writes ``script``: the token after the longest start of it the context ends with (then EOS, id 0)."""

    def __init__(self, script: list[int]) -> None:
        super().__init__(toy_vocab_size())
        self.script = script

    def next_logits(self, context):
        done = next((k for k in range(len(self.script), 0, -1) if list(context[-k:]) == self.script[:k]), 0)
        logits = torch.full((toy_vocab_size(),), -30.0)
        logits[self.script[done] if done < len(self.script) else 0] = 30.0
        return logits


def test_complete_reports_a_repeated_key_as_an_error():
    tok = toy_tokenizer()
    text = '{"k":1,"k":2}'
    model = Continuing(tok(text, add_special_tokens=False)["input_ids"])
    schema = {"type": "object", "patternProperties": {"^k$": {"type": "integer"}}, "maxProperties": 2}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = grammarspec.complete(model, tok, "go", schema=schema, do_sample=False, max_new_tokens=20)
    assert (result.text, result.finish_reason, result.value) == (text, "stop", {"k": 2})
    assert not result.valid and "the key 'k' appears 2 times" in result.errors[0]


@pytest.mark.parametrize("backend", ["xgrammar", "outlines"])
def test_an_output_an_ignored_keyword_let_through_is_marked_invalid(backend):
    """Both backends ignore ``not``: "a" gets through the grammar, and the validator says it breaks the schema."""
    written, stats = scripted_generate({"enum": ["a", "b"], "not": {"const": "a"}}, '"a"', backend)
    assert written == '"a"' and stats.finish_reason == "stop" and "not" in stats.unenforced_keywords
    assert stats.valid is False and stats.schema_errors


# -- every 2020-12 keyword classified; dynamic references -----------------------------------------


def test_every_2020_12_keyword_is_classified_on_every_backend():
    for backend, table in tables().items():
        unclassified = sorted(KEYWORDS_2020_12 - NEUTRAL_2020_12 - set(table))
        assert not unclassified, (backend, unclassified)
    assert {"$dynamicRef", "$dynamicAnchor", "unevaluatedItems", "unevaluatedProperties", "propertyNames"}.isdisjoint(
        NEUTRAL_2020_12
    )


DYNAMIC = {
    "type": "array",
    "items": {"$dynamicRef": "#i"},
    "$defs": {"i": {"$dynamicAnchor": "i", "type": "integer"}},
}


def test_an_ignored_dynamic_ref_is_reported_and_warned_about():
    toy = toy_tokenizer()
    assert "$dynamicRef" in features_used(DYNAMIC) and "$dynamicRef" in unenforced(DYNAMIC, "xgrammar")
    with pytest.warns(GrammarWarning, match=r"does not enforce .*\$dynamicRef"):
        compiled = compile_grammar(grammar_spec(schema=DYNAMIC), toy, backend="xgrammar")
    assert "$dynamicRef" in compiled.unenforced
    assert output_errors(DYNAMIC, '["a"]') == ["at 0: 'a' is not of type 'integer'"]  # the validator resolves it
    assert "$dynamicAnchor" not in features_used({"$dynamicAnchor": "x", "type": "integer"})  # alone: no effect


def test_a_refusal_does_not_suggest_a_backend_that_ignores_the_refused_keyword():
    toy = toy_tokenizer()
    with pytest.raises(GrammarError) as info:
        compile_grammar(grammar_spec(schema=DYNAMIC), toy, backend="llguidance")
    message = str(info.value)
    assert "grammar_backend='xgrammar'" not in message and "Try " not in message, message
    assert "No other backend enforces $dynamicRef" in message, message
    assert "xgrammar compiles it but does not enforce $dynamicRef either" in message, message


# -- ECMA-262 Unicode property escapes ------------------------------------------------------------

CAPITALISED = {"type": "string", "pattern": r"^\p{Lu}\p{Ll}+$"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_unicode_property_pattern_compiles_and_the_grammar_agrees_with_the_validator(smol_tokenizer, backend):
    spec = grammar_spec(schema=CAPITALISED)  # before: "is not a 'regex'" on every backend
    compiled = compile_grammar(spec, smol_tokenizer, backend=backend)
    assert compiled.unenforced == ()
    eos = compiled.stop_token_ids[0]
    for word, valid in (("Ab", True), ("Élan", True), ("Ωμέγα", True), ("ab", False), ("AB", False), ("A1", False)):
        tokens = smol_tokenizer.encode(f'"{word}"', add_special_tokens=False)
        accepted = compiled.matcher().validate(tokens + [eos]) == len(tokens) + 1
        assert accepted == valid, (backend, word)
        assert (output_errors(spec, f'"{word}"') == []) == valid, word


def test_property_escapes_are_checked_by_the_validator_in_every_place_a_pattern_goes():
    assert output_errors(CAPITALISED, '"Ωμ"') == []
    assert output_errors(CAPITALISED, '"ab"') == ["'ab' does not match '^\\\\p{Lu}\\\\p{Ll}+$'"]  # named as written
    keys = {"type": "object", "patternProperties": {r"^\p{Lu}": {"type": "integer"}}}
    assert output_errors(keys, '{"A":"x","a":"x"}') == ["at A: 'x' is not of type 'integer'"]
    names = {"type": "object", "propertyNames": {"pattern": r"^\P{N}+$"}}
    assert output_errors(names, '{"ab":1}') == [] and output_errors(names, '{"a1":1}')
    negated = {"type": "string", "pattern": r"^[^\p{L}\d]+$"}
    assert output_errors(negated, '"-_"') == [] and output_errors(negated, '"é"') and output_errors(negated, '"1"')


def test_a_property_ecma_262_does_not_define_is_refused_as_an_invalid_pattern_naming_it():
    for pattern, words in ((r"^\p{lu}$", "'lu' is not a Unicode property"), (r"^\p{Foo=Bar}$", "before '='")):
        with pytest.raises(GrammarError, match="not a valid JSON Schema") as info:
            grammar_spec(schema={"type": "string", "pattern": pattern})
        assert words in str(info.value)


def test_an_xgrammar_regex_with_a_property_escape_compiles(smol_tokenizer):
    compiled = compile_grammar(grammar_spec(regex=r"\p{Lu}\p{Ll}+"), smol_tokenizer, backend="xgrammar")
    eos = compiled.stop_token_ids[0]
    good = smol_tokenizer.encode("Ab", add_special_tokens=False)
    bad = smol_tokenizer.encode("ab", add_special_tokens=False)
    assert compiled.matcher().validate(good + [eos]) == len(good) + 1
    assert compiled.matcher().validate(bad + [eos]) < len(bad) + 1
