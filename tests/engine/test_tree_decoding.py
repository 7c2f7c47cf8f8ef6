"""The decoding loop with a tree proposer on the embedded model: greedy parity, and trees really verified."""

from __future__ import annotations

import torch

import grammarspec
from proposers.presets import resolve_assistant
from proposers.tree import DraftTree, TreeProposer

SCHEMA = {
    "type": "object",
    "properties": {
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit", "kelvin"]},
        "days": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "day": {"type": "string"},
                    "high": {"type": "integer"},
                    "sky": {"enum": ["sun", "rain"]},
                },
                "required": ["day", "high", "sky"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["unit", "days"],
    "additionalProperties": False,
}
PROMPT = "Forecast for Oslo in Celsius: Monday 12 sun, Tuesday 9 rain, Wednesday 11 sun. Give it as JSON."


class CountingTrees(TreeProposer):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.trees = 0

    def propose_tree(self, context, grammar, k):
        out = super().propose_tree(context, grammar, k)
        self.trees += isinstance(out, DraftTree)
        return out


def test_greedy_tree_decoding_equals_plain_greedy_on_the_embedded_model(smol):
    model, tok = smol
    ids = grammarspec.build_prompt(tok, PROMPT)
    plain = grammarspec.generate(model, torch.tensor([ids]), tokenizer=tok, schema=SCHEMA, max_new_tokens=60)
    proposer = CountingTrees(resolve_assistant("auto"), width=4, size=32)
    out = grammarspec.generate(
        model,
        torch.tensor([ids]),
        tokenizer=tok,
        schema=SCHEMA,
        assistant=proposer,
        max_new_tokens=60,
        return_dict_in_generate=True,
    )
    assert out.sequences[0].tolist() == plain[0].tolist()
    assert proposer.trees > 0  # branching trees went through tree_layout
    stats = out.stats[0]
    assert stats.target_forwards < stats.new_tokens
