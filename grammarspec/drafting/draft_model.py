"""A small draft model (``assistant=``) that shares the target's tokenizer.

The draft samples from its own distribution after the SAME processing as the
target row it drafts for (grammar mask, processors, temperature, top-k, top-p):
a forked matcher walks its samples, so every drafted token is grammar-legal.  It
returns the distributions it sampled from; the verifier's rejection sampling
makes the output exact whatever those are.  Under greedy decoding the drafts are
the draft model's masked argmax (deterministic, ``probs=None``).

Its KV cache holds committed tokens (committed state) and, after a
:meth:`propose`, its own draft after them (scratch).  :meth:`propose` only
appends scratch: it never crops what is committed.  :meth:`commit` (called by
the loop's commit path, also on a step where the composite chose another
drafter's draft) rolls the scratch back to what the committed tokens repeat of
it, so a rejected position leaves no trace; :meth:`start` keeps the longest
cached prefix of the new prompt (a conversation starts it again every turn).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from grammars.base import allocate_bitmask
from grammarspec.engine.masking import apply_masks
from grammarspec.engine.processing import LogitsPipeline
from grammarspec.engine.sampling import SamplingParams
from grammarspec.kv.cache import common_prefix_length, crop_cache, forward_with_cache, new_cache, require_croppable
from proposers.base import EMPTY_DRAFT, Draft, GrammarView, Request

__all__ = ["DraftModelProposer", "common_prefix_length"]

#: (logits [n, V] float32 already masked, prefixes) -> processed scores [n, V]
Processing = Callable[[torch.Tensor, Sequence[Sequence[int]]], torch.Tensor]


class DraftModelProposer:
    """Drafts with a small causal LM sharing the target's tokenizer.

    ``sampling``: how the target samples (greedy drafts are deterministic).
    ``processing``: the target row's processing (default: ``sampling``'s
    temperature / top-k / top-p); the runtime passes the row's own pipeline so
    draft and target distributions are processed identically.
    ``vocab_size``: the target's logits width (a padded target vocabulary).
    """

    #: runs a model: the composite asks it only when the cheap drafters have little
    runs_model = True

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        sampling: SamplingParams | None = None,
        processing: Processing | None = None,
        generator: torch.Generator | None = None,
        vocab_size: int | None = None,
        name: str = "draft_model",
    ) -> None:
        self.model = model
        self.name = name
        self.sampling = sampling or SamplingParams()
        self.processing: Processing = processing or LogitsPipeline.from_sampling(self.sampling)
        self.generator = generator
        config: Any = model.config
        self.vocab_size = int(vocab_size or config.vocab_size)
        self._cache: Any = None
        self._cached: list[int] = []
        self._base = 0  # context length at the last propose (its draft follows in the cache)

    def bind(
        self, *, sampling: SamplingParams, processing: Processing, generator: torch.Generator | None, vocab_size: int
    ) -> None:
        """Draft for a request with these settings (the target row's own processing).  Changes state."""
        self.sampling, self.processing, self.generator, self.vocab_size = sampling, processing, generator, vocab_size

    def start(self, request: Request) -> None:
        """A new generation.  Changes state.

        The KV cache is kept across starts (a conversation starts its proposer
        every turn): it keeps the longest cached prefix of the new prompt, less
        its last token at least (a draft needs one token fed), and the first
        :meth:`propose` feeds the rest.
        """
        if self._cache is None:
            self._cache = new_cache(self.model)
            require_croppable(self._cache, "draft model")
            self._cached = []
        prompt = list(request.prompt_ids)
        self._sync(min(common_prefix_length(self._cached, prompt), max(len(prompt) - 1, 0)))
        self._base = 0

    def propose(self, context: Sequence[int], grammar: GrammarView | None, k: int) -> Draft:
        if k <= 0 or (grammar is not None and grammar.is_terminated()):
            return EMPTY_DRAFT
        keep = common_prefix_length(self._cached, context)
        if keep < len(self._cached) or keep >= len(context):
            # A context that does not extend what start and commit left (a caller that skipped commit):
            # re-synced here, the one case where propose crops.  At least one token must be fed.
            keep = min(keep, len(context) - 1)
            self._sync(keep)
        feed = list(context[keep:])
        matcher = grammar.fork() if grammar is not None else None
        width = self.vocab_size
        mask = allocate_bitmask(1, width) if matcher is not None else None
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        confidence: list[float] = []
        fed = list(context[:keep])  # what the draft cache holds
        for _ in range(k):
            logits = self._forward(feed)[:, :width]  # [1, V_target]
            fed += feed
            if logits.shape[-1] < width:  # padded target vocabulary: the pad tokens are impossible
                logits = torch.nn.functional.pad(logits, (0, width - logits.shape[-1]), value=float("-inf"))
            if matcher is not None:
                assert mask is not None
                matcher.fill_mask(mask, 0)
                apply_masks(logits, mask)
            scores = self.processing(logits, [list(context) + tokens])
            if torch.isneginf(scores).all():
                break  # nothing legal: never emit a token
            if self.sampling.greedy:
                token = int(scores.argmax(-1))
            else:
                probs = scores.softmax(-1)
                token = int(_draw(probs[0], self.generator))
                rows.append(probs[0])
            tokens.append(token)
            confidence.append(float(scores.softmax(-1)[0, token]))  # its own probability (the policy's estimate)
            feed = [token]
            if matcher is not None and (not matcher.accept(token) or matcher.is_terminated()):
                break
        self._cached = fed
        self._base = len(context)
        if not tokens:
            return EMPTY_DRAFT
        stacked = torch.stack(rows) if rows else None
        return Draft(
            tokens=tuple(tokens), probs=stacked, sources=(self.name,) * len(tokens), confidence=tuple(confidence)
        )

    def commit(self, draft: Draft, num_accepted: int, committed: Sequence[int]) -> None:
        """Crop the draft cache to what it shares with the new context.  Changes state.

        The new context is the one of the last :meth:`propose` plus ``committed``;
        whether or not the loop verified this drafter's draft (the composite may
        have chosen another), the cache afterwards holds committed tokens only,
        so the next :meth:`propose` only feeds.  (Its prefix check re-syncs
        should a caller's context ever differ.)
        """
        if self._cache is None:
            return
        if self._base:  # a draft follows the context in the cache: keep what `committed` repeats of it
            self._sync(self._base + common_prefix_length(self._cached[self._base :], committed))
        self._base = 0

    def _sync(self, keep: int) -> None:
        """Crop the cache to its first ``keep`` tokens (no-op when it holds no more).  Changes state."""
        if keep < len(self._cached):
            crop_cache(self._cache, keep, "draft model")
            self._cached = self._cached[:keep]

    def _forward(self, input_ids: list[int]) -> torch.Tensor:
        return forward_with_cache(self.model, input_ids, self._cache, 1)  # [1, V]


def _draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token from ``probs`` ``[V]`` (the generator may live on another device)."""
    if generator is not None and generator.device != probs.device:
        return torch.multinomial(probs.to(generator.device), 1, generator=generator).to(probs.device)
    return torch.multinomial(probs, 1, generator=generator)
