"""Prompt lookup: propose what followed the longest earlier match of the context's suffix.

Extraction and tool calls copy long spans of the prompt into the answer; once
the answer has started a copied span, the tokens that followed it in the
prompt are an excellent guess (Saxena's "prompt lookup decoding", vLLM's
n-gram proposer).  The search runs over the prompt and the tokens generated
so far.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from .base import EMPTY_DRAFT, Draft, GrammarView, Request

__all__ = ["PromptLookupProposer", "find_ngram_continuation", "find_ngram_match"]


def find_ngram_continuation(tokens: Sequence[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Up to ``k`` tokens that followed the longest earlier match of the suffix.

    Tries suffix lengths ``n = max_n .. min_n`` (longest first); for the first
    ``n`` whose last ``n`` tokens occur earlier in ``tokens``, returns the
    tokens that followed the most recent such occurrence (the suffix itself
    does not count).  ``[]`` when nothing matches.

    Worked example::

        tokens = [1, 2, 3, 4, 1, 2, 3, 9, 9, 1, 2]   min_n=1, max_n=3, k=3
        n=3: suffix [9, 1, 2] occurs nowhere earlier
        n=2: suffix [1, 2] occurs at 0 and at 4; the most recent is 4
        -> what followed it: tokens[6:9] = [3, 9, 9]

    Pure function.
    """
    match = find_ngram_match(tokens, min_n, max_n)
    if match is None or k <= 0:
        return []
    return _copy(tokens, match[1], k)


def find_ngram_match(tokens: Sequence[int], min_n: int, max_n: int) -> tuple[int, int] | None:
    """``(n, start)``: the longest suffix length ``n`` that occurs earlier, and where its continuation starts.

    The most recent occurrence wins; ``None`` when nothing matches.  In the
    example of :func:`find_ngram_continuation` the answer is ``(2, 6)``.  Pure.
    """
    length = len(tokens)
    if min_n < 1 or max_n < min_n or length < min_n + 1:
        return None
    # Search in the raw bytes of a 4-byte array: bytes.rfind runs in C; hits
    # that do not start on a token boundary are skipped.
    data = array("i", tokens).tobytes()
    width = array("i").itemsize
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        pattern = data[(length - n) * width :]
        end = (length - 1) * width  # an occurrence must end before the last token
        while True:
            pos = data.rfind(pattern, 0, end)
            if pos < 0:
                break
            if pos % width == 0:
                return n, pos // width + n
            end = pos + len(pattern) - 1
    return None


def _copy(tokens: Sequence[int], start: int, k: int) -> list[int]:
    """``k`` tokens from ``start`` on, continuing into the copy itself past the end (LZ77)."""
    out = list(tokens[start : start + k])
    period = len(tokens) - start
    while len(out) < k:
        out.append(out[len(out) - period] if len(out) >= period else tokens[start + len(out)])
    return out


class PromptLookupProposer:
    """Longest-suffix n-gram lookup over the prompt and the generated tokens.

    ``min_n``/``max_n``: the suffix lengths tried (longest first).  The caller
    chooses ``k``.  Deterministic drafts (``probs=None``).  A draft's ``kind``
    is its match length (``"n2"`` .. ``"n4"``; longer counts as 4): a longer
    match is a safer guess, and the composite keeps a record per kind.
    """

    def __init__(self, min_n: int = 2, max_n: int = 5, *, name: str = "prompt_lookup") -> None:
        if min_n < 1 or max_n < min_n:
            raise ValueError(f"PromptLookupProposer needs 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.min_n = min_n
        self.max_n = max_n
        self.name = name

    def start(self, request: Request) -> None:
        """Nothing to reset: the search runs over the context each time."""

    def propose(self, context: Sequence[int], grammar: GrammarView | None, k: int) -> Draft:
        """Up to ``k`` tokens, cut at the first one the grammar rejects.  Does not change state."""
        match = find_ngram_match(context, self.min_n, self.max_n) if k > 0 else None
        if match is None:
            return EMPTY_DRAFT
        n, start = match
        tokens = _copy(context, start, k)
        if grammar is not None:
            tokens = tokens[: grammar.validate(tokens)]
        if not tokens:
            return EMPTY_DRAFT
        # Its estimate: a match of n tokens is right about n times in n + 1 (calibrated by the policy).
        return Draft(
            tokens=tuple(tokens),
            sources=(self.name,) * len(tokens),
            kind=f"n{min(n, 4)}",
            confidence=(n / (n + 1),) * len(tokens),
        )

    def commit(self, draft: Draft, num_accepted: int, committed: Sequence[int]) -> None:
        """Stateless: nothing to learn."""
