"""Grammar work of one decoding step: forced tokens, the draft tree's walk, and applying the masks.

The grammar backend fills int32 bitmasks on the host (one row per target row,
the format of ``xgrammar.allocate_token_bitmask``); :func:`apply_masks` applies
them to the logits on the logits' device with xgrammar's kernel (CPU, CUDA or
Triton).  A matcher is always left as it was found, except by the commit path.
"""

from __future__ import annotations

import torch
import xgrammar

from grammars.base import Matcher
from proposers.tree import DraftTree

__all__ = ["walk", "forced_token", "apply_masks"]


def walk(
    matcher: Matcher | None,
    masks: torch.Tensor,
    start: int,
    tree: DraftTree,
    eos: frozenset[int],
    root: torch.Tensor | None = None,
) -> tuple[DraftTree, list[bool]]:
    """Prune ``tree`` to its grammar-legal nodes and fill one mask row per scored row, from ``masks[start]`` on.

    ``masks``: int32 ``[rows, ceil(V/32)]`` on the host, written in place: row
    ``start`` gets the root's mask, row ``start + 1 + i`` pruned node ``i``'s.
    A node the grammar forbids is dropped with its subtree, so no illegal token
    reaches the target.  Returns the pruned tree and ``ends[i]``: node ``i``
    ends generation (its token terminates the grammar, or is an EOS without a
    grammar), so it has no children and its row is never read (a full mask).
    ``root``: the root's mask row ``[1, ceil(V/32)]`` if the caller already
    filled it for the same state (the forced-token check), so it is not filled twice.
    The matcher ends as it began (walked depth first with accept / rollback,
    never more than the tree's depth back).

    Example: a grammar allowing ``"ab"`` then EOS and a chain ``a b EOS x`` ->
    the chain is cut to ``a b EOS``, the EOS node ends generation.
    """
    if matcher is None:  # unconstrained: only an EOS ends a branch
        alive: dict[int, bool] = {-1: True}
        kept: list[bool] = []
        for i, (parent, token) in enumerate(zip(tree.parents, tree.tokens)):
            kept.append(alive.get(parent, False))
            alive[i] = kept[-1] and token not in eos
        pruned = tree.keep(kept)
        masks[start : start + len(pruned) + 1] = -1
        return pruned, [t in eos for t in pruned.tokens]
    assert masks.shape[0] >= start + len(tree) + 1, "one mask row per node plus the root"
    if root is not None:
        masks[start] = root[0]
    else:
        matcher.fill_mask(masks, start)
    kept = [False] * len(tree)
    ended: list[bool] = []
    path: list[int] = []  # nodes the matcher has accepted, root first
    for i, (parent, token) in enumerate(zip(tree.parents, tree.tokens)):
        if parent >= 0 and not kept[parent]:
            continue  # the parent was dropped, and with it this subtree
        while path and path[-1] != parent:  # back up to the parent (an ancestor of the last node)
            matcher.rollback(1)
            path.pop()
        if not matcher.accept(token):
            continue
        path.append(i)
        kept[i] = True
        row = start + 1 + len(ended)
        terminated = matcher.is_terminated()
        ended.append(terminated)
        if terminated:
            masks[row] = -1
        else:
            matcher.fill_mask(masks, row)
    if path:
        matcher.rollback(len(path))
    return tree.keep(kept), ended


def forced_token(matcher: Matcher, mask: torch.Tensor, *, filled: bool = False) -> int | None:
    """The only legal next token, if the grammar allows exactly one.  Does not change the matcher.

    ``mask``: an int32 ``[1, ceil(V/32)]`` host row, filled here unless ``filled``
    (it already holds the matcher's current mask, e.g. from a batched fill).
    """
    if not filled:
        matcher.fill_mask(mask, 0)
    words = mask[0].numpy()  # the host buffer itself (a bitmask never lives on the device)
    set_words = words.nonzero()[0]
    if len(set_words) != 1:
        return None
    word = int(set_words[0])
    bits = int(words[word]) & 0xFFFFFFFF
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
