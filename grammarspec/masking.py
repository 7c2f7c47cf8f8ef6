"""Grammar work of one decoding step: forced tokens, the draft walk, and applying the masks.

The grammar backend fills int32 bitmasks on the host (one row per target row,
the format of ``xgrammar.allocate_token_bitmask``); :func:`apply_masks` applies
them to the logits on the logits' device with xgrammar's kernel (CPU, CUDA or
Triton).  A matcher is always left as it was found, except by the commit path.
"""

from __future__ import annotations

import torch
import xgrammar

from grammars.base import Matcher
from proposers.base import Draft

__all__ = ["walk_draft", "forced_token", "apply_masks"]


def walk_draft(
    matcher: Matcher | None, masks: torch.Tensor, start: int, draft: Draft, eos: frozenset[int]
) -> tuple[Draft, int]:
    """Fill one mask per target row from ``masks[start]`` on and cut the draft where it stops being legal.

    ``masks``: int32 ``[rows, ceil(V/32)]``, written in place (``None`` rows are
    left for unconstrained requests).  Returns the (possibly shorter) draft and
    the number of target rows it needs: ``len(draft) + 1``, or ``len(draft)``
    when the draft's last token ends generation (then no bonus token may
    follow).  The matcher ends as it began.

    Example: a grammar allowing ``"ab"`` then EOS and a draft ``a b EOS x`` ->
    the draft is cut to ``a b EOS`` with 3 rows (no bonus row after the end).
    """
    if matcher is None:  # unconstrained: only cut after an EOS token
        masks[start : start + len(draft) + 1] = -1
        for i, token in enumerate(draft.tokens):
            if token in eos:
                return draft.truncate(i + 1), i + 1
        return draft, len(draft) + 1
    walked = 0
    rows = len(draft) + 1
    for i in range(len(draft) + 1):
        matcher.fill_mask(masks, start + i)
        if i == len(draft):
            break
        if not matcher.accept(draft.tokens[i]):
            draft, rows = draft.truncate(i), i + 1
            break
        walked += 1
        if matcher.is_terminated():  # the draft ends the document: no bonus row
            draft, rows = draft.truncate(i + 1), i + 1
            break
    if walked:
        matcher.rollback(walked)
    return draft, rows


def forced_token(matcher: Matcher, mask: torch.Tensor) -> int | None:
    """The only legal next token, if the grammar allows exactly one.  Does not change the matcher.

    ``mask``: an int32 ``[1, ceil(V/32)]`` scratch row.
    """
    matcher.fill_mask(mask, 0)
    row = mask[0]
    set_words = (row != 0).nonzero()
    if set_words.numel() != 1:
        return None
    word = int(set_words[0])
    bits = int(row[word]) & 0xFFFFFFFF
    if bits & (bits - 1):  # more than one bit set
        return None
    token = word * 32 + bits.bit_length() - 1
    return token if token < matcher.vocab_size else None


def apply_masks(logits: torch.Tensor, masks: torch.Tensor) -> None:
    """Set illegal tokens of ``logits`` ``[N, V]`` (float32, any device) to -inf.  Changes ``logits``.

    ``masks``: int32 ``[N, ceil(V/32)]`` on the host; copied to the logits' device once.
    """
    xgrammar.apply_token_bitmask_inplace(
        logits, masks.to(logits.device, non_blocking=True), vocab_size=logits.shape[-1]
    )
