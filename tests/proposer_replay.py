"""Replay a reference output through a proposer: how many tokens would its drafts have saved?

The target is an oracle whose greedy choice is the reference
(:class:`tools.oracle.OracleLM`), and the real decoding loop runs against it:
each step the proposer drafts up to ``k`` tokens, the draft's longest prefix
that matches the reference is accepted, plus one token the target adds.
``tokens / steps`` is the number of accepted tokens per target forward pass
the proposer would reach.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from grammars import compile_grammar, grammar_spec
from grammarspec.engine.decoding import DecodeConfig, decode
from grammarspec.policy.adaptive import AdaptiveController
from proposers.base import Draft, GrammarView, Proposer, Request
from tools.oracle import OracleLM


@dataclass
class Replay:
    tokens: int = 0
    steps: int = 0
    proposed: Counter = field(default_factory=Counter)  # per source
    accepted: Counter = field(default_factory=Counter)

    @property
    def per_step(self) -> float:
        return self.tokens / max(1, self.steps)


def reference_ids(tokenizer: Any, reference: Any) -> list[int]:
    """The reference serialised as the grammar's compact JSON, in canonical tokens."""
    text = json.dumps(reference, separators=(",", ":"), ensure_ascii=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


class _LegalDrafts:
    """Wraps a proposer and fails the test if it ever drafts a grammar-illegal token."""

    def __init__(self, inner: Proposer) -> None:
        self.inner, self.name = inner, inner.name

    def start(self, request: Request) -> None:
        self.inner.start(request)

    def propose(self, context: Sequence[int], grammar: GrammarView | None, k: int) -> Draft:
        draft = self.inner.propose(context, grammar, k)
        assert len(draft) <= k
        assert grammar is None or grammar.validate(draft.tokens) == len(draft), "a draft must be legal for the grammar"
        return draft

    def commit(self, draft: Draft, num_accepted: int, committed: Sequence[int]) -> None:
        self.inner.commit(draft, num_accepted, committed)


def replay(
    proposer: Proposer, tokenizer: Any, schema: dict, prompt_ids: list[int], reference: list[int], k: int
) -> Replay | None:
    """Replay ``reference`` through the real loop against an oracle target; ``None`` when the grammar rejects it.

    The proposal length is fixed at ``k`` (no adaptive controller); tokens the
    grammar forces are committed without a pass, as in every generation.
    """
    spec = grammar_spec(schema=schema)
    eos = tokenizer.eos_token_id
    vocab = max(len(tokenizer), tokenizer.vocab_size)
    compiled = compile_grammar(spec, tokenizer, vocab_size=vocab, stop_token_ids=(eos,))
    check = compiled.matcher()
    if any(not check.accept(t) for t in reference):
        return None
    output = list(reference) + [eos]
    oracle = OracleLM(prompt_ids, output, vocab, eos_token_id=eos)
    proposer.start(Request(prompt_ids=tuple(prompt_ids), tokenizer=tokenizer, schema=spec.schema))
    config = DecodeConfig(max_new_tokens=len(output), eos_token_ids=(eos,))
    new, stats = decode(
        oracle,
        prompt_ids,
        config,
        matcher=compiled.matcher(max_rollback=k + 1),
        proposer=_LegalDrafts(proposer),
        controller=AdaptiveController(k_min=k, k_max=k, adaptive=False),
        tokenizer=tokenizer,
    )
    assert new[: len(reference)] == list(reference), "the oracle target must reproduce the reference"
    return Replay(
        tokens=len(reference),
        steps=stats.target_forwards,
        proposed=Counter(stats.proposed),
        accepted=Counter(stats.accepted),
    )
