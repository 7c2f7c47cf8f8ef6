"""Small stand-ins for proposer tests: a rule-based matcher and a scripted proposer."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from grammars.base import GrammarError, Matcher, bitmask_width
from proposers.base import EMPTY_DRAFT, Draft, GrammarView, Request


class RuleMatcher(Matcher):
    """A matcher whose grammar is a Python rule: ``legal(history, token) -> bool``.

    ``forced(history) -> str`` gives the forced text (default: none).  Token 0
    is the stop token and terminates the matcher.
    """

    def __init__(
        self,
        legal: Callable[[list[int], int], bool],
        forced: Callable[[list[int]], str] | None = None,
        vocab_size: int = 64,
    ) -> None:
        self.legal = legal
        self.forced = forced or (lambda history: "")
        self.vocab_size = vocab_size
        self.stop_token_ids = (0,)
        self.max_rollback = 1 << 30
        self.history: list[int] = []

    def accept(self, token: int) -> bool:
        if self.is_terminated() or not 0 <= token < self.vocab_size or not self.legal(self.history, token):
            return False
        self.history.append(token)
        return True

    def rollback(self, n: int) -> None:
        if n > len(self.history):
            raise GrammarError(f"cannot roll back {n} tokens: only {len(self.history)} accepted")
        del self.history[len(self.history) - n :]

    def fill_mask(self, bitmask: torch.Tensor, row: int = 0) -> None:
        if self.is_terminated():
            raise GrammarError("terminated")
        bitmask[row].zero_()
        assert bitmask.shape[1] == bitmask_width(self.vocab_size)
        for token in range(self.vocab_size):
            if self.legal(self.history, token):
                bitmask[row, token // 32] |= 1 << (token % 32)

    def forced_text(self) -> str:
        return "" if self.is_terminated() else self.forced(self.history)

    def is_terminated(self) -> bool:
        return bool(self.history) and self.history[-1] in self.stop_token_ids

    def reset(self) -> None:
        self.history = []

    def fork(self) -> RuleMatcher:
        twin = RuleMatcher(self.legal, self.forced, self.vocab_size)
        twin.history = list(self.history)
        return twin


class ScriptedProposer:
    """Proposes ``script(context, grammar, k)`` and records every call and every commit.

    ``commits``: every ``(draft tokens, num_accepted, committed)`` it was told;
    ``feedbacks``: the ``(draft tokens, num_accepted)`` of the steps it drafted.
    """

    def __init__(self, name: str, script: Callable[[Sequence[int], GrammarView | None, int], Draft]) -> None:
        self.name = name
        self.script = script
        self.calls: list[tuple[list[int], int]] = []
        self.commits: list[tuple[tuple[int, ...], int, tuple[int, ...]]] = []
        self.started = 0

    def start(self, request: Request) -> None:
        self.started += 1

    def propose(self, context: Sequence[int], grammar: GrammarView | None, k: int) -> Draft:
        self.calls.append((list(context), k))
        draft = self.script(context, grammar, k)
        return draft.truncate(k) if draft else EMPTY_DRAFT

    def commit(self, draft: Draft, num_accepted: int, committed: Sequence[int]) -> None:
        self.commits.append((draft.tokens, num_accepted, tuple(committed)))

    @property
    def feedbacks(self) -> list[tuple[tuple[int, ...], int]]:
        return [(tokens, n) for tokens, n, _ in self.commits if tokens]


class ScriptFollower:
    """Drafts the next tokens of a fixed ``script`` (the output so far picks the place), wrong every ``noise_every``-th call.

    The wrong token (40, a letter) is usually illegal or rejected: the loop's cut and rollback paths run.
    """

    name = "scripted"

    def __init__(self, script: list[int], noise_every: int = 0) -> None:
        self.script, self.noise_every, self.calls = script, noise_every, 0

    def start(self, request: Request) -> None:
        self.prompt = len(request.prompt_ids)

    def propose(self, context: Sequence[int], grammar: GrammarView | None, k: int) -> Draft:
        self.calls += 1
        done = len(context) - self.prompt
        tokens = list(self.script[done : done + k])
        if self.noise_every and self.calls % self.noise_every == 0 and tokens:
            tokens[-1] = 40
        return Draft(tuple(tokens), sources=(self.name,) * len(tokens))

    def commit(self, draft: Draft, num_accepted: int, committed: Sequence[int]) -> None:
        pass


def commit_step(proposer, draft: Draft, num_accepted: int, next_token: int | None = None) -> None:
    """``proposer.commit`` as the loop calls it: the accepted prefix of ``draft`` plus the target's ``next_token``."""
    committed = draft.tokens[:num_accepted] + ((next_token,) if next_token is not None else ())
    proposer.commit(draft, num_accepted, committed)


def fixed(name: str, tokens: Sequence[int], probs: torch.Tensor | None = None) -> ScriptedProposer:
    """A proposer that always drafts ``tokens`` (cut to ``k``)."""
    draft = Draft(tokens=tuple(tokens), probs=probs, sources=(name,) * len(tokens)) if tokens else EMPTY_DRAFT
    return ScriptedProposer(name, lambda context, grammar, k: draft)
