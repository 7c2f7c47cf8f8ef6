"""Schema inputs a new user tries (booleans, deep nesting, long enums, $id refs)."""

from __future__ import annotations

import json
import warnings

import pytest

from grammars import GrammarError, GrammarWarning, compile_grammar, grammar_spec
from tests.toy import toy_tokenizer


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


def test_a_long_enum_gives_one_warning_that_points_to_compile_timeout():
    spec = grammar_spec(schema={"enum": [f"v{i}" for i in range(20000)]})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compile_grammar(spec, toy_tokenizer(), backend="xgrammar")
    said = [str(w.message) for w in caught if issubclass(w.category, GrammarWarning)]
    assert len(said) == 1, said
    assert "enum of 20,000 values" in said[0] and "compile_timeout=" in said[0] and "shorten the enum" in said[0]


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
    from grammarspec.cli import main as cli

    path = tmp_path / "s.json"
    path.write_text('"just a string"')
    try:
        status = cli.main(["generate", "--schema", str(path), "--prompt", "x"])
    except SystemExit as e:
        status = e.code
    err = capsys.readouterr().err
    assert status != 0 and "valid JSON but holds a str" in err and "object" in err and "boolean" in err


TREE = {  # a tree node: '#' is the tool's parameters, and the leaf (no children) ends it
    "type": "object",
    "properties": {"label": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}},
    "required": ["label"],
}
POINT = {
    "type": "object",
    "$defs": {"pt": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
    "properties": {"at": {"$ref": "#/$defs/pt"}},
    "required": ["at"],
}


def _tool(name: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


@pytest.mark.parametrize("parallel", [False, True])
def test_refs_in_a_tools_parameters_resolve_against_those_parameters(parallel):
    import jsonschema

    tools = [_tool("tree", TREE), _tool("mark", POINT)]
    spec = grammar_spec(tools=tools, parallel_tool_calls=parallel)
    tree = {"name": "tree", "arguments": {"label": "a", "children": [{"label": "b", "children": [{"label": "c"}]}]}}
    mark = {"name": "mark", "arguments": {"at": {"x": 3}}}
    wrong = {"name": "tree", "arguments": {"label": "a", "children": [tree]}}  # a child is a node, not a call
    good = [[tree, mark]] if parallel else [tree, mark]
    bad = [[wrong], [{"name": "mark", "arguments": {"at": {"x": "3"}}}]] if parallel else [wrong]
    for value in good:
        jsonschema.validate(value, spec.schema)
    for value in bad:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(value, spec.schema)
    tok = toy_tokenizer()
    compiled = compile_grammar(spec, tok, backend="xgrammar")
    for value, ok in [(v, True) for v in good] + [(v, False) for v in bad]:
        ids = tok(json.dumps(value, separators=(",", ":")), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        assert (compiled.matcher().validate(ids) == len(ids)) is ok, value


def test_a_ref_to_nothing_in_a_tools_parameters_names_the_tool_and_the_ref():
    broken = {"type": "object", "properties": {"at": {"$ref": "#/$defs/nope"}}, "required": ["at"]}
    with pytest.raises(GrammarError, match=r"tools\[1\] \('mark'\) parameters has a \$ref '#/\$defs/nope'"):
        grammar_spec(tools=[_tool("tree", TREE), _tool("mark", broken)])
