"""grammars.lru.LRU: the size-bounded least-recently-used map the caches share."""

from __future__ import annotations

import pytest

from grammars.lru import LRU


def test_storing_past_the_bound_drops_the_least_recently_used():
    cache: LRU[str, int] = LRU(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "a" is now the most recently used
    cache.put("c", 3)
    assert "b" not in cache and cache.get("a") == 1 and cache.get("c") == 3 and len(cache) == 2


def test_membership_is_not_a_use_and_a_miss_gives_the_default():
    cache: LRU[str, int] = LRU(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert "a" in cache  # does not refresh "a"
    cache.put("c", 3)
    assert "a" not in cache and cache.get("a") is None and cache.get("a", -1) == -1


def test_storing_again_refreshes_and_replaces():
    cache: LRU[str, int] = LRU(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("a", 10)
    cache.put("c", 3)
    assert "b" not in cache and cache.get("a") == 10


def test_a_bound_under_one_is_refused():
    with pytest.raises(ValueError, match="maxsize=0"):
        LRU(0)


def test_token_text_caches_are_bounded():
    from proposers.text import TokenText
    from tests.toy import toy_tokenizer

    toy = toy_tokenizer()
    helper = TokenText(toy)
    helper._cache = LRU(2)
    for text in ("ab", "cd", "ef"):
        assert toy.decode(list(helper.encode(text))) == text
    assert len(helper._cache) == 2 and "ab" not in helper._cache and helper.encode("ab") == helper.encode("ab")
