"""The grammar interface every backend implements.

Two levels, as in vLLM's structured-output backends:

* a :class:`CompiledGrammar` is built once per (tokenizer, grammar, options) and
  is immutable and shareable between requests and threads;
* a :class:`Matcher` is the per-request parser state.  It advances token by
  token, can roll back a bounded number of tokens, and writes the set of legal
  next tokens into a bitmask.

Bitmask format (shared by every backend and by ``grammarspec``): an ``int32``
tensor of shape ``[rows, ceil(vocab_size / 32)]`` where bit ``t % 32`` of word
``t // 32`` is set when token ``t`` is legal -- the format of
``xgrammar.allocate_token_bitmask``.  ``vocab_size`` is the width of the model's
logits, which may exceed ``len(tokenizer)``; padding tokens are never legal.

Backend quirks (raise vs. bool, EOS handling, bounded rollback) stay in the
adapters; the contract test suite (tests/grammars/test_contract.py) pins them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

__all__ = ["GrammarError", "GrammarWarning", "CompiledGrammar", "Matcher", "bitmask_width", "allocate_bitmask"]


class GrammarError(ValueError):
    """A grammar could not be built or used.

    The message names the backend, the offending part when known, and what to
    do about it (for example: try the other backend).
    """


class GrammarWarning(UserWarning):
    """A grammar compiled but does not hold the output to everything the user asked for.

    Raised at compile time for schema keywords the chosen backend does not
    enforce and for unknown keywords (typos such as ``propertiez``); the
    message says what to do.  ``strict=True`` turns the first kind into a
    :class:`GrammarError`.
    """


def bitmask_width(vocab_size: int) -> int:
    """Number of int32 words needed for a mask over ``vocab_size`` tokens."""
    return (vocab_size + 31) // 32


def allocate_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """A bitmask of ``rows`` rows with every token allowed (all bits set)."""
    return torch.full((rows, bitmask_width(vocab_size)), -1, dtype=torch.int32, device="cpu")  # filled on the host


class Matcher(ABC):
    """Per-request grammar state.

    Every method says whether it changes state.  A rejected token is a return
    value (``False``), never an exception; misuse (rolling back too far, asking
    a terminated matcher for a mask) raises :class:`GrammarError`.
    """

    #: Width of the masks this matcher writes (the model's logits width).
    vocab_size: int
    #: Tokens that end generation when the grammar allows it (EOS and friends).
    stop_token_ids: tuple[int, ...]
    #: How many tokens :meth:`rollback` can undo at most.
    max_rollback: int

    @abstractmethod
    def accept(self, token: int) -> bool:
        """Advance by ``token`` if the grammar allows it.

        Changes state only when it returns ``True``.  A stop token is accepted
        exactly when the grammar can end here; the matcher is then terminated.
        A terminated matcher accepts nothing.
        """

    def validate(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` are legal in sequence.

        This method does not change the matcher state.  Lists longer than
        ``max_rollback`` are checked on a :meth:`fork`.
        """
        tokens = list(tokens)
        matcher = self.fork() if len(tokens) > self.max_rollback else self
        n = 0
        for token in tokens:
            if not matcher.accept(int(token)):
                break
            n += 1
        if n and matcher is self:
            self.rollback(n)
        return n

    @abstractmethod
    def rollback(self, n: int) -> None:
        """Undo the last ``n`` accepted tokens (``n <= max_rollback``).

        Changes state.  Rolling back a stop token un-terminates the matcher.
        """

    @abstractmethod
    def fill_mask(self, bitmask: torch.Tensor, row: int = 0) -> None:
        """Write the legal next tokens into ``bitmask[row]``.

        ``bitmask``: int32 ``[rows, ceil(vocab_size / 32)]``.  This method does
        not change the matcher state.  Raises :class:`GrammarError` when the
        matcher is terminated (a terminated grammar has no next token).
        """

    @classmethod
    def fill_masks(cls, matchers: Sequence[Matcher], bitmask: torch.Tensor, rows: Sequence[int]) -> None:
        """Write ``matchers[i]``'s legal next tokens into ``bitmask[rows[i]]``, for matchers of this class.

        One call for many requests (a batch's root masks).  This default fills
        them one by one; a backend with a batched call overrides it (xgrammar:
        ``BatchGrammarMatcher``).  Does not change any matcher's state.  Use
        :func:`fill_masks` for matchers of mixed classes.
        """
        for matcher, row in zip(matchers, rows, strict=True):
            matcher.fill_mask(bitmask, row)

    @abstractmethod
    def forced_text(self) -> str:
        """The text the grammar forces next, whatever the model does ("" if none).

        This method does not change the matcher state.
        """

    @abstractmethod
    def is_terminated(self) -> bool:
        """Whether a stop token was accepted.  Does not change state."""

    @abstractmethod
    def reset(self) -> None:
        """Return to the initial state.  Changes state."""

    @abstractmethod
    def fork(self) -> Matcher:
        """An independent copy of this matcher in its current state."""

    def allowed_tokens(self) -> torch.Tensor:
        """The legal next token ids as a 1-D int64 tensor (empty when terminated).

        Convenience for tests and proposers; does not change state.
        """
        if self.is_terminated():
            return torch.empty(0, dtype=torch.long, device="cpu")
        mask = allocate_bitmask(1, self.vocab_size)
        self.fill_mask(mask, 0)
        return bitmask_to_ids(mask[0], self.vocab_size)


def fill_masks(matchers: Sequence[Matcher], bitmask: torch.Tensor, rows: Sequence[int]) -> None:
    """Write ``matchers[i]``'s legal next tokens into ``bitmask[rows[i]]``: one :meth:`Matcher.fill_masks` per class.

    Does not change any matcher's state.  Raises :class:`GrammarError` as
    :meth:`Matcher.fill_mask` does (a terminated matcher, a bad bitmask).
    """
    if len(matchers) != len(rows):
        raise ValueError(f"fill_masks got {len(matchers)} matchers for {len(rows)} rows: pass one row per matcher")
    groups: dict[type, tuple[list[Matcher], list[int]]] = {}
    for matcher, row in zip(matchers, rows):
        group = groups.setdefault(type(matcher), ([], []))
        group[0].append(matcher)
        group[1].append(row)
    for cls, (members, where) in groups.items():
        if issubclass(cls, Matcher):
            cls.fill_masks(members, bitmask, where)
        else:  # a duck-typed matcher (a wrapper, a test spy): its own fill_mask, row by row
            for matcher, row in zip(members, where):
                matcher.fill_mask(bitmask, row)


def bitmask_to_ids(row: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Token ids whose bit is set in one bitmask row (``[ceil(V/32)]`` int32)."""
    bits = torch.arange(32, dtype=torch.int32, device=row.device)
    expanded = (row.unsqueeze(-1) >> bits) & 1  # [words, 32]
    ids = torch.nonzero(expanded.reshape(-1), as_tuple=False).squeeze(-1)
    return ids[ids < vocab_size]


class CompiledGrammar(ABC):
    """An immutable compiled grammar; makes per-request matchers."""

    backend: str
    vocab_size: int
    #: Tokens that end generation once the grammar is complete (the first is the EOS).
    stop_token_ids: tuple[int, ...]
    #: Why this backend was used ("requested", or what ``backend="auto"`` found).
    backend_reason: str = "requested"
    #: Schema features this backend compiled but does not enforce (see grammars.capabilities).
    unenforced: tuple[str, ...] = ()

    def __init__(self, vocab_size: int, stop_token_ids: Sequence[int]) -> None:
        """A backend's grammar over the logits width ``vocab_size`` and its ``stop_token_ids``."""
        self.vocab_size = int(vocab_size)
        self.stop_token_ids = tuple(int(t) for t in stop_token_ids)

    @abstractmethod
    def matcher(self, max_rollback: int = 64) -> Matcher:
        """A fresh matcher in the initial state that can roll back ``max_rollback`` tokens."""
