"""Prompt lookup: the pure n-gram search and the proposer's grammar truncation."""

from __future__ import annotations

import random

import pytest

from proposers.base import Draft, GrammarView
from proposers.prompt_lookup import PromptLookupProposer, find_ngram_continuation, find_ngram_match
from tests.proposer_fakes import RuleMatcher


def naive(tokens, min_n, max_n, k):
    """Obvious reference implementation."""
    for n in range(max_n, min_n - 1, -1):
        if n >= len(tokens):
            continue
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                out = []
                while len(out) < k:  # past the end, the text repeats with period len(tokens) - (start + n)
                    out.append((tokens + out)[start + n + len(out)])
                return out
    return []


def test_worked_example():
    assert find_ngram_continuation([1, 2, 3, 4, 1, 2, 3, 9, 9, 1, 2], 1, 3, 3) == [3, 9, 9]


def test_the_match_reports_its_length_and_the_drafts_kind_follows_it():
    assert find_ngram_match([1, 2, 3, 4, 1, 2, 3, 9, 9, 1, 2], 1, 3) == (2, 6)
    assert find_ngram_match([1, 2, 3], 2, 3) is None
    view = GrammarView(RuleMatcher(legal=lambda h, t: True))
    proposer = PromptLookupProposer(min_n=2, max_n=6)
    assert proposer.propose([1, 2, 3, 4, 9, 1, 2], view, 4).kind == "n2"
    assert proposer.propose([1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6], view, 4).kind == "n4"  # 6 counts as 4


def test_longest_match_wins_over_more_recent_shorter_one():
    tokens = [5, 6, 7, 8, 0, 7, 1, 5, 6, 7]
    # n=3 [5,6,7] occurs at 0 -> 8; n=1 [7] would find the more recent 7 -> 1.
    assert find_ngram_continuation(tokens, 1, 3, 2) == [8, 0]
    assert find_ngram_continuation(tokens, 1, 1, 2) == [1, 5]


def test_no_match_and_degenerate_arguments():
    assert find_ngram_continuation([1, 2, 3], 1, 3, 4) == []
    assert find_ngram_continuation([1, 1], 1, 3, 0) == []
    assert find_ngram_continuation([], 1, 3, 4) == []
    assert find_ngram_continuation([1], 1, 3, 4) == []


def test_a_match_overlapping_the_suffix_repeats_its_period():
    # [1, 1, 1]: the suffix [1, 1] occurs at 0, followed by the last 1; the copy runs on (period 1).
    assert find_ngram_continuation([1, 1, 1], 2, 2, 5) == [1, 1, 1, 1, 1]
    # "0,0,0": the suffix [0, 44] occurs 2 tokens back; the draft repeats ", 0" ...
    assert find_ngram_continuation([9, 0, 44, 0, 44], 2, 2, 5) == [0, 44, 0, 44, 0]
    # A match far from the end copies what followed it, no repetition needed.
    assert find_ngram_continuation([1, 2, 3, 4, 5, 1, 2], 2, 2, 3) == [3, 4, 5]


def test_byte_search_never_matches_across_token_boundaries():
    # Token ids whose 4-byte encodings contain each other's bytes at odd offsets.
    tokens = [0x01020304, 0x05060708, 0x0304, 0x0506, 7, 0x0304]
    assert find_ngram_continuation(tokens, 1, 1, 1) == [0x0506]


@pytest.mark.parametrize("seed", range(5))
def test_matches_naive_reference_on_random_lists(seed):
    rng = random.Random(seed)
    for _ in range(300):
        tokens = [rng.randrange(4) for _ in range(rng.randrange(1, 30))]
        min_n = rng.randrange(1, 3)
        max_n = rng.randrange(min_n, 5)
        k = rng.randrange(1, 6)
        assert find_ngram_continuation(tokens, min_n, max_n, k) == naive(tokens, min_n, max_n, k)


def test_proposer_truncates_at_first_illegal_token():
    proposer = PromptLookupProposer(min_n=1, max_n=3)
    context = [10, 11, 12, 13, 14, 10, 11]
    assert proposer.propose(context, None, 3).tokens == (12, 13, 14)
    view = GrammarView(RuleMatcher(legal=lambda history, t: t != 13))
    draft = proposer.propose(context, view, 3)
    assert draft.tokens == (12,) and draft.probs is None and draft.sources == ("prompt_lookup",)
    assert not proposer.propose([1, 2, 3], view, 3)


def test_constructor_checks_its_arguments():
    with pytest.raises(ValueError, match="min_n"):
        PromptLookupProposer(min_n=0)
    with pytest.raises(ValueError, match="max_n"):
        PromptLookupProposer(min_n=3, max_n=2)
    assert isinstance(PromptLookupProposer().propose([1], None, 4), Draft)
