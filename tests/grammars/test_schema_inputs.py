"""Schema inputs a user may send: invalid, unsupported, unsatisfiable, remote, recursive, deep, huge, non-ASCII,
booleans, $id refs, refs in tools' parameters; one schema from many calls and threads.

Each gets a clear error naming the offending part (and a backend that would take it, where one does), or is
compiled, enforced and generated from.  Tiny random models over the toy tokenizers (conftest's tok, model, prompt);
the embedded SmolLM2 tokenizer only where its byte-level split of emoji matters.
"""

from __future__ import annotations

import json
import threading
import warnings

import pytest
import torch

import grammarspec
from grammars import GrammarError, GrammarWarning, compile_grammar, grammar_spec
from tests.helpers import OBJECT_SCHEMA, generate_one
from tests.toy import toy_byte_level_tokenizer, toy_tokenizer
from tests.toy_models import tiny_llama

# --- booleans, depth, long enums, $id refs, refs in a tool's parameters ------------------------------------------


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


TOOL_TREE = {  # a tree node: '#' is the tool's parameters, and the leaf (no children) ends it
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

    tools = [_tool("tree", TOOL_TREE), _tool("mark", POINT)]
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
        grammar_spec(tools=[_tool("tree", TOOL_TREE), _tool("mark", broken)])


# --- invalid, unsupported and unsatisfiable schemas, through generate() and complete() -----------------------------


@pytest.mark.parametrize(
    "schema, says",
    [
        ({"type": "strng"}, "at type"),
        ({"type": "object", "properties": {"a": {"minLength": -1}}}, "at properties/a/minLength"),
        ('{"type": "object",', "not valid JSON"),
        ([{"type": "object"}, {"type": "object"}], "got list"),  # a list is one schema per row: two for one row
        ({"required": "a"}, "at required"),
    ],
)
def test_an_invalid_schema_names_the_offending_part(model, tok, prompt, schema, says):
    with pytest.raises(GrammarError, match="schema") as caught:
        grammarspec.generate(model, prompt, tokenizer=tok, schema=schema, max_new_tokens=5)
    assert says in str(caught.value)


@pytest.mark.parametrize(
    "backend, schema, says, suggests",
    [
        # a backreference: no backend compiles it, so none is suggested
        ("xgrammar", {"type": "string", "pattern": "^(a)\\1$"}, "^(a)\\\\1$", "No other backend compiles it"),
        ("xgrammar", {"type": "array", "minItems": 2}, "minItems", "backend='outlines'"),  # strict: no items allowed
        ("outlines", {"type": "string", "format": "hostname"}, "hostname", "backend='xgrammar'"),
        ("outlines", {"allOf": [{"type": "integer"}, {"minimum": 3}]}, "minimum", "backend='xgrammar'"),
    ],
)
def test_unsupported_keywords_are_refused_with_the_reason_and_the_other_backend(
    model, tok, prompt, backend, schema, says, suggests
):
    with pytest.raises(GrammarError) as caught:
        grammarspec.generate(model, prompt, tokenizer=tok, schema=schema, grammar_backend=backend, max_new_tokens=5)
    message = str(caught.value)
    assert backend.split("-")[0] in message and says in message and suggests in message


def test_an_ebnf_grammar_on_outlines_is_refused(model, tok, prompt):
    with pytest.raises(GrammarError, match="EBNF.*backend='xgrammar'"):
        grammarspec.generate(model, prompt, tokenizer=tok, grammar='root ::= "a"', grammar_backend="outlines")


def test_a_schema_only_an_ignored_keyword_makes_empty_is_refused_up_front(model, tok):
    """xgrammar and outlines-core ignore `not`: their grammar would allow "a", which the schema forbids, and "a" is
    its enum's only value, so no value satisfies it: refused before decoding (tests/grammars/test_strict_validation.py has
    an output an ignored `not` lets through marked invalid)."""
    schema = {"enum": ["a"], "not": {"const": "a"}}
    for backend in ("xgrammar", "outlines"):
        with pytest.raises(GrammarError, match="accepts no value.*no value of its enum"):
            grammarspec.complete(model, tok, "go", schema=schema, grammar_backend=backend, max_new_tokens=8)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "minimum": 5, "maximum": 2},
        {"enum": []},
        {"type": "object", "properties": {"a": False}, "required": ["a"]},
    ],
)
def test_unsatisfiable_schemas_do_not_suggest_another_backend(tok, schema):
    with pytest.raises(GrammarError) as info:
        compile_grammar(grammar_spec(schema=schema), tok, vocab_size=len(tok), stop_token_ids=(0,))
    message = str(info.value)
    assert "accepts no value" in message and "outlines" not in message


def test_schema_true_generates_any_json_and_schema_false_says_why(smol_chat, model, tok, prompt):
    chat_model, chat_tok = smol_chat
    result = grammarspec.complete(chat_model, chat_tok, "go", schema=True, assistant=None, max_new_tokens=16)
    assert result.finish_reason == "stop" and result.valid and result.has_value and result.stats.grammar_backend
    assert json.loads(result.text) == result.value
    with pytest.raises(GrammarError, match="schema=False .* no value matches.*schema=True means any JSON"):
        grammarspec.generate(model, prompt, tokenizer=tok, schema=False, max_new_tokens=4)


# --- references: remote, inside example data, cycles ---------------------------------------------------------------


def test_a_remote_ref_is_refused_up_front(model, tok, prompt):
    """grammarspec fetches nothing: a remote $ref can be neither compiled nor checked.

    Today xgrammar compiles it as "anything" and Completion's jsonschema check
    crashes with referencing's Unresolvable after the generation.
    """
    schema = {"type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}, "required": ["a"]}
    with pytest.raises(GrammarError, match=r"\$ref.*https://example.com/a.json"):
        grammarspec.complete(model, tok, "go", schema=schema, max_new_tokens=12)
    with pytest.raises(GrammarError, match=r"\$ref"):
        grammarspec.generate(model, prompt, tokenizer=tok, schema=schema, max_new_tokens=12)


def test_a_ref_inside_example_data_is_not_a_reference(tok):
    """``enum``/``const``/``default``/``examples`` hold instances, not schemas: a "$ref" key there is data
    (a schema for OpenAPI or JSON Schema documents has plenty).  A property *named* "default" is a schema."""
    documents = {
        "type": "object",
        "properties": {"link": {"type": "object", "properties": {"$ref": {"type": "string"}}}},
        "default": {"link": {"$ref": "other.yaml#/pets"}},
        "examples": [{"link": {"$ref": "https://example.com/pet.json"}}],
    }
    assert grammar_spec(schema=documents).schema == documents
    with pytest.raises(GrammarError, match="remote"):
        grammar_spec(schema={"type": "object", "properties": {"default": {"$ref": "https://example.com/a.json"}}})


REF_CYCLES = [{"$ref": "#"}, {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}]


@pytest.mark.parametrize("schema", REF_CYCLES)
@pytest.mark.parametrize("backend", ["xgrammar", "outlines"])
def test_a_ref_cycle_without_content_is_refused(tok, schema, backend):
    with pytest.raises(GrammarError, match="(?i)circular|rec\\w*sion"):  # outlines-core says "recusion"
        compile_grammar(grammar_spec(schema=schema), tok, backend=backend)


# --- recursion, depth, size ----------------------------------------------------------------------------------------


TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            "required": ["v", "kids"],
            "additionalProperties": False,
        }
    },
    "$ref": "#/$defs/node",
}


@pytest.mark.parametrize("backend", ["xgrammar", "outlines"])
def test_a_recursive_schema_generates_within_the_token_limit(model, tok, prompt, backend):
    for kwargs in ({}, {"do_sample": True, "generator": torch.Generator().manual_seed(1)}):
        new, text, stats = generate_one(
            model, tok, prompt, schema=TREE, grammar_backend=backend, max_new_tokens=30, assistant="auto", **kwargs
        )
        assert stats.new_tokens == len(new) <= 30
        if stats.finish_reason == "stop":
            assert set(json.loads(text)) == {"v", "kids"}
        else:
            assert stats.finish_reason == "length" and len(new) == 30


def _nested(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def test_a_moderately_deep_schema_compiles(tok):
    compiled = compile_grammar(grammar_spec(schema=_nested(60)), tok)
    matcher = compiled.matcher()
    text = '{"a":' * 60 + "7" + "}" * 60
    assert all(matcher.accept(t) for t in tok(text, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("as_text", [False, True])
def test_a_schema_nested_too_deeply_is_a_grammar_error_not_a_recursion_error(model, tok, prompt, as_text):
    """150 nested objects exhaust Python's recursion in jsonschema's check_schema, copy.deepcopy
    and json.dumps; the user must get a GrammarError that says so, not a RecursionError."""
    schema = _nested(150)
    schema = json.dumps(schema) if as_text else schema
    with pytest.raises(GrammarError, match="(?i)deep|nest"):
        grammarspec.generate(model, prompt, tokenizer=tok, schema=schema, max_new_tokens=5)


@pytest.mark.parametrize("backend", ["xgrammar", "outlines"])
def test_a_huge_enum_compiles_and_is_enforced(model, tok, prompt, backend):
    words = [f"{a}{b}{c}{d}" for a in "abcdefghij" for b in "klmnopqrst" for c in "uvwxyzabcd" for d in "0123456789"]
    assert len(set(words)) == 10_000
    schema = {"type": "object", "properties": {"w": {"enum": words}}, "required": ["w"], "additionalProperties": False}
    new, text, stats = generate_one(
        model, tok, prompt, schema=schema, grammar_backend=backend, max_new_tokens=16, assistant="auto"
    )
    assert stats.finish_reason == "stop" and json.loads(text)["w"] in set(words)
    matcher = compile_grammar(grammar_spec(schema=schema), tok, backend=backend).matcher()
    not_a_member = tok('{"w":"kkkk"}', add_special_tokens=False)["input_ids"]
    assert matcher.validate(not_a_member) < len(not_a_member)


# --- non-ASCII -----------------------------------------------------------------------------------------------------


UNICODE = {
    "title": "Café 😀 menu",
    "type": "object",
    "properties": {
        "naïve": {"enum": ["café", "😀", "日本語", "Ünïcödé"]},
        "名前": {"type": "string", "pattern": "^[äöü😀]{1,3}$"},
        "emoji": {"const": "🎉✨"},
    },
    "required": ["naïve", "名前", "emoji"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def byte_tok():
    return toy_byte_level_tokenizer()


@pytest.mark.parametrize("backend", ["xgrammar", "outlines"])
def test_non_ascii_and_emoji_in_schema_and_prompt(byte_tok, backend):
    model = tiny_llama(len(byte_tok), seed=4)
    for kwargs in ({}, {"do_sample": True, "generator": torch.Generator().manual_seed(2)}):
        result = grammarspec.complete(
            model,
            byte_tok,
            "Menü 😀 bitte — 日本語?",
            schema=UNICODE,
            grammar_backend=backend,
            assistant="auto",
            max_new_tokens=80,
            **kwargs,
        )
        assert result.finish_reason == "stop", result.text
        assert result.valid, result.errors
        assert result.value["emoji"] == "🎉✨" and result.value["naïve"] in UNICODE["properties"]["naïve"]["enum"]


@pytest.mark.parametrize("backend", ["xgrammar", "outlines"])
def test_emoji_split_across_real_tokens_are_matched(smol_tokenizer, backend):
    """SmolLM2 splits an emoji into byte-level pieces; the matcher must accept exactly the document."""
    compiled = compile_grammar(grammar_spec(schema=UNICODE), smol_tokenizer, backend=backend)
    good = {"naïve": "😀", "名前": "ä😀", "emoji": "🎉✨"}
    ids = smol_tokenizer(json.dumps(good, ensure_ascii=False, separators=(",", ":")), add_special_tokens=False)[
        "input_ids"
    ]
    matcher = compiled.matcher()
    assert all(matcher.accept(t) for t in ids) and matcher.accept(smol_tokenizer.eos_token_id)
    bad = dict(good, emoji="🎉")
    ids = smol_tokenizer(json.dumps(bad, ensure_ascii=False, separators=(",", ":")), add_special_tokens=False)[
        "input_ids"
    ]
    assert compiled.matcher().validate(ids + [smol_tokenizer.eos_token_id]) < len(ids) + 1


# --- one schema, many calls and threads ----------------------------------------------------------------------------


def test_the_same_schema_twice_gives_the_same_output_from_one_compiled_grammar(model, tok, prompt):
    spec = grammar_spec(schema=OBJECT_SCHEMA)
    first = compile_grammar(spec, tok, vocab_size=len(tok), stop_token_ids=[tok.eos_token_id])
    a, _, _ = generate_one(model, tok, prompt, schema=OBJECT_SCHEMA, assistant="auto")
    b, _, _ = generate_one(model, tok, prompt, schema=dict(OBJECT_SCHEMA), assistant="auto")
    assert a == b
    assert (
        compile_grammar(
            grammar_spec(schema=json.dumps(OBJECT_SCHEMA)), tok, vocab_size=len(tok), stop_token_ids=[tok.eos_token_id]
        )
        is first
    )


def test_two_threads_with_the_same_new_schema_get_their_own_grammar_state(model, tok, prompt):
    schema = dict(OBJECT_SCHEMA, title="threads")  # not compiled yet: both threads ask for it at once
    settings = [
        {"assistant": "auto"},
        {"assistant": None, "do_sample": True, "seed": 7},
        {"assistant": "schema_ngram", "do_sample": True, "seed": 8},
        {"assistant": "prompt_lookup"},
    ]

    def one(setting):
        setting = dict(setting)
        seed = setting.pop("seed", None)
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        return generate_one(model, tok, prompt, schema=schema, generator=generator, **setting)[0]

    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(settings))

    def work(i):
        try:
            barrier.wait()
            results[i] = one(settings[i])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(settings))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    alone = [one(s) for s in settings]  # afterwards, one by one, from the cached grammar
    assert [results[i] for i in range(len(settings))] == alone
