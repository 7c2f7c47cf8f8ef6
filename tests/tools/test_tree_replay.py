"""The replay script's tree measurement: tree shapes on a recorded output, and the measured cost model."""

from __future__ import annotations

import json

import pytest

from proposers.presets import resolve_assistant
from proposers.tree import TreeProposer
from tests.helpers import load_tool

SCHEMA = {
    "type": "object",
    "properties": {"unit": {"enum": ["celsius", "fahrenheit", "kelvin"]}},
    "required": ["unit"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def script():
    return load_tool("replay_bench")


def test_a_tree_of_candidates_saves_the_pass_a_chain_loses_on_the_unlikely_enum_value(script, smol_tokenizer):
    tok = smol_tokenizer
    prompt = tok.encode("The weather in Oslo.", add_special_tokens=False)
    doc = {"unit": "kelvin"}  # an enum value the prompt does not name: the chain bets on the first one
    output = tok.encode(json.dumps(doc, separators=(",", ":")), add_special_tokens=False) + [tok.eos_token_id]
    chain = script.replay_tree(tok, prompt, SCHEMA, output, "auto", "1x16")
    tree = script.replay_tree(tok, prompt, SCHEMA, output, "auto", "4x32")
    assert chain["tokens"] == tree["tokens"] == len(output)
    assert chain["trees"] == 0 and tree["trees"] > 0
    assert tree["passes"] < chain["passes"]  # the tree carried "kelvin" beside the chain's "celsius"
    assert chain["passes"] == script.replay(tok, prompt, SCHEMA, output, "auto")["passes"]  # width 1 is the chain


def test_the_measured_cost_model_interpolates(script):
    cost = script.measured_cost({1: 1.0, 4: 1.5, 16: 2.1})
    assert cost(1) == 1.0 and cost(4) == 1.5 and cost(10) == pytest.approx(1.8) and cost(64) == 2.1


def test_tree_shapes_parse_and_refuse_bad_ones():
    tree = TreeProposer.from_shape(resolve_assistant("auto"), "4x32x3s")
    assert (tree.width, tree.size, tree.branch) == (4, 32, 3) and tree.sizer is not None
    assert TreeProposer.from_shape(resolve_assistant("auto"), "2x16").sizer is None
    with pytest.raises(ValueError, match="WIDTHxSIZE"):
        TreeProposer.from_shape(resolve_assistant("auto"), "wide")
