"""The planner of the schema-aware drafter: candidate segments -> one legal draft.

A draft is planned in rounds: rank the candidate segments for the current
position (:func:`proposers.schema_sources.candidates`), keep the first whose
tokens the grammar accepts (``GrammarView.validate``), advance a copy of the
cursor over it, repeat until the text holds more than ``k`` tokens (so the
last kept token is followed by text and split canonically).  Candidates rank
by their source's score (its token acceptance in this request) times their
rank within the source.  Text becomes tokens in the tokenizer's canonical
split, then re-split where the target was seen to split the same text
otherwise (:class:`proposers.text.SplitPreferences`).

Nothing here changes the document, the grammar or the learned splits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from .base import GrammarView
from .json_cursor import DONE, ERROR, advance
from .json_document import Document
from .schema_sources import Candidate, candidates
from .text import SplitPreferences, continuation_tokens, token_sources, token_text

__all__ = ["Drafter", "plan", "ranked", "check_candidate", "MAX_ROUNDS"]

MAX_ROUNDS = 16


class Drafter(Protocol):
    """The drafter a plan is made for (:class:`proposers.schema_ngram.SchemaNgramProposer`): its settings,
    learned splits and source scores."""

    #: What the tokens of a draft without segments are named.
    name: str
    #: How many candidates are tried per round, at most.
    max_candidates: int
    #: Candidates scoring lower are not tried (unless certain).
    min_score: float
    #: The target's own splits of text, where they differ from the canonical one.
    splits: SplitPreferences

    def score(self, source: str) -> float:
        """The source's expected token acceptance."""
        ...


def plan(
    context: Sequence[int], grammar: GrammarView | None, k: int, doc: Document, tokenizer: Any, drafter: Drafter
) -> tuple[list[int], list[str]]:
    """Up to ``k`` tokens after ``context`` (whose generated part ``doc`` holds), and each token's source.

    Candidates rank by ``drafter.score(source)`` times their rank within the source; those scoring below
    ``drafter.min_score`` are not tried (unless certain), and at most ``drafter.max_candidates`` are tried per
    round.  Does not change state.
    """
    cursor, text, segments = doc.cursor, b"", []  # segments: (source, end byte in text)
    prompt_cursor = doc.prompt_cursor
    tokens: list[int] = []
    for _ in range(MAX_ROUNDS):
        chosen: tuple[Candidate, list[int]] | None = None
        partial: tuple[Candidate, list[int]] | None = None
        cands = candidates(cursor, doc, text, prompt_cursor)
        for cand in ranked(cands, drafter.score, drafter.max_candidates, drafter.min_score):
            found = check_candidate(tokenizer, context, grammar, k, text, cand, len(tokens))
            if found is None:
                continue
            cand, cand_tokens, complete = found
            if complete:
                chosen = (cand, cand_tokens)
                break
            if partial is None or len(cand_tokens) > len(partial[1]):
                partial = (cand, cand_tokens)
        picked = chosen if chosen is not None else partial
        if picked is None:
            break
        cand, tokens = picked
        text += cand.data
        segments.append((cand.source, len(text)))
        if cand.prompt_end >= 0:
            prompt_cursor = cand.prompt_end
        if chosen is None or len(tokens) > k:
            break
        cursor = advance(cursor, cand.data, doc.schema)
        if cursor.mode in (DONE, ERROR):
            break
    if tokens:
        # The target's own way of splitting this text, where it was seen to differ.
        tokens = drafter.splits.resplit(context, tokens)[:k]
        if grammar is not None:
            tokens = tokens[: grammar.validate(tokens)]
    return tokens[:k], token_sources(tokens[:k], doc.token_bytes, segments, drafter.name)


def ranked(
    cands: Sequence[Candidate], score: Callable[[str], float], max_candidates: int, min_score: float
) -> list[Candidate]:
    """The candidates worth trying, best first: source score times rank, at least ``min_score``.

    Certain candidates stay whatever their score; ties keep the given order.  Pure.

    Worked example (every source scores 0.5)::

        ranked([Candidate("a", b"x", 0.05), Candidate("b", b"y"), Candidate("c", b"z", 0.05, certain=True)],
               lambda source: 0.5, max_candidates=6, min_score=0.05)
        -> [Candidate("b", b"y"), Candidate("c", b"z", 0.05, certain=True)]    ('a' scores 0.025)
    """
    scored = [(score(cand.source) * cand.weight, i, cand) for i, cand in enumerate(cands)]
    scored.sort(key=lambda entry: (-entry[0], entry[1]))
    kept = [cand for value, _, cand in scored if value >= min_score or cand.certain]
    return kept[:max_candidates]


def check_candidate(
    tokenizer: Any,
    context: Sequence[int],
    grammar: GrammarView | None,
    k: int,
    text: bytes,
    cand: Candidate,
    have: int,
) -> tuple[Candidate, list[int], bool] | None:
    """Tokenise ``text + cand``: ``(cand, tokens, all legal)`` or ``None`` if it adds nothing legal.

    Only the first ``k + 1`` tokens are validated (the rest are dropped anyway).
    """
    tokens = _tokens(tokenizer, context, text + cand.data)
    if not tokens:
        return None
    limit = min(len(tokens), k + 1)
    legal = grammar.validate(tokens[:limit]) if grammar is not None else limit
    if legal == limit:
        return cand, tokens, True
    if cand.closes_string and legal > have and grammar is not None:
        # The grammar ended the string earlier (pattern, format, maxLength):
        # close it where the legal part ends.
        legal_bytes = len(token_text(tokenizer).bytes_of(tokens[:legal])) - len(text)
        least = 2 if cand.data[:1] == b'"' else 1  # keep the opening quote and some content
        for cut in (legal_bytes, legal_bytes - 1):
            if least <= cut < len(cand.data) - 1:
                shorter = Candidate(cand.source, cand.data[:cut] + b'"', cand.weight, -1, True)
                retry = _tokens(tokenizer, context, text + shorter.data)
                n = min(len(retry), k + 1)
                if retry and grammar.validate(retry[:n]) == n:
                    return shorter, retry, True
    if legal > have:
        return cand, tokens[:legal], False
    return None


def _tokens(tokenizer: Any, context: Sequence[int], data: bytes) -> list[int]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return []
    return continuation_tokens(tokenizer, context, text)
