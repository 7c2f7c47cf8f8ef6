"""Where generation stops: a stop string inside a forced span, a grammar that can only end past the token limit,
and an EOS the grammar forbids (never taken, even by a model that wants nothing else).

Tiny random models over the toy tokenizer (conftest's tok, model, prompt), every assistant a user may pick.
"""

from __future__ import annotations

import json

import pytest
import torch

import grammarspec
from tests.helpers import OBJECT_SCHEMA, generate_one
from tests.toy_models import ToyCausalLM

FORCED = {"type": "object", "properties": {"abc": {"const": "xyz"}}, "required": ["abc"], "additionalProperties": False}


@pytest.mark.parametrize("assistant", [None, "jump_forward", "auto"])
def test_a_stop_string_inside_a_forced_span_stops_there(model, tok, prompt, assistant):
    """The grammar forces {"abc":"xyz"}; the stop string "bc" ends generation inside the key."""
    full, full_text, full_stats = generate_one(model, tok, prompt, schema=FORCED, assistant=assistant)
    assert full_stats.finish_reason == "stop" and json.loads(full_text) == {"abc": "xyz"}
    new, text, stats = generate_one(model, tok, prompt, schema=FORCED, stop_strings=["bc"], assistant=assistant)
    assert stats.finish_reason == "stop_string"
    assert "bc" in text and "bc" not in tok.decode(new[:-1])  # cut at the token that completes it
    assert new == full[: len(new)]  # the same tokens as without the stop string, up to the cut
    result = grammarspec.complete(model, tok, "go", schema=FORCED, stop_strings=["bc"], assistant=assistant)
    assert result.finish_reason == "stop_string" and not result.valid and result.value is None


@pytest.mark.parametrize("backend", ["xgrammar", "outlines"])
def test_a_grammar_that_can_only_end_past_the_limit_reports_length(model, tok, prompt, backend):
    schema = {"type": "array", "items": {"const": 7}, "minItems": 40, "maxItems": 40}
    new, text, stats = generate_one(
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
    unconstrained, _, stats = generate_one(eos_model, tok, prompt, max_new_tokens=10)
    assert unconstrained == [0] and stats.finish_reason == "eos"  # it really wants to stop
    for assistant in (None, "auto"):
        new, text, stats = generate_one(
            eos_model,
            tok,
            prompt,
            schema=OBJECT_SCHEMA,
            assistant=assistant,
            do_sample=do_sample,
            generator=torch.Generator().manual_seed(0),
            max_new_tokens=60,
        )
        assert stats.finish_reason == "stop" and new[-1] == 0 and 0 not in new[:-1]
        value = json.loads(text)
        assert set(value) == {"a", "b"}
