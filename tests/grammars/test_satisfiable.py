"""Schemas no value satisfies are refused before decoding, on every backend alike; satisfiable ones never are.

Before, the default backend (xgrammar) compiled ``allOf`` of ``string`` and
``integer`` and answered with an object, and outlines answered ``minimum: 10,
maximum: 5``; now :mod:`grammars.satisfiable` refuses each with one
:class:`GrammarError` naming the conflict and where it is.  The server turns it
into a 400 (tests/serve/test_adversarial_schemas.py sends two of these through it).
"""

from __future__ import annotations

import json
import warnings

import pytest

from grammars import GrammarError, compile_grammar, grammar_spec
from grammars.satisfiable import conflict

#: name -> (schema, words the refusal must hold: the conflict and where)
UNSATISFIABLE = {
    "allOf string and integer": (
        {"allOf": [{"type": "string"}, {"type": "integer"}]},
        ["at /allOf/1", "type 'integer' excludes", "'string', from /allOf/0"],
    ),
    "type beside allOf": ({"type": "string", "allOf": [{"type": "integer"}]}, ["at /allOf/0", "'integer'"]),
    "required forbidden by additionalProperties": (
        {"type": "object", "properties": {}, "required": ["a"], "additionalProperties": False},
        ["property 'a' is required", "additionalProperties: false forbids it"],
    ),
    "minItems beyond uniqueItems over an enum": (
        {"type": "array", "items": {"enum": ["a", "b"]}, "uniqueItems": True, "minItems": 3},
        ["minItems 3 with uniqueItems", "at /items allow only 2 different values"],
    ),
    "minItems beyond uniqueItems over booleans": (
        {"type": "array", "items": {"type": "boolean"}, "uniqueItems": True, "minItems": 3},
        ["only 2 different values"],
    ),
    "minimum above maximum": ({"type": "integer", "minimum": 10, "maximum": 5}, ["minimum 10", "maximum 5"]),
    "exclusiveMinimum at maximum": (
        {"type": "number", "exclusiveMinimum": 5, "maximum": 5},
        ["exclusiveMinimum 5", "maximum 5"],
    ),
    "no integer between the bounds": (
        {"type": "integer", "minimum": 1.2, "maximum": 1.8},
        ["no integer lies between minimum 1.2"],
    ),
    "minLength above maxLength": ({"type": "string", "minLength": 5, "maxLength": 2}, ["minLength 5", "maxLength 2"]),
    "minItems above maxItems": ({"type": "array", "minItems": 5, "maxItems": 2}, ["minItems 5", "maxItems 2"]),
    "minProperties above maxProperties": (
        {"type": "object", "minProperties": 3, "maxProperties": 2},
        ["minProperties 3", "maxProperties 2"],
    ),
    "enum values of another type": (
        {"type": "string", "enum": [1, 2]},
        ["no value of its enum [1, 2]", "1 is not of type 'string'"],
    ),
    "const of another type": ({"type": "string", "const": 1}, ["no value of its const 1"]),
    "a required property that accepts nothing, through a $ref": (
        {
            "$defs": {"x": {"allOf": [{"type": "string"}, {"type": "null"}]}},
            "type": "object",
            "properties": {"a": {"$ref": "#/$defs/x"}},
            "required": ["a"],
        },
        ["property 'a' is required", "at /$defs/x/allOf/1"],
    ),
    "every anyOf branch empty": (
        {
            "anyOf": [
                {"type": "integer", "minimum": 3, "maximum": 1},
                {"type": "string", "minLength": 2, "maxLength": 1},
            ]
        },
        ["every anyOf branch", "/anyOf/0"],
    ),
}

#: Satisfiable schemas close to the refused ones: none may be refused.
SATISFIABLE = {
    "allOf number and integer": {"allOf": [{"type": "number"}, {"type": "integer"}], "minimum": 1},
    "uniqueItems with minItems equal to the enum's size": {
        "type": "array",
        "items": {"enum": ["a", "b"]},
        "uniqueItems": True,
        "minItems": 2,
    },
    "required satisfied by patternProperties": {
        "type": "object",
        "patternProperties": {"^a": {"type": "integer"}},
        "required": ["ab"],
        "additionalProperties": False,
    },
    "an optional property that accepts nothing": {
        "type": "object",
        "properties": {"a": {"type": "integer", "minimum": 3, "maximum": 1}, "b": {"type": "string"}},
    },
    "one anyOf branch empty": {"anyOf": [{"type": "integer", "minimum": 3, "maximum": 1}, {"type": "string"}]},
    "crossed string bounds on a string-or-integer": {"type": ["string", "integer"], "minLength": 5, "maxLength": 2},
    "bounds with no type": {"minimum": 10, "maximum": 5},
    "an integer between exclusive fractional bounds": {
        "type": "integer",
        "exclusiveMinimum": 1.5,
        "exclusiveMaximum": 2.5,
    },
    "an enum with one value of the type": {"type": "string", "enum": [1, "a"]},
    "a recursive $ref": {
        "$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}},
        "$ref": "#/$defs/n",
    },
    "uniqueItems over boolean or null": {
        "type": "array",
        "items": {"type": ["boolean", "null"]},
        "uniqueItems": True,
        "minItems": 3,
    },
    "draft-07: siblings of a $ref are ignored": {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "definitions": {"n": {"type": "integer"}},
        "$ref": "#/definitions/n",
        "type": "string",
    },
    "uniqueItems over 1 and true (different values)": {
        "type": "array",
        "items": {"enum": [1, True]},
        "uniqueItems": True,
        "minItems": 2,
    },
}

#: a value each satisfiable example accepts
SATISFIABLE_INSTANCES = {
    "allOf number and integer": 2,
    "uniqueItems with minItems equal to the enum's size": ["a", "b"],
    "required satisfied by patternProperties": {"ab": 1},
    "an optional property that accepts nothing": {"b": "x"},
    "one anyOf branch empty": "x",
    "crossed string bounds on a string-or-integer": 7,
    "bounds with no type": "x",
    "an integer between exclusive fractional bounds": 2,
    "an enum with one value of the type": "a",
    "a recursive $ref": {"next": {}},
    "uniqueItems over boolean or null": [True, False, None],
    "uniqueItems over 1 and true (different values)": [1, True],
    "draft-07: siblings of a $ref are ignored": 3,
}

BACKENDS = ("xgrammar", "outlines", "llguidance", "auto")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(UNSATISFIABLE))
def test_an_unsatisfiable_schema_is_refused_up_front_on_every_backend(tok, case, backend):
    schema, words = UNSATISFIABLE[case]
    with pytest.raises(GrammarError) as info:
        compile_grammar(grammar_spec(schema=schema), tok, backend=backend)
    message = str(info.value)
    assert message.startswith("the JSON schema accepts no value"), message  # one message, not a backend's words
    assert all(word in message for word in words), (words, message)
    assert "fix the schema" in message and "grammar_backend=" not in message, message


@pytest.mark.parametrize("case", list(SATISFIABLE))
def test_a_satisfiable_schema_is_never_refused(tok, case):
    schema = SATISFIABLE[case]
    assert conflict(schema) is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = compile_grammar(grammar_spec(schema=schema), tok, backend="auto")
    text = json.dumps(SATISFIABLE_INSTANCES[case], separators=(",", ":"))
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert compiled.matcher().validate(ids) == len(ids), (text, compiled.backend)  # the grammar takes a value


def test_every_satisfiable_example_has_a_valid_instance():
    """The satisfiable examples really are satisfiable: jsonschema accepts a value for each."""
    from grammars.validation import schema_errors

    assert set(SATISFIABLE_INSTANCES) == set(SATISFIABLE)
    for case, value in SATISFIABLE_INSTANCES.items():
        assert schema_errors(SATISFIABLE[case], value) == [], case
