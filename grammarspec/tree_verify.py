"""Token-tree verification: one target pass over a :class:`proposers.tree.DraftTree`.

One tree step (batch 1), the tree twin of a chain step in :mod:`grammarspec.decoding`::

    1. walk    -- the matcher walks the tree depth first (accept / rollback): one
                  bitmask per node, a node the grammar forbids is dropped with its
                  subtree, so no illegal token reaches the target; the matcher
                  ends as it began
    2. forward -- ONE target pass over pending + tree tokens with a tree
                  attention mask (each node sees the context and its ancestors)
                  and per-node position ids (context length + depth)
    3. accept  -- the shared processing per row; from the root, draw the target's
                  own token from the node's processed distribution (greedy:
                  argmax) and descend while it is a child
    4. commit  -- every KV cache keeps only the accepted path: the path's
                  keys/values are gathered into place, the rest is cropped

Exactness.  Step 3 is ordinary sequential sampling: every output token is
drawn from the target's processed distribution given the tokens before it;
the tree only decides how many of those distributions one pass computed.
So any deterministic tree leaves the output distribution unchanged, at
every temperature.  (Sampled draft-model drafts need SpecInfer's recursive
rejection for trees; they stay chains.)

Row layout used throughout: row 0 is the distribution after the last
pending token (the tree's root), row ``1 + i`` the one after node ``i``.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grammars.base import Matcher
from proposers.tree import DraftTree

from .cache import CacheError, cache_length, crop_cache, require_croppable
from .masking import apply_masks
from .processing import LogitsPipeline
from .sampling import SamplingParams, probabilities

__all__ = [
    "TreeStep",
    "choose_path",
    "commit_path",
    "forward_tree",
    "tree_attention_inputs",
    "verify_tree",
    "walk_tree",
]


def tree_attention_inputs(
    parents: Sequence[int], pending: int, past: int, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """The 4-D additive attention mask and the position ids of a tree pass.

    The pass feeds ``pending`` committed tokens (not yet in the cache) and
    then the tree's nodes, on top of ``past`` cached tokens.  Returns
    ``mask`` float ``[1, 1, pending + n, past + pending + n]`` (0: attend,
    dtype minimum: not) and ``positions`` int64 ``[1, pending + n]``.
    Pending tokens attend causally; node ``i`` attends to the context and to
    its ancestors and itself, at position ``past + pending + depth(i)``.

    >>> mask, pos = tree_attention_inputs([-1, 0, -1], pending=1, past=2)
    >>> (mask[0, 0] == 0).int().tolist()
    [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 1]]
    >>> pos.tolist()
    [[2, 3, 4, 3]]
    """
    n = len(parents)
    if pending < 1:
        raise ValueError("a tree pass needs at least one pending token (the last committed one) to score the root")
    q = pending + n
    allowed = torch.zeros(q, past + q, dtype=torch.bool)
    allowed[:, :past] = True
    allowed[:pending, past : past + pending] = torch.tril(torch.ones(pending, pending, dtype=torch.bool))
    allowed[pending:, past : past + pending] = True
    depth = [0] * n
    for i, parent in enumerate(parents):
        row = pending + i
        if parent >= 0:
            allowed[row, past + pending : past + q] = allowed[pending + parent, past + pending : past + q]
            depth[i] = depth[parent] + 1
        allowed[row, past + row] = True
    mask = torch.zeros(q, past + q, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    positions = list(range(past, past + pending)) + [past + pending + d for d in depth]
    return mask[None, None], torch.tensor([positions], dtype=torch.long)


def walk_tree(
    matcher: Matcher | None, masks: torch.Tensor | None, tree: DraftTree, eos: frozenset[int] = frozenset()
) -> tuple[DraftTree, list[bool]]:
    """Prune ``tree`` to its grammar-legal nodes and fill one mask per row.

    Returns the pruned tree and ``ends[i]``: node ``i`` ends generation (its
    token terminates the grammar, or is an EOS without a grammar), so it has
    no children and no mask row.  ``masks``: int32 ``[>= 1 + len(tree),
    ceil(V/32)]``; row 0 gets the root's mask, row ``1 + i`` pruned node
    ``i``'s.  The matcher ends as it began (it is walked with accept /
    rollback, never more than the tree's depth back).
    """
    if matcher is None:
        kept: list[bool] = []
        index: dict[int, bool] = {-1: True}  # node -> kept and not ended
        for i, (parent, token) in enumerate(zip(tree.parents, tree.tokens)):
            ok = index.get(parent, False)
            kept.append(ok)
            index[i] = ok and token not in eos
        pruned = tree.keep(kept)
        return pruned, [t in eos for t in pruned.tokens]
    assert masks is not None and masks.shape[0] >= len(tree) + 1, "one mask row per node plus the root"
    matcher.fill_mask(masks, 0)
    kept = [False] * len(tree)
    ended: list[bool] = []
    path: list[int] = []  # original indices of the nodes the matcher has accepted, root first
    new_index: dict[int, int] = {}
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
        new_index[i] = len(ended)
        terminated = matcher.is_terminated()
        ended.append(terminated)
        if not terminated:
            matcher.fill_mask(masks, 1 + new_index[i])
    if path:
        matcher.rollback(len(path))
    return tree.keep(kept), ended


def forward_tree(model: torch.nn.Module, pending: Sequence[int], tree: DraftTree, cache: Any) -> torch.Tensor:
    """Run ``pending`` + the tree's tokens on top of ``cache`` (extended in place).

    Returns float32 logits ``[1 + len(tree), V]`` on CPU in the row layout of
    the module docstring.  Changes the cache: it holds every node afterwards
    (:func:`commit_path` keeps the accepted ones).
    """
    past = cache_length(cache)
    dtype = _float_dtype(model)
    mask, positions = tree_attention_inputs(tree.parents, len(pending), past, dtype)
    device = getattr(model, "device", torch.device("cpu"))
    ids = torch.tensor([list(pending) + list(tree.tokens)], dtype=torch.long, device=device)
    kwargs = {
        _cache_argument(model): cache,
        "use_cache": True,
        "logits_to_keep": len(tree) + 1,
        "attention_mask": mask.to(device),
        "position_ids": positions.to(device),
    }
    with torch.inference_mode():
        out = model(input_ids=ids, **kwargs)
    return out.logits[0, -(len(tree) + 1) :].float().cpu()


def _float_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype the model computes attention in (float32 for parameter-free toys)."""
    param = next(iter(model.parameters()), None)
    return param.dtype if param is not None and param.dtype.is_floating_point else torch.float32


def _cache_argument(model: torch.nn.Module) -> str:
    """``cache`` or ``past_key_values``: transformers renamed the argument (read from ``forward``)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def choose_path(
    scores: torch.Tensor, tree: DraftTree, ends: Sequence[bool], greedy: bool, generator: torch.Generator | None = None
) -> tuple[list[int], int | None]:
    """Walk down ``tree`` drawing the target's own tokens; returns ``(path, next_token)``.

    ``scores``: processed (masked, filtered) ``[1 + len(tree), V]`` in the row
    layout above.  At each node the target's token is drawn from its row
    (greedy: the argmax; else one sample) and the walk descends while that
    token is a child.  ``path`` lists the accepted nodes; ``next_token`` is
    the first drawn token that is no child, ``None`` when the path ends in a
    node that ends generation.  Pure apart from the generator.

    >>> t = DraftTree.from_paths([[5, 6], [7]])          # nodes: 5, 6 (under 5), 7
    >>> s = torch.full((4, 9), -1e9); s[0, 7] = s[3, 2] = 0.0
    >>> choose_path(s, t, [False] * 3, greedy=True)
    ([2], 2)
    """
    assert scores.dim() == 2 and scores.shape[0] == len(tree) + 1, (
        f"scores must be [1 + {len(tree)}, V], got {tuple(scores.shape)}"
    )
    children: dict[int, dict[int, int]] = {}
    for i, (parent, token) in enumerate(zip(tree.parents, tree.tokens)):
        children.setdefault(parent, {})[token] = i
    path: list[int] = []
    node = -1
    while True:
        if node >= 0 and ends[node]:
            return path, None
        row = scores[node + 1 : node + 2]  # [1, V]
        if greedy:
            token = int(row.argmax(dim=-1))
        else:
            token = int(torch.multinomial(probabilities(row)[0], 1, generator=generator))
        child = children.get(node, {}).get(token)
        if child is None:
            return path, token
        path.append(child)
        node = child


def commit_path(cache: Any, start: int, path: Sequence[int], nodes: int, model_name: str = "model") -> None:
    """Keep only ``path``'s nodes of a tree pass in ``cache``.  Changes the cache.

    The tree's ``nodes`` entries sit at ``start .. start + nodes`` (after the
    context); afterwards the cache holds the context plus the path's keys and
    values in path order, ``start + len(path)`` tokens -- exactly what a
    chain pass over the accepted tokens would have left.  Works on every
    layer of a ``DynamicCache`` (``keys``/``values`` ``[B, H, L, D]``).
    """
    if cache_length(cache) != start + nodes:
        raise CacheError(f"the {model_name} cache holds {cache_length(cache)} tokens, expected {start + nodes}")
    require_croppable(cache, model_name)
    if list(path) != list(range(len(path))):  # nodes off the first branch: gather them into place
        layers = getattr(cache, "layers", None)
        if layers is None:
            raise CacheError(
                f"the {model_name} cache ({type(cache).__name__}) has no per-layer keys/values to gather a tree "
                "path from; use a transformers DynamicCache, or verify chains (no tree proposer)"
            )
        index = torch.tensor([start + p for p in path], dtype=torch.long)
        with torch.inference_mode():  # the cache tensors were made under inference mode
            for layer in layers:
                if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
                    continue
                idx = index.to(layer.keys.device)
                layer.keys[..., start : start + len(path), :] = layer.keys.index_select(-2, idx)
                layer.values[..., start : start + len(path), :] = layer.values.index_select(-2, idx)
    crop_cache(cache, start + len(path), model_name)


@dataclass(frozen=True)
class TreeStep:
    """What one tree verification step did.

    ``tree``: the tree after grammar pruning (what the target saw);
    ``accepted``: the accepted draft tokens (a path of ``tree``);
    ``next_token``: the target's own token after them (``None``: generation ended);
    ``rows``: rows of the target pass (pending + nodes).
    """

    tree: DraftTree
    accepted: tuple[int, ...]
    next_token: int | None
    rows: int


def verify_tree(
    model: torch.nn.Module,
    cache: Any,
    tokens: Sequence[int],
    cached: int,
    tree: DraftTree,
    params: SamplingParams,
    *,
    matcher: Matcher | None = None,
    masks: torch.Tensor | None = None,
    eos: frozenset[int] = frozenset(),
    processing: Any = None,
    generator: torch.Generator | None = None,
) -> TreeStep:
    """One tree step: walk, one target pass, accept, commit the cache (steps 1-4 above).

    ``tokens``: prompt + committed tokens; ``cached``: how many of them the
    cache holds (the rest are pending and go into this pass).  Leaves the
    cache holding ``tokens`` plus the accepted draft tokens; the matcher is
    unchanged (the caller commits the returned tokens to it, as for a chain).
    ``processing``: the row's processing ``(masked scores [n, V], prefixes) ->
    scores`` (default: ``params``' temperature / top-k / top-p), applied to every
    node with its own prefix -- the same processing a chain step applies.
    """
    if matcher is not None and masks is None:
        raise ValueError("verify_tree needs mask rows when a matcher is given")
    # 1. Walk: prune to legal nodes, one mask per row.
    tree, ends = walk_tree(matcher, masks, tree, eos)
    rows = len(tree) + 1
    # 2. One target pass over pending + tree.
    pending = list(tokens[cached:])
    logits = forward_tree(model, pending, tree, cache)  # [1 + n, V]
    # 3. Same processing for every row, then the target's own draws down the tree.
    prefixes = [list(tokens) + [tree.tokens[j] for j in tree.path(r - 1)] for r in range(rows)]
    row_masks = masks[:rows] if masks is not None else None
    if matcher is not None and any(ends):  # rows of ended nodes are never read; give them a full mask
        row_masks = row_masks.clone()  # type: ignore[union-attr]
        for i, end in enumerate(ends):
            if end:
                row_masks[1 + i] = -1
    scores = logits.float().clone()
    if row_masks is not None:
        apply_masks(scores, row_masks)
    scores = (processing or LogitsPipeline.from_sampling(params))(scores, prefixes)
    path, next_token = choose_path(scores, tree, ends, params.greedy, generator)
    # 4. Commit: the cache keeps the context plus the accepted path.
    commit_path(cache, len(tokens), path, len(tree), "target model")
    return TreeStep(
        tree=tree, accepted=tuple(tree.tokens[i] for i in path), next_token=next_token, rows=len(pending) + len(tree)
    )
