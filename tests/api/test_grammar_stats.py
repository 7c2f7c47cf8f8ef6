"""Every constrained call reports its grammar backend, why, what it leaves unenforced, and whether the
finished output validates against the full schema (tiny random Llama over the toy vocabulary)."""

from __future__ import annotations

import pytest
import torch

import grammarspec
from grammars import GrammarError, GrammarWarning
from grammars.validation import output_errors

#: Every finished output breaks uniqueItems (the only item is "x" and at least two are needed),
#: a keyword xgrammar compiles without enforcing.
DUPLICATES = {"type": "array", "items": {"enum": ["x", "y"]}, "minItems": 2, "maxItems": 3, "uniqueItems": True}
PLAIN = {"type": "object", "properties": {"b": {"type": "boolean"}}, "required": ["b"], "additionalProperties": False}


def _run(model, tok, schema, **kw):
    prompt = torch.tensor([tok("{b:1}", add_special_tokens=False)["input_ids"]])
    out = grammarspec.generate(
        model, prompt, tokenizer=tok, schema=schema, max_new_tokens=40, return_dict_in_generate=True, **kw
    )
    stats = out.stats[0]
    text = tok.decode(out.sequences[0, prompt.shape[1] :][: stats.new_tokens].tolist(), skip_special_tokens=True)
    return stats, text


def test_a_finished_but_invalid_output_is_stop_with_valid_false(tok):
    from tests.grammars.test_strict_validation import Continuing  # a model that writes the repeat xgrammar lets through

    with pytest.warns(GrammarWarning, match="does not enforce uniqueItems"):
        stats, text = _run(Continuing(tok('["x","x"]', add_special_tokens=False)["input_ids"]), tok, DUPLICATES)
    assert text == '["x","x"]'
    assert stats.finish_reason == "stop" and stats.grammar_backend == "xgrammar"
    assert stats.unenforced_keywords == ["uniqueItems"] and stats.backend_reason == "requested"
    assert stats.valid is False and stats.schema_errors == output_errors(DUPLICATES, text)
    assert any("non-unique" in e for e in stats.schema_errors)
    assert stats.as_dict()["valid"] is False


def test_strict_refuses_what_the_backend_cannot_enforce(model, tok):
    with pytest.raises(GrammarError, match="uniqueItems.*strict=True"):
        _run(model, tok, DUPLICATES, strict=True)


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance", "auto"])
def test_valid_finished_output_and_backend_in_stats(model, tok, backend):
    stats, text = _run(model, tok, PLAIN, grammar_backend=backend)
    assert stats.grammar_backend == ("llguidance" if backend == "auto" else backend)
    assert stats.backend_reason == (
        "auto: llguidance enforces every keyword this schema uses" if backend == "auto" else "requested"
    )
    assert stats.unenforced_keywords == []
    if stats.finish_reason == "stop":
        assert stats.valid is True and stats.schema_errors == [] and output_errors(PLAIN, text) == []
    else:
        assert stats.valid is False


def test_cut_output_is_never_valid(model, tok):
    prompt = torch.tensor([tok("{b:1}", add_special_tokens=False)["input_ids"]])
    out = grammarspec.generate(
        model,
        prompt,
        tokenizer=tok,
        schema={"type": "string", "minLength": 30},
        max_new_tokens=3,
        return_dict_in_generate=True,
    )
    stats = out.stats[0]
    assert (
        stats.finish_reason == "length"
        and stats.valid is False
        and "before the grammar completed" in stats.schema_errors[0]
    )


def test_unconstrained_call_has_no_verdict(model, tok):
    prompt = torch.tensor([tok("{b:1}", add_special_tokens=False)["input_ids"]])
    out = grammarspec.generate(model, prompt, tokenizer=tok, max_new_tokens=3, return_dict_in_generate=True)
    assert out.stats[0].valid is None and out.stats[0].grammar_backend == ""
