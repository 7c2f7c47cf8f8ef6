"""Schema inputs a new user tries (booleans, deep nesting, long enums, $id refs)."""

from __future__ import annotations

import pytest
from toy import toy_tokenizer

from grammars import GrammarError, GrammarWarning, compile_grammar, grammar_spec


def test_boolean_schemas():
    assert grammar_spec(schema=True).schema == {}
    assert grammar_spec(schema="true").schema == {}
    with pytest.raises(GrammarError, match="schema=False is a valid JSON Schema that no value matches"):
        grammar_spec(schema=False)


def test_a_json_string_that_is_not_a_schema_is_not_called_invalid_json():
    with pytest.raises(GrammarError, match="is valid JSON but holds a str.*object or a boolean"):
        grammar_spec(schema='"just a string"')


def test_a_deep_schema_names_the_limit_not_pythons_recursion():
    schema: dict = {"type": "integer"}
    for _ in range(299):
        schema = {"type": "object", "properties": {"a": schema}}
    with pytest.raises(GrammarError, match="more than 64 levels deep") as info:
        grammar_spec(schema=schema)
    assert "recursion" not in str(info.value)


def test_a_long_enum_points_to_compile_timeout():
    with pytest.warns(GrammarWarning, match="enum of 20000 values.*compile_timeout="):
        grammar_spec(schema={"enum": [f"v{i}" for i in range(20000)]})


def test_a_ref_to_a_subschema_id_is_enforced():
    schema = {
        "$id": "https://ex.com/root",
        "$defs": {"i": {"$id": "int", "type": "integer"}},
        "type": "object",
        "properties": {"a": {"$ref": "int"}},
        "required": ["a"],
    }
    spec = grammar_spec(schema=schema)
    assert spec.schema["properties"]["a"]["$ref"] == "#/$defs/i"
    tok = toy_tokenizer()
    matcher = compile_grammar(spec, tok, backend="xgrammar").matcher()
    ids = tok('{"a":"x"}', add_special_tokens=False)["input_ids"]
    assert matcher.validate(ids) < len(ids)  # a string is not an integer: the grammar stops it
    good = tok('{"a":12}', add_special_tokens=False)["input_ids"]
    assert matcher.validate(good) == len(good)


def test_the_cli_says_a_schema_file_holding_a_string_is_json_but_not_a_schema(tmp_path, capsys):
    from grammarspec import cli

    path = tmp_path / "s.json"
    path.write_text('"just a string"')
    try:
        status = cli.main(["generate", "--schema", str(path), "--prompt", "x"])
    except SystemExit as e:
        status = e.code
    err = capsys.readouterr().err
    assert status != 0 and "valid JSON but holds a str" in err and "object" in err and "boolean" in err
