"""Grammar work of one decoding step: forced tokens, the draft tree's walk, and applying the masks.

The grammar backend fills int32 bitmasks on the host (one row per target row,
the format of ``xgrammar.allocate_token_bitmask``); :func:`apply_masks` applies
them to the logits on the logits' device with xgrammar's kernel (CPU, CUDA or
Triton).  A matcher is always left as it was found, except by the commit path.
"""

from __future__ import annotations

import numpy as np
import torch
import xgrammar

from grammars.base import Matcher
from proposers.tree import DraftTree

__all__ = ["prune_and_fill_masks", "forced_token", "apply_masks"]


def prune_and_fill_masks(
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


#: A row whose nonzero words are at most this share of its bitmask is masked by copying its few legal scores.
SPARSE_SHARE = 1 / 8
_BITS = np.arange(32, dtype=np.int32)


def apply_masks(logits: torch.Tensor, masks: torch.Tensor) -> None:
    """Set illegal tokens of ``logits`` ``[N, V]`` (float32, any device) to -inf.  Changes ``logits``.

    ``masks``: int32 ``[N, ceil(V/32)]`` on the host; copied to the logits' device once.
    On a GPU this is xgrammar's kernel.  On a CPU that kernel writes each
    illegal score one by one (about 0.2 ms for a row of 49,152 that allows
    nothing, 0.01 ms for one that allows nearly everything), and JSON rows are
    mostly one or the other: a row where at most :data:`SPARSE_SHARE` of the
    words allow anything keeps its few legal scores, is filled with -inf in
    one vectorized write and gets them back; the other rows go to the kernel.
    The result is the same tensor bit for bit (about half the time on the
    overhead bench's masks at batch 16).  The split reads the host bitmask
    (numpy), never the logits.
    """
    vocab = logits.shape[-1]
    if logits.device.type != "cpu":
        xgrammar.apply_token_bitmask_inplace(logits, masks.to(logits.device, non_blocking=True), vocab_size=vocab)
        return
    words = masks.numpy()  # the host buffer itself
    nonzero = words != 0  # [N, W]
    sparse = nonzero.sum(axis=1) <= SPARSE_SHARE * words.shape[1]  # [N]
    sparse_rows = np.flatnonzero(sparse)
    if len(sparse_rows) < logits.shape[0]:  # the kernel for the dense rows (all rows when none is sparse)
        dense = None if not len(sparse_rows) else np.flatnonzero(~sparse).tolist()
        xgrammar.apply_token_bitmask_inplace(logits, masks, vocab_size=vocab, indices=dense)
    if len(sparse_rows):
        where = np.argwhere(nonzero & sparse[:, None])  # [m, 2]: (row, word) of every word that allows something
        bits = (words[where[:, 0], where[:, 1]][:, None] >> _BITS) & 1  # [m, 32]
        tokens = where[:, 1:2] * 32 + _BITS  # [m, 32]
        legal = (bits != 0) & (tokens < vocab)
        rows = torch.from_numpy(np.broadcast_to(where[:, 0:1], tokens.shape)[legal])
        columns = torch.from_numpy(tokens[legal])
        kept = logits[rows, columns]
        logits.index_fill_(0, torch.from_numpy(sparse_rows), float("-inf"))
        logits[rows, columns] = kept
