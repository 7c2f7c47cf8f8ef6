"""Several proposers as one: the forced span first, then the best continuation.

One target pass verifies a whole draft, so a draft should cover as much as
possible: jump-forward's forced span (keys and punctuation the grammar
dictates) followed by a guess for what comes after it.  The followers are
asked to continue *after* the forced tokens -- their context includes them
and their grammar view has been advanced over them -- so the forced span and
the guess go to the target together.

Choice among the followers: the draft with the most expected accepted
tokens, from the follower's record in this request for that kind of draft
(a :class:`proposers.track.Calibration` per follower and ``Draft.kind``: a value
copied from the prompt and a guessed enum value succeed at very different
rates; with equal records, the longest, the first on ties).  Where the chosen
draft stops short of the budget (a value copied by prompt lookup ends), the
other followers are asked once more, after it, and the best of them worth
verifying goes on (the next key, from the schema).  Without a forced span,
a draft expected to bring fewer than ``min_expected`` tokens is not worth a
wider verification pass and is held back (probed now and then); with a
forced span the step verifies a draft anyway, so the follower rides along.
A draft model, if present, is asked only when the cheap ones offer fewer
than ``short`` tokens, and used when it offers more.

The seam: the forced span was split into tokens on its own, and its last
token may merge with the text after it (``"}}`` + ``,{"`` is split ``"}``
``},`` ``{"``).  A draft of text (anything but a draft model's tokens) is
therefore split again as one text (:func:`proposers.text.continuation_tokens`),
then the way the target was seen to split such text in this request
(:class:`proposers.text.SplitPreferences`); what was accepted is shared out by bytes.
Without a continuation, jump-forward's own rule drops an ambiguous last
token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .base import EMPTY_DRAFT, Draft, ForcedSpanDrafter, GrammarView, ModelDrafter, Proposer, Request
from .cost import PassCost
from .jump_forward import trim_ambiguous
from .text import SplitPreferences, TokenText, continuation_tokens, token_sources, token_text
from .track import Calibration, HoldBack

__all__ = ["CompositeProposer", "concat_drafts", "is_model_proposer"]


def is_model_proposer(proposer: Proposer) -> bool:
    """Whether ``proposer`` runs a draft model (expensive: asked only as a fallback).

    A drafter says so with a true ``runs_model`` attribute (:class:`proposers.base.ModelDrafter`;
    the draft-model drafter lives with the model runtime, this package never imports it).
    """
    return isinstance(proposer, ModelDrafter) and bool(proposer.runs_model)


def concat_drafts(first: Draft, second: Draft) -> Draft:
    """``first`` then ``second`` as one draft.

    If either part was sampled (``probs`` not ``None``), the deterministic
    part gets one-hot rows -- a point mass, which is what a deterministic
    draft means to the verifier.  Sources are kept per token.
    """
    if not first:
        return second
    if not second:
        return first
    probs = None
    if first.probs is not None or second.probs is not None:
        like = first.probs if first.probs is not None else second.probs
        assert like is not None
        probs = torch.cat([_rows(first, like), _rows(second, like)])  # [len(first) + len(second), V]
    sources = (first.sources or ("",) * len(first)) + (second.sources or ("",) * len(second))
    confidence = None  # a part without estimates gets -1 per token: no estimate (grammarspec.policy.allocation)
    if first.confidence is not None or second.confidence is not None:
        confidence = (first.confidence or (-1.0,) * len(first)) + (second.confidence or (-1.0,) * len(second))
    return Draft(
        tokens=first.tokens + second.tokens, probs=probs, sources=sources, kind=first.kind, confidence=confidence
    )


def _rows(draft: Draft, like: torch.Tensor) -> torch.Tensor:
    """``draft.probs`` ``[n, V]``, or one-hot rows for a deterministic draft (on ``like``'s device and dtype)."""
    if draft.probs is not None:
        return draft.probs
    rows = torch.zeros(len(draft), like.shape[-1], dtype=like.dtype, device=like.device)  # [n, V]
    tokens = torch.tensor(draft.tokens, dtype=torch.long, device=like.device)
    rows[torch.arange(len(draft), device=like.device), tokens] = 1.0
    return rows


class CompositeProposer:
    """Jump-forward first, then the best follower continues after the forced span.

    ``proposers``: any mix; the drafters of the forced span
    (:class:`proposers.base.ForcedSpanDrafter`: jump-forward) lead, draft
    models (:class:`proposers.base.ModelDrafter`) are the fallback, the rest
    are the cheap followers, tried in the given order.
    ``short``: the draft model is asked only when the best cheap draft is
    shorter than this.  ``min_expected``: the fewest expected accepted tokens
    for which a cheap draft alone is verified, or continues another; ``None``
    (the default): what a pass of ``typical_rows`` rows costs beyond a plain
    step (``cost_model.break_even(typical_rows)``: 0.6 with the prior, the
    value tuned on replayed benchmark outputs; lower where extra rows are
    cheap, as on a GPU).
    ``cost_model``: the :class:`proposers.cost.PassCost` of the target,
    exposed as :attr:`cost_model`, read only.  ``None``: the prior until the
    loop hands over the target's profiled curve (:meth:`use_cost_model`);
    one given here is kept.
    ``splits``: the learned splits of this request; the composite owns them
    (starts them and teaches them, from its own drafts, once per
    :meth:`commit`), and members built with the same object only read them.
    ``None``: a fresh one, not shared.
    """

    def __init__(
        self,
        proposers: Sequence[Proposer],
        *,
        name: str = "composite",
        short: int = 2,
        min_expected: float | None = None,
        splits: SplitPreferences | None = None,
        cost_model: PassCost | None = None,
        typical_rows: int = 10,
    ) -> None:
        if not proposers:
            raise ValueError("CompositeProposer needs at least one proposer")
        self.name = name
        self.short = short
        self.min_expected = min_expected
        # Never taught measured times: a hold-back threshold that followed the wall clock would make the
        # drafts, and so the target passes, depend on machine load.
        self.cost_model = cost_model if cost_model is not None else PassCost()
        self._cost_given = cost_model is not None
        self.typical_rows = typical_rows
        self.proposers = list(proposers)
        self.leaders: list[ForcedSpanDrafter] = [p for p in self.proposers if isinstance(p, ForcedSpanDrafter)]
        self.fallbacks = [p for p in self.proposers if is_model_proposer(p)]
        self.followers = [p for p in self.proposers if p not in self.leaders and p not in self.fallbacks]
        self._tokenizer: Any = None
        self.splits = splits if splits is not None else SplitPreferences()
        # per (follower id, draft kind), for this request: its survival record and when a held-back draft probes
        self._tracks: dict[tuple[int, str], tuple[Calibration, HoldBack]] = {}
        # The last draft's parts: (proposer, its draft, first byte, bytes per token).
        self._parts: list[tuple[Proposer, Draft, int, list[int]]] = []
        self._token_bytes: list[int] = []  # bytes of each token of the last draft

    def use_cost_model(self, cost: PassCost) -> None:
        """Size the hold-back threshold and the tracks by ``cost``, unless built with a model.  Changes state."""
        if not self._cost_given:
            self.cost_model = cost
            self._tracks = {}

    def start(self, request: Request) -> None:
        """Start every member for the new request."""
        self._tokenizer = request.tokenizer
        self.splits.start(request.tokenizer, request.prompt_ids)
        for proposer in self.proposers:
            proposer.start(request)
        self._tracks = {}
        self._parts, self._token_bytes = [], []

    def propose(self, context: Sequence[int], grammar: GrammarView | None, k: int) -> Draft:
        """Forced span, then the chosen follower's draft after it.  Does not change the grammar state."""
        self._parts, self._token_bytes = [], []
        if k <= 0:
            return EMPTY_DRAFT
        # 1. The forced span.
        lead, leader = EMPTY_DRAFT, None
        for candidate in self.leaders:
            lead = candidate.forced(context, grammar, k)
            if lead:
                leader = candidate
                break
        # 2. The followers continue after it, on a grammar view advanced over it.
        rest = k - len(lead)
        view, ctx = grammar, context
        if lead and rest > 0:
            ctx = list(context) + list(lead.tokens)
            view = _advanced(grammar, lead.tokens)
            if grammar is not None and view is None:
                rest = 0
        follow, follower = EMPTY_DRAFT, None
        if rest > 0:
            drafts = [p.propose(ctx, view, rest).truncate(rest) for p in self.followers]
            best = self._best(drafts, self.followers)
            if best >= 0 and (lead or self._worth_verifying(self.followers[best], drafts[best])):
                follow, follower = drafts[best], self.followers[best]
            if len(follow) < self.short:
                for fallback in self.fallbacks:
                    draft = fallback.propose(ctx, view, rest)
                    if len(draft) > len(follow):
                        follow, follower = draft.truncate(rest), fallback
                    break
        follows = [(follower, follow)] if follower is not None and follow else []
        # 2b. Where the chosen draft stops short, another follower may go on after it.
        if follows and follower in self.followers and 0 < len(follow) < rest and follow.probs is None:
            follows += self._continuation(ctx, view, follower, follow, rest - len(follow))
        # 3. Join them, re-splitting the seams when every part is deterministic.
        draft = self._join(context, grammar, k, (leader, lead), follows)
        self.splits.remember(context, draft.tokens)
        return draft

    def _continuation(
        self, context: Sequence[int], grammar: GrammarView | None, first: Proposer, draft: Draft, rest: int
    ) -> list[tuple[Proposer, Draft]]:
        """The best draft of the other followers after ``draft`` (one more round), if worth verifying."""
        others = [p for p in self.followers if p is not first]
        if not others:
            return []
        view = _advanced(grammar, draft.tokens)
        if grammar is not None and view is None:
            return []
        ctx = list(context) + list(draft.tokens)
        drafts = [p.propose(ctx, view, rest).truncate(rest) for p in others]
        drafts = [d if d.probs is None else EMPTY_DRAFT for d in drafts]  # only deterministic parts are joined
        best = self._best(drafts, others, gated=True)
        return [(others[best], drafts[best])] if best >= 0 else []

    def _track(self, proposer: Proposer, draft: Draft) -> tuple[Calibration, HoldBack]:
        """The record of ``proposer``'s drafts of the same kind as ``draft``, and its hold-back schedule.

        The record starts at even odds and follows recent drafts closely: it only
        screens drafts; the loop's allocation, from the row's own record, decides
        how much of a draft is verified.
        """
        key = (id(proposer), draft.kind)
        track = self._tracks.get(key)
        if track is None:
            track = self._tracks[key] = (Calibration(decay=0.8, prior_fade=0.8, default_open=0.5), HoldBack())
        return track

    def _best(self, drafts: Sequence[Draft], proposers: Sequence[Proposer], gated: bool = False) -> int:
        """Index of the draft with the most expected accepted tokens (the longest on ties), -1 if none.

        ``drafts[i]`` comes from ``proposers[i]``; ``gated``: a draft not worth its pass
        (:meth:`_worth`) is passed over.
        """
        best, key = -1, (0.0, 0)
        for i, draft in enumerate(drafts):
            if not draft:
                continue
            record, _ = self._track(proposers[i], draft)
            candidate = (record.expected(draft), len(draft))
            if candidate > key and (not gated or self._worth(record, draft)):
                best, key = i, candidate
        return best

    def _worth_verifying(self, proposer: Proposer, draft: Draft) -> bool:
        record, hold = self._track(proposer, draft)
        return self._worth(record, draft) or hold.admit()

    def _worth(self, record: Calibration, draft: Draft) -> bool:
        """Whether ``draft``'s expected accepted tokens reach the bar (:meth:`_floor`)."""
        return len(draft) > 0 and record.expected(draft) >= self._floor()

    def _floor(self) -> float:
        """The fewest expected accepted tokens worth a pass (see ``min_expected``)."""
        return self.min_expected if self.min_expected is not None else self.cost_model.break_even(self.typical_rows)

    def _join(
        self,
        context: Sequence[int],
        grammar: GrammarView | None,
        k: int,
        lead_part: tuple[Proposer | None, Draft],
        follow_parts: list[tuple[Proposer, Draft]],
    ) -> Draft:
        leader, lead = lead_part
        draft = lead
        for _, follow in follow_parts:
            draft = concat_drafts(draft, follow)
        helper = token_text(self._tokenizer) if self._tokenizer is not None else None
        if helper is None:
            return draft
        parts = [(p, d) for p, d in [(leader, lead), *follow_parts] if p is not None and d]
        if draft and draft.probs is None and not any(p in self.fallbacks for p, _ in follow_parts):
            joined = self._resplit(context, grammar, k, draft, helper)  # a model's own tokens stay
            if joined is not None:
                draft = joined
        forced = grammar.forced_text() if lead and grammar is not None and not follow_parts else ""
        if forced and grammar is not None and helper.bytes_of(draft.tokens) == forced.encode("utf-8"):  # whole span
            keep = trim_ambiguous(self._tokenizer, context, forced, draft.tokens, grammar, self.splits)
            if keep < len(draft):
                draft = draft.truncate(keep)
                lead = lead.truncate(
                    _tokens_within(
                        [len(helper.vocab_bytes[t]) for t in lead.tokens], len(helper.bytes_of(draft.tokens))
                    )
                )
                parts = [(leader, lead)] if lead and leader is not None else []
        offset = 0
        for proposer, part in parts:
            sizes = [len(helper.vocab_bytes[t]) for t in part.tokens]
            self._parts.append((proposer, part, offset, sizes))
            offset += sum(sizes)
        self._token_bytes = [len(helper.vocab_bytes[t]) for t in draft.tokens]
        return draft if draft else EMPTY_DRAFT

    def _resplit(
        self, context: Sequence[int], grammar: GrammarView | None, k: int, draft: Draft, helper: TokenText
    ) -> Draft | None:
        """``draft`` split again as one text: canonically, then as the target was seen to split it.

        ``None`` if that changes nothing or is illegal.
        """
        data = helper.bytes_of(draft.tokens)
        try:
            tokens = continuation_tokens(self._tokenizer, context, data.decode("utf-8"))
        except UnicodeDecodeError:
            return None
        tokens = self.splits.resplit(context, tokens)[:k]
        if not tokens or tuple(tokens) == draft.tokens:
            return None
        if grammar is not None:
            tokens = tokens[: grammar.validate(tokens)]
        if not tokens:
            return None
        # Each token's source: the part holding its first byte.
        segments, offset = [], 0
        for token, source in zip(draft.tokens, draft.sources):
            offset += len(helper.vocab_bytes[token])
            segments.append((source, offset))
        return Draft(tokens=tuple(tokens), sources=tuple(token_sources(tokens, helper.vocab_bytes, segments)))

    def commit(self, draft: Draft, num_accepted: int, committed: Sequence[int]) -> None:
        """Share out ``num_accepted`` by bytes over the parts of the last draft and commit every member.

        ``draft`` may be a prefix of the last draft (the loop cuts drafts).
        A member whose part reached the target gets that part and its share
        of the accepted tokens; every other member gets ``EMPTY_DRAFT, 0``.
        All of them get ``committed``; the learned splits learn from it once.
        Changes state.
        """
        self.splits.commit(committed)
        shown = sum(self._token_bytes[: len(draft)])
        accepted = sum(self._token_bytes[: min(num_accepted, len(draft))])
        reports: dict[int, tuple[Draft, int]] = {}
        for proposer, part, start, sizes in self._parts:
            n_shown = _tokens_within(sizes, shown - start)
            if n_shown:
                n_accepted = _tokens_within(sizes, accepted - start)
                reports[id(proposer)] = (part.truncate(n_shown), n_accepted)
                if proposer in self.followers:
                    record, hold = self._track(proposer, part)
                    record.update(part.truncate(n_shown), n_accepted)
                    hold.verified(n_accepted > 0)
        for proposer in self.proposers:
            part, n_accepted = reports.get(id(proposer), (EMPTY_DRAFT, 0))
            proposer.commit(part, n_accepted, committed)
        self._parts, self._token_bytes = [], []


def _advanced(grammar: GrammarView | None, tokens: Sequence[int]) -> GrammarView | None:
    """A view of ``grammar`` after ``tokens``; ``None`` if there is no grammar, or none is left after them."""
    if grammar is None:
        return None
    matcher = grammar.fork()
    if not all(matcher.accept(token) for token in tokens) or matcher.is_terminated():
        return None
    return GrammarView(matcher)


def _tokens_within(sizes: list[int], budget: int) -> int:
    """How many leading tokens (of ``sizes`` bytes each) fit entirely in ``budget`` bytes."""
    n, used = 0, 0
    for size in sizes:
        if used + size > budget:
            break
        used += size
        n += 1
    return n
