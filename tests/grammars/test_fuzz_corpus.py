"""Fuzzing over the production schema corpus: the CI slice, and the fuzz runner's own logic.

The slice is deterministic and category-stratified (``tools.fuzz.CI_SLICES``:
schemas ranked by a hash of their id within each category, size-capped so
that the slice stays within about two minutes on two cores).  It reads the
repository's ``data/schemas`` sample, which holds exactly these slices of the
full corpus (``$GRAMMARSPEC_SCHEMAS`` pointing at the full corpus gives the
same slices).  A whole corpus runs with ``python -m tools.fuzz --schemas DIR
--out FUZZ.md`` (see docs/FUZZ.md).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from grammars import compile_grammar, grammar_spec
from tests.helpers import corpus_records
from tests.toy import toy_byte_level_tokenizer
from tools.fuzz import (
    BUG_OUTCOMES,
    CI_SLICES,
    ENFORCED,
    FORMATS,
    GENERATION_CONFIGS,
    Check,
    FuzzContext,
    Job,
    RunOptions,
    classify_completion,
    configs_for,
    generation_checks,
    grammar_checks,
    is_enforced,
    read_results,
    run_isolated,
    schema_errors,
    stratified_slice,
    summarize,
)

CORPUS = corpus_records()
#: Grammar checks with xgrammar: 3 schemas per category (up to 6 KB).
XGRAMMAR_SLICE = CI_SLICES["xgrammar"].of(CORPUS)
#: outlines-core compiles slowly (seconds per schema, minutes for some): 1 small schema per category.
OUTLINES_SLICE = CI_SLICES["outlines"].of(CORPUS)
#: Generation with the embedded model: 2 schemas per category, one setting each (rotating).
GENERATION_SLICE = CI_SLICES["generation"].of(CORPUS)
GENERATION_TOKENS = 40


def _ids(records):
    return [r["id"] for r in records]


def _bugs(checks):
    return "\n".join(f"{c.kind} {c.outcome}: {c.detail}" for c in checks if c.is_bug)


@pytest.fixture(scope="module")
def grammar_ctx(smol_tokenizer):
    return FuzzContext.create(smol_tokenizer)


@pytest.fixture(scope="module")
def generation_ctx(smol):
    model, tokenizer = smol
    return FuzzContext.create(tokenizer, model)


# --- the CI slice of the corpus ---------------------------------------------------------


def test_the_slice_covers_every_category():
    categories = {r["category"] for r in CORPUS}
    assert len(categories) == 7
    for part in (XGRAMMAR_SLICE, OUTLINES_SLICE, GENERATION_SLICE):
        assert {r["category"] for r in part} == categories
    assert stratified_slice(CORPUS, 3, max_bytes=6000, salt="ci") == XGRAMMAR_SLICE  # deterministic
    assert stratified_slice(list(reversed(CORPUS)), 3, max_bytes=6000, salt="ci") == XGRAMMAR_SLICE  # not file order


_GRAMMAR_CHECKS: dict[tuple[str, str], list[Check]] = {}


def checked(ctx, record, backend):
    """``grammar_checks`` of one record, run once per process (the slice tests and their totals share it)."""
    key = (record["id"], backend)
    if key not in _GRAMMAR_CHECKS:
        _GRAMMAR_CHECKS[key] = grammar_checks(ctx, record, backend)
    return _GRAMMAR_CHECKS[key]


@pytest.mark.parametrize("record", XGRAMMAR_SLICE, ids=_ids(XGRAMMAR_SLICE))
def test_xgrammar_compiles_and_is_sound(grammar_ctx, record):
    checks = checked(grammar_ctx, record, "xgrammar")
    assert checks[0].kind == "compile" and checks[0].outcome in ("compiled", "unsupported")
    assert not _bugs(checks), _bugs(checks)
    if record["meta"].get("xgrammar_compiles"):  # the corpus keeps only schemas xgrammar compiles
        assert checks[0].outcome == "compiled", checks[0].detail
    expected = 1 + len(record.get("examples") or []) + len(record.get("invalid_examples") or [])
    assert checks[0].outcome == "unsupported" or len(checks) == expected


@pytest.mark.parametrize("record", OUTLINES_SLICE, ids=_ids(OUTLINES_SLICE))
def test_outlines_compiles_and_is_sound(grammar_ctx, record):
    checks = checked(grammar_ctx, record, "outlines")
    assert checks[0].outcome in ("compiled", "unsupported"), checks[0].detail
    if checks[0].outcome == "unsupported":
        assert "outlines" in checks[0].detail and "backend='xgrammar'" in checks[0].detail
    assert not _bugs(checks), _bugs(checks)


@pytest.mark.parametrize(
    "backend, records", [("xgrammar", XGRAMMAR_SLICE), ("outlines", OUTLINES_SLICE)], ids=["xgrammar", "outlines"]
)
def test_most_of_the_slice_compiles_and_its_examples_are_walked(grammar_ctx, backend, records):
    """A backend that refused every schema would pass each test above: the slice as a whole must not.

    xgrammar compiles the whole corpus (420 of 420) and outlines-core 353
    (see docs/FUZZ.md); half of a slice is a floor neither gets near.
    """
    runs = [checked(grammar_ctx, record, backend) for record in records]
    compiled = [checks for checks in runs if checks[0].outcome == "compiled"]
    assert len(compiled) >= len(records) / 2, [checks[0].detail for checks in runs]
    walked = [c for checks in compiled for c in checks[1:]]
    assert {c.kind for c in walked} == {"example", "invalid_example"}
    assert sum(c.outcome in ("accepted", "rejected") for c in walked) >= len(walked) / 2


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(GENERATION_SLICE)), ids=_ids(GENERATION_SLICE))
def test_generation_never_claims_an_invalid_output(generation_ctx, index):
    record = GENERATION_SLICE[index]
    config = configs_for(index, 1)
    backend = "outlines" if index % 7 == 3 else "xgrammar"  # two generations with outlines-core
    checks = generation_checks(generation_ctx, record, backend, config, max_new_tokens=GENERATION_TOKENS)
    assert [c.kind for c in checks] == ["generate"]
    assert not _bugs(checks), _bugs(checks)
    assert checks[0].outcome in ("stop_valid", "stop_unenforced", "length", "unsupported"), checks[0]
    if checks[0].outcome == "unsupported":
        assert backend == "outlines" and "backend='xgrammar'" in checks[0].detail


def test_the_generation_slice_uses_every_setting():
    used = {configs_for(i, 1)[0] for i in range(len(GENERATION_SLICE))}
    assert used == set(GENERATION_CONFIGS)


# --- what each backend enforces (the claims the fuzz checks rely on) ---------------------

INT = {"type": "integer"}
#: keyword -> (schema, an instance violating only that keyword); every claim in ENFORCED.
VIOLATIONS = {
    "type": ({"type": "integer"}, "x"),
    "enum": ({"enum": ["a", "b"]}, "c"),
    "const": ({"const": "a"}, "b"),
    "required": ({"type": "object", "properties": {"a": INT}, "required": ["a"]}, {}),
    "additionalProperties": (
        {"type": "object", "properties": {"a": INT}, "additionalProperties": False},
        {"a": 1, "b": 2},
    ),
    "items": ({"type": "array", "items": INT}, ["a"]),
    "prefixItems": ({"type": "array", "prefixItems": [INT]}, ["a"]),
    "minItems": ({"type": "array", "items": INT, "minItems": 2}, [1]),
    "maxItems": ({"type": "array", "items": INT, "maxItems": 1}, [1, 2]),
    "minLength": ({"type": "string", "minLength": 3}, "ab"),
    "maxLength": ({"type": "string", "maxLength": 1}, "😀a"),
    "pattern": ({"type": "string", "pattern": "^[0-9]+$"}, "ab"),
    "minimum": ({"type": "object", "properties": {"a": {"type": "number", "minimum": 5}}}, {"a": 3.5}),
    "maximum": ({"type": "integer", "maximum": 5}, 7),
    "exclusiveMinimum": ({"type": "integer", "exclusiveMinimum": 5}, 5),
    "exclusiveMaximum": ({"type": "object", "properties": {"a": {"type": "number", "exclusiveMaximum": 5}}}, {"a": 5}),
    "multipleOf": ({"type": "integer", "multipleOf": 3}, 4),
    "minProperties": ({"type": "object", "additionalProperties": INT, "minProperties": 1}, {}),
    "maxProperties": ({"type": "object", "additionalProperties": INT, "maxProperties": 1}, {"a": 1, "b": 2}),
    "propertyNames": ({"type": "object", "additionalProperties": INT, "propertyNames": {"pattern": "^a"}}, {"b": 1}),
    "anyOf": ({"anyOf": [INT, {"type": "boolean"}]}, "x"),
    "oneOf": ({"oneOf": [INT, {"type": "boolean"}]}, "x"),
}
#: What both backends are known to ignore (so a completion must check it): schema, a violating instance.
IGNORED = {
    "not": ({"type": "integer", "not": {"const": 1}}, 1),
    "if/then": ({"type": "integer", "if": {"minimum": 0}, "then": {"maximum": 3}}, 5),
    "oneOf matching twice": ({"oneOf": [INT, {"type": "number"}]}, 1),
    "enum beside type": ({"type": "object", "properties": {"a": {"enum": ["x"], "type": "object"}}}, {"a": "x"}),
    "uniqueItems": ({"type": "array", "items": INT, "uniqueItems": True}, [1, 1]),
    "dependentRequired": (
        {"type": "object", "properties": {"a": INT, "b": INT}, "dependentRequired": {"a": ["b"]}},
        {"a": 1},
    ),
}


@pytest.fixture(scope="module")
def byte_tok():
    return toy_byte_level_tokenizer()


def _accepts(tok, schema, instance, backend):
    matcher = compile_grammar(grammar_spec(schema=schema), tok, backend=backend).matcher(max_rollback=4)
    text = json.dumps(instance, separators=(",", ":"), ensure_ascii=False)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return all(matcher.accept(t) for t in ids) and matcher.accept(tok.eos_token_id)


@pytest.mark.parametrize("backend", sorted(ENFORCED))
def test_every_claimed_keyword_is_enforced(byte_tok, backend):
    assert ENFORCED[backend] <= set(VIOLATIONS)
    for keyword in sorted(ENFORCED[backend]):
        schema, instance = VIOLATIONS[keyword]
        errors = schema_errors(schema, instance, formats=True, default="latest")
        assert len(errors) == 1 and keyword in list(errors[0].absolute_schema_path), keyword  # violates just that
        assert is_enforced(errors[0], backend, schema), keyword
        assert not _accepts(byte_tok, schema, instance, backend), f"{backend} accepts a {keyword} violation"


@pytest.mark.parametrize("backend", sorted(ENFORCED))
def test_ignored_keywords_are_known_as_such(byte_tok, backend):
    for name, (schema, instance) in IGNORED.items():
        errors = schema_errors(schema, instance, formats=True, default="latest")
        assert errors, name
        assert not any(is_enforced(e, backend, schema) for e in errors), name
        assert _accepts(byte_tok, schema, instance, backend), f"{backend} now enforces {name}: update ENFORCED"


@pytest.mark.parametrize("backend", sorted(FORMATS))
def test_formats_are_approximated_and_a_completion_checks_them(byte_tok, backend):
    """A date's shape is enforced, its calendar is not: format stays out of ENFORCED."""
    schema = {"type": "object", "properties": {"d": {"type": "string", "format": "date"}}, "required": ["d"]}
    assert "date" in FORMATS[backend] and "format" not in ENFORCED[backend]
    assert not _accepts(byte_tok, schema, {"d": "hello"}, backend)
    assert _accepts(byte_tok, schema, {"d": "2023-02-30"}, backend)
    (error,) = schema_errors(schema, {"d": "2023-02-30"}, formats=True, default="latest")
    assert error.validator == "format" and not is_enforced(error, backend, schema)


@pytest.mark.parametrize("backend", sorted(ENFORCED))
def test_a_pattern_wins_over_length_bounds_on_both_backends(byte_tok, backend):
    """outlines-core alone would keep the length and drop the pattern (snowplow/sp_329 in the corpus)."""
    version = {"type": "string", "maxLength": 8, "pattern": "^(\\d+\\.\\d+\\.\\d+.*)$"}
    schema = {"type": "object", "properties": {"v": version}, "required": ["v"], "additionalProperties": False}
    assert _accepts(byte_tok, schema, {"v": "1.2.3"}, backend)
    (error,) = schema_errors(schema, {"v": "1.2"}, formats=True, default="latest")
    assert error.validator == "pattern" and is_enforced(error, backend, schema)
    assert not _accepts(byte_tok, schema, {"v": "1.2"}, backend)
    (error,) = schema_errors(schema, {"v": "1.2.3-rc.1"}, formats=True, default="latest")
    assert error.validator == "maxLength" and not is_enforced(error, backend, schema)
    assert _accepts(byte_tok, schema, {"v": "1.2.3-rc.1"}, backend)


def _errors(schema, instance):
    return schema_errors(schema, instance, formats=False)


def test_any_of_is_enforced_only_when_every_branch_fails_on_an_enforced_keyword():
    schema = {"anyOf": [{"type": "string", "not": {"const": "a"}}, INT]}
    (error,) = _errors(schema, "a")  # branch 0 fails only on `not`: the grammar takes it
    assert error.validator == "anyOf" and not is_enforced(error, "xgrammar", schema)
    (error,) = _errors(schema, 1.5)  # both branches fail on `type`
    assert is_enforced(error, "xgrammar", schema)


def test_the_path_walk_tells_keywords_from_property_names_and_follows_refs():
    schema = {
        "definitions": {"n": {"type": "object", "properties": {"not": {"type": "string"}}}},
        "type": "object",
        "properties": {"a": {"$ref": "#/definitions/n"}},
    }
    (error,) = _errors(schema, {"a": {"not": 1}})
    assert list(error.absolute_schema_path) == ["properties", "a", "properties", "not", "type"]
    assert is_enforced(error, "xgrammar", schema)  # "not" is a property name here, and $ref is followed
    schema["properties"]["a"]["maxLength"] = 3  # a sibling of $ref (applies since 2019-09): the backends drop it
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    errors = {e.validator: is_enforced(e, "xgrammar", schema) for e in _errors(schema, {"a": "abcd"})}
    assert errors == {"type": True, "maxLength": False}


# --- classifying completions -----------------------------------------------------------


def _completion(text, finish, valid, new_tokens=5, value="parse"):
    parsed = None
    if value == "parse" and finish == "stop":
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError:
            parsed = None
    return SimpleNamespace(
        text=text,
        finish_reason=finish,
        valid=valid,
        value=parsed if value == "parse" else value,
        errors=[] if valid else ["x"],
        stats=SimpleNamespace(new_tokens=new_tokens),
    )


NOT_ONE = {"type": "integer", "not": {"const": 1}}


@pytest.mark.parametrize(
    "completion, schema, expected",
    [
        (_completion("7", "stop", True), NOT_ONE, "stop_valid"),
        (_completion("1", "stop", False), NOT_ONE, "stop_unenforced"),
        (_completion("1", "stop", True), NOT_ONE, "claimed_valid"),
        (_completion('"x"', "stop", False), NOT_ONE, "stop_invalid"),
        (_completion("[1", "stop", False), NOT_ONE, "not_json"),
        (_completion("[1", "length", False, new_tokens=5), NOT_ONE, "length"),
        (_completion("[1", "length", False, new_tokens=3), NOT_ONE, "length_wrong"),
        (_completion("[1", "length", True, new_tokens=5), NOT_ONE, "claimed_valid"),
        (_completion("[1", "stop_string", False, new_tokens=2), NOT_ONE, "length_wrong"),
    ],
)
def test_classify_completion(completion, schema, expected):
    assert classify_completion(completion, schema, "xgrammar", max_new_tokens=5)[0] == expected
    assert (expected in BUG_OUTCOMES) == (expected not in ("stop_valid", "stop_unenforced", "length"))


def test_the_summary_counts_outcomes_per_category_and_lists_bugs():
    checks = [
        Check("a/1", "a", "xgrammar", "compile", "compiled"),
        Check("a/1", "a", "xgrammar", "generate", "length"),
        Check("b/1", "b", "xgrammar", "compile", "compiled", "warnings: multipleOf is not supported"),
        Check("b/1", "b", "xgrammar", "generate", "stop_invalid", "enforced violation: type"),
        Check("b/1", "b", "outlines", "compile", "timeout", "compile did not finish within 1 s"),
    ]
    report = summarize(checks)
    assert "2 schemas, 5 checks, **1 bug outcome**" in report
    assert "| a | 1 | 0 |" in report and "| b | 0 | 1 |" in report  # generate: length, stop_invalid
    assert "`b/1` xgrammar generate: **stop_invalid**" in report
    assert "1 x multipleOf is not supported" in report and "Timeouts: 1" in report


def test_a_rerun_replaces_the_earlier_checks_of_that_schema_and_backend(tmp_path):
    def write(name, checks):
        path = tmp_path / name
        path.write_text("".join(json.dumps(vars(c)) + "\n" for c in checks), encoding="utf-8")
        return path

    first = write(
        "first.jsonl",
        [
            Check("a/1", "a", "outlines", "compile", "timeout"),
            Check("a/1", "a", "xgrammar", "compile", "compiled"),
            Check("a/2", "a", "outlines", "compile", "compiled"),
            Check("a/2", "a", "outlines", "invalid_example", "accepted_invalid"),
        ],
    )
    rerun = write(
        "rerun.jsonl",
        [
            Check("a/1", "a", "outlines", "compile", "compiled"),
            Check("a/2", "a", "outlines", "compile", "compiled"),
            Check("a/2", "a", "outlines", "invalid_example", "rejected"),
        ],
    )
    merged = {(c.record, c.backend, c.kind, c.outcome) for c in read_results([first, rerun])}
    assert merged == {
        ("a/1", "outlines", "compile", "compiled"),
        ("a/1", "xgrammar", "compile", "compiled"),  # not rerun: kept
        ("a/2", "outlines", "compile", "compiled"),
        ("a/2", "outlines", "invalid_example", "rejected"),
    }
    assert len(read_results([rerun, first])) == 4  # the order of the files decides


def test_the_isolated_runner_times_out_and_recovers():
    """A job past its compile timeout is recorded as a timeout; the next job gets a fresh worker."""
    small = min(CORPUS, key=lambda r: r["meta"]["size_bytes"])
    checks = run_isolated([Job(small, "xgrammar")], RunOptions(compile_timeout=0.001, job_timeout=60))
    assert [(c.kind, c.outcome) for c in checks] == [("compile", "timeout")]
    checks = run_isolated([Job(small, "xgrammar")] * 2, RunOptions(compile_timeout=120, job_timeout=120))
    assert [c.outcome for c in checks if c.kind == "compile"] == ["compiled", "compiled"]
    assert not any(c.is_bug for c in checks)
