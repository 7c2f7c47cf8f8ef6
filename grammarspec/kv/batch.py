"""The target's KV cache for a batch of rows of different lengths.

Every row lives in its own slot of one storage per layer
(:class:`grammarspec.kv.slots.SlotLayer`): row ``r``'s cached tokens are the
columns ``[0, lengths[r])`` of slot ``r``, the token at position ``c`` in
column ``c``.  A forward writes each row's new tokens at its own columns
``lengths[r], lengths[r] + 1, ...`` and attends through a 4-D mask that shows
each query its row's prefix and its own new tokens; afterwards each row keeps
some of its new columns (:meth:`BatchKV.keep`, the rollback) and the rest is
overwritten by a later step.  So there are no holes and no padding in front, a
row joins by taking a free slot (:meth:`BatchKV.add_rows`) and leaves by
freeing its own (:meth:`BatchKV.select`), and no step copies the other rows'
caches.

Worked example (two rows, a 3-token step)::

    before      row 0: a b       (lengths [2, 3])
                row 1: c d e
    forward     row 0 writes x y z at columns 2 3 4; row 1 writes u v at columns 3 4 (+ a pad at 5)
    keep [1, 2] row 0 keeps x, row 1 keeps u v      lengths [3, 5]
                row 0's columns 3 4 hold y z, unread and overwritten by its next step
    next step   row 0's next token gets position 3, row 1's position 5

A prompt longer than the step's width is *folded* (``forward(..., width=w)``):
its leading tokens ride as extra batch rows of ``w`` tokens, each reading the
same slot, so a joining prompt is read in the same forward as the decoding rows
without padding them all to its length.  When every row starts at the same
column and feeds the same number of tokens as a chain (always at batch 1 with a
chain), the forward is the plain mask-free ``model(input_ids, cache)`` call: the
same computation as ordinary decoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grammarspec.engine.tree_layout import position_offsets, tree_allowed
from grammarspec.kv.cache import (
    CacheError,
    cache_argument,
    has_sliding_window,
    input_device,
    new_cache,
    require_croppable,
    require_transformers_floor,
)
from grammarspec.kv.grouped_attention import grouped_model
from grammarspec.kv.host_values import to_device
from grammarspec.kv.packed_attention import (
    BATCHED,
    PackedLayout,
    attention_path,
    batched,
    batched_arrays,
    packed_model,
    row_mask,
    supports_packing,
)
from grammarspec.kv.slots import SlotLayer, Storage, WritePlan

__all__ = ["BatchKV"]

#: Attention implementations that take a 4-D additive mask (token trees, rows of different lengths); None: a
#: model without the setting.
TREE_ATTENTION = frozenset({None, "eager", "sdpa"})


@dataclass
class _Feed:
    """One batch row of a forward: ``tokens`` written to ``slot`` from column ``start``."""

    row: int
    slot: int
    start: int
    tokens: list[int]
    pending: int  # leading tokens that attend causally; the rest are tree nodes
    parents: Sequence[int]
    logits: int  # trailing positions whose logits are returned (0: a folded piece of a prompt)


class BatchKV:
    """The batch's target cache.  ``lengths[r]`` tokens of row ``r`` are cached, in slot ``r``.

    ``slots``: how many rows the storage holds before it must grow (the batch's
    most rows at once); ``columns``: how many columns per row to allocate at first.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        batch_size: int,
        *,
        pad_token_id: int = 0,
        slots: int | None = None,
        columns: int = 0,
        cache: Any = None,
    ) -> None:
        require_transformers_floor()
        self.model = model
        self.device = input_device(model)
        self.storage = Storage(slots=max(slots or batch_size, 1), columns=columns)
        self.cache: Any = cache if cache is not None else new_cache(model)
        self._layers = _install(self.cache, self.storage, model)
        self.lengths: list[int] = [0] * batch_size
        self.pad_token_id = pad_token_id
        self._appended: list[int] | None = None  # new columns per row from the last forward, not yet kept
        self.last_pass: tuple[int, int, bool] = (0, 0, False)  # the last forward's batch rows, width, masked path
        self._cache_arg = cache_argument(model)
        self._window, self._layer_types = _attention_windows(model)
        #: Ragged forwards run packed (:mod:`grammarspec.kv.packed_attention`); False: padded rows under a 4-D mask.
        self.packed = supports_packing(model)
        #: How a packed forward attends on this device (:func:`grammarspec.kv.packed_attention.attention_path`).
        self.attention_path = attention_path(self.device)
        self._groups = _query_groups(model)
        self._sync()

    @classmethod
    def from_cache(cls, model: torch.nn.Module, cache: object, length: int, *, columns: int = 0) -> BatchKV:
        """A batch of one row whose first ``length`` tokens are already in ``cache`` (a prompt cache).

        The caller's cache object becomes this batch's cache: its layers are replaced
        by slot layers holding the same tensors, so it keeps what the run commits.
        """
        kv = cls(model, 1, columns=columns, cache=cache)
        kv.lengths = [length]
        kv._sync()
        return kv

    @property
    def batch_size(self) -> int:
        return len(self.lengths)

    @property
    def columns(self) -> int:
        """Columns any row uses (the longest row's length)."""
        return max(self.lengths, default=0)

    @property
    def valid(self) -> torch.Tensor:
        """``[B, columns]`` bool: which columns hold a row's tokens (always a prefix of its slot)."""
        lengths = torch.tensor(self.lengths, dtype=torch.long, device=self.device)
        return torch.arange(self.columns, device=self.device)[None, :] < lengths[:, None]

    @property
    def copied_bytes(self) -> int:
        """Bytes moved between or into slots so far (growth, leaves, prompt caches); no step copies a cache."""
        return self.storage.copied

    def storage_pointers(self) -> list[int]:
        """Where each layer's key storage lives (unchanged while the storage does not grow)."""
        return [layer.data_ptr() for layer in self._layers]

    def require_croppable(self) -> None:
        require_croppable(self.cache, "target model")

    # -- joining and leaving ---------------------------------------------------------------

    def reserve(self, columns: int) -> None:
        """Rows up to ``columns`` long are coming: the next time the storage grows, it grows to that at least."""
        self.storage.columns = max(self.storage.columns, columns)

    def add_rows(self, count: int, caches: Sequence[Any] = ()) -> list[int]:
        """Append ``count`` empty rows in free slots; returns their rows.  Changes the cache.

        ``caches[i]``: a prompt cache (``DynamicCache``) whose tokens start row ``i``
        (copied into its slot: the only columns a join copies), or ``None``.
        """
        assert self._appended is None, "add_rows() between forward() and keep()"
        first = self.batch_size
        self.lengths += [0] * count
        self.storage.slots = max(self.storage.slots, self.batch_size)
        for i, cache in enumerate(caches):
            if cache is None:
                continue
            sources = [layer for layer in getattr(cache, "layers", []) if getattr(layer, "keys", None) is not None]
            if len(sources) != len(self._layers):
                raise CacheError("internal error: the prompt cache and the batch cache have different layers")
            for target, source in zip(self._layers, sources):
                target.write(first + i, source.keys, source.values)
            self.lengths[first + i] = int(sources[0].keys.shape[2]) if sources else 0
        self._sync()
        return list(range(first, self.batch_size))

    def select(self, rows: Sequence[int]) -> list[int]:
        """Keep only ``rows``: the others leave the batch.  Returns the kept rows in their new order.  Changes the cache.

        A kept row stays in its slot unless it sits past the new batch size; then
        it moves into a slot a leaving row freed (the only columns a leave copies).
        """
        assert self._appended is None, "select() between forward() and keep()"
        kept = set(rows)
        size = len(kept)
        movers = iter(sorted(r for r in kept if r >= size))
        order = [slot if slot in kept else next(movers) for slot in range(size)]
        for slot, row in enumerate(order):
            if row != slot:
                for layer in self._layers:
                    layer.move(row, slot, self.lengths[row])
        self.lengths = [self.lengths[r] for r in order]
        self._sync()
        return order

    # -- the forward pass ----------------------------------------------------------------

    def forward(
        self,
        chunks: Sequence[Sequence[int]],
        parents: Sequence[Sequence[int]],
        *,
        width: int | None = None,
        scored: Sequence[bool] | None = None,
    ) -> torch.Tensor:
        """Feed ``chunks[r]`` to row ``r``; float32 logits ``[N, V]``, ``1 + len(parents[r])`` rows per row.

        ``chunks[r]``: the row's pending tokens (at least one) followed by the
        nodes of its draft tree; ``parents[r]``: the parent of each node (``-1``:
        the last pending token), so a chain has ``(-1, 0, 1, ...)``.  The result
        stacks, row after row, the logits after the last pending token and after
        each node.  Pending tokens attend causally; node ``i`` attends to the
        row's cached columns, its pending tokens, its ancestors and itself, at
        position ``length + pending + depth(i)``.  ``width``: a row with more
        pending tokens than that feeds its leading ones as folded pieces of
        ``width`` tokens (extra batch rows reading its slot), so the forward is
        about ``width`` wide whatever the prompts' lengths.  ``scored[r]`` False: row
        ``r`` reads a prompt chunk and gets no logits rows.
        Changes the cache: row ``r`` gets ``len(chunks[r])`` new columns, settled by :meth:`keep`.
        """
        if self._appended is not None:
            raise CacheError("internal error: BatchKV.forward called twice without keep()")
        batch = self.batch_size
        assert len(chunks) == batch and len(parents) == batch, "one chunk and one parent list per row"
        feeds = self._feeds(chunks, parents, None if self.packed else width)
        if scored is not None:
            for feed, wanted in zip(feeds, scored):
                feed.logits = feed.logits if wanted else 0
        n = max(len(f.tokens) for f in feeds)
        branching = any(any(parent != i - 1 for i, parent in enumerate(p)) for p in parents)
        plain = len(feeds) == batch and len({f.start for f in feeds}) == 1 and len({len(f.tokens) for f in feeds}) == 1
        plain = plain and not branching and len({f.logits for f in feeds}) == 1 and feeds[0].logits > 0
        # On the CPU one token a row goes to the masked call (it reads every slot in one kernel); an accelerator
        # runs every ragged step packed, in one attention call per layer.
        if not plain and self.packed and (n > 1 or self.attention_path == BATCHED):
            return self._forward_packed(feeds, chunks)
        plan = WritePlan([f.slot for f in feeds], [f.start for f in feeds], n, max(f.start + n for f in feeds))
        plan.real = [len(f.tokens) for f in feeds]
        pad = self.pad_token_id
        ids_host = [t for f in feeds for t in f.tokens + [pad] * (n - len(f.tokens))]
        kwargs: dict[str, object] = {self._cache_arg: self.cache, "use_cache": True}
        if plain:
            (ids,) = to_device([ids_host], self.device)
            kwargs["logits_to_keep"] = feeds[0].logits
            for layer in self._layers:
                layer.seq = feeds[0].start  # the model reads its positions from the cache length
        else:
            keep = [int(len(f.tokens) - f.logits <= j < len(f.tokens)) for f in feeds for j in range(n)]
            ids, keep_mask, mask, positions = self._masks(feeds, n, plan, ids_host, keep)
            kwargs["logits_to_keep"] = keep_mask.view(len(feeds), n) != 0
            kwargs["attention_mask"], kwargs["position_ids"] = mask, positions
        return self._run(plan, ids.view(len(feeds), n), kwargs, chunks, (len(feeds), n, not plain))

    def _forward_packed(self, feeds: Sequence[_Feed], chunks: Sequence[Sequence[int]]) -> torch.Tensor:
        """:meth:`forward` as one packed sequence of every row's tokens (no padding; see
        :mod:`grammarspec.kv.packed_attention`).  Changes the cache as :meth:`forward`."""
        device = self.device
        sizes = [len(f.tokens) for f in feeds]
        plan = WritePlan(
            [f.slot for f in feeds], [f.start for f in feeds], max(sizes), max(f.start + len(f.tokens) for f in feeds)
        )
        plan.sizes = sizes
        one_call = self.attention_path == BATCHED
        layout = PackedLayout(
            plan.slots,
            plan.starts,
            sizes,
            [None] * len(feeds)
            if one_call
            else [row_mask(f.start, f.pending, f.parents, self._groups, device) for f in feeds],
            self._groups,
        )
        # every integer of the step, built here on the host, reaches the device in one copy
        ids = [t for f in feeds for t in f.tokens]
        positions = [f.start + offset for f in feeds for offset in position_offsets(list(f.parents), f.pending)]
        wanted = [
            at + size - f.logits + i for f, at, size in zip(feeds, layout.offsets, sizes) for i in range(f.logits)
        ]
        arrays = [ids, positions, wanted, *plan.host_packed_index()]
        if one_call:
            extra, queries, nodes = batched_arrays(
                plan.starts, sizes, [f.pending for f in feeds], [f.parents for f in feeds]
            )
            arrays += extra
        tensors = to_device(arrays, device)
        plan.preset(tensors[3], tensors[4])
        if one_call:
            assert plan.in_order, "internal error: a packed forward reads row r's slot r"
            layout.batched = batched(tensors[5:], queries, nodes, plan.width, self._groups, _float_dtype(self.model))
        kwargs: dict[str, object] = {
            self._cache_arg: self.cache,
            "use_cache": True,
            "position_ids": tensors[1][None],
            "logits_to_keep": tensors[2],
        }
        return self._run(plan, tensors[0][None], kwargs, chunks, (len(feeds), max(sizes), True), layout)

    def _run(
        self,
        plan: WritePlan,
        ids: torch.Tensor,
        kwargs: dict[str, object],
        chunks: Sequence[Sequence[int]],
        shape: tuple[int, int, bool],
        layout: PackedLayout | None = None,
    ) -> torch.Tensor:
        """The model's forward with every layer writing by ``plan`` (packed attention over ``layout`` when given);
        float32 logits ``[N, V]``, row after row.  Changes the cache: ``chunks[r]`` columns pending :meth:`keep`."""
        for layer in self._layers:
            layer.plan = plan
        try:
            with (
                torch.inference_mode(),
                packed_model(self.model, layout) if layout is not None else grouped_model(self.model),
            ):
                out = self.model(input_ids=ids, **kwargs)
        finally:
            for layer in self._layers:
                layer.plan = None
            self._sync()
        self._appended = [len(c) for c in chunks]
        self.last_pass = shape
        return out.logits.reshape(-1, out.logits.shape[-1]).float()

    def _feeds(
        self, chunks: Sequence[Sequence[int]], parents: Sequence[Sequence[int]], width: int | None
    ) -> list[_Feed]:
        """Each row's batch row (its last pending tokens and its tree), then the folded pieces of long prompts."""
        rows, pieces = [], []
        for r, (chunk, nodes) in enumerate(zip(chunks, parents)):
            pending = len(chunk) - len(nodes)
            if pending < 1:
                raise CacheError("internal error: every row must feed at least one pending token")
            folded = 0
            if width is not None and pending > width:  # the leading tokens ride as pieces of `width`
                folded = (pending - 1) // width * width
                for start in range(0, folded, width):
                    tokens = list(chunk[start : start + width])
                    pieces.append(_Feed(r, r, self.lengths[r] + start, tokens, width, (), 0))
            rows.append(
                _Feed(r, r, self.lengths[r] + folded, list(chunk[folded:]), pending - folded, nodes, 1 + len(nodes))
            )
        return rows + pieces

    def _masks(
        self, feeds: Sequence[_Feed], n: int, plan: WritePlan, ids: Sequence[int], keep: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor, Any, torch.Tensor]:
        """``ids`` and ``keep`` (host integers) on the device, the 4-D additive mask(s) ``[R, 1, n, width]`` and
        the position ids ``[R, n]`` of a forward, all from one copy of the host's integers (the plan's write index
        too).

        Query ``j`` of a batch row sees its slot's columns before its start (the
        row's cache and any folded pieces before it) and, among its new columns,
        what :func:`grammarspec.engine.tree_layout.tree_allowed` allows; a pad query sees
        itself only (its logits are never read).  A sliding-window layer also hides
        keys ``window`` or more positions behind the query (a dict per layer type
        when the model mixes full and sliding layers).
        """
        device = self.device
        width = plan.width
        grids, offsets = [], []
        for f in feeds:
            grid, offset = tree_allowed(list(f.parents), f.pending)
            size = len(grid)
            grids += [int(seen) for line in grid for seen in line + [False] * (n - size)]
            grids += [int(j == i) for i in range(size, n) for j in range(n)]
            offsets += offset + [offset[-1] + 1 + i for i in range(n - size)]
        rows = len(feeds)
        host = [ids, keep, [f.start for f in feeds], [len(f.tokens) for f in feeds], grids, offsets, *plan.host_index()]
        ids_on, keep_on, starts, sizes, allowed, offset_ids, slots, write_columns = to_device(host, device)
        plan.preset(slots, write_columns)
        starts, sizes = starts[:, None], sizes[:, None]  # [R, 1]
        steps = torch.arange(n, dtype=torch.long, device=device)[None, :]  # [1, n]
        columns = torch.arange(width, dtype=torch.long, device=device)[None, :]  # [1, W]
        new_columns = starts + steps  # [R, n]: where each new token sits
        past = (columns[:, None, :] < starts[:, :, None]) & (steps < sizes)[:, :, None]  # [R, n, W]
        allowed = allowed.view(rows, n, n) != 0  # [R, n, n]
        visible = past.scatter(2, new_columns[:, None, :].expand(-1, n, -1), allowed)  # new columns: the grid
        positions = starts + offset_ids.view(rows, n)  # [R, n]
        dtype = _float_dtype(self.model)

        def additive(seen: torch.Tensor) -> torch.Tensor:
            mask = torch.zeros(seen.shape, dtype=dtype, device=device)
            return mask.masked_fill_(~seen, torch.finfo(dtype).min)[:, None]  # [R, 1, n, W]

        if self._window is None:
            return ids_on, keep_on, additive(visible), positions
        key_positions = columns.expand(len(feeds), -1).scatter(1, new_columns, positions)  # [R, W]
        near = positions[:, :, None] - key_positions[:, None, :] < self._window  # [R, n, W]
        windowed = additive(visible & near)
        if self._layer_types is None:  # every layer slides (Mistral v0.1)
            return ids_on, keep_on, windowed, positions
        full = additive(visible)
        kinds = {kind: windowed if kind == "sliding_attention" else full for kind in self._layer_types}
        return ids_on, keep_on, kinds, positions

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

        ``kept[r]``: increasing offsets into the tokens the row fed (a chain keeps
        a prefix; a tree its pending tokens and the accepted path).  Kept columns
        that are not already in place are moved there within the row's slot; the
        rest stay beyond the row's length, unread, until a later step overwrites
        them.  This is the target cache's one rollback.
        """
        appended, self._appended = self._appended, None
        assert appended is not None, "keep() without forward()"
        assert len(kept) == self.batch_size and all(not k or k[-1] < a for k, a in zip(kept, appended)), (
            f"bad kept {kept} for {appended}"
        )
        moves = [
            (r, self.lengths[r] + k, self.lengths[r] + i)
            for r, row in enumerate(kept)
            for i, k in enumerate(row)
            if k != i
        ]
        if moves:  # a tree path off the first branch
            host = [[m[0] for m in moves], [m[1] for m in moves], [m[2] for m in moves]]
            index: dict[torch.device, list[torch.Tensor]] = {}  # one copy per device the layers live on
            with torch.inference_mode():  # the cache tensors were made under inference mode
                for layer in self._layers:
                    if layer._k is None:
                        continue
                    if layer._k.device not in index:
                        index[layer._k.device] = to_device(host, layer._k.device)
                    _move_columns(layer, *index[layer._k.device])
        self.lengths = [length + len(k) for length, k in zip(self.lengths, kept)]
        self._sync()

    def _sync(self) -> None:
        """Every layer's view: the batch's rows, up to the longest row's columns."""
        for layer in self._layers:
            layer.rows, layer.seq = self.batch_size, self.columns


def _move_columns(layer: SlotLayer, slot: torch.Tensor, source: torch.Tensor, target: torch.Tensor) -> None:
    """Move ``(slot, from column, to column)`` for each element of the three index tensors (read all first, then
    write)."""
    storage_k, storage_v = layer._k, layer._v
    if storage_k is None or storage_v is None:
        return
    storage_k[slot, :, target] = storage_k[slot, :, source]  # the right side is gathered before the write
    storage_v[slot, :, target] = storage_v[slot, :, source]


def _install(cache: Any, storage: Storage, model: torch.nn.Module) -> list[SlotLayer]:
    """Replace ``cache``'s attention layers by slot layers (adopting any tensors they hold).  Changes ``cache``."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise CacheError(
            "this KV cache type cannot hold a batch for speculative decoding; use a model with a standard dynamic cache"
        )
    if not layers:  # a cache that creates its layers on first use
        config: Any = getattr(model, "config", None)
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        layers.extend(SlotLayer(storage) for _ in range(int(getattr(text, "num_hidden_layers", 1))))
    if hasattr(cache, "layer_class_to_replicate"):
        cache.layer_class_to_replicate = None
    out = []
    for i, layer in enumerate(layers):
        if isinstance(layer, SlotLayer):
            layer.storage = storage
            out.append(layer)
            continue
        if type(layer).__name__ not in ("DynamicLayer", "DynamicSlidingWindowLayer"):
            raise CacheError(
                f"the target's KV cache has a {type(layer).__name__} layer, which grammarspec's batch cache cannot "
                "hold (recurrent or quantised layers); use a model with attention layers only"
            )
        slot = SlotLayer(storage)
        keys = getattr(layer, "keys", None)
        if keys is not None and keys.numel():
            if type(layer).__name__ == "DynamicSlidingWindowLayer" and layer.cumulative_length >= layer.sliding_window:
                raise CacheError(
                    "the prompt cache has a sliding-window layer, which forgets the earliest columns; build the "
                    "prompt cache with grammarspec.kv.cache.new_cache(model) (full layers; the model still attends "
                    "within its window)"
                )
            slot.keys, slot.values = keys, layer.values
            slot.is_initialized = True
            storage.columns = max(storage.columns, int(keys.shape[2]))
        layers[i] = slot
        out.append(slot)
    return out


def _attention_windows(model: torch.nn.Module) -> tuple[int | None, tuple[str, ...] | None]:
    """``(window, layer types)``: the sliding window (None: none), and the layer types when they differ by layer."""
    if not has_sliding_window(model):
        return None, None
    config: Any = getattr(model, "config", None)
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    types = getattr(text, "layer_types", None)
    if types and "chunked_attention" in types:
        raise CacheError(
            "chunked-attention layers (Llama 4) are not supported by grammarspec's batch cache; use another model"
        )
    window = int(getattr(text, "sliding_window", 0) or 0)
    return window, tuple(sorted(set(types))) if types else None


def _query_groups(model: torch.nn.Module) -> int:
    """How many query heads share a key head (1 without grouped-query attention)."""
    config: Any = getattr(model, "config", None)
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    heads = getattr(text, "num_attention_heads", None)
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    return heads // kv_heads if heads and kv_heads else 1


def _float_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype the model computes attention in (float32 for parameter-free toys)."""
    param = next(iter(model.parameters()), None)
    return param.dtype if param is not None and param.dtype.is_floating_point else torch.float32
