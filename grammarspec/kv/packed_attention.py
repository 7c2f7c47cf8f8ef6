"""Packed attention: rows of different lengths in one forward with no padding.

A ragged step (rows of different lengths, a prompt chunk beside decoding rows,
draft trees) runs as one sequence of every row's new tokens back to back,
``input_ids [1, T]``: the model's projections and MLPs see exactly the ``T``
real tokens, none padded to the widest row.  Only attention needs to know the
rows: :func:`packed_attention`, registered with transformers'
``AttentionInterface`` under :data:`NAME`, attends each row's queries to its own
slot of the batch cache (:class:`grammarspec.kv.slots.SlotLayer`), over that
row's columns only, through a mask no larger than the row's own block.  This is
the layout of vLLM's and transformers' continuous batching (packed tokens,
per-sequence attention) applied to grammarspec's slot cache.

Grouped-query attention is computed without copying keys: the query heads that
share a key head are stacked along the query axis, so every row reads its slot
in place.

Two ways to attend, one per kind of device (:func:`attention_path`):

- :data:`ROWS` (the CPU): each row's queries against its own slot, one SDPA
  call per row and layer (the single-token rows batched in one).  On a CPU a
  call costs what its arithmetic costs, and SDPA under a mask loses its causal
  fast kernel, so the smallest calls are the fastest.
- :data:`BATCHED` (every accelerator): one SDPA call per layer for the whole
  batch, whatever its rows, drafts, trees or prompt chunks.  The packed queries
  are gathered into ``[rows, key heads, groups * Q, D]`` (``Q``: the widest
  row; shorter rows padded, their padding never read), attend to the slots in
  place ``[rows, key heads, width, D]`` under one additive mask
  ``[rows, 1, groups * Q, width]`` built once a step from the host's own
  integers (:class:`Batched`) and shared by every layer, and are scattered back
  to the packed order.  A GPU's cost is kernel launches and host waits, not the
  padded queries' arithmetic: the call count is the number of layers, and
  nothing in the step reads a device value.  On CUDA the masked call goes to the
  memory-efficient (or cuDNN) kernel, which takes an arbitrary additive mask;
  the mask's rows are laid out 16-aligned so the kernel need not copy it.
  ``flex_attention`` (a block mask over the packed tokens and the slots) would
  skip the padded queries' work too, but is fast only under ``torch.compile``,
  which recompiles as the step's shapes change from step to step; it stays out
  unless the padded queries show in the device's step times (a long joining
  prompt chunk makes ``Q`` its length for every row of that step).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn import functional

__all__ = [
    "BATCHED",
    "NAME",
    "ROWS",
    "Batched",
    "attention_path",
    "batched_arrays",
    "PackedLayout",
    "attention_implementation",
    "packed_attention",
    "packed_model",
    "supports_packing",
    "row_mask",
]

#: The attention implementation's name in transformers' registry (set on the model's config during a packed forward).
NAME = "grammarspec_packed"

_layout: ContextVar[PackedLayout | None] = ContextVar("grammarspec_packed_layout", default=None)

#: One attention call per row and layer (single-token rows batched): the CPU's path.
ROWS = "rows"
#: One attention call per layer for the whole batch under one mask built once a step: every accelerator's path.
BATCHED = "batched"


def attention_path(device: torch.device | str) -> str:
    """How a packed forward on ``device`` attends: :data:`ROWS` on the CPU, :data:`BATCHED` elsewhere.  Pure."""
    return ROWS if torch.device(device).type == "cpu" else BATCHED


@dataclass
class Batched:
    """A packed forward's one attention call per layer (:data:`BATCHED`), built once a step for every layer.

    ``gather [rows * queries]``: the packed token at each (row, query) place
    (padding: token 0, never read back); ``scatter [T]``: each packed token's
    place; ``mask [rows, 1, groups * queries, width]``: additive, each row's
    query heads stacked per key head as the queries are.
    """

    rows: int
    queries: int
    width: int
    gather: torch.Tensor
    scatter: torch.Tensor
    mask: torch.Tensor


def batched_arrays(
    starts: Sequence[int], sizes: Sequence[int], pendings: Sequence[int], parents: Sequence[Sequence[int]]
) -> tuple[list[list[int]], int, int]:
    """The host integers of :func:`batched`: ``(arrays, queries, nodes)``.  Pure.

    ``arrays``: the rows' starts, sizes and pending counts, ``gather``,
    ``scatter`` and the tree grid (``[rows, nodes, nodes]`` flattened: node
    ``k`` of row ``r`` is an ancestor of node ``i`` or ``i`` itself; empty when
    no row branches, every row then causal).
    """
    queries = max(sizes)
    gather, scatter, offset = [0] * (len(sizes) * queries), [], 0
    for r, size in enumerate(sizes):
        for j in range(size):
            gather[r * queries + j] = offset + j
            scatter.append(r * queries + j)
        offset += size
    branching = any(any(parent != i - 1 for i, parent in enumerate(p)) for p in parents)
    nodes = max((len(p) for p in parents), default=0) if branching else 0
    grid = [0] * (len(sizes) * nodes * nodes)
    for r, p in enumerate(parents if nodes else ()):
        base = r * nodes * nodes
        for i, parent in enumerate(p):
            if parent >= 0:
                grid[base + i * nodes : base + i * nodes + i] = grid[base + parent * nodes : base + parent * nodes + i]
            grid[base + i * nodes + i] = 1
    return [list(starts), list(sizes), list(pendings), gather, scatter, grid], queries, nodes


def batched(
    tensors: Sequence[torch.Tensor], queries: int, nodes: int, width: int, groups: int, dtype: torch.dtype
) -> Batched:
    """:class:`Batched` from :func:`batched_arrays`' arrays on the device (``tensors``), in a fixed number of
    kernels whatever the rows: query ``j`` of row ``r`` sees its slot's columns before ``starts[r]`` and its new
    columns up to itself (a tree node: its pending tokens, its ancestors and itself).  Reads nothing back."""
    starts, sizes, pendings, gather, scatter, grid = tensors
    rows = len(starts)
    device = starts.device
    j = torch.arange(queries, device=device)[None, :, None]  # [1, Q, 1]
    new = torch.arange(width, device=device)[None, None, :] - starts[:, None, None]  # [R, 1, W]: offset in the row
    seen = (new < 0) | ((new <= j) & (new < sizes[:, None, None]))  # [R, Q, W]; a padded query sees the row whole
    if nodes:
        node_q = j - pendings[:, None, None]  # [R, Q, 1]
        node_k = new - pendings[:, None, None]  # [R, 1, W]
        count = (sizes - pendings)[:, None, None]
        inside = (node_q >= 0) & (node_q < count) & (node_k >= 0) & (node_k < count)  # [R, Q, W]
        place = (
            torch.arange(rows, device=device)[:, None, None] * nodes * nodes
            + node_q.clamp(0, nodes - 1) * nodes
            + node_k.clamp(0, nodes - 1)
        )
        seen = torch.where(inside, grid[place] != 0, seen)
    aligned = -(-width // 16) * 16  # the kernels want the mask's rows 16-aligned, or copy it
    mask = torch.zeros((rows, 1, groups, queries, aligned), dtype=dtype, device=device)[..., :width]
    mask.masked_fill_(~seen[:, None, None], torch.finfo(dtype).min)
    return Batched(rows, queries, width, gather, scatter, mask.view(rows, 1, groups * queries, width))


@dataclass
class PackedLayout:
    """Where each row's tokens sit in the packed sequence and what they attend to.

    Row ``i`` fed ``sizes[i]`` tokens, at ``offsets[i]`` in the packed sequence;
    they were written to slot ``slots[i]`` at columns ``starts[i] ...``, and they
    attend over the slot's columns ``[0, starts[i] + sizes[i])`` through
    ``masks[i]`` (``[groups * sizes[i], starts[i] + sizes[i]]`` bool, True: seen;
    ``None``: every column, a single token's query).  The rows of a single token
    attend in one batched call over their slots (:meth:`singles`), as a plain
    decode step would; the others one row at a time.
    """

    slots: list[int]
    starts: list[int]
    sizes: list[int]
    masks: list[torch.Tensor | None]
    groups: int
    batched: Batched | None = None  # set: the whole batch in one call per layer (BATCHED)
    _singles: dict[torch.device, _Singles | None] = field(default_factory=dict)
    offsets: list[int] = field(init=False)  # where each row's tokens begin in the packed sequence

    def __post_init__(self) -> None:
        self.offsets = [sum(self.sizes[:i]) for i in range(len(self.sizes))]

    def singles(self, device: torch.device) -> _Singles | None:
        """The single-token rows' batched call (``None`` for fewer than two), built once per device a forward."""
        if device not in self._singles:
            rows = [i for i, size in enumerate(self.sizes) if size == 1]
            found = None
            if len(rows) >= 2:
                offsets = self.offsets
                slots = [self.slots[i] for i in rows]
                ends = [1] * (max(slots) + 1)  # a slot no single row reads sees its first column (never used)
                for i, slot in zip(rows, slots):
                    ends[slot] = self.starts[i] + 1
                width = max(ends)
                columns = torch.arange(width, dtype=torch.long, device=device)
                seen = columns[None, :] < torch.tensor(ends, dtype=torch.long, device=device)[:, None]
                found = _Singles(
                    frozenset(rows),
                    torch.tensor([offsets[i] for i in rows], dtype=torch.long, device=device),
                    torch.tensor(slots, dtype=torch.long, device=device),
                    seen[:, None, None, :],
                    width,
                )
            self._singles[device] = found
        return self._singles[device]


@dataclass
class _Singles:
    """The rows of one query token each, attended in one call over slots ``[0, len(mask))``."""

    rows: frozenset[int]
    positions: torch.Tensor  # [S]: each row's token in the packed sequence
    slots: torch.Tensor  # [S]
    mask: torch.Tensor  # [slots, 1, 1, width] bool: each slot's cached columns and its new one
    width: int


def row_mask(
    start: int, pending: int, parents: Sequence[int], groups: int, device: torch.device
) -> torch.Tensor | None:
    """One row's mask over its slot's columns ``[0, start + q)``, ``q = pending + len(parents)``.

    Its cached columns are all seen; its ``pending`` tokens attend causally and
    each tree node sees every pending token, its ancestors and itself (as
    :func:`grammarspec.engine.tree_layout.tree_allowed`).  Rows are repeated ``groups``
    times (the query heads sharing a key head, stacked).  ``None`` for a single
    token, which sees every column.  Pure.
    """
    q = pending + len(parents)
    if q == 1:
        return None
    new = torch.ones((q, q), dtype=torch.bool, device=device).tril_()
    if parents:
        nodes = torch.zeros((len(parents), len(parents)), dtype=torch.bool, device="cpu")
        for i, parent in enumerate(parents):
            if parent >= 0:
                nodes[i] = nodes[parent]
            nodes[i, i] = True
        new[pending:, pending:] = nodes.to(device)
    mask = torch.cat([torch.ones((q, start), dtype=torch.bool, device=device), new], dim=1)
    return mask.repeat(groups, 1) if groups > 1 else mask


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention for a packed forward: ``query [1, H, T, D]``; ``key`` / ``value`` the whole slot storage.

    Returns ``[1, T, H, D]`` as transformers' attention functions do.
    """
    layout = _layout.get()
    if layout is None:
        raise RuntimeError("internal error: a packed forward ran without its layout")
    heads, dim = query.shape[1], query.shape[3]
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    if layout.batched is not None:
        return _attend_batched(layout.batched, query, key, value, kv_heads, groups, scaling), None
    result = query.new_empty((query.shape[2], heads, value.shape[3]))  # [T, H, D]
    singles = layout.singles(query.device)
    if singles is not None:  # [slots, kv_heads, groups, D]: each slot's one query, its heads stacked per key head
        stacked = query.new_zeros((singles.mask.shape[0], kv_heads, groups, dim))
        stacked[singles.slots] = query[0][:, singles.positions].transpose(0, 1).reshape(-1, kv_heads, groups, dim)
        rows = singles.mask.shape[0]
        out = functional.scaled_dot_product_attention(
            stacked,
            key[:rows, :, : singles.width],
            value[:rows, :, : singles.width],
            attn_mask=singles.mask,
            scale=scaling,
        )
        result[singles.positions] = out[singles.slots].reshape(-1, heads, value.shape[3])
    done = singles.rows if singles is not None else frozenset()
    for i, (slot, start, size, offset, mask) in enumerate(
        zip(layout.slots, layout.starts, layout.sizes, layout.offsets, layout.masks)
    ):
        if i in done:
            continue
        end = start + size
        # the query heads sharing a key head, stacked along the query axis: [1, kv_heads, groups * size, D]
        q = query[:, :, offset : offset + size].reshape(1, kv_heads, groups * size, dim)
        out = functional.scaled_dot_product_attention(
            q, key[slot : slot + 1, :, :end], value[slot : slot + 1, :, :end], attn_mask=mask, scale=scaling
        )
        result[offset : offset + size] = out.reshape(heads, size, -1).transpose(0, 1)
    return result[None], None


def _attend_batched(
    plan: Batched,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    kv_heads: int,
    groups: int,
    scaling: float | None,
) -> torch.Tensor:
    """The whole batch in one SDPA call: ``query [1, H, T, D]`` -> ``[1, T, H, Dv]``."""
    rows, queries, dim = plan.rows, plan.queries, query.shape[3]
    stacked = (
        query[0]
        .index_select(1, plan.gather)  # [H, R * Q, D]
        .view(kv_heads, groups, rows, queries, dim)
        .permute(2, 0, 1, 3, 4)
        .reshape(rows, kv_heads, groups * queries, dim)
    )
    out = functional.scaled_dot_product_attention(
        stacked, key[:rows, :, : plan.width], value[:rows, :, : plan.width], attn_mask=plan.mask, scale=scaling
    )  # [R, kv_heads, groups * Q, Dv]
    heads = kv_heads * groups
    out = out.view(rows, kv_heads, groups, queries, -1).permute(0, 3, 1, 2, 4).reshape(rows * queries, heads, -1)
    return out.index_select(0, plan.scatter)[None]


def supports_packing(model: torch.nn.Module) -> bool:
    """Whether a ragged forward of ``model`` can run packed: SDPA attention with nothing beside the softmax.

    Not for sliding-window layers, logit soft-capping or attention sinks (they
    keep the 4-D masked path), nor for other attention implementations.
    """
    config: Any = getattr(model, "config", None)
    if config is None:
        return False
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    if getattr(text, "_attn_implementation", None) != "sdpa":
        return False
    if getattr(text, "sliding_window", None) or getattr(text, "attn_logit_softcapping", None):
        return False
    heads, kv_heads = getattr(text, "num_attention_heads", None), getattr(text, "num_key_value_heads", None)
    if heads is None or (kv_heads is not None and heads % kv_heads):
        return False
    return not any(hasattr(module, "sinks") for module in model.modules())


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, packed_attention)


@contextmanager
def packed_model(model: torch.nn.Module, layout: PackedLayout) -> Iterator[None]:
    """Run ``model`` with packed attention over ``layout`` for the duration of the block.

    Sets the attention implementation on the model's config (and its sub-configs)
    and restores each afterwards; transformers builds no mask for it.
    """
    _register()
    token = _layout.set(layout)
    try:
        with attention_implementation(_configs(getattr(model, "config", None)), NAME):
            yield
    finally:
        _layout.reset(token)


@contextmanager
def attention_implementation(configs: Sequence[Any], name: str) -> Iterator[None]:
    """Set the attention implementation ``name`` (registered with transformers) on each of ``configs`` for the
    block, and restore each one's own afterwards."""
    saved = [(config, config.__dict__.get("_attn_implementation_internal")) for config in configs]
    try:
        for config in configs:
            config._attn_implementation_internal = name
        yield
    finally:
        for config, value in saved:
            config._attn_implementation_internal = value


def _configs(config: Any) -> list[Any]:
    """``config`` and every sub-config under it."""
    out: list[Any] = []
    todo = [config]
    while todo:
        current = todo.pop()
        if current is None or any(current is seen for seen in out):
            continue
        out.append(current)
        todo.extend(getattr(current, key, None) for key in getattr(current, "sub_configs", {}) or {})
    return out
