"""The target's KV cache for a batch of rows of different lengths.

One Hugging Face ``DynamicCache`` holds every row (``[B, H, L, D]`` per layer) and
``valid`` (bool ``[B, L]``) says which columns hold a row's tokens.  A step appends
the same number of columns ``n`` to every row -- a row with fewer new tokens is
right-padded with invalid columns -- and afterwards each row keeps a prefix of its
new columns (:meth:`BatchKV.keep`, the rollback).  Columns that no row kept are
cropped off the end; a column kept by one row but not another is a *hole* in the
other, masked out of attention and skipped by the explicit position ids, so it
leaves no trace.  :meth:`BatchKV.compact` removes holes once they are a large share
of the cache, and :meth:`BatchKV.select` drops finished rows.

Worked example (two rows, a 3-token step)::

    before      row 0: a b   (lengths [2, 2])      valid [[1 1], [1 1]]
                row 1: c d
    forward     row 0 feeds x y z, row 1 feeds u v  (right-padded with one pad)
    keep [1, 2] row 0 keeps x, row 1 keeps u v      valid [[1 1 1 0], [1 1 1 1]]
                the last column (z / pad) is cropped; row 0 now has a hole at column 3
    next step   row 0's next token gets position 3, row 1's position 4

At batch 1 no column is ever a hole or a pad, so the forward is the plain
``model(input_ids, cache)`` call (no attention mask, no position ids): the same
computation as ordinary decoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .cache import (
    CacheError,
    cache_argument,
    crop_cache,
    has_sliding_window,
    input_device,
    new_cache,
    require_croppable,
    require_transformers_floor,
)

__all__ = ["BatchKV"]

#: Attention implementations that take a 4-D additive mask (token trees); None: a model without the setting.
TREE_ATTENTION = frozenset({None, "eager", "sdpa"})

#: Compact once holes are more than this share of the columns (and there are enough columns to bother).
COMPACT_HOLE_SHARE = 0.5
COMPACT_MIN_COLUMNS = 64


class BatchKV:
    """The batch's target cache.  ``lengths[r]`` tokens of row ``r`` are cached."""

    def __init__(self, model: torch.nn.Module, batch_size: int, *, pad_token_id: int = 0) -> None:
        require_transformers_floor()
        self.model = model
        self.cache: Any = new_cache(model)
        self.device = input_device(model)
        self.lengths: list[int] = [0] * batch_size
        self.valid = torch.zeros((batch_size, 0), dtype=torch.bool, device=self.device)  # [B, L]
        self.pad_token_id = pad_token_id
        self._appended = 0  # columns added by the last forward, not yet settled by keep()
        self._cache_arg = cache_argument(model)
        self._windowed = has_sliding_window(model)  # a sliding mask counts columns: no hole may sit in a window

    @classmethod
    def from_cache(cls, model: torch.nn.Module, cache: object, length: int) -> BatchKV:
        """A batch of one row whose first ``length`` tokens are already in ``cache`` (a prompt cache)."""
        kv = cls(model, 1)
        kv.cache = cache
        kv.lengths = [length]
        kv.valid = torch.ones((1, length), dtype=torch.bool, device=kv.device)
        return kv

    @property
    def batch_size(self) -> int:
        return len(self.lengths)

    @property
    def columns(self) -> int:
        return int(self.valid.shape[1])

    @property
    def has_holes(self) -> bool:
        return any(n != self.columns for n in self.lengths)

    def require_croppable(self) -> None:
        require_croppable(self.cache, "target model")

    # -- the forward pass ----------------------------------------------------------------

    def forward(self, chunks: Sequence[Sequence[int]], parents: Sequence[Sequence[int]]) -> torch.Tensor:
        """Feed ``chunks[r]`` to row ``r``; float32 logits ``[N, V]``, ``1 + len(parents[r])`` rows per row.

        ``chunks[r]``: the row's pending tokens (at least one) followed by the
        nodes of its draft tree; ``parents[r]``: the parent of each node (``-1``:
        the last pending token), so a chain has ``(-1, 0, 1, ...)``.  The result
        stacks, row after row, the logits after the last pending token and after
        each node.  Pending tokens attend causally; node ``i`` attends to the
        row's valid columns, its pending tokens, its ancestors and itself, at
        position ``length + pending + depth(i)``.  When no row branches and no
        row is padded (always at batch 1 with a chain) the forward is the plain
        mask-free call; otherwise each row's mask is built from its valid columns
        and its parents (2-D for chains, 4-D additive for trees).
        Changes the cache: every row gets ``max(len(chunk))`` new columns, settled by :meth:`keep`.
        """
        if self._appended:
            raise CacheError("internal error: BatchKV.forward called twice without keep()")
        batch = self.batch_size
        assert len(chunks) == batch and len(parents) == batch, "one chunk and one parent list per row"
        sizes = [len(c) for c in chunks]
        pending = [size - len(p) for size, p in zip(sizes, parents)]
        if min(pending) < 1:
            raise CacheError("internal error: every row must feed at least one pending token")
        n = max(sizes)
        branching = any(any(parent != i - 1 for i, parent in enumerate(p)) for p in parents)
        padded = batch > 1 and (self.has_holes or min(sizes) != n)
        pad = self.pad_token_id
        ids = torch.tensor([list(c) + [pad] * (n - len(c)) for c in chunks], dtype=torch.long, device=self.device)
        new_valid = torch.tensor([[j < size for j in range(n)] for size in sizes], dtype=torch.bool, device=self.device)
        kwargs: dict[str, object] = {self._cache_arg: self.cache, "use_cache": True}
        wanted = [1 + len(p) for p in parents]  # a contiguous tail of every chunk
        if not padded and len(set(wanted)) == 1:
            kwargs["logits_to_keep"] = wanted[0]
        else:
            keep = [[size - w <= j < size for j in range(n)] for size, w in zip(sizes, wanted)]
            kwargs["logits_to_keep"] = torch.tensor(keep, dtype=torch.bool, device=self.device)
        if branching:
            kwargs["attention_mask"], kwargs["position_ids"] = self._tree_inputs(pending, parents, n)
        elif padded:
            last = [size - 1 for size in sizes]
            positions = [[length + min(j, end) for j in range(n)] for length, end in zip(self.lengths, last)]
            kwargs["attention_mask"] = torch.cat([self.valid, new_valid], dim=1).long()
            kwargs["position_ids"] = torch.tensor(positions, dtype=torch.long, device=self.device)
        with torch.inference_mode():
            out = self.model(input_ids=ids, **kwargs)
        logits = out.logits.reshape(-1, out.logits.shape[-1])  # [N, V]: row after row, offsets in order
        self.valid = torch.cat([self.valid, new_valid], dim=1)
        self._appended = n
        return logits.float()

    def _tree_inputs(
        self, pending: Sequence[int], parents: Sequence[Sequence[int]], n: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The 4-D additive mask ``[B, 1, n, L + n]`` and the position ids ``[B, n]`` of a tree pass.

        Each row's new part is :func:`grammarspec.tree_layout.tree_attention_inputs`'
        (past 0); its cached part is the row's valid columns.  A pad query attends
        to itself only (its logits are never read).
        """
        from .tree_layout import tree_allowed

        allowed, positions = [], []
        for r, (p, rows) in enumerate(zip(pending, parents)):
            grid, offsets = tree_allowed(rows, p)  # pending p, then the nodes
            size = len(grid)
            grid = [line + [False] * (n - size) for line in grid]
            grid += [[j == i for j in range(n)] for i in range(size, n)]
            allowed.append(grid)
            offsets = offsets + [offsets[-1]] * (n - size)
            positions.append([self.lengths[r] + o for o in offsets])
        new = torch.tensor(allowed, dtype=torch.bool, device=self.device)  # [B, n, n]
        real = torch.tensor([[j < p + len(rows) for j in range(n)] for p, rows in zip(pending, parents)],
                            dtype=torch.bool, device=self.device)  # [B, n]  # fmt: skip
        past = self.valid[:, None, :] & real[:, :, None]  # [B, n, L]: a pad query sees no past
        dtype = _float_dtype(self.model)
        visible = torch.cat([past, new], dim=2)[:, None]  # [B, 1, n, L + n]
        mask = torch.zeros(visible.shape, dtype=dtype, device=self.device).masked_fill_(
            ~visible, torch.finfo(dtype).min
        )
        return mask, torch.tensor(positions, dtype=torch.long, device=self.device)

    def supports_trees(self) -> bool:
        """Whether a tree pass can run here: a 4-D additive mask and a gatherable cache.

        Not under flash-attention / flex attention (they take no additive mask),
        nor on a static or quantized cache (a tree's path is gathered column by
        column).  The loop verifies chains there instead.
        """
        config = getattr(self.model, "config", None)
        attention = getattr(config, "_attn_implementation", None)
        if attention not in TREE_ATTENTION:
            return False
        return type(self.cache).__name__ == "DynamicCache"

    # -- commit / rollback ---------------------------------------------------------------

    def keep(self, kept: Sequence[Sequence[int]]) -> None:
        """After :meth:`forward`: row ``r`` keeps its new columns ``kept[r]``, in that order.  Changes the cache.

        ``kept[r]``: increasing offsets into the columns the forward appended
        (a chain keeps a prefix; a tree its pending tokens and the accepted
        path).  Kept columns that are not already in place are gathered there;
        everything else the forward wrote becomes invalid, and columns invalid
        in every row are cropped off the end.  This is the target cache's one rollback.
        """
        n, self._appended = self._appended, 0
        start = self.columns - n
        assert len(kept) == self.batch_size and all(not k or k[-1] < n for k in kept), f"bad kept {kept} for {n}"
        if any(list(k) != list(range(len(k))) for k in kept):  # a tree path off the first branch
            index = [list(k) + list(range(len(k), n)) for k in kept]
            with torch.inference_mode():  # the cache tensors were made under inference mode
                for layer in _layers(self.cache):
                    idx = torch.tensor(index, dtype=torch.long, device=layer.keys.device)
                    layer.keys[:, :, start:] = _gather_columns(layer.keys[:, :, start:], idx)
                    layer.values[:, :, start:] = _gather_columns(layer.values[:, :, start:], idx)
        counts = [len(k) for k in kept]
        limit = torch.tensor(counts, dtype=torch.long, device=self.device)
        self.valid[:, start:] &= torch.arange(n, device=self.device)[None, :] < limit[:, None]
        end = start + max(counts, default=0)
        self.valid = self.valid[:, :end]
        crop_cache(self.cache, end, "target model")
        self.lengths = [length + k for length, k in zip(self.lengths, counts)]
        if self.columns >= COMPACT_MIN_COLUMNS and self.holes() > COMPACT_HOLE_SHARE * self.columns * self.batch_size:
            self.compact()
        elif self._windowed and len(set(counts)) > 1:  # rows kept different numbers of columns: holes
            self.compact()

    def holes(self) -> int:
        """Invalid cells over all rows (holes and left padding)."""
        return self.columns * self.batch_size - sum(self.lengths)

    def select(self, rows: Sequence[int]) -> None:
        """Keep only ``rows`` (in this order): finished rows leave the batch.  Changes the cache."""
        if list(rows) == list(range(self.batch_size)):
            return
        index = torch.tensor(list(rows), dtype=torch.long, device=self.device)
        if self.columns:
            for layer in _layers(self.cache):  # each layer's index on its own device (device_map="auto")
                layer.batch_select_indices(index.to(layer.keys.device))
        self.valid = self.valid[index]
        self.lengths = [self.lengths[r] for r in rows]
        if self.batch_size and self.columns - max(self.lengths) > 0:
            self.compact()

    def extend(self, other: BatchKV) -> None:
        """Append the rows of ``other`` (a batch that just ran its prompt pass).  Changes this cache.

        Both caches are aligned to the longer one: the shorter is left-padded with
        invalid columns.  Costs one copy of both caches.
        """
        assert not self._appended and not other._appended, "extend() between forward() and keep()"
        width = max(self.columns, other.columns)
        mine, theirs = _layers(self.cache), _layers(other.cache)
        if len(mine) != len(theirs):
            raise CacheError("internal error: the two caches have different layers")
        for a, b in zip(mine, theirs):
            a.keys = torch.cat([_left_pad(a.keys, width), _left_pad(b.keys, width)], dim=0)
            a.values = torch.cat([_left_pad(a.values, width), _left_pad(b.values, width)], dim=0)
        pad = lambda valid: torch.nn.functional.pad(valid, (width - valid.shape[1], 0), value=False)  # noqa: E731
        self.valid = torch.cat([pad(self.valid), pad(other.valid)], dim=0)
        self.lengths = self.lengths + other.lengths

    def compact(self) -> None:
        """Move every row's valid columns together, left-padded to the longest row.  Changes the cache.

        Keys carry their rotary positions already, and positions are given
        explicitly from ``lengths``, so moving columns changes no attention score.
        """
        width = max(self.lengths, default=0)
        if not self.columns:
            return
        # Each row's valid columns in order (a stable sort puts them first), right-aligned to `width`; the
        # left padding repeats the first one.  Built from the host's lengths: no host sync.
        order = torch.argsort((~self.valid).to(torch.int8), dim=1, stable=True)  # [B, L]
        lengths = torch.tensor(self.lengths, dtype=torch.long, device=self.device)[:, None]  # [B, 1]
        offsets = torch.arange(width, dtype=torch.long, device=self.device)[None, :]  # [1, W]
        index = order.gather(1, (offsets - (width - lengths)).clamp_min(0))  # [B, W]
        valid = offsets >= width - lengths
        for layer in _layers(self.cache):
            idx = index.to(layer.keys.device)  # each layer's index on its own device (device_map="auto")
            layer.keys, layer.values = _gather_columns(layer.keys, idx), _gather_columns(layer.values, idx)
        self.valid = valid


def _left_pad(states: torch.Tensor, width: int) -> torch.Tensor:
    """``states`` ``[B, H, L, D]`` with ``width - L`` zero columns in front."""
    return torch.nn.functional.pad(states, (0, 0, width - states.shape[2], 0))


def _gather_columns(states: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``states[b, h, index[b, j], d]`` for ``states`` ``[B, H, L, D]`` and ``index`` ``[B, W]``."""
    batch, heads, _, dim = states.shape
    return states.gather(2, index[:, None, :, None].expand(batch, heads, index.shape[1], dim))


def _layers(cache: object) -> list:
    layers = getattr(cache, "layers", None)
    if layers is None or not all(hasattr(layer, "keys") for layer in layers):
        raise CacheError(
            "this KV cache type cannot be compacted for batched speculative decoding; "
            "use batch size 1 or a model with a standard dynamic cache"
        )
    return [layer for layer in layers if getattr(layer, "is_initialized", True) and layer.keys is not None]


def _float_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype the model computes attention in (float32 for parameter-free toys)."""
    param = next(iter(model.parameters()), None)
    return param.dtype if param is not None and param.dtype.is_floating_point else torch.float32
