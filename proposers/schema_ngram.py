"""The schema-aware n-gram drafter: predictable JSON from the document, the prompt and the schema.

A JSON answer is full of text a cheap guesser can predict: keys, punctuation,
enum values, values copied from the prompt, the same keys in every array
item.  This proposer tracks where generation stands in the document (the
container stack, the key being filled, the schema node of the next value;
see :mod:`proposers.json_cursor`) and drafts from three kinds of source:

* **history** -- what followed the same position earlier in this document.
  Positions compare by path with array indices erased, so the second item of
  an array copies the first: after ``},{"`` comes the key that came after
  ``[{"``.  ``history`` covers keys and punctuation; ``history_value`` a
  value seen at the same path (weighted by how often values repeat there);
  ``sibling`` the value of the nearest earlier member of the same object and
  type (``"strength":10,"dexterity":10``).  ``past`` / ``past_value``: the
  same from the conversation's earlier documents (``Request.documents``: the
  last turns' tool calls and JSON answers).
* **prompt** -- spans of the prompt that fit the current value (see
  :mod:`proposers.prompt_spans`).  ``prompt``: once a string or number has
  started, the prompt text that continues it, up to a likely end and the
  closing quote (``document``: the same from an earlier value of this
  document).  At a value's start: ``prompt_label`` (after a label naming
  the key, ``Due date: ...``), ``prompt_next`` (after the latest copied
  value), ``prompt_near`` (a number just before it on the same line).
* **schema** -- the next declared property names, ``const``, a unique
  ``enum`` completion and the structure the schema implies (``schema``);
  ``enum``/``default``/``examples`` values and literals as guesses
  (``schema_guess``, ranked by where the prompt mentions them).

A draft is planned in rounds (:mod:`proposers.schema_plan`): rank the
candidate segments (:mod:`proposers.schema_sources`) for the current position,
keep the first the grammar accepts, advance a copy of the cursor over it,
repeat until more than ``k`` tokens.  Candidates rank by their source's token
acceptance in this request (a prior plus what
:meth:`SchemaNgramProposer.commit` reports) times their rank within the
source.  The document generated so far, with its undo log, is
:class:`proposers.json_document.Document`; this module only holds the state
of one request and the source scores.

All text here is bytes of JSON text: string contents stay JSON-escaped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .base import EMPTY_DRAFT, Draft, GrammarView, Request
from .json_cursor import DONE, ERROR
from .json_document import Document, Prompt, prompt_start
from .schema_nav import SchemaIndex
from .schema_plan import check_candidate, plan
from .schema_sources import candidates, follow_length
from .text import SplitPreferences, token_text

__all__ = ["SchemaNgramProposer", "SOURCE_PRIORS", "follow_length", "prompt_start"]

#: Token-acceptance rate assumed for each source before any commit reports on it.
SOURCE_PRIORS = {
    "history": 0.8,
    "schema": 0.8,
    "prompt": 0.7,
    "document": 0.5,
    "prompt_label": 0.45,
    "prompt_next": 0.4,
    "history_value": 0.35,
    "sibling": 0.3,
    "prompt_near": 0.3,
    "schema_guess": 0.3,
    "past": 0.6,
    "past_value": 0.3,
}
#: How many of the conversation's earlier documents (``Request.documents``, the latest) the history sources read.
MAX_PAST_DOCUMENTS = 4
_PRIOR_WEIGHT = 8.0  # pseudo-tokens behind each prior


class SchemaNgramProposer:
    """Drafts JSON from this document's history, the prompt and the schema.

    ``max_candidates``: how many candidates per round are tried against the
    grammar.  ``min_score``: candidates scoring lower (source acceptance
    times rank within the source) are not proposed.  A draft token pays when
    its acceptance chance exceeds its share of the verification cost: about
    0.05 when a pass over 16 tokens costs 1.7 plain steps.

    Deterministic drafts (``probs=None``).  Works without a schema (history
    and prompt only) and without a grammar (no validation); proposes nothing
    once the output is not JSON.  ``splits``: learned splits owned by someone
    else (the composite, which teaches them at every commit from every draft
    remembered in them, this proposer's included); ``None``: its own, taught
    at its :meth:`commit`.

    The document model holds the committed tokens: :meth:`commit` advances
    it.  A context that goes on past them (the composite drafts after a
    forced span) is fed for the plan and undone after it, so ``propose``
    must be given the committed tokens plus, possibly, more.
    """

    #: It drafts text: it cannot run without the request's tokenizer (:class:`proposers.base.TextDrafter`).
    needs_tokenizer = True

    def __init__(
        self,
        *,
        name: str = "schema_ngram",
        max_candidates: int = 6,
        min_score: float = 0.05,
        splits: SplitPreferences | None = None,
    ) -> None:
        self.name = name
        self.max_candidates = max_candidates
        self.min_score = min_score
        #: source -> [tokens proposed, tokens accepted] in this request.
        self.stats: dict[str, list[float]] = {}
        self._tokenizer: Any = None
        self._owns_splits = splits is None
        self.splits = splits if splits is not None else SplitPreferences()
        self._doc: Document | None = None
        self._prompt_len = 0
        self._last: tuple[tuple[int, ...], tuple[str, ...]] = ((), ())

    # -- protocol -------------------------------------------------------------

    def start(self, request: Request) -> None:
        """Reset for a new generation: read the prompt and index the schema."""
        self._tokenizer = request.tokenizer
        helper = token_text(request.tokenizer)
        prompt = Prompt.from_ids(request.prompt_ids, helper.vocab_bytes, helper.special_ids)
        self._doc = Document(SchemaIndex(request.schema), prompt, helper.vocab_bytes, helper.special_ids)
        recent = getattr(request, "documents", ())[-MAX_PAST_DOCUMENTS:]
        self._doc.past = tuple(Document.of_text(text) for text in reversed(recent))
        self._prompt_len = len(request.prompt_ids)
        self.stats = {source: [0.0, 0.0] for source in SOURCE_PRIORS}
        if self._owns_splits:
            self.splits.start(request.tokenizer, request.prompt_ids)
        self._last = ((), ())

    def propose(self, context: Sequence[int], grammar: GrammarView | None, k: int) -> Draft:
        """Up to ``k`` tokens of predicted JSON after ``context`` (the committed tokens, maybe more).

        Does not change the grammar state or the document (tokens past the
        committed ones are fed for the plan and undone); remembers the draft
        for :meth:`commit`.  Raises ``ValueError`` if ``context`` does not
        start with the prompt and the committed tokens.
        """
        doc = self._doc
        if doc is None or k <= 0 or len(context) < self._prompt_len:
            return EMPTY_DRAFT
        committed = len(doc.tokens)
        base = self._prompt_len + committed
        if list(context[self._prompt_len : base]) != doc.tokens:
            raise ValueError(
                f"{self.name}: the context does not extend the {committed} tokens committed so far; "
                "call commit() with every token appended before proposing again, or start() for a new generation"
            )
        doc.feed(context[base:])
        try:
            if doc.cursor.mode in (DONE, ERROR):
                return EMPTY_DRAFT
            tokens, sources = plan(context, grammar, k, doc, self._tokenizer, self)
        finally:
            doc.truncate(committed)  # the one place a speculative position is undone
        self.splits.remember(context, tokens)
        if not tokens:
            return EMPTY_DRAFT
        self._last = (tuple(tokens), tuple(sources))
        return Draft(tokens=tuple(tokens), sources=(self.name,) * len(tokens), kind=sources[0])

    def commit(self, draft: Draft, num_accepted: int, committed: Sequence[int]) -> None:
        """Advance the document by ``committed``; credit each source of ``draft`` (it may be a prefix).

        Changes state.  A ``draft`` that is not (a prefix of) its last one credits nothing.
        """
        if self._doc is not None:
            self._doc.feed(committed)
        if self._owns_splits:
            self.splits.commit(committed)
        tokens, sources = self._last
        if not draft.tokens or tokens[: len(draft.tokens)] != draft.tokens:
            return
        for i, source in enumerate(sources[: len(draft.tokens)]):
            entry = self.stats.setdefault(source, [0.0, 0.0])
            entry[0] += 1
            entry[1] += i < num_accepted
        self._last = ((), ())

    def score(self, source: str) -> float:
        """Expected acceptance of ``source``'s tokens: its prior updated by this request's commits."""
        proposed, accepted = self.stats.get(source, (0.0, 0.0))
        prior = SOURCE_PRIORS.get(source, 0.3)
        return (prior * _PRIOR_WEIGHT + accepted) / (_PRIOR_WEIGHT + proposed)

    def alternatives(self, context: Sequence[int], grammar: GrammarView, k: int, n: int = 3) -> list[list[int]]:
        """Up to ``n`` legal token lists, one per top-ranked candidate for the text after ``context``.

        Token trees branch with these (:mod:`proposers.tree`): each is one
        candidate segment (an earlier item's value, a prompt span, an enum value,
        a key...) split canonically, cut at its first illegal token and at ``k``
        tokens; the best-ranked first, every candidate considered (no score floor:
        a tree verifies alternatives a chain would not bet on).  Does not change
        state: tokens past the committed ones are fed and undone, nothing is
        remembered for :meth:`commit`.
        """
        doc = self._doc
        if doc is None or k <= 0 or len(context) < self._prompt_len:
            return []
        committed = len(doc.tokens)
        base = self._prompt_len + committed
        if list(context[self._prompt_len : base]) != doc.tokens:
            return []
        doc.feed(context[base:])
        try:
            if doc.cursor.mode in (DONE, ERROR):
                return []
            cands = candidates(doc.cursor, doc, b"", doc.prompt_cursor)
            order = sorted(range(len(cands)), key=lambda i: (-self.score(cands[i].source) * cands[i].weight, i))
            out: list[list[int]] = []
            for i in order:
                found = check_candidate(self._tokenizer, context, grammar, k, b"", cands[i], 0)
                if found is None:
                    continue
                tokens = found[1][:k]
                tokens = tokens[: grammar.validate(tokens)]
                if tokens and tokens not in out:
                    out.append(tokens)
                if len(out) >= n:
                    break
            return out
        finally:
            doc.truncate(committed)
