"""Token trees in the one decoding step: the tree attention pattern and the walk down the target's choices.

A chain is the degenerate tree (parents ``-1, 0, 1, ...``), so every row of every
batch goes through the same step (:func:`grammarspec.engine.step.run_step`): the
matcher walks the tree (:func:`grammarspec.engine.masking.prune_and_fill_masks`), one target pass
scores every node (:meth:`grammarspec.kv.batch.BatchKV.forward` builds each row's
mask from :func:`tree_allowed`), the target makes one choice per scored row
(:func:`grammarspec.engine.rejection.target_choices`) and :func:`descend` follows them
down the tree; :meth:`grammarspec.kv.batch.BatchKV.keep` keeps the path.

Exactness.  At each node the target's own token is drawn from the node's
processed distribution (greedy: the argmax) and the walk descends while it is
a child.  That is ordinary sequential sampling: every output token is drawn
from the target's processed distribution given the tokens before it, so any
deterministic tree leaves the output distribution unchanged, at every
temperature.  (Sampled draft-model drafts stay chains and are verified by
residual rejection, whose choice at a row is the draft token when accepted
and the residual draw otherwise -- the same walk.)

Row layout: a row's block of scored rows starts with the distribution after
its last pending token (the tree's root), then the one after each node.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from proposers.tree import DraftTree

__all__ = ["descend", "position_offsets", "tree_allowed", "tree_attention_inputs"]


def tree_allowed(parents: Sequence[int], pending: int) -> tuple[list[list[bool]], list[int]]:
    """Which of a pass's new tokens each new token sees, and their position offsets.  Pure.

    The pass feeds ``pending`` committed tokens, then the tree's nodes.
    Returns ``allowed`` ``[q][q]`` (``q = pending + len(parents)``) and the
    offset of each token from the row's cached length: pending tokens attend
    causally at offsets ``0 .. pending - 1``; node ``i`` attends to every pending
    token, its ancestors and itself, at offset ``pending + depth(i)``.

    >>> allowed, offsets = tree_allowed([-1, 0, -1], pending=1)
    >>> [[int(x) for x in line] for line in allowed], offsets
    ([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 1]], [0, 1, 2, 1])
    """
    if pending < 1:
        raise ValueError("a tree pass needs at least one pending token (the last committed one) to score the root")
    q = pending + len(parents)
    allowed = [[j <= i and (i < pending or j < pending) for j in range(q)] for i in range(q)]
    for i, parent in enumerate(parents):
        row = pending + i
        if parent >= 0:
            allowed[row][pending:] = allowed[pending + parent][pending:]
        allowed[row][row] = True
    return allowed, position_offsets(parents, pending)


def position_offsets(parents: Sequence[int], pending: int) -> list[int]:
    """Each new token's position offset from its row's cached length: pending tokens in order, a node at
    ``pending + depth``.  Pure.

    >>> position_offsets([-1, 0, -1], pending=2)
    [0, 1, 2, 3, 2]
    """
    offsets = list(range(pending))
    for parent in parents:
        offsets.append(pending if parent < 0 else offsets[pending + parent] + 1)
    return offsets


def tree_attention_inputs(
    parents: Sequence[int], pending: int, past: int, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """One row's 4-D additive mask ``[1, 1, q, past + q]`` and position ids ``[1, q]`` (every past column valid).

    >>> mask, pos = tree_attention_inputs([-1, 0, -1], pending=1, past=2)
    >>> (mask[0, 0] == 0).int().tolist()
    [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 1]]
    >>> pos.tolist()
    [[2, 3, 4, 3]]
    """
    allowed, offsets = tree_allowed(parents, pending)
    q = len(allowed)
    visible = torch.cat(
        [
            torch.ones((q, past), dtype=torch.bool, device=device),
            torch.tensor(allowed, dtype=torch.bool, device=device),
        ],
        dim=1,
    )
    mask = torch.zeros((q, past + q), dtype=dtype, device=device).masked_fill_(~visible, torch.finfo(dtype).min)
    positions = torch.tensor([[past + o for o in offsets]], dtype=torch.long, device=device)
    return mask[None, None], positions


def descend(tree: DraftTree, ends: Sequence[bool], choices: Sequence[int]) -> tuple[list[int], int | None]:
    """Walk down ``tree`` along the target's choices; returns ``(path, next_token)``.  Pure.

    ``choices[0]``: the target's token at the root, ``choices[1 + i]`` after node
    ``i``.  The walk descends while the choice is a child; ``path`` lists the
    accepted nodes, ``next_token`` is the first choice that is no child, ``None``
    when the path ends in a node that ends generation (``ends[i]``).

    >>> t = DraftTree.from_paths([[5, 6], [7]])          # nodes: 5, 6 (under 5), 7
    >>> descend(t, [False] * 3, [7, 0, 0, 2])
    ([2], 2)
    """
    assert len(choices) == len(tree) + 1, f"one choice per scored row: {len(choices)} for {len(tree)} nodes"
    children: dict[int, dict[int, int]] = {}
    for i, (parent, token) in enumerate(zip(tree.parents, tree.tokens)):
        children.setdefault(parent, {})[token] = i
    path: list[int] = []
    node = -1
    while True:
        if node >= 0 and ends[node]:
            return path, None
        token = choices[node + 1]
        child = children.get(node, {}).get(token)
        if child is None:
            return path, token
        path.append(child)
        node = child
