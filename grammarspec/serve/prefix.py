"""A bounded cache of target KV states by token prefix (hash of blocks, LRU under a byte budget).

Each entry is the KV of one finished row -- prompt plus answer, the token ids
as the chat template rendered the prompt and as the model wrote the answer --
so the next turn of a conversation, whose prompt re-renders all of it and
adds the new messages, finds it.  The index maps the chained hash of every
full block of ``block`` tokens to the entries holding that prefix; a lookup
walks the prompt's blocks as far as they are known, then takes the exact
common prefix with those entries.  A hit is a copy (the decode loop extends
it in place), cut to at most ``len(prompt) - 1`` tokens: the model must read
at least the prompt's last token.

Worked example (block 2)::

    store [1 2 3 4 5]      blocks (1 2) (3 4) indexed
    lookup [1 2 3 4 9 9]   blocks (1 2) (3 4) known -> entry; common prefix 4 -> a cache of 4 tokens
    lookup [1 9 9]         block (1 9) unknown -> miss
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grammars.lru import LRU
from grammarspec.kv.cache import common_prefix_length, new_cache

__all__ = ["PrefixCache", "PrefixStats", "row_cache"]


@dataclass
class PrefixStats:
    lookups: int = 0
    hits: int = 0
    reused_tokens: int = 0
    stored: int = 0
    evicted: int = 0


@dataclass
class _Entry:
    tokens: tuple[int, ...]
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [1, H, L, D]
    nbytes: int
    extra: Any = None  # what the drafters learned in this conversation (serve's acceptance records)


class PrefixCache:
    """Token prefix -> KV.  ``budget_bytes``: the most the entries may hold (LRU eviction).  Thread-safe."""

    def __init__(self, model: torch.nn.Module, budget_bytes: int, *, block: int = 16) -> None:
        self.model, self.budget, self.block = model, int(budget_bytes), block
        self._entries: LRU[tuple[int, ...], _Entry] = LRU(
            None, max_bytes=self.budget, weigh=lambda entry: entry.nbytes, on_evict=self._evicted
        )
        self._index: dict[int, set[tuple[int, ...]]] = {}
        self._lock = threading.Lock()
        self.stats = PrefixStats()

    @property
    def nbytes(self) -> int:
        return self._entries.nbytes

    def __len__(self) -> int:
        return len(self._entries)

    def _hashes(self, tokens: Sequence[int]) -> list[int]:
        out, h = [], 0
        for end in range(self.block, len(tokens) + 1, self.block):
            h = hash((h, tuple(tokens[end - self.block : end])))
            out.append(h)
        return out

    def lookup(self, tokens: Sequence[int]) -> tuple[Any, int, Any]:
        """``(cache copy or None, cached length, the entry's extra)`` for the longest known prefix.

        Changes only the LRU order and the statistics.
        """
        with self._lock:
            self.stats.lookups += 1
            candidates: set[tuple[int, ...]] = set()
            for h in self._hashes(tokens):
                found = self._index.get(h)
                if not found:
                    break
                candidates = found
            best, length = None, 0
            for key in candidates:
                n = min(common_prefix_length(key, tokens), len(tokens) - 1)
                if n > length:
                    best, length = self._entries.peek(key), n
            if best is None or length < 1:
                return None, 0, None
            self._entries.get(best.tokens)  # now the most recently used
            self.stats.hits += 1
            self.stats.reused_tokens += length
            cache = new_cache(self.model)
            for i, (keys, values) in enumerate(best.layers):
                cache.update(keys[:, :, :length].clone(), values[:, :, :length].clone(), i)
            return cache, length, best.extra

    def store(self, tokens: Sequence[int], layers: list[tuple[torch.Tensor, torch.Tensor]], extra: Any = None) -> None:
        """Keep ``layers`` (the KV of ``tokens``); an entry it extends is replaced.  Changes the cache."""
        key = tuple(tokens)
        nbytes = sum(k.nbytes + v.nbytes for k, v in layers)
        if not key or nbytes > self.budget:
            return
        with self._lock:
            for old in [k for k in self._entries.keys() if len(k) <= len(key) and key[: len(k)] == k]:
                self._drop(old)
            for h in self._hashes(key):
                self._index.setdefault(h, set()).add(key)
            self.stats.stored += 1
            self._entries.put(key, _Entry(key, layers, nbytes, extra))  # past the budget: the oldest are evicted

    def annotate(self, tokens: Sequence[int], extra: Any, min_length: int = 1) -> bool:
        """Set ``extra`` on the longest entry (``min_length`` tokens or more) that is a prefix of ``tokens``.

        For a row that ended without its KV (cut at the start of a step): its
        records go to the entry its prompt stored.  Returns whether there was
        one.  Changes the cache.
        """
        key = tuple(tokens)
        with self._lock:
            found = [k for k in self._entries.keys() if min_length <= len(k) <= len(key) and key[: len(k)] == k]
            entry = self._entries.peek(max(found, key=len)) if found else None
            if entry is None:
                return False
            entry.extra = extra
            return True

    def _evicted(self, key: tuple[int, ...], entry: _Entry) -> None:
        """The budget dropped ``key``'s entry (the least recently used): forget its blocks.  Holds the lock."""
        self._unindex(key)
        self.stats.evicted += 1

    def _drop(self, key: tuple[int, ...]) -> None:
        self._entries.pop(key)
        self._unindex(key)

    def _unindex(self, key: tuple[int, ...]) -> None:
        for h in self._hashes(key):
            keys = self._index.get(h)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._index[h]

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            return {
                "entries": len(self._entries),
                "bytes": self.nbytes,
                "budget_bytes": self.budget,
                **vars(self.stats),
            }


def row_cache(kv: Any, slot: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The first ``length`` cached tokens of row ``slot`` of a :class:`~grammarspec.kv.batch.BatchKV`, as ``[1, H, L, D]``
    keys and values per layer (copies, holes and padding removed).  Does not change ``kv``."""
    columns = kv.valid[slot].nonzero().flatten()[:length]
    out = []
    for layer in kv.cache.layers:
        if getattr(layer, "keys", None) is None:
            continue
        out.append((layer.keys[slot : slot + 1, :, columns].clone(), layer.values[slot : slot + 1, :, columns].clone()))
    return out
