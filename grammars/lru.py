"""A small least-recently-used map with a size bound: :class:`LRU`.

Not thread-safe by itself: a cache shared between threads is read and written
under its owner's lock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar, overload

__all__ = ["LRU"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
D = TypeVar("D")


class LRU(Generic[K, V]):
    """At most ``maxsize`` entries; storing one more drops the least recently used.

    >>> cache: LRU[str, int] = LRU(2)
    >>> cache.put("a", 1); cache.put("b", 2); cache.get("a"); cache.put("c", 3)
    1
    >>> "b" in cache, "a" in cache, len(cache)
    (False, True, 2)
    """

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError(f"an LRU holds at least one entry; got maxsize={maxsize}")
        self.maxsize = maxsize
        self._entries: OrderedDict[K, V] = OrderedDict()

    @overload
    def get(self, key: K) -> V | None: ...
    @overload
    def get(self, key: K, default: D) -> V | D: ...
    def get(self, key: K, default: object = None) -> object:
        """The value stored for ``key`` (now the most recently used), else ``default``."""
        if key not in self._entries:
            return default
        self._entries.move_to_end(key)
        return self._entries[key]

    def put(self, key: K, value: V) -> None:
        """Store ``value`` for ``key`` as the most recently used; drops the least recently used beyond ``maxsize``."""
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.maxsize:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        """Drop every entry."""
        self._entries.clear()

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is stored (does not count as a use)."""
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)
