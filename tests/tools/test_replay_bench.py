"""tools/replay_bench.py: the offline replay that counts target passes for a recorded greedy output."""

from __future__ import annotations

import json

import pytest

from tests.helpers import load_tool

SCHEMA = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
                "required": ["sku", "qty"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["items"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def script():
    return load_tool("replay_bench")


def test_replay_counts_every_token_and_saves_passes_on_repeated_items(script, smol_tokenizer):
    tok = smol_tokenizer
    doc = {"items": [{"sku": "A-1", "qty": 2}, {"sku": "A-1", "qty": 2}, {"sku": "A-1", "qty": 2}]}
    output = tok.encode(json.dumps(doc, separators=(",", ":")), add_special_tokens=False) + [tok.eos_token_id]
    prompt = tok.encode("Order: three times A-1, two each.", add_special_tokens=False)
    counts = script.replay(tok, prompt, SCHEMA, output, "auto")
    assert counts["tokens"] == len(output)
    assert counts["passes"] + counts["forced"] <= len(output)
    assert counts["per_pass"] > 2.0  # the repeated items are drafted
    plain = script.replay(tok, prompt, SCHEMA, output, "jump_forward")
    assert plain["passes"] > counts["passes"]


def test_the_pass_cost_model():
    from importlib import import_module

    cost = import_module("replay_bench").pass_cost
    assert cost(1) == 1.0
    assert cost(2) == cost(4) < cost(8) < cost(16)  # 2-3 rows cost as much as 4
    assert cost(16, base=1.0, per_row=0.0) == 1.0


def test_an_output_the_grammar_rejects_is_skipped(script, smol_tokenizer):
    tok = smol_tokenizer
    output = tok.encode('{"items":[{"qty":2}]}', add_special_tokens=False)  # "sku" is required
    assert script.replay(tok, [1, 2, 3], SCHEMA, output, "auto") is None


def test_same_text_tokens_counts_the_tokens_that_spell_the_drafted_text(script):
    assert script.same_text_tokens(b'":"IN', [b'":', b'"', b"IN", b"V"]) == 3
    assert script.same_text_tokens(b'":"IN', [b'":"', b"OUT"]) == 1
    assert script.same_text_tokens(b'",', [b'","']) == 0  # longer than the drafted text
    assert script.same_text_tokens(b"abc", []) == 0


def test_the_split_oracle_accepts_the_same_text_split_otherwise(script, smol_tokenizer):
    tok = smol_tokenizer
    doc = {"items": [{"sku": "A-1", "qty": 2}, {"sku": "A-1", "qty": 2}, {"sku": "A-1", "qty": 2}]}
    canonical = tok.encode(json.dumps(doc, separators=(",", ":")), add_special_tokens=False)
    merged = tok.convert_tokens_to_ids('":"')
    split = tok.convert_tokens_to_ids(['":', '"'])
    assert merged in canonical and tok.unk_token_id not in split
    output = []  # the same text, with every '":"' written as '":' '"'
    for token in canonical:
        output += split if token == merged else [token]
    output.append(tok.eos_token_id)
    prompt = tok.encode("Order: three times A-1, two each.", add_special_tokens=False)
    plain = script.replay(tok, prompt, SCHEMA, output, "schema_ngram")
    bound = script.replay(tok, prompt, SCHEMA, output, "schema_ngram", split_oracle=True)
    assert bound["tokens"] == plain["tokens"] == len(output)
    assert bound["passes"] < plain["passes"]


def test_end_to_end_keeps_the_prompt_pass_and_divides_the_decode_phase(script):
    baseline = {"seconds": 10.0, "first_step_seconds": 2.0}
    arm = {"seconds": 5.0, "first_step_seconds": 1.5}
    assert script.end_to_end(baseline, arm, 4.0) == pytest.approx(10.0 / (1.5 + 8.0 / 4.0))


def test_a_flat_gpu_cost_curve_lengthens_the_chosen_drafts(script, smol_tokenizer):
    """The same policy, the same estimates: where extra rows are nearly free, it verifies more."""
    from proposers.cost import PassCost, flat_until

    tok = smol_tokenizer
    doc = {"items": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 3}, {"sku": "A-1", "qty": 5}]}
    output = tok.encode(json.dumps(doc, separators=(",", ":")), add_special_tokens=False) + [tok.eos_token_id]
    prompt = tok.encode("Order: A-1 twice, B-7 three.", add_special_tokens=False)
    steep = PassCost(1.0, 0.3, 1).cost  # every row costs a third of a step: drafts must earn it
    cpu = script.replay(tok, prompt, SCHEMA, output, "auto", cost=steep)
    gpu = script.replay(tok, prompt, SCHEMA, output, "auto", cost=flat_until(64).cost)
    assert cpu["tokens"] == gpu["tokens"] == len(output)  # the output never changes
    assert gpu["drafted"] > cpu["drafted"]
