"""Slot storage for the batch's KV cache: each row in its own slot, written in place.

:class:`SlotLayer` is a Hugging Face cache layer whose keys and values live in
one tensor ``[slots, H, capacity, D]`` per layer, allocated once and grown only
when a row needs more columns (or the batch more slots) than any before.  Row
``r`` of the batch lives in slot ``r`` and its column ``c`` holds its token at
position ``c``: a row's cache is always the prefix ``[0, length)`` of its slot,
so there are no holes and no padding to compact.  A forward writes each row's
new states at its own columns (:class:`WritePlan`), rejected columns are simply
overwritten later, a row joins by taking a free slot and leaves by freeing its
own; no step copies the other rows' caches.  This is the layout of vLLM's and
transformers' paged caches with one page per row: a row's columns never move
between slots, and attention reads each row's own prefix through the mask.

Without a plan the layer acts like ``DynamicLayer`` for the rows ``[0, rows)``:
new states are appended at column :attr:`SlotLayer.seq` of every row, so a
prompt cache handed back to a caller keeps working with plain ``model(...)`` calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, overload

import torch

try:
    from transformers.cache_utils import DynamicLayer
except ImportError:  # transformers without per-layer caches: BatchKV refuses to run (require_transformers_floor)
    DynamicLayer = object  # type: ignore[assignment,misc]

__all__ = ["SlotLayer", "WritePlan", "Storage"]


@dataclass
class Storage:
    """What every layer of one batch shares: the slot and column capacity to allocate, the bytes copied.

    ``copied``: bytes moved between or into slots (growing the storage, a row taking a
    freed slot, a prompt cache copied in) -- the count the tests read.
    """

    slots: int = 1
    columns: int = 0
    copied: int = 0


@dataclass
class WritePlan:
    """Where one forward's new states go, and which slots its batch rows read.

    Batch row ``b`` writes its ``n`` new columns to slot ``slots[b]`` at columns
    ``starts[b], starts[b] + 1, ...`` and reads that slot's columns ``[0, width)``.
    When the batch rows are the slots ``0, 1, ...`` in order the layer returns views
    (no copy); otherwise it gathers the slots a batch row reads (a folded prompt).

    ``real[b]``: how many of batch row ``b``'s ``n`` new states are its tokens; the
    rest (padding) are written to the scratch column ``width``, which nothing reads,
    so one row's padding never lands on another row's columns (a folded prompt's
    pieces sit side by side in one slot).

    ``sizes`` set: a packed forward (:mod:`grammarspec.kv.packed_attention`): the
    new states arrive as one sequence, ``sizes[b]`` tokens of batch row ``b``
    after another, and the layer returns its whole storage (packed attention
    reads each row's slot in place).
    """

    slots: list[int]
    starts: list[int]
    n: int
    width: int
    real: list[int] | None = None
    sizes: list[int] | None = None
    _index: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    _packed: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    @property
    def in_order(self) -> bool:
        return self.slots == list(range(len(self.slots)))

    @property
    def aligned(self) -> bool:
        """Every batch row writes the same columns: a plain slice assignment."""
        return self.in_order and len(set(self.starts)) <= 1

    def host_index(self) -> tuple[list[int], list[int]]:
        """:meth:`index`'s slot and column of every new state, ``R * n`` host integers each (row after row).  Pure."""
        slots = [s for s in self.slots for _ in range(self.n)]
        real = self.real if self.real is not None else [self.n] * len(self.slots)
        columns = [start + i if i < r else self.width for start, r in zip(self.starts, real) for i in range(self.n)]
        return slots, columns

    def host_packed_index(self) -> tuple[list[int], list[int]]:
        """:meth:`packed_index`'s slot and column of every packed token, as host integers.  Pure."""
        assert self.sizes is not None
        slots = [s for s, size in zip(self.slots, self.sizes) for _ in range(size)]
        columns = [start + i for start, size in zip(self.starts, self.sizes) for i in range(size)]
        return slots, columns

    def preset(self, slots: torch.Tensor, columns: torch.Tensor) -> None:
        """Give the plan its write index already on the device (``[R * n]`` or ``[T]``, from the host integers of
        :meth:`host_index` / :meth:`host_packed_index`, copied with the step's other integers).  Changes the plan."""
        device = slots.device
        if self.sizes is not None:
            self._packed[device] = (slots, columns)
        else:
            rows = len(self.slots)
            self._index[device] = (slots.view(rows, self.n), columns.view(rows, self.n), slots.view(rows, self.n)[:, 0])

    def index(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(slot [R, n], column [R, n], slot [R])`` on ``device`` (built once per device a forward)."""
        found = self._index.get(device)
        if found is None:
            slots = torch.tensor(self.slots, dtype=torch.long, device=device)
            offsets = torch.arange(self.n, dtype=torch.long, device=device)
            starts = torch.tensor(self.starts, dtype=torch.long, device=device)
            columns = starts[:, None] + offsets
            if self.real is not None:
                real = torch.tensor(self.real, dtype=torch.long, device=device)
                columns = torch.where(offsets[None, :] < real[:, None], columns, self.width)
            found = self._index[device] = (slots[:, None].expand(-1, self.n), columns, slots)
        return found

    def packed_index(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``(slot [T], column [T])`` of each packed token on ``device`` (built once per device a forward)."""
        found = self._packed.get(device)
        if found is None:
            slots, columns = self.host_packed_index()
            found = self._packed[device] = (
                torch.tensor(slots, dtype=torch.long, device=device),
                torch.tensor(columns, dtype=torch.long, device=device),
            )
        return found


class _CachedView:
    """A :class:`SlotLayer` attribute (``keys``, ``values``) that reads as the ``[rows, H, seq, D]`` view of the
    cached columns of its storage tensor (the layer's attribute ``storage``) and adopts a tensor assigned to it as
    that storage; with ``sizes``, the assigned tensor also sets the layer's rows and length."""

    def __init__(self, storage: str, sizes: bool = False) -> None:
        self.storage = storage
        self.sizes = sizes

    @overload
    def __get__(self, layer: None, owner: type | None = None) -> _CachedView: ...
    @overload
    def __get__(self, layer: SlotLayer, owner: type | None = None) -> torch.Tensor | None: ...
    def __get__(self, layer: SlotLayer | None, owner: type | None = None) -> _CachedView | torch.Tensor | None:
        if layer is None:
            return self
        tensor = getattr(layer, self.storage)
        return None if tensor is None else tensor[: layer.rows, :, : layer.seq]

    def __set__(self, layer: SlotLayer, value: torch.Tensor | None) -> None:
        setattr(layer, self.storage, value)
        if value is not None and self.sizes:
            layer.rows, layer.seq = int(value.shape[0]), int(value.shape[2])


class SlotLayer(DynamicLayer):
    """One attention layer's keys and values, ``[slots, H, capacity, D]``, written in place.

    ``keys`` / ``values`` read as the ``[rows, H, seq, D]`` view of the cached columns
    (what Hugging Face code and the tests index); assigning a tensor adopts it as the
    storage.  ``plan`` is set by :class:`grammarspec.kv.batch.BatchKV` around its forward.
    """

    is_sliding = False
    is_croppable = True

    def __init__(self, storage: Storage | None = None) -> None:
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self.rows = 0
        self.seq = 0
        self.storage = storage or Storage()
        self.plan: WritePlan | None = None
        super().__init__()

    # -- the views Hugging Face code reads --------------------------------------------------

    keys = _CachedView("_k", sizes=True)
    values = _CachedView("_v")

    @property
    def capacity(self) -> tuple[int, int]:
        """``(slots, columns)`` allocated (``(0, 0)`` before the first write)."""
        return (0, 0) if self._k is None else (int(self._k.shape[0]), int(self._k.shape[2]))

    def data_ptr(self) -> int:
        """Where the key storage lives (tests check that joins and leaves do not reallocate it)."""
        return 0 if self._k is None else int(self._k.data_ptr())

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.is_initialized = True

    def get_seq_length(self) -> int:
        return self.seq if self._k is not None else 0

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def crop(self, tokens_to_remove: int) -> None:
        """Forget the last ``-tokens_to_remove`` columns of every row (nothing is copied).  Changes the layer."""
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number: how many tokens to remove")
        self.seq = max(0, self.seq + tokens_to_remove)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self._k is not None and self._v is not None:
            k, v = self._k[indices, :, : self.seq], self._v[indices, :, : self.seq]
            self.keys, self.values = k, v

    def reset(self) -> None:
        self._k = self._v = None
        self.rows = self.seq = 0
        self.is_initialized = False

    # -- writing ------------------------------------------------------------------------------

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new states where the plan says (without a plan: at column ``seq`` of every row).

        Returns the keys and values each batch row attends over: views of the
        storage when the batch rows are the slots in order, gathered otherwise.
        Changes the layer.
        """
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        plan = self.plan
        if plan is None:
            rows, n = int(key_states.shape[0]), int(key_states.shape[2])
            self.ensure(key_states, value_states, rows, self.seq + n)
            assert self._k is not None and self._v is not None
            self._k[:rows, :, self.seq : self.seq + n] = key_states
            self._v[:rows, :, self.seq : self.seq + n] = value_states
            self.rows, self.seq = rows, self.seq + n
            return self._k[:rows, :, : self.seq], self._v[:rows, :, : self.seq]
        batch = len(plan.slots)
        self.ensure(key_states, value_states, max(plan.slots) + 1, plan.width + (plan.real is not None))
        assert self._k is not None and self._v is not None
        if plan.sizes is not None:  # one sequence of every row's tokens: each to its slot's columns
            slot, column = plan.packed_index(self._k.device)
            self._k[slot, :, column] = key_states[0].transpose(0, 1)  # [T, H, D]
            self._v[slot, :, column] = value_states[0].transpose(0, 1)
            return self._k, self._v
        if plan.aligned:
            start = plan.starts[0] if plan.starts else 0
            self._k[:batch, :, start : start + plan.n] = key_states
            self._v[:batch, :, start : start + plan.n] = value_states
        else:
            slot, column, _ = plan.index(self._k.device)
            self._k[slot, :, column] = key_states.transpose(1, 2)  # [R, n, H, D] into each row's own columns
            self._v[slot, :, column] = value_states.transpose(1, 2)
        if plan.in_order:
            return self._k[:batch, :, : plan.width], self._v[:batch, :, : plan.width]
        _, _, read = plan.index(self._k.device)
        return self._k[read, :, : plan.width], self._v[read, :, : plan.width]

    def ensure(self, key_states: torch.Tensor, value_states: torch.Tensor, slots: int, columns: int) -> None:
        """Allocate (or grow) the storage to hold ``slots`` slots of ``columns`` columns.  Changes the layer.

        Grows by at least half again, so a batch whose rows keep getting longer copies
        its cache a logarithmic number of times.
        """
        want_slots = max(slots, self.storage.slots)
        want_columns = max(columns, self.storage.columns)
        have_slots, have_columns = self.capacity
        if self._k is not None and slots <= have_slots and columns <= have_columns:
            return
        if self._k is not None:
            want_slots = max(want_slots, have_slots)
            want_columns = (
                max(want_columns, have_columns + have_columns // 2) if columns > have_columns else have_columns
            )
        heads, dim_k, dim_v = key_states.shape[1], key_states.shape[3], value_states.shape[3]
        device = key_states.device
        new_k = torch.zeros((want_slots, heads, want_columns, dim_k), dtype=key_states.dtype, device=device)
        new_v = torch.zeros((want_slots, heads, want_columns, dim_v), dtype=value_states.dtype, device=device)
        if self._k is not None and self._v is not None:
            used = self._k[:have_slots, :, :have_columns]
            new_k[:have_slots, :, :have_columns] = used
            new_v[:have_slots, :, :have_columns] = self._v[:have_slots, :, :have_columns]
            self.storage.copied += used.nbytes + self._v[:have_slots, :, :have_columns].nbytes
        self._k, self._v = new_k, new_v
        self.storage.slots, self.storage.columns = want_slots, want_columns

    def move(self, source: int, target: int, length: int) -> None:
        """Copy slot ``source``'s first ``length`` columns into slot ``target``.  Changes the layer."""
        if self._k is None or self._v is None or source == target or length <= 0:
            return
        with torch.inference_mode():  # the storage is made inside the model's forward
            self._k[target, :, :length] = self._k[source, :, :length]
            self._v[target, :, :length] = self._v[source, :, :length]
        self.storage.copied += self._k[source, :, :length].nbytes + self._v[source, :, :length].nbytes

    def write(self, slot: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Put ``keys`` / ``values`` ``[1, H, L, D]`` at the front of ``slot`` (a prompt cache).  Changes the layer."""
        with torch.inference_mode():  # the storage is made inside the model's forward
            self.ensure(keys, values, slot + 1, int(keys.shape[2]))
            assert self._k is not None and self._v is not None
            length = int(keys.shape[2])
            self._k[slot, :, :length] = keys[0]
            self._v[slot, :, :length] = values[0]
        self.storage.copied += keys.nbytes + values.nbytes
