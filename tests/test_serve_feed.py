"""decode_batch's feed (continuous batching for ``grammarspec serve``): joins, cancels, prompt caches.

Requests handed in while the loop runs decode exactly as they would alone; a
cancelled row stops and leaves without disturbing the others; a row whose prompt
cache holds its first tokens decodes the same as one prefilled from scratch.
"""

from __future__ import annotations

import copy

from test_batch import SCHEMAS, _request, check_rows, grammars  # noqa: F401  (fixture)
from test_decoding import ScriptedProposer as Noisy
from toy import toy_vocab_size
from toy_models import ToyCausalLM, tiny_llama

from grammarspec.cache import crop_cache
from grammarspec.decoding import DecodeConfig, decode, decode_batch
from grammarspec.kv import BatchKV

V = toy_vocab_size()
PROMPTS = [[2, 3], [2, 5, 9, 4, 7], [6], [4, 4, 2], [7, 1, 3, 3]]


class ListFeed:
    """Hands out what fits (after ``delay`` polls), cancels on demand, records what ended."""

    def __init__(self, requests, delay=1, cancel=()):
        self.queue = list(requests)
        self.delay = delay
        self.cancel = set(cancel)
        self.ended = {}
        self.polls = 0
        self.cached_at_end = {}

    def more(self, free):
        self.polls += 1
        if self.polls <= self.delay or not self.queue:
            return []
        given, self.queue = self.queue[:free], self.queue[free:]
        return given

    def cancelled(self, index):
        return index in self.cancel

    def joined(self, row, kv, slot):
        assert row.index not in self.ended and row.cached >= 1

    def finished(self, row, kv, slot):
        assert row.index not in self.ended, "reported twice"
        self.ended[row.index] = (list(row.generated), row.finish_reason)
        if kv is not None:
            columns = kv.valid[slot].nonzero().flatten()
            self.cached_at_end[row.index] = len(columns)


def test_requests_that_join_while_the_loop_runs_decode_as_alone(grammars):  # noqa: F811
    model = ToyCausalLM(V, seed=3)
    config = DecodeConfig(max_new_tokens=24, eos_token_ids=(0,))
    gs = [grammars[i % len(grammars)] for i in range(len(PROMPTS))]
    alone = [decode(model, p, config, matcher=g.matcher())[0] for p, g in zip(PROMPTS, gs)]
    first = [_request(PROMPTS[0], gs[0].matcher(), Noisy(alone[0], 1), 2, config)]
    later = [(_request(p, g.matcher(), Noisy(out, 2), 2, config), None)
             for p, g, out in zip(PROMPTS[1:], gs[1:], alone[1:])]  # fmt: skip
    feed = ListFeed(later, delay=1)
    on_step, seen = check_rows({i: g for i, g in enumerate(gs)})
    rows = decode_batch(model, first, config, max_batch_size=3, feed=feed, on_step=on_step)
    assert [r.generated for r in rows] == alone[:1]
    assert sorted(feed.ended) == [0, 1, 2, 3, 4]
    for index, (generated, _) in feed.ended.items():
        assert generated == alone[index]
    assert max(len(ids) for ids, _ in seen) <= 3  # never more than max_batch_size rows
    assert any(len(ids) > 1 for ids, _ in seen)  # and they did run together


def test_a_cancelled_row_leaves_and_the_others_finish(grammars):  # noqa: F811
    model = tiny_llama(V, seed=2)
    config = DecodeConfig(max_new_tokens=24, eos_token_ids=(0,))
    alone = [decode(model, p, config, matcher=grammars[1].matcher())[0] for p in PROMPTS[:3]]
    requests = [(_request(p, grammars[1].matcher(), None, 0, config), None) for p in PROMPTS[:3]]
    feed = ListFeed(requests, delay=0, cancel={1})
    decode_batch(model, [], config, max_batch_size=4, feed=feed)
    assert feed.ended[1][1] == "cancelled"
    assert len(feed.ended[1][0]) < len(alone[1])
    assert feed.ended[0][0] == alone[0] and feed.ended[2][0] == alone[2]


def test_a_prompt_cache_from_the_feed_prefills_only_the_rest(grammars):  # noqa: F811
    model = tiny_llama(V, seed=4)
    config = DecodeConfig(max_new_tokens=16, eos_token_ids=(0,))
    prompt = [2, 5, 9, 4, 7, 3, 3, 1]
    kv = BatchKV(model, 1)
    kv.forward([prompt[:5]], [[]])  # the prompt pass: no draft tree
    kv.keep([list(range(5))])  # row 0 keeps its 5 new columns
    cache = copy.deepcopy(kv.cache)
    crop_cache(cache, 5)
    alone = decode(model, prompt, config, matcher=grammars[0].matcher())[0]
    feed = ListFeed([(_request(prompt, grammars[0].matcher(), None, 0, config), cache)], delay=0)
    seen_cached = []
    decode_batch(model, [], config, max_batch_size=2, feed=feed,
                 on_step=lambda rows, kv: seen_cached.append(rows[0].cached))  # fmt: skip
    assert feed.ended[0][0] == alone
    assert cache.get_seq_length() > 5  # the cache was extended in place, not re-read from scratch
