"""Grammar specs (schema / pydantic / tools / EBNF / regex / any JSON), validation, caching, whitespace."""

from __future__ import annotations

import doctest
import importlib
import json
import threading

import pytest

from grammars import (
    BACKENDS,
    GrammarError,
    GrammarSpec,
    clear_grammar_cache,
    compile_grammar,
    grammar_spec,
    tools_schema,
)
from grammars.spec import schema_nodes
from tests.toy import toy_tokenizer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time"}}


def _tool(name, parameters):
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def _accepts(compiled, tokenizer, text: str) -> bool:
    """Whether ``text`` (in the tokenizer's own split) followed by EOS is a complete legal output."""
    tokens = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(tokens) == text, "the test text must be expressible in the vocabulary"
    tokens.append(tokenizer.eos_token_id)
    return compiled.matcher().validate(tokens) == len(tokens)


# -- building specs -------------------------------------------------------------------------------


def test_no_constraint_gives_none():
    assert grammar_spec() is None
    assert grammar_spec(json_object=False, any_whitespace=True) is None


def test_schema_from_dict_string_and_pydantic_are_the_same_spec():
    pydantic = pytest.importorskip("pydantic")

    class Point(pydantic.BaseModel):
        x: int
        y: int

    schema = Point.model_json_schema()
    from_dict = grammar_spec(schema=schema)
    from_str = grammar_spec(schema=json.dumps(schema))
    from_model = grammar_spec(schema=Point)
    assert from_dict == from_str == from_model
    assert hash(from_dict) == hash(from_model)
    assert from_model.kind == "json_schema" and from_model.schema == schema
    assert from_dict != grammar_spec(schema=schema, any_whitespace=True)


def test_spec_keeps_property_order_and_is_a_copy():
    schema = {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "string"}}}
    spec = grammar_spec(schema=schema)
    schema["properties"]["c"] = {"type": "string"}  # the caller's later edits do not leak in
    assert list(spec.schema["properties"]) == ["b", "a"]
    assert spec.source.index('"b"') < spec.source.index('"a"')
    with pytest.raises(AttributeError):
        spec.kind = "regex"  # frozen


def test_pydantic_model_output_is_accepted(tok):
    pydantic = pytest.importorskip("pydantic")

    class Item(pydantic.BaseModel):
        name: str
        qty: int
        tags: list[str]

    text = Item(name="pen", qty=3, tags=["a", "b"]).model_dump_json()
    for backend in BACKENDS:
        assert _accepts(compile_grammar(grammar_spec(schema=Item), tok, backend=backend), tok, text)


def test_tools_one_call_and_parallel_calls():
    one = tools_schema([WEATHER])
    assert one["properties"]["name"] == {"type": "string", "const": "get_weather"}
    assert one["required"] == ["name", "arguments"] and one["additionalProperties"] is False
    args = one["properties"]["arguments"]
    assert args["properties"] == WEATHER["function"]["parameters"]["properties"]
    assert args["additionalProperties"] is False  # strict, as in OpenAI's strict mode
    both = tools_schema([WEATHER, CLOCK])
    assert [b["properties"]["name"]["const"] for b in both["anyOf"]] == ["get_weather", "get_time"]
    assert both["anyOf"][1]["properties"]["arguments"] == {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    }
    parallel = tools_schema([WEATHER, CLOCK], parallel=True)
    assert parallel == {"type": "array", "items": both, "minItems": 1}
    spec = grammar_spec(tools=[WEATHER, CLOCK], parallel_tool_calls=True)
    assert spec.kind == "json_schema" and spec.schema == parallel
    flat = {"type": "function", **WEATHER["function"]}  # the flat (Responses API) form
    assert tools_schema([flat]) == one


def test_tools_schema_matches_the_task_schemas(tasks):
    """The task file's tool-call schemas are exactly what tools_schema builds (forced-choice tasks aside)."""
    checked = 0
    for task in tasks:
        if task["kind"] != "tool_call":
            continue
        expected = {k: v for k, v in task["schema"].items() if k != "$schema"}
        parallel = expected.get("type") == "array"
        calls = expected["items"] if parallel else expected
        if len(calls.get("anyOf", [calls])) != len(task["tools"]):
            continue  # a forced tool choice: only one of the listed tools is allowed
        if parallel:
            expected.pop("maxItems", None)  # the task caps the number of calls; tools= does not
        assert tools_schema(task["tools"], parallel=parallel) == expected, task["id"]
        checked += 1
    assert checked >= 8


def test_tool_calls_are_accepted(tok):
    call = {"name": "get_weather", "arguments": {"city": "oslo"}}
    for backend in BACKENDS:
        one = compile_grammar(grammar_spec(tools=[WEATHER, CLOCK]), tok, backend=backend)
        many = compile_grammar(grammar_spec(tools=[WEATHER, CLOCK], parallel_tool_calls=True), tok, backend=backend)
        clock = {"name": "get_time", "arguments": {}}
        assert _accepts(one, tok, json.dumps(call, separators=(",", ":")))
        assert not _accepts(one, tok, json.dumps({"name": "get_time", "arguments": {"city": "oslo"}}))
        assert _accepts(many, tok, json.dumps([call, clock], separators=(",", ":")))
        assert not _accepts(many, tok, "[]")


def test_any_json_object_regex_and_ebnf(tok):
    for backend in BACKENDS:
        any_json = compile_grammar(grammar_spec(json_object=True), tok, backend=backend)
        assert _accepts(any_json, tok, '{"a":[1,{"b":null}],"c":"x"}')
        assert not _accepts(any_json, tok, "[1]")
        regex = compile_grammar(grammar_spec(regex="[0-9]{3}-[a-z]+"), tok, backend=backend)
        assert _accepts(regex, tok, "123-ab")
        assert not _accepts(regex, tok, "12-ab")
    for backend in ("xgrammar", "llguidance", "auto"):
        ebnf = compile_grammar(grammar_spec(grammar='root ::= "yes" | "no"'), tok, backend=backend)
        assert _accepts(ebnf, tok, "yes") and not _accepts(ebnf, tok, "yesno")
    assert grammar_spec(grammar='root ::= "a"', any_whitespace=True).any_whitespace is False


# -- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(schema={"type": "object"}, regex="a"), "more than one grammar source"),
        (dict(tools=[WEATHER], json_object=True), "exactly one of"),
        (dict(schema={"type": "object"}, parallel_tool_calls=True), "needs tools"),
        (dict(schema={"type": "nope"}), r"not a valid JSON Schema: at type"),
        (dict(schema={"properties": {"a": {"minLength": -1}}}), r"at properties/a/minLength"),
        (dict(schema='{"type": "object",}'), "not valid JSON"),
        (dict(schema="[1, 2]"), "must be an object or a boolean"),
        (dict(schema=[{"type": "object"}]), "JSON Schema"),
        (dict(schema=42), "pydantic model class"),
        (dict(schema={"type": "string", "default": {1, 2}}), "JSON-serialisable"),
        (dict(tools=[]), "empty"),
        (dict(tools=WEATHER), "must be a list"),
        (dict(tools=["get_weather"]), r"tools\[0\] must be a dict"),
        (dict(tools=[{"type": "function", "function": {"parameters": {}}}]), "no function name"),
        (dict(tools=[{"type": "function", "function": {"name": "bad name!"}}]), "invalid"),
        (dict(tools=[_tool("f", "x")]), "must be a JSON Schema object"),
        (dict(tools=[_tool("f", {"type": "array"})]), "must describe an object"),
        (dict(tools=[_tool("f", {"properties": {"a": {"type": 3}}})]), r"'f'.*parameters is not a valid JSON Schema"),
        (dict(tools=[WEATHER, WEATHER]), "used twice"),
        (dict(tools=[{"type": "retrieval"}]), "only function tools"),
        (dict(grammar=""), "empty"),
        (dict(regex=b"[0-9]"), "must be a string"),
    ],
)
def test_bad_input_raises_a_clear_grammar_error(kwargs, match):
    with pytest.raises(GrammarError, match=match):
        grammar_spec(**kwargs)


def test_grammar_error_is_a_value_error():
    assert issubclass(GrammarError, ValueError)


def test_compile_argument_errors(tok):
    spec = grammar_spec(schema={"type": "object"})
    with pytest.raises(GrammarError, match="'xgrammar', 'outlines', 'llguidance', 'auto'"):
        compile_grammar(spec, tok, backend="lmformatenforcer")
    with pytest.raises(GrammarError, match="compile_timeout must be a positive number"):
        compile_grammar(spec, tok, compile_timeout=0)
    with pytest.raises(GrammarError, match="GrammarSpec"):
        compile_grammar({"type": "object"}, tok)
    with pytest.raises(GrammarError, match="vocab_size"):
        compile_grammar(spec, tok, vocab_size=0)
    with pytest.raises(GrammarError, match="outside the vocabulary"):
        compile_grammar(spec, tok, stop_token_ids=[len(tok) + 1])
    with pytest.raises(GrammarError, match="empty"):
        compile_grammar(spec, tok, stop_token_ids=[])
    with pytest.raises(GrammarError, match="max_rollback"):
        compile_grammar(spec, tok).matcher(max_rollback=-1)


# -- cache ----------------------------------------------------------------------------------------


def test_compiled_grammars_are_cached(tok):
    schema = {"type": "object", "properties": {"k": {"type": "integer"}}}
    for backend in BACKENDS:
        first = compile_grammar(grammar_spec(schema=schema), tok, backend=backend)
        assert compile_grammar(grammar_spec(schema=json.dumps(schema)), tok, backend=backend) is first
        same_vocabulary = toy_tokenizer()
        assert compile_grammar(grammar_spec(schema=schema), same_vocabulary, backend=backend) is first
        assert compile_grammar(grammar_spec(schema=schema, any_whitespace=True), tok, backend=backend) is not first
        assert compile_grammar(grammar_spec(schema=schema), tok, vocab_size=len(tok) + 9, backend=backend) is not first
        assert compile_grammar(grammar_spec(schema=schema), tok, stop_token_ids=[0, 1], backend=backend) is not first
    assert compile_grammar(grammar_spec(schema=schema), tok, backend="outlines") is not compile_grammar(
        grammar_spec(schema=schema), tok, backend="xgrammar"
    )


def test_cache_is_shared_safely_between_threads(tok):
    clear_grammar_cache()
    spec = grammar_spec(schema={"type": "object", "properties": {"t": {"type": "string"}}})
    results, errors = [], []

    def work():
        try:
            results.append(compile_grammar(spec, tok))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 6
    assert all(r is results[0] for r in results)


def test_errors_are_not_cached(tok):
    spec = grammar_spec(schema={"not": {"type": "string"}})
    for _ in range(2):
        with pytest.raises(GrammarError):
            compile_grammar(spec, tok, backend="outlines")


# -- whitespace -----------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_compact_json_by_default_flexible_on_request(smol_tokenizer, tasks, backend):
    """The compact reference is accepted token by token; the pretty-printed one only with any_whitespace."""
    task = next(t for t in tasks if t["kind"] == "tool_call")
    compact = json.dumps(task["reference"], separators=(",", ":"), ensure_ascii=False)
    pretty = json.dumps(task["reference"], indent=2, ensure_ascii=False)
    strict = compile_grammar(grammar_spec(schema=task["schema"]), smol_tokenizer, backend=backend)
    m = strict.matcher()
    for token in smol_tokenizer.encode(compact, add_special_tokens=False):
        assert m.accept(token), smol_tokenizer.decode([token])
    assert m.accept(smol_tokenizer.eos_token_id)
    assert not _accepts(strict, smol_tokenizer, pretty)
    flexible_spec = grammar_spec(schema=task["schema"], any_whitespace=True)
    flexible = compile_grammar(flexible_spec, smol_tokenizer, backend=backend)
    assert _accepts(flexible, smol_tokenizer, pretty)
    assert _accepts(flexible, smol_tokenizer, compact)


@pytest.mark.parametrize("backend", BACKENDS)
def test_compact_json_on_the_toy_vocabulary(tok, backend):
    doc = {"a": [1, 2], "b": {"c": "x y"}}
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "array", "items": {"type": "integer"}},
            "b": {"type": "object", "properties": {"c": {"type": "string"}}, "required": ["c"]},
        },
        "required": ["a", "b"],
    }
    strict = compile_grammar(grammar_spec(schema=schema), tok, backend=backend)
    flexible = compile_grammar(grammar_spec(schema=schema, any_whitespace=True), tok, backend=backend)
    assert _accepts(strict, tok, json.dumps(doc, separators=(",", ":")))
    for text in (json.dumps(doc), json.dumps(doc, indent=2)):
        assert not _accepts(strict, tok, text)
        assert _accepts(flexible, tok, text)


# -- documentation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "module",
    [
        "grammars.spec",
        "grammars.outlines_backend",
        "grammars.llguidance_backend",
        "grammars.capabilities",
        "grammars.keywords",
        "grammars.validation",
    ],
)
def test_docstring_examples_run(module):
    failures, tried = doctest.testmod(importlib.import_module(module), verbose=False)
    assert tried > 0 and failures == 0


def test_spec_rejects_unknown_kind():
    with pytest.raises(GrammarError, match="unknown grammar kind"):
        GrammarSpec("lark", "start: 'a'")


def test_importing_grammars_loads_no_backend():
    """Backends (and pydantic) are imported only when used."""
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys, grammars; "
        "loaded = [m for m in ('xgrammar', 'outlines_core', 'llguidance', 'pydantic', 'transformers') "
        "if m in sys.modules]; "
        "assert not loaded, loaded"
    )
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_a_tokenizer_that_grows_is_seen_afresh():
    tokenizer = toy_tokenizer()
    spec = grammar_spec(schema={"type": "object", "properties": {"q": {"type": "string"}}})
    before = compile_grammar(spec, tokenizer)
    tokenizer.add_tokens(["qq"])
    after = compile_grammar(spec, tokenizer)
    assert after is not before and after.vocab_size == before.vocab_size + 1
    assert compile_grammar(spec, tokenizer) is after


def test_schema_nodes_walks_schemas_not_data_or_names():
    schema = {
        "type": "object",
        "properties": {"pattern": {"type": "string", "maxLength": 3}, "tags": {"items": [{"const": {"type": 1}}]}},
        "enum": [{"type": "string"}],
        "$defs": {"d": {"anyOf": [{"type": "integer"}]}},
    }
    nodes = list(schema_nodes(schema))
    assert nodes[0] is schema
    assert {"type": "string", "maxLength": 3} in nodes and {"type": "integer"} in nodes
    assert {"const": {"type": 1}} in nodes
    assert {"type": 1} not in nodes and {"type": "string"} not in nodes  # const and enum hold data
    assert schema["properties"] not in nodes  # a name map, whatever its keys are called
    assert len(nodes) == 6


def test_outlines_gets_the_pattern_not_the_length():
    from grammars.outlines_backend import shape_over_length

    schema = {
        "type": "object",
        "properties": {
            "v": {"type": "string", "pattern": "^a+$", "minLength": 2, "maxLength": 3},
            "d": {"type": "string", "format": "date", "maxLength": 10},
            "h": {"type": "string", "format": "hostname", "maxLength": 10},  # outlines has no hostname regex
            "maxLength": {"type": "string", "maxLength": 4},
        },
        "const": {"pattern": "x", "maxLength": 1},
    }
    shaped = json.loads(shape_over_length(grammar_spec(schema=schema)))
    assert shaped["properties"]["v"] == {"type": "string", "pattern": "^a+$"}
    assert shaped["properties"]["d"] == {"type": "string", "format": "date"}
    assert shaped["properties"]["h"] == schema["properties"]["h"]
    assert shaped["properties"]["maxLength"] == {"type": "string", "maxLength": 4}
    assert shaped["const"] == schema["const"]
    assert schema["properties"]["v"]["maxLength"] == 3  # the caller's schema is not touched
    plain = grammar_spec(schema={"type": "string", "maxLength": 3})
    assert shape_over_length(plain) == plain.source


# -- capabilities, auto, strict, validation ---------------------------------------------------------

from grammars import GrammarWarning  # noqa: E402
from grammars.capabilities import PROBES, features_used, support, unenforced  # noqa: E402
from grammars.probes import run_probe  # noqa: E402
from grammars.validation import output_errors  # noqa: E402


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.feature)
def test_capability_table_is_what_the_backend_does(tok, probe, backend):
    """Each table entry is checked: the probe's invalid instance is rejected exactly when the table says enforced."""
    got, detail = run_probe(probe, backend, tok)
    assert got == support(backend, probe.feature), (probe.feature, backend, detail)


def test_every_table_feature_has_a_probe():
    from grammars.capabilities import tables
    from grammars.registry import BACKENDS as REGISTERED

    probed = {p.feature for p in PROBES}
    assert set(tables()) == set(REGISTERED) == set(BACKENDS)  # one table per registered backend
    for backend, table in tables().items():
        assert set(table) <= probed, (backend, set(table) - probed)


def test_features_used_sees_the_settings_that_matter():
    schema = {
        "type": "object",
        "properties": {
            "s": {"type": "string", "pattern": "^(?=a)a+$", "maxLength": 3},
            "n": {"type": "number", "multipleOf": 0.5},
            "d": {"type": "string", "format": "date", "description": "not a keyword: pattern"},
        },
        "allOf": [{"required": ["s"]}, {"required": ["n"]}],
    }
    used = features_used(schema)
    for feature in ("pattern:lookaround", "maxLength+pattern", "multipleOf:number", "allOf:multi", "format:date"):
        assert feature in used
    assert "description" not in used and "properties" not in used
    assert unenforced(schema, "xgrammar") == [
        "allOf:multi",
        "anyOf+siblings",
        "pattern:lookaround",
        "maxLength+pattern",
        "multipleOf:number",
    ]
    assert unenforced(schema, "llguidance") == ["pattern:lookaround"]  # it refuses lookaround: not enforced either
    # annotations and the values of unknown keywords are not schemas (Snowplow's "self" has a "format")
    snowplow = {
        "type": "object",
        "self": {"format": "jsonschema", "vendor": "x"},
        "properties": {"a": {"$ref": "#/x", "title": "t"}},
    }
    assert features_used(snowplow) == ["type"]
    # a type beside enum is dropped by xgrammar: flagged only when some value does not have that type
    assert "enum+siblings" not in features_used({"type": "string", "enum": ["a", "b"]})
    assert "enum+siblings" in features_used({"type": "object", "enum": ["a", {"b": 1}]})


def test_unenforced_keyword_warns_with_what_to_do_and_strict_refuses(tok):
    spec = grammar_spec(schema={"type": "string", "pattern": "^a+$", "maxLength": 2})
    with pytest.warns(
        GrammarWarning,
        match=r"xgrammar grammar does not enforce maxLength\+pattern.*"
        r"grammar_backend='llguidance'.*post-validation",
    ):
        compiled = compile_grammar(spec, tok, backend="xgrammar")
    assert compiled.unenforced == ("maxLength+pattern",) and compiled.backend_reason == "requested"
    assert _accepts(compiled, tok, '"aaa"')  # the gap is real
    with pytest.raises(GrammarError, match="does not enforce maxLength\\+pattern.*strict=True"):
        compile_grammar(spec, tok, backend="xgrammar", strict=True)
    # nothing to warn about: llguidance enforces both
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", GrammarWarning)
        assert compile_grammar(spec, tok, backend="llguidance", strict=True).unenforced == ()


def test_auto_picks_the_backend_that_enforces_everything(tok):
    import warnings

    plain = grammar_spec(schema={"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    with warnings.catch_warnings():
        warnings.simplefilter("error", GrammarWarning)
        chosen = compile_grammar(plain, tok, backend="auto")
        assert (
            chosen.backend == "llguidance"
            and chosen.backend_reason == "auto: llguidance enforces every keyword this schema uses"
        )
        shaped = compile_grammar(
            grammar_spec(schema={"type": "string", "pattern": "^a+$", "maxLength": 2}), tok, backend="auto", strict=True
        )
        # llguidance refuses propertyNames; xgrammar enforces it
        named = compile_grammar(
            grammar_spec(schema={"type": "object", "propertyNames": {"pattern": "^a+$"}}),
            tok,
            backend="auto",
            strict=True,
        )
    assert shaped.backend == "llguidance" and shaped.unenforced == ()
    assert compile_grammar(
        grammar_spec(schema={"type": "string", "pattern": "^a+$", "maxLength": 2}), tok, backend="xgrammar"
    ).unenforced == ("maxLength+pattern",)  # what auto avoided
    assert not _accepts(shaped, tok, '"aaa"') and _accepts(shaped, tok, '"aa"')
    assert named.backend == "xgrammar" and "llguidance does not enforce propertyNames" in named.backend_reason
    assert not _accepts(named, tok, '{"b":1}') and _accepts(named, tok, '{"aa":1}')


def test_auto_falls_back_to_the_best_with_a_warning(tok):
    spec = grammar_spec(schema={"type": "array", "items": {"type": "integer"}, "uniqueItems": True})
    with pytest.warns(GrammarWarning, match="does not enforce uniqueItems.*no backend enforces all of them"):
        chosen = compile_grammar(spec, tok, backend="auto")
    assert chosen.backend == "xgrammar" and chosen.unenforced == ("uniqueItems",)
    assert (
        "no backend enforces every keyword" in chosen.backend_reason
        and "llguidance refuses uniqueItems" in chosen.backend_reason  # from its table, without compiling it
    )
    with pytest.raises(GrammarError, match="uniqueItems"):
        compile_grammar(spec, tok, backend="auto", strict=True)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "minimum": 5, "maximum": 2},
        {"enum": []},
        {"type": "object", "properties": {"a": False}, "required": ["a"]},
    ],
)
def test_unsatisfiable_schemas_suggest_no_other_backend(tok, schema):
    for backend in ("auto", "xgrammar", "llguidance"):
        with pytest.raises(GrammarError) as info:
            compile_grammar(grammar_spec(schema=schema), tok, backend=backend)
        message = str(info.value)
        assert "fix the schema" in message and "backend=" not in message, (backend, message)


def test_compile_timeout_gives_a_grammar_error_instead_of_a_hang(tok):
    spec = grammar_spec(
        schema={
            "type": "object",
            "properties": {f"k{i}": {"type": "string", "pattern": "^[a-z]{2,9}$"} for i in range(30)},
        }
    )
    # the deadline's own error (not a finished compile) proves the call did not wait for the grammar
    with pytest.raises(GrammarError, match=r"outlines did not compile the grammar within compile_timeout=0.001 s"):
        compile_grammar(spec, tok, backend="outlines", compile_timeout=0.001)
    assert compile_grammar(grammar_spec(schema={"type": "integer"}), tok, compile_timeout=60).backend == "xgrammar"


def test_a_local_ref_through_id_is_not_remote(tok):
    schema = {
        "$id": "https://example.com/order.json",
        "$defs": {"qty": {"$id": "qty.json", "type": "integer", "minimum": 1}},
        "type": "object",
        "properties": {"a": {"$ref": "https://example.com/order.json#/$defs/qty"}, "b": {"$ref": "qty.json"}},
        "required": ["a", "b"],
    }
    spec = grammar_spec(schema=schema)
    assert output_errors(spec, '{"a":2,"b":3}') == []
    assert output_errors(spec, '{"a":0,"b":"x"}') == [
        "at a: 0 is less than the minimum of 1",
        "at b: 'x' is not of type 'integer'",
    ]
    with pytest.raises(GrammarError, match="remote \\$ref 'https://elsewhere.org/x.json'"):
        grammar_spec(schema={"properties": {"a": {"$ref": "https://elsewhere.org/x.json"}}})


def test_an_unknown_keyword_warns_instead_of_silently_allowing_anything():
    with pytest.warns(GrammarWarning, match="'propertiez' \\(did you mean 'properties'\\?\\)"):
        grammar_spec(schema={"type": "object", "propertiez": {"a": {"type": "integer"}}})
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", GrammarWarning)
        grammar_spec(schema={"type": "object", "properties": {"propertiez": {}}, "x-owner": {"team": 1}})


def test_output_errors_checks_the_full_request():
    assert output_errors({"type": "array", "uniqueItems": True}, "[1,1]") == ["[1, 1] has non-unique elements"]
    assert output_errors({"type": "string", "format": "date"}, '"2023-02-30"') == ["'2023-02-30' is not a 'date'"]
    assert output_errors({"type": "object"}, '{"a":')[0].startswith("not JSON")
    assert (
        output_errors(grammar_spec(regex="[0-9]{3}"), "12a")
        and output_errors(grammar_spec(regex="[0-9]{3}"), "123") == []
    )
    assert output_errors(grammar_spec(json_object=True), "[1]") == ["[1] is not of type 'object'"]
    assert output_errors(grammar_spec(grammar='root ::= "a"'), "a") == []


def test_a_schema_that_passed_is_not_walked_again_but_a_bad_one_always_is(monkeypatch):
    from grammars import spec as spec_module
    from grammars.lru import LRU

    walked = []
    real = spec_module._check_json_schema
    monkeypatch.setattr(spec_module, "_check_json_schema", lambda s, where: (walked.append(1), real(s, where)))
    monkeypatch.setattr(spec_module, "_CHECKED", LRU(spec_module._CHECKED_LIMIT))
    good = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}}
    reordered = {"properties": {"b": {"type": "string"}, "a": {"type": "integer"}}, "type": "object"}
    spec_module.check_json_schema(good)
    spec_module.check_json_schema(reordered)  # the same canonical JSON
    assert len(walked) == 1
    bad = {"type": "object", "properties": {"a": {"type": 5}}}
    for _ in range(2):
        with pytest.raises(GrammarError, match="not a valid JSON Schema"):
            spec_module.check_json_schema(bad)
    assert len(walked) == 3
    tupled = {"type": "object", "required": ("a",)}  # not plain JSON: checked as given, never remembered
    for _ in range(2):
        with pytest.raises(GrammarError):
            spec_module.check_json_schema(tupled)
    assert len(walked) == 5
    monkeypatch.setattr(spec_module._CHECKED, "maxsize", 2)
    for n in range(4):
        spec_module.check_json_schema({"type": "object", "maxProperties": n})
    assert len(spec_module._CHECKED) == 2
