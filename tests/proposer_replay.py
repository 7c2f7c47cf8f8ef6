"""Replay a reference output through a proposer: how many tokens would its drafts have saved?

The target is assumed to produce exactly the reference (a greedy model that
agrees with it).  Each step the proposer drafts up to ``k`` tokens for the
committed context; the draft's longest prefix that matches the reference is
accepted, plus one token the target adds (the bonus or the correction) --
the accounting of a real speculative step.  ``tokens / steps`` is the number
of accepted tokens per target forward pass the proposer would reach.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from grammars import compile_grammar, grammar_spec
from proposers.base import GrammarView, Proposer, Request


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


def replay(
    proposer: Proposer, tokenizer: Any, schema: dict, prompt_ids: list[int], reference: list[int], k: int
) -> Replay | None:
    """Replay ``reference``; ``None`` when the grammar itself rejects the reference."""
    spec = grammar_spec(schema=schema)
    compiled = compile_grammar(spec, tokenizer)
    check = compiled.matcher()
    if any(not check.accept(t) for t in reference):
        return None
    matcher = compiled.matcher(max_rollback=k + 1)
    view = GrammarView(matcher)
    proposer.start(Request(prompt_ids=tuple(prompt_ids), tokenizer=tokenizer, schema=spec.schema))
    context, done, result = list(prompt_ids), 0, Replay(tokens=len(reference))
    while done < len(reference):
        draft = proposer.propose(context, view, k)
        assert len(draft) <= k
        assert matcher.validate(draft.tokens) == len(draft), "a draft must be legal for the grammar"
        n = 0
        while n < len(draft) and done + n < len(reference) and draft.tokens[n] == reference[done + n]:
            n += 1
        for i, source in enumerate(draft.sources):
            result.proposed[source] += 1
            result.accepted[source] += i < n
        commit = reference[done : done + n + 1]
        proposer.commit(draft, n, commit)
        for token in commit:
            assert matcher.accept(token)
        context += commit
        done += len(commit)
        result.steps += 1
    return result
