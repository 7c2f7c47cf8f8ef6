"""A small least-recently-used map with a size bound, and optionally a byte bound: :class:`LRU`.

Not thread-safe by itself: a cache shared between threads is read and written
under its owner's lock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar, overload

__all__ = ["LRU"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
D = TypeVar("D")


class LRU(Generic[K, V]):
    """At most ``maxsize`` entries; storing one more drops the least recently used.

    ``maxsize=None``: no bound on the count.  ``max_bytes`` with ``weigh``
    (an entry's bytes): the entries together weigh at most ``max_bytes``
    too, and an entry heavier than that alone is not stored (it drops
    nothing).  ``on_evict(key, value)`` sees each entry a bound drops.

    >>> cache: LRU[str, int] = LRU(2)
    >>> cache.put("a", 1); cache.put("b", 2); cache.get("a"); cache.put("c", 3)
    1
    >>> "b" in cache, "a" in cache, len(cache)
    (False, True, 2)
    >>> sized: LRU[str, str] = LRU(None, max_bytes=5, weigh=len)
    >>> sized.put("a", "xyz"); sized.put("b", "xy"); sized.put("c", "x"); list(sized.keys()), sized.nbytes
    (['b', 'c'], 3)
    """

    def __init__(
        self,
        maxsize: int | None,
        *,
        max_bytes: int | None = None,
        weigh: Callable[[V], int] | None = None,
        on_evict: Callable[[K, V], None] | None = None,
    ) -> None:
        if maxsize is not None and maxsize < 1:
            raise ValueError(f"an LRU holds at least one entry; got maxsize={maxsize}")
        if (max_bytes is None) != (weigh is None):
            raise ValueError("an LRU's byte bound needs both max_bytes= and weigh= (an entry's bytes)")
        self.maxsize = maxsize
        self.max_bytes = max_bytes
        self._weigh = weigh
        self._on_evict = on_evict
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._bytes: dict[K, int] = {}
        self.nbytes = 0  # what the entries weigh together (0 without ``weigh``)

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

    @overload
    def peek(self, key: K) -> V | None: ...
    @overload
    def peek(self, key: K, default: D) -> V | D: ...
    def peek(self, key: K, default: object = None) -> object:
        """The value stored for ``key``, else ``default``; not a use (the order stays)."""
        return self._entries.get(key, default)

    def put(self, key: K, value: V) -> None:
        """Store ``value`` for ``key`` as the most recently used; drops the least recently used beyond the bounds."""
        size = self._weigh(value) if self._weigh is not None else 0
        if self.max_bytes is not None and size > self.max_bytes:
            return
        self.pop(key)
        self._entries[key] = value
        self._bytes[key] = size
        self.nbytes += size
        while self._over():
            old, dropped = next(iter(self._entries.items()))
            self.pop(old)
            if self._on_evict is not None:
                self._on_evict(old, dropped)

    def _over(self) -> bool:
        too_many = self.maxsize is not None and len(self._entries) > self.maxsize
        return too_many or (self.max_bytes is not None and self.nbytes > self.max_bytes)

    def pop(self, key: K) -> V | None:
        """Remove ``key``'s entry; its value, or ``None`` when there was none."""
        self.nbytes -= self._bytes.pop(key, 0)
        return self._entries.pop(key, None)

    def clear(self) -> None:
        """Drop every entry."""
        self._entries.clear()
        self._bytes.clear()
        self.nbytes = 0

    def keys(self) -> list[K]:
        """The keys, least recently used first (a copy)."""
        return list(self._entries)

    def values(self) -> list[V]:
        """The values, least recently used first (a copy)."""
        return list(self._entries.values())

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is stored (does not count as a use)."""
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)
