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

import torch

from .cache import CacheError, cache_argument, crop_cache, has_sliding_window, new_cache, require_croppable

__all__ = ["BatchKV"]

#: Compact once holes are more than this share of the columns (and there are enough columns to bother).
COMPACT_HOLE_SHARE = 0.5
COMPACT_MIN_COLUMNS = 64


class BatchKV:
    """The batch's target cache.  ``lengths[r]`` tokens of row ``r`` are cached."""

    def __init__(self, model: torch.nn.Module, batch_size: int, *, pad_token_id: int = 0) -> None:
        self.model = model
        self.cache = new_cache(model)
        self.device = _device(model)
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

    def forward(self, chunks: Sequence[Sequence[int]], wanted: Sequence[Sequence[int]]) -> torch.Tensor:
        """Feed ``chunks[r]`` to row ``r``; float32 logits ``[N, V]`` of the ``wanted`` offsets.

        ``chunks``: the new token ids of every row (at least one each).
        ``wanted[r]``: offsets into ``chunks[r]`` whose next-token logits are needed,
        increasing; the result stacks them row after row (N = total wanted).
        Changes the cache: every row gets ``max(len(chunk))`` new columns, settled by :meth:`keep`.
        """
        if self._appended:
            raise CacheError("internal error: BatchKV.forward called twice without keep()")
        batch = self.batch_size
        assert len(chunks) == batch and len(wanted) == batch, "one chunk and one wanted list per row"
        sizes = [len(c) for c in chunks]
        if min(sizes) < 1:
            raise CacheError("internal error: every row must feed at least one token")
        n = max(sizes)
        padded = batch > 1 and (self.has_holes or min(sizes) != n)
        ids = torch.full((batch, n), self.pad_token_id, dtype=torch.long)
        new_valid = torch.zeros((batch, n), dtype=torch.bool)
        for r, chunk in enumerate(chunks):
            ids[r, : len(chunk)] = torch.tensor(chunk, dtype=torch.long)
            new_valid[r, : len(chunk)] = True
        kwargs: dict[str, object] = {self._cache_arg: self.cache, "use_cache": True}
        contiguous = all(list(w) == list(range(sizes[r] - len(w), sizes[r])) for r, w in enumerate(wanted))
        same_tail = contiguous and len({len(w) for w in wanted}) == 1 and not padded
        if same_tail:
            kwargs["logits_to_keep"] = len(wanted[0])
        else:
            keep = torch.zeros((batch, n), dtype=torch.bool)
            for r, offsets in enumerate(wanted):
                keep[r, list(offsets)] = True
            kwargs["logits_to_keep"] = keep.to(self.device)
        new_valid = new_valid.to(self.device)
        if padded:
            offsets = torch.arange(n, device=self.device)
            last = torch.tensor([s - 1 for s in sizes], device=self.device)
            starts = torch.tensor(self.lengths, device=self.device)
            kwargs["attention_mask"] = torch.cat([self.valid, new_valid], dim=1).long()
            kwargs["position_ids"] = starts[:, None] + torch.minimum(offsets[None, :], last[:, None])
        with torch.inference_mode():
            out = self.model(input_ids=ids.to(self.device), **kwargs)
        logits = out.logits.reshape(-1, out.logits.shape[-1])  # [N, V]: row after row, offsets in order
        self.valid = torch.cat([self.valid, new_valid], dim=1)
        self._appended = n
        return logits.float()

    # -- commit / rollback ---------------------------------------------------------------

    def keep(self, kept: Sequence[int]) -> None:
        """After :meth:`forward`: row ``r`` keeps the first ``kept[r]`` of its new columns.  Changes the cache.

        Everything else the forward wrote becomes invalid; columns invalid in every
        row are cropped off the end.  This is the target cache's rollback.
        """
        n, self._appended = self._appended, 0
        start = self.columns - n
        assert len(kept) == self.batch_size and all(0 <= k <= n for k in kept), f"bad kept {kept} for {n} columns"
        limit = torch.tensor(list(kept), device=self.device)
        self.valid[:, start:] &= torch.arange(n, device=self.device)[None, :] < limit[:, None]
        end = start + max(kept, default=0)
        self.valid = self.valid[:, :end]
        crop_cache(self.cache, end, "target model")
        self.lengths = [length + k for length, k in zip(self.lengths, kept)]
        if self.columns >= COMPACT_MIN_COLUMNS and self.holes() > COMPACT_HOLE_SHARE * self.columns * self.batch_size:
            self.compact()
        elif self._windowed and len(set(kept)) > 1:  # rows kept different numbers of columns: holes
            self.compact()

    def keep_prefix(self, length: int) -> None:
        """Batch 1, after a tree step gathered its path into place: the cache holds ``length`` tokens.  Changes it."""
        assert self.batch_size == 1 and not self._appended, "keep_prefix is for a batch of one, between steps"
        crop_cache(self.cache, length, "target model")
        self.lengths = [length]
        self.valid = torch.ones((1, length), dtype=torch.bool, device=self.device)

    def holes(self) -> int:
        """Invalid cells over all rows (holes and left padding)."""
        return self.columns * self.batch_size - sum(self.lengths)

    def select(self, rows: Sequence[int]) -> None:
        """Keep only ``rows`` (in this order): finished rows leave the batch.  Changes the cache."""
        if list(rows) == list(range(self.batch_size)):
            return
        index = torch.tensor(list(rows), dtype=torch.long, device=self.device)
        if self.columns:
            self.cache.batch_select_indices(index)
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
        index = torch.zeros((self.batch_size, width), dtype=torch.long, device=self.device)
        valid = torch.zeros((self.batch_size, width), dtype=torch.bool, device=self.device)
        for r, length in enumerate(self.lengths):
            columns = self.valid[r].nonzero().flatten()
            assert columns.numel() == length, "internal error: valid columns disagree with the row length"
            if length:
                index[r, width - length :] = columns
                index[r, : width - length] = columns[0]
                valid[r, width - length :] = True
        for layer in _layers(self.cache):
            layer.keys, layer.values = _gather_columns(layer.keys, index), _gather_columns(layer.values, index)
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


def _device(model: torch.nn.Module) -> torch.device:
    device = getattr(model, "device", None)
    if device is not None:
        return torch.device(device)
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")
