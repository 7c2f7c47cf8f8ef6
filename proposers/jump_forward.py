"""Jump-forward: propose the text the grammar forces next.

After ``{"name":`` a schema may force ``"`` or a whole run of keys and
punctuation.  A mask that allows exactly one token is rare (about 1% of
steps: a forced text has many tokenisations, all legal), so committing forced
text directly would inject a split the model might never produce and change
the output distribution.  Instead the forced text is proposed as a
deterministic draft in the tokenizer's canonical split and verified by the
target like any other draft: a split the model disagrees with is rejected,
never injected.

The forced text ends where the grammar has a choice, and the text chosen
there may merge with the last forced token (forced ``"}}`` then ``,{`` is
split ``"}`` ``},`` ``{"``).  When a legal next character would re-split
the last forced token, that token is left out (:func:`trim_ambiguous`);
:class:`~proposers.compose.CompositeProposer` instead re-splits the forced
text together with the continuation it drafts after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grammars.base import allocate_bitmask

from .base import EMPTY_DRAFT, Draft, GrammarView, Request
from .text import SplitPreferences, continuation_tokens, token_text

__all__ = ["JumpForwardProposer", "forced_tokens", "forced_limit", "trim_ambiguous", "PROBES"]


def forced_tokens(
    tokenizer: Any, context: Sequence[int], forced: str, grammar: GrammarView | None, k: int
) -> list[int]:
    """Canonical tokens of ``forced`` after ``context``, at most ``k``, cut at the first illegal one.

    Worked example (SmolLM2, a schema whose first key is ``name``)::

        forced = '{"name":"'   context = prompt
        -> ['{"', 'name', '":"']    (all legal: the grammar forced this text)

    Does not change the grammar state.
    """
    if not forced or k <= 0:
        return []
    tokens = continuation_tokens(tokenizer, context, forced[: forced_limit(k)])[:k]
    if tokens and grammar is not None:
        tokens = tokens[: grammar.validate(tokens)]
    return tokens


#: Characters of forced text split per drafted token at most: a draft of ``k`` tokens reads only the first
#: ``k * FORCED_CHARS_PER_TOKEN`` characters (no tokenizer's tokens are that long on average).
FORCED_CHARS_PER_TOKEN = 32


def forced_limit(k: int) -> int:
    """How many characters of forced text a draft of ``k`` tokens reads.  Pure."""
    return max(k, 1) * FORCED_CHARS_PER_TOKEN


#: Likely first characters after a forced span (JSON structure, a letter, a digit, a space).
PROBES = (",", "}", "]", '"', ":", "a", "1", " ", "{", "[")


def trim_ambiguous(
    tokenizer: Any,
    context: Sequence[int],
    text: str,
    tokens: Sequence[int],
    grammar: GrammarView,
    splits: SplitPreferences | None = None,
) -> int:
    """How many of ``text``'s forced ``tokens`` to keep: all but the last if it may re-split.

    The last forced token is left out when

    * a longer token that starts with its bytes is legal in its place (the
      model would write ``off`` where the grammar forces only ``o``), or
    * for a probe character the grammar allows after ``text``, the canonical
      split of ``text + probe`` (with the learned ``splits`` applied, when
      given) does not begin with ``tokens``.

    Worked example (SmolLM2)::

        text '"}}'   tokens ['"}}']
        probe ',': '"}},' splits as ['"}', '},'] -- not ['"}}', ...]
        -> keep 0 tokens

    Does not change the grammar state (works on a fork).
    """
    if not tokens:
        return 0
    tokens = list(tokens)
    longer = token_text(tokenizer).extensions(tokens[-1])
    if longer:
        matcher = grammar.fork()
        if all(matcher.accept(t) for t in tokens[:-1]) and not matcher.is_terminated():
            mask = allocate_bitmask(1, matcher.vocab_size)
            matcher.fill_mask(mask, 0)
            words = mask[0].tolist()
            if any(t < matcher.vocab_size and (words[t >> 5] >> (t & 31)) & 1 for t in longer):
                return len(tokens) - 1
    for probe in PROBES:
        split = continuation_tokens(tokenizer, context, text + probe)
        if splits is not None:
            split = splits.resplit(context, split)
        if split[: len(tokens)] == tokens:
            continue
        if split and grammar.validate(split) == len(split):  # a legal continuation re-splits the span
            return len(tokens) - 1
    return len(tokens)


class JumpForwardProposer:
    """Drafts the grammar's forced continuation (``GrammarView.forced_text``).

    The forced text is split canonically, then re-split where the target was
    seen to split the same text otherwise (:class:`~proposers.text.SplitPreferences`).
    ``splits``: learned splits owned by someone else (the composite, which
    teaches them at every commit from every draft remembered in them, this
    proposer's included); ``None``: its own, taught at its :meth:`commit`.
    """

    #: It drafts text: it cannot run without the request's tokenizer (:class:`proposers.base.TextDrafter`).
    needs_tokenizer = True

    def __init__(self, *, name: str = "jump_forward", splits: SplitPreferences | None = None) -> None:
        self.name = name
        self._tokenizer: Any = None
        self._owns_splits = splits is None
        self.splits = splits if splits is not None else SplitPreferences()

    def start(self, request: Request) -> None:
        """Remember the tokenizer; forget learned splits (its own ones).  Changes state."""
        self._tokenizer = request.tokenizer
        if self._owns_splits:
            self.splits.start(request.tokenizer, request.prompt_ids)

    def forced(self, context: Sequence[int], grammar: GrammarView | None, k: int) -> Draft:
        """The whole forced span in canonical tokens (at most ``k``), last token included.

        Does not change state (the composite uses this and splits the seam itself).
        """
        if grammar is None or self._tokenizer is None or grammar.is_terminated():
            return EMPTY_DRAFT
        tokens = forced_tokens(self._tokenizer, context, grammar.forced_text(), grammar, k)
        if not tokens:
            return EMPTY_DRAFT
        return Draft(tokens=tuple(tokens), sources=(self.name,) * len(tokens), confidence=(1.0,) * len(tokens))

    def propose(self, context: Sequence[int], grammar: GrammarView | None, k: int) -> Draft:
        """The forced span, split as the target splits it, without an ambiguous last token.

        Does not change the grammar state; remembers the draft in the learned splits (taught at commit).
        """
        splits = self.splits
        if k <= 0 or grammar is None or self._tokenizer is None or grammar.is_terminated():
            return EMPTY_DRAFT
        forced = grammar.forced_text()
        if not forced:
            return EMPTY_DRAFT
        cut = len(forced) > forced_limit(k)  # a long forced text (a long const): only its start is split
        if cut:
            forced = forced[: forced_limit(k)]
        tokens = continuation_tokens(self._tokenizer, context, forced)
        tokens = splits.resplit(context, tokens)
        whole = not cut and len(tokens) <= k
        tokens = tokens[:k]
        tokens = tokens[: grammar.validate(tokens)]
        if whole and tokens and token_text(self._tokenizer).bytes_of(tokens) == forced.encode("utf-8"):
            tokens = tokens[: trim_ambiguous(self._tokenizer, context, forced, tokens, grammar, splits)]
        splits.remember(context, tokens)
        if not tokens:
            return EMPTY_DRAFT
        return Draft(tokens=tuple(tokens), sources=(self.name,) * len(tokens), confidence=(1.0,) * len(tokens))

    def commit(self, draft: Draft, num_accepted: int, committed: Sequence[int]) -> None:
        """Learn from ``committed`` how the target split its draft (own splits only).  Changes state."""
        if self._owns_splits:
            self.splits.commit(committed)
