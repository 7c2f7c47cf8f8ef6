"""grammars.lru.LRU's byte bound: what the prefix cache of ``grammarspec serve`` and the schema check share."""

from __future__ import annotations

import doctest

import pytest

import grammars.lru
from grammars.lru import LRU


def test_the_docstring_examples_run():
    failures, tried = doctest.testmod(grammars.lru, verbose=False)
    assert tried > 0 and failures == 0


def test_storing_past_the_byte_bound_evicts_the_least_recently_used_and_tells_the_owner():
    evicted: list[tuple[str, str]] = []
    cache: LRU[str, str] = LRU(None, max_bytes=6, weigh=len, on_evict=lambda k, v: evicted.append((k, v)))
    cache.put("a", "aaa")
    cache.put("b", "bb")
    assert cache.get("a") == "aaa"  # "a" is now the most recently used
    cache.put("c", "cc")
    assert evicted == [("b", "bb")] and cache.keys() == ["a", "c"] and cache.nbytes == 5
    cache.put("a", "a")  # stored again: replaced, its old bytes given back, nothing evicted
    assert evicted == [("b", "bb")] and cache.nbytes == 3 and cache.keys() == ["c", "a"]


def test_an_entry_heavier_than_the_bound_is_not_stored_and_evicts_nothing():
    cache: LRU[str, str] = LRU(None, max_bytes=4, weigh=len)
    cache.put("a", "aaa")
    cache.put("big", "bbbbb")
    assert "big" not in cache and cache.keys() == ["a"] and cache.nbytes == 3


def test_peek_is_not_a_use_and_pop_gives_the_bytes_back():
    cache: LRU[str, str] = LRU(2, max_bytes=100, weigh=len)
    cache.put("a", "aa")
    cache.put("b", "bbb")
    assert cache.peek("a") == "aa" and cache.peek("zz", "none") == "none"
    cache.put("c", "c")  # "a" was only peeked at: it goes
    assert "a" not in cache and cache.values() == ["bbb", "c"]
    assert cache.pop("b") == "bbb" and cache.pop("b") is None and cache.nbytes == 1
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0


def test_a_byte_bound_needs_its_weight():
    with pytest.raises(ValueError, match="max_bytes= and weigh="):
        LRU(None, max_bytes=10)
