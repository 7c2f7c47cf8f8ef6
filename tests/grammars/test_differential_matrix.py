"""The differential matrix: every grammar backend x every tokenizer family the repository ships x schemas.

Cells: the three backends (:data:`grammars.BACKENDS`) x the tokenizer families
-- SmolLM2's byte-level BPE (the embedded model) and the SentencePiece
vocabularies shipped in ``data/tokenizers`` (Llama 2 / Mistral with byte
fallback, Phi-3) -- x the grammar contract's schemas, the schemas users
reported and a stratified sample of the production corpus (``data/schemas``)
x greedy and sampled x without and with drafting (``assistant="auto"``).

The models are 1-layer random Llamas over each family's vocabulary, their
logits tilted towards short JSON tokens and EOS so that many outputs finish
within the token limit.  Every cell asserts:

* no internal error: a backend may refuse a schema up front with a
  :class:`GrammarError` (recorded as the cell's ``refused`` property, and the
  same for every family), but once compiled, generation runs to ``stop`` or
  ``length``;
* an output that finished with a grammar that enforces every keyword of its
  schema is marked valid, and every output marked valid passes the strict
  validator (:func:`grammars.validation.output_errors`) and parses with no
  duplicate key;
* greedy with drafting writes the same tokens as greedy without (exactness).

After the matrix, the two findings it pins, each as a test that fails on the
code before the fix: llguidance over a SentencePiece vocabulary allowed the
token ``▁{"`` where the grammar forces ``{"`` (its tokenize callback encoded
text on its own, dummy prefix included) and the matcher then refused it; and
a ``$ref`` cycle ``a -> b -> a`` compiled under llguidance into a grammar whose
mask allowed only EOS, which the matcher refused.
"""

from __future__ import annotations

import json
import os
import warnings
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaForCausalLM

import grammarspec
from grammars import BACKENDS, GrammarError, allocate_bitmask, bitmask_to_ids, compile_grammar, grammar_spec
from grammars.outlines_backend import token_bytes
from grammars.validation import output_errors
from grammarspec.bench.families import load_family_tokenizer
from grammarspec.bench.tiny_llama import tiny_llama_config
from tests.helpers import corpus_records
from tools.fuzz import CI_SLICES

DATA = Path(__file__).resolve().parents[2] / "data" / "tokenizers"
#: Family -> where its tokenizer comes from: the embedded model, or a vocabulary shipped in data/tokenizers.
#: ``$GRAMMARSPEC_TOKENIZERS`` (GGUF vocabulary files, separated by ``os.pathsep``) adds families for larger runs.
FAMILIES: dict[str, Path | None] = {
    "smollm2": None,
    "llama-spm": DATA / "ggml-vocab-llama-spm.gguf",
    "phi-3": DATA / "ggml-vocab-phi-3.gguf",
    **{
        Path(p).stem.removeprefix("ggml-vocab-"): Path(p)
        for p in os.environ.get("GRAMMARSPEC_TOKENIZERS", "").split(os.pathsep)
        if p
    },
}
SENTENCEPIECE = ("llama-spm", "phi-3")

#: The grammar contract's schema (tests/grammars/test_contract.py), its small ones, and the schemas users reported.
SCHEMAS: dict[str, dict[str, Any]] = {
    "contract": {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 0},
            "name": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "ab"]}},
            "ok": {"type": "boolean"},
        },
        "required": ["id", "name", "tags", "ok"],
        "additionalProperties": False,
    },
    "string": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
    "split-char-enum": {"type": "object", "properties": {"a": {"type": "string", "enum": ["éé"]}}, "required": ["a"]},
    "multipleOf": {"type": "object", "properties": {"x": {"type": "number", "multipleOf": 0.25}}, "required": ["x"]},
    "recursive": {
        "type": "object",
        "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}},
        "required": ["v"],
    },
}
#: A stratified sample of the production corpus: one small schema per category (the fuzz CI's outlines slice,
#: which every backend compiles within seconds).
PRODUCTION = {record["id"]: record["schema"] for record in CI_SLICES["outlines"].of(corpus_records())}
ALL_SCHEMAS = {**SCHEMAS, **PRODUCTION}

MAX_NEW_TOKENS = 40
#: Logit added to EOS and to tokens made only of JSON punctuation and digits (the random logits' spread is ~1).
TILT = 3.0
_JSON_BYTES = frozenset(b'{}[],:"0123456789.-')
PROMPT = 'Example: {"id":12,"name":"Ana Lee","tags":["a"],"ok":true}\nReply with one JSON document.\n'


class TiltedLlama(LlamaForCausalLM):
    """A random Llama whose logits get a fixed per-token ``tilt`` (the decoding loop's own forward, cache and
    positions; only the output logits change)."""

    tilt: torch.Tensor

    def forward(self, input_ids: Any = None, cache: Any = None, **kwargs: Any) -> Any:
        out = super().forward(input_ids=input_ids, cache=cache, **kwargs)
        out.logits = out.logits + self.tilt.to(out.logits.dtype)
        return out


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny tensors: OpenMP hand-offs would cost more than the work (and stall on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@cache
def family(name: str) -> tuple[Any, TiltedLlama]:
    """``(tokenizer, model)`` of a family (a missing shipped vocabulary fails, it is never skipped)."""
    path = FAMILIES[name]
    if path is None:
        from grammarspec.model.loading import load_tokenizer

        tokenizer = load_tokenizer("smollm2-135m")
    else:
        assert path.is_file(), f"{path} is missing: the repository ships it (see data/tokenizers/README.md)"
        tokenizer = load_family_tokenizer(path)
    vocab = len(tokenizer)
    eos = int(tokenizer.eos_token_id)
    torch.manual_seed(0)
    model = TiltedLlama(tiny_llama_config(vocab, eos_token_id=eos, pad_token_id=eos)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(10.0)  # logits with a spread of about 1: few near-ties for greedy
    tilt = torch.zeros(vocab)
    for token, piece in enumerate(token_bytes(tokenizer, vocab)):
        if piece and set(piece) <= _JSON_BYTES:
            tilt[token] = TILT
    tilt[eos] = TILT
    model.tilt = tilt
    return tokenizer, model


def compiled_or_refusal(backend: str, family_name: str, schema_id: str) -> tuple[Any, str | None]:
    """The compiled grammar of a cell, or the message of the backend's up-front refusal."""
    tokenizer, _ = family(family_name)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # unenforced keywords: read from the result instead
            return compile_grammar(grammar_spec(schema=ALL_SCHEMAS[schema_id]), tokenizer, backend=backend), None
    except GrammarError as e:
        return None, str(e)


@cache
def run(backend: str, family_name: str, schema_id: str, decoding: str, drafting: str) -> tuple[list[int], Any]:
    """One cell's generation: its new tokens (stop token included) and its stats."""
    tokenizer, model = family(family_name)
    prompt = tokenizer.encode(PROMPT, add_special_tokens=False)
    sampling = (
        {"do_sample": True, "temperature": 1.0, "generator": torch.Generator().manual_seed(7)}
        if decoding == "sampled"
        else {}
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = grammarspec.generate(
            model,
            torch.tensor([prompt]),
            tokenizer=tokenizer,
            schema=ALL_SCHEMAS[schema_id],
            grammar_backend=backend,
            assistant=drafting,
            max_new_tokens=MAX_NEW_TOKENS,
            return_dict_in_generate=True,
            **sampling,
        )
    (stats,) = out.stats
    return out.sequences[0, len(prompt) : len(prompt) + stats.new_tokens].tolist(), stats


def strict_json(text: str) -> Any:
    """``json.loads`` that refuses a duplicate key (the strict validator's rule, checked here as well)."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in items]
        duplicated = sorted({k for k in keys if keys.count(k) > 1})
        assert not duplicated, f"duplicate keys {duplicated} in {text!r}"
        return dict(items)

    return json.loads(text, object_pairs_hook=pairs)


#: What each backend refused, per schema, in this process: a refusal must not depend on the tokenizer.
_REFUSED: dict[tuple[str, str], set[bool]] = {}

CELLS = [
    pytest.param(b, f, s, d, a, id=f"{b}/{f}/{s}/{d}/draft-{a}")
    for b in BACKENDS
    for f in FAMILIES
    for s in ALL_SCHEMAS
    for d in ("greedy", "sampled")
    for a in ("none", "auto")
]


@pytest.mark.parametrize(("backend", "family_name", "schema_id", "decoding", "drafting"), CELLS)
def test_cell(backend, family_name, schema_id, decoding, drafting, record_property):
    compiled, refusal = compiled_or_refusal(backend, family_name, schema_id)
    _REFUSED.setdefault((backend, schema_id), set()).add(refusal is not None)
    assert len(_REFUSED[(backend, schema_id)]) == 1, f"{backend} refuses {schema_id} on some tokenizers only"
    if refusal is not None:  # refused up front, with a message that says what to do
        record_property("refused", refusal)
        assert backend in refusal or "schema" in refusal, refusal
        return
    tokenizer, _ = family(family_name)
    tokens, stats = run(backend, family_name, schema_id, decoding, drafting)  # an internal error fails the cell
    assert stats.finish_reason in ("stop", "length"), stats.finish_reason
    assert stats.new_tokens == len(tokens) <= MAX_NEW_TOKENS
    eos = tokenizer.eos_token_id
    text_tokens = tokens[:-1] if stats.finish_reason == "stop" and tokens and tokens[-1] == eos else tokens
    pieces = token_bytes(tokenizer, len(tokenizer))
    text = b"".join(pieces[t] or b"" for t in text_tokens).decode("utf-8", errors="replace")
    if stats.finish_reason == "stop" and not compiled.unenforced:
        assert stats.valid, f"a finished output of a fully enforced grammar is invalid: {text!r} {stats.schema_errors}"
    if stats.valid:
        assert output_errors(ALL_SCHEMAS[schema_id], text) == [], text
        strict_json(text)
    if decoding == "greedy" and drafting != "none":
        plain, _ = run(backend, family_name, schema_id, "greedy", "none")
        assert tokens == plain, "greedy with drafting wrote other tokens than greedy without"


# --- the findings it pins --------------------------------------------------------------------


@pytest.mark.parametrize("name", SENTENCEPIECE)
def test_llguidance_forced_token_is_one_the_matcher_accepts(name):
    """Where the grammar forces ``{"x":``, llguidance's mask allowed only ``▁{"`` (a space the grammar never allows):
    its tokenize callback encoded the text on its own, with SentencePiece's dummy prefix.  The mask's tokens are the
    matcher's, state after state."""
    tokenizer, _ = family(name)
    compiled = compile_grammar(grammar_spec(schema=SCHEMAS["multipleOf"]), tokenizer, backend="llguidance")
    matcher = compiled.matcher()
    pieces = token_bytes(tokenizer, len(tokenizer))
    forced = b'{"x":'
    while forced:
        mask = allocate_bitmask(1, len(tokenizer))
        matcher.fill_mask(mask, 0)
        allowed = bitmask_to_ids(mask[0], len(tokenizer)).tolist()
        names = tokenizer.convert_ids_to_tokens(allowed)
        assert allowed and all(matcher.fork().accept(t) for t in allowed), names
        assert all(forced.startswith(pieces[t]) for t in allowed), (forced, names)
        longest = max(allowed, key=lambda t: len(pieces[t]))
        assert matcher.accept(longest)
        forced = forced[len(pieces[longest]) :]


@pytest.mark.parametrize("name", SENTENCEPIECE)
def test_llguidance_tokenize_spells_exactly_the_text(name):
    """What llguidance reads as the tokenizer: tokens that spell the text byte for byte, in the in-context split."""
    from grammars.llguidance_backend import _Wrapped

    tokenizer, _ = family(name)
    wrapped = _Wrapped(tokenizer, len(tokenizer), (tokenizer.eos_token_id,))
    pieces = token_bytes(tokenizer, len(tokenizer))
    for text in ('{"x":', '"}', " a", "hello world", "\n{", "éé", "▁"):
        ids = wrapped(text)
        assert b"".join(pieces[t] or b"?" for t in ids) == text.encode(), (text, tokenizer.convert_ids_to_tokens(ids))
    assert wrapped('{"x":') == tokenizer.encode('\n{"x":', add_special_tokens=False)[-3:]  # '{"', 'x', '":'


@pytest.mark.parametrize("backend", ["llguidance", "auto"])
@pytest.mark.parametrize("name", SENTENCEPIECE)
def test_sentencepiece_generates_under_llguidance_and_auto(backend, name):
    """The user's report: ``multipleOf: 0.25`` (auto picks llguidance) on a Phi-3 / Llama 2 vocabulary raised
    "committed token 8853 is illegal"; now it generates, greedy and sampled."""
    tokenizer, model = family(name)
    prompt = torch.tensor([tokenizer.encode(PROMPT, add_special_tokens=False)])
    for sampling in ({}, {"do_sample": True, "generator": torch.Generator().manual_seed(3)}):
        out = grammarspec.generate(
            model,
            prompt,
            tokenizer=tokenizer,
            schema=SCHEMAS["multipleOf"],
            grammar_backend=backend,
            max_new_tokens=MAX_NEW_TOKENS,
            return_dict_in_generate=True,
            **sampling,
        )
        (stats,) = out.stats
        assert stats.grammar_backend == "llguidance" and stats.new_tokens > 3
        text = tokenizer.decode(
            out.sequences[0, prompt.shape[1] : prompt.shape[1] + stats.new_tokens], skip_special_tokens=True
        )
        assert text.startswith('{"x":'), text
        if stats.finish_reason == "stop":
            assert stats.valid and json.loads(text)["x"] % 0.25 == 0, text


REF_CYCLE = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}


@pytest.mark.parametrize("backend", [*BACKENDS, "auto"])
def test_a_ref_cycle_is_refused_naming_the_chain(backend):
    """a -> b -> a describes no value: every backend refuses it up front, naming the chain and what to do (llguidance
    and auto raised "internal error: committed token ... is illegal" at the first token)."""
    tokenizer, model = family("smollm2")
    with pytest.raises(GrammarError) as e:
        grammarspec.generate(
            model,
            torch.tensor([tokenizer.encode(PROMPT)]),
            tokenizer=tokenizer,
            schema=REF_CYCLE,
            grammar_backend=backend,
            max_new_tokens=8,
        )
    message = str(e.value)
    assert "circular $ref chain" in message and "#/$defs/a -> #/$defs/b -> #/$defs/a" in message, message
    assert "property or an array item" in message, message  # what to do


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#"},
        {"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "string"}]}}, "$ref": "#/$defs/a"},
        {"type": "object", "dependentSchemas": {"x": {"$ref": "#"}}},
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "properties": {"x": {"$ref": "#/$defs/a"}}},
    ],
    ids=["self", "anyOf-branch", "dependentSchemas", "under-a-property"],
)
def test_every_same_value_cycle_is_refused(schema):
    with pytest.raises(GrammarError, match="circular \\$ref chain"):
        grammar_spec(schema=schema)


@pytest.mark.parametrize(
    "schema",
    [
        SCHEMAS["recursive"],
        {"type": "object", "properties": {"next": {"$ref": "#"}}},
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "type": "string"},  # never referred to
        {"$defs": {"a": {"type": "array", "items": {"$ref": "#/$defs/b"}}, "b": {"anyOf": [{"$ref": "#/$defs/a"}]}}},
    ],
    ids=["tree", "linked-list", "unused-defs", "through-items"],
)
def test_a_recursion_through_a_property_or_item_is_kept(schema):
    assert '"$ref"' in json.dumps(grammar_spec(schema=schema).schema)  # neither refused nor unrolled away


def test_a_number_beyond_a_float_is_reported_not_raised():
    """Found by the matrix: xgrammar leaves ``multipleOf`` on numbers unenforced, a sampled output held a number
    past a float's range, and checking it raised OverflowError from inside jsonschema out of ``generate``."""
    errors = output_errors(SCHEMAS["multipleOf"], '{"x":1e999}')
    assert errors and "too large" in errors[0], errors
    assert output_errors(SCHEMAS["multipleOf"], '{"x":1e99}') == []
