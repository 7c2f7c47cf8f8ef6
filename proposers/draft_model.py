"""A small draft model (``assistant=``) that shares the target's tokenizer.

The draft samples from its own distribution after the SAME processing as the
target (grammar mask, processors, temperature, top-k, top-p): a forked matcher
walks its samples, so every drafted token is grammar-legal.  It returns the
distributions it sampled from; the verifier's rejection sampling makes the
output exact whatever those are.  Under greedy decoding the drafts are the
draft model's masked argmax (deterministic, ``probs=None``).

Its KV cache follows the committed context lazily: before drafting it keeps
the longest cached prefix that still matches the context, crops the rest, and
feeds the missing tokens -- so a rejected position leaves no trace in it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from grammars.base import allocate_bitmask
from grammarspec.cache import crop_cache, forward_with_cache, new_cache, require_croppable
from grammarspec.sampling import SamplingParams, process_logits

from .base import EMPTY_DRAFT, Draft, GrammarView, Request

__all__ = ["DraftModelProposer", "common_prefix_length"]


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix.  ``common_prefix_length([1,2,3], [1,2,4]) == 2``."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class DraftModelProposer:
    """Drafts with a small causal LM sharing the target's tokenizer."""

    #: It runs a model: the composite asks it only as a fallback (:func:`proposers.compose.is_model_proposer`).
    runs_model = True

    def __init__(self, model: torch.nn.Module, *, name: str = "draft_model") -> None:
        self.model = model
        self.name = name
        config: Any = model.config
        self.vocab_size = int(config.vocab_size)
        self._cache: Any = None
        self._cached: list[int] = []
        self._sampling = SamplingParams()
        self._generator: torch.Generator | None = None
        self._target_vocab = self.vocab_size
        self._base = 0

    def start(self, request: Request) -> None:
        self._cache = new_cache(self.model)
        require_croppable(self._cache, "draft model")
        self._cached = []
        self._sampling = request.sampling if request.sampling is not None else SamplingParams()
        self._generator = request.generator
        self._target_vocab = int(request.extra.get("target_vocab_size", self.vocab_size))

    def propose(self, context: Sequence[int], grammar: GrammarView | None, k: int) -> Draft:
        if k <= 0 or (grammar is not None and grammar.is_terminated()):
            return EMPTY_DRAFT
        # Keep the cached prefix that still matches; at least one token must be fed.
        keep = min(common_prefix_length(self._cached, context), len(context) - 1)
        crop_cache(self._cache, keep, "draft model")
        feed = list(context[keep:])
        matcher = grammar.fork() if grammar is not None else None
        width = self._target_vocab
        mask = allocate_bitmask(1, width) if matcher is not None else None
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        fed = list(context[:keep])  # what the draft cache holds
        for _ in range(k):
            logits = self._forward(feed)[:, :width]  # [1, V_target]
            fed += feed
            if logits.shape[-1] < width:  # padded target vocabulary: the pad tokens are impossible
                logits = torch.nn.functional.pad(logits, (0, width - logits.shape[-1]), value=float("-inf"))
            if matcher is not None and mask is not None:
                matcher.fill_mask(mask, 0)
            scores = process_logits(logits, self._sampling, mask)
            if torch.isneginf(scores).all():
                break  # nothing legal: never emit a token
            if self._sampling.greedy:
                token = int(scores.argmax(-1))
            else:
                probs = scores.softmax(-1)
                token = int(torch.multinomial(probs[0], 1, generator=self._generator))
                rows.append(probs[0])
            tokens.append(token)
            feed = [token]
            if matcher is not None and (not matcher.accept(token) or matcher.is_terminated()):
                break
        self._cached = fed
        self._base = len(context)
        if not tokens:
            return EMPTY_DRAFT
        stacked = torch.stack(rows) if rows else None
        return Draft(tokens=tuple(tokens), probs=stacked, sources=(self.name,) * len(tokens))

    def commit(self, draft: Draft, num_accepted: int, committed: Sequence[int]) -> None:
        """Crop the draft cache back to the accepted prefix of the last draft.

        The cache then holds committed tokens only.  A step it did not draft
        (``draft`` empty) changes nothing: the prefix check in :meth:`propose`
        feeds what was committed.  (Should a caller's bookkeeping ever
        disagree, that check re-syncs too.)
        """
        if not draft:
            return
        keep = min(self._base + num_accepted, len(self._cached))
        if self._cache is not None and keep < len(self._cached):
            crop_cache(self._cache, keep, "draft model")
            self._cached = self._cached[:keep]

    def _forward(self, input_ids: list[int]) -> torch.Tensor:
        return forward_with_cache(self.model, input_ids, self._cache, 1)  # [1, V]
