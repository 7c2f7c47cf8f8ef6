"""decode_batch's feed (continuous batching for ``grammarspec serve``): joins, cancels, prompt caches.

Requests handed in while the loop runs decode exactly as they would alone; a
cancelled row stops and leaves without disturbing the others; a row whose prompt
cache holds its first tokens decodes the same as one prefilled from scratch.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from grammarspec.engine.decoding import DecodeConfig, decode, decode_batch
from grammarspec.kv.batch import BatchKV
from grammarspec.kv.cache import crop_cache
from tests.helpers import batch_row, check_rows
from tests.proposer_fakes import ScriptFollower as Noisy  # the next tokens of a script, wrong every n-th call
from tests.toy import toy_vocab_size
from tests.toy_models import ToyCausalLM, tiny_llama

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


def test_requests_that_join_while_the_loop_runs_decode_as_alone(grammars):
    model = ToyCausalLM(V, seed=3)
    config = DecodeConfig(max_new_tokens=24, eos_token_ids=(0,))
    gs = [grammars[i % len(grammars)] for i in range(len(PROMPTS))]
    alone = [decode(model, p, config, matcher=g.matcher())[0] for p, g in zip(PROMPTS, gs)]
    first = [batch_row(PROMPTS[0], gs[0].matcher(), Noisy(alone[0], 1), 2, config)]
    later = [
        (batch_row(p, g.matcher(), Noisy(out, 2), 2, config), None) for p, g, out in zip(PROMPTS[1:], gs[1:], alone[1:])
    ]
    feed = ListFeed(later, delay=1)
    on_step, seen = check_rows({i: g for i, g in enumerate(gs)})
    rows = decode_batch(model, first, config, max_batch_size=3, feed=feed, on_step=on_step)
    assert [r.generated for r in rows] == alone[:1]
    assert sorted(feed.ended) == [0, 1, 2, 3, 4]
    for index, (generated, _) in feed.ended.items():
        assert generated == alone[index]
    assert max(len(ids) for ids, _ in seen) <= 3  # never more than max_batch_size rows
    assert any(len(ids) > 1 for ids, _ in seen)  # and they did run together


def test_a_cancelled_row_leaves_and_the_others_finish(grammars):
    model = tiny_llama(V, seed=2)
    config = DecodeConfig(max_new_tokens=24, eos_token_ids=(0,))
    alone = [decode(model, p, config, matcher=grammars[1].matcher())[0] for p in PROMPTS[:3]]
    requests = [(batch_row(p, grammars[1].matcher(), None, 0, config), None) for p in PROMPTS[:3]]
    feed = ListFeed(requests, delay=0, cancel={1})
    decode_batch(model, [], config, max_batch_size=4, feed=feed)
    assert feed.ended[1][1] == "cancelled"
    assert len(feed.ended[1][0]) < len(alone[1])
    assert feed.ended[0][0] == alone[0] and feed.ended[2][0] == alone[2]


def test_a_prompt_cache_from_the_feed_prefills_only_the_rest(grammars):
    model = tiny_llama(V, seed=4)
    config = DecodeConfig(max_new_tokens=16, eos_token_ids=(0,))
    prompt = [2, 5, 9, 4, 7, 3, 3, 1]
    kv = BatchKV(model, 1)
    kv.forward([prompt[:5]], [[]])  # the prompt pass: no draft tree
    kv.keep([list(range(5))])  # row 0 keeps its 5 new columns
    cache = copy.deepcopy(kv.cache)
    crop_cache(cache, 5)
    alone = decode(model, prompt, config, matcher=grammars[0].matcher())[0]
    feed = ListFeed([(batch_row(prompt, grammars[0].matcher(), None, 0, config), cache)], delay=0)
    seen_cached = []
    widths = []
    original = model.forward
    model.forward = lambda *args, **kwargs: (
        widths.append(int(kwargs["input_ids"].shape[1])),
        original(*args, **kwargs),
    )[1]
    try:
        decode_batch(
            model, [], config, max_batch_size=2, feed=feed, on_step=lambda rows, kv: seen_cached.append(rows[0].cached)
        )
    finally:
        del model.forward
    assert feed.ended[0][0] == alone
    assert widths[0] < len(prompt)  # the 5 cached tokens are not read again: the cache was copied into its slot


LONG = [3, 8, 2, 9, 4, 4, 7, 1, 5, 2, 6, 3, 8, 8, 1, 2, 9, 5]  # a prompt longer than any decoding step's width


@pytest.mark.parametrize(("kind", "chunk"), [("toy", 3), ("toy", None), ("llama", 8), ("llama-masked", 8)])
def test_a_request_joining_a_busy_batch_reads_its_prompt_in_chunks_and_decodes_as_alone(
    grammars, kind, chunk, monkeypatch
):
    """The joining prompt is read next to the decoding rows, a chunk a step (packed into one sequence with them
    on SDPA models; folded into extra batch rows of a masked forward otherwise); every row's output is its output
    alone."""
    if kind == "llama-masked":
        monkeypatch.setattr("grammarspec.kv.batch.supports_packing", lambda model: False)
    model = ToyCausalLM(V, seed=3) if kind == "toy" else tiny_llama(V, seed=2)
    config = DecodeConfig(max_new_tokens=24, eos_token_ids=(0,))
    prompts, gs = [PROMPTS[1], PROMPTS[3], LONG], [grammars[1], grammars[2], grammars[0]]
    alone = [decode(model, p, config, matcher=g.matcher())[0] for p, g in zip(prompts, gs)]
    first = [batch_row(p, g.matcher(), Noisy(out, 2), 2, config) for p, g, out in zip(prompts[:2], gs[:2], alone[:2])]
    feed = ListFeed([(batch_row(LONG, gs[2].matcher(), Noisy(alone[2], 2), 2, config), None)], delay=1)
    check, _ = check_rows(dict(enumerate(gs)))
    reading = []  # (row 2's cached tokens, rows decoding beside it) after each step while it reads its prompt
    joined = []  # row 2

    def on_step(rows, kv):
        if kind == "toy":
            check(rows, kv)  # every row's cached columns spell its tokens, the reading row's too
        for row in rows:
            if row.index == 2 and row.cached < len(LONG):
                reading.append((row.cached, sum(r.index != 2 for r in rows)))
            if row.index == 2 and not joined:
                joined.append(row)

    shapes = []
    original = model.forward
    model.forward = lambda *args, **kwargs: (
        shapes.append(tuple(kwargs["input_ids"].shape)),
        original(*args, **kwargs),
    )[1]
    try:
        rows = decode_batch(model, first, config, max_batch_size=3, feed=feed, on_step=on_step, prompt_chunk=chunk)
    finally:
        del model.forward
    assert [r.generated for r in rows] == alone[:2]
    assert feed.ended[2][0] == alone[2]
    if chunk is not None:
        assert len(reading) >= 2 and all(busy for _, busy in reading)  # read over several steps, beside decoding rows
        cached = [n for n, _ in reading]
        assert all(0 < b - a <= chunk for a, b in zip(cached, cached[1:]))  # a chunk a step, within the budget
    if kind == "llama":  # a chunk and the decoding rows' tokens as one sequence, nothing padded
        assert any(rows == 1 and width > chunk for rows, width in shapes)
        assert max(rows for rows, _ in shapes) <= 3
    if kind == "llama-masked":
        assert max(rows for rows, _ in shapes) > 3  # a chunk wider than the step rode as folded batch rows
    stats = joined[0].stats  # each pass that read only a chunk is counted apart from the passes that scored the row
    assert stats.prompt_passes == len(reading) and stats.target_forwards == len(stats.steps)


def test_a_steep_pass_cost_still_reads_a_joining_prompt_in_the_next_step(grammars):  # noqa: F811
    """On a curve where every extra row costs a whole step (a CPU's steep one), the pass cost alone would read a
    long prompt a token or two a step; the joining request's prompt is read whole in the step it joins, beside
    the decoding row, which takes its token in that step too."""
    from grammarspec.engine.step import prompt_budget

    model = ToyCausalLM(V, seed=3)
    config = DecodeConfig(max_new_tokens=24, eos_token_ids=(0,))

    def steep(rows):
        return float(rows)

    alone = decode(model, LONG, config, matcher=grammars[0].matcher())[0]
    first = [batch_row(PROMPTS[1], grammars[1].matcher(), None, 0, config)]
    feed = ListFeed([(batch_row(LONG, grammars[0].matcher(), Noisy(alone, 2), 2, config), None)], delay=1)
    steps = []  # after each step: (the joined row's cached tokens and generated count, the decoding row's)

    def on_step(rows, kv):
        by_index = {row.index: row for row in rows}
        joined, decoding = by_index.get(1), by_index.get(0)
        steps.append(
            (
                None if joined is None else (joined.cached, len(joined.generated)),
                None if decoding is None else len(decoding.generated),
            )
        )

    decode_batch(model, first, config, max_batch_size=2, feed=feed, on_step=on_step, step_cost=steep)
    assert prompt_budget(model, 1, SimpleNamespace(step_cost=steep)) == 1  # the cost alone: a token a step
    assert feed.ended[1][0] == alone
    joined_at = next(i for i, (joined, _) in enumerate(steps) if joined is not None)
    cached, generated = steps[joined_at][0]
    assert cached >= len(LONG) and generated >= 1  # its whole prompt read and its first token sampled at once
    assert joined_at > 0 and steps[joined_at][1] > steps[joined_at - 1][1]  # the decoding row stepped beside it


def test_prompts_that_join_together_are_read_first_come_first_served(grammars):  # noqa: F811
    """Four long prompts join a busy batch at once on a steep curve: each step reads the earliest unread prompt
    whole (the budget is never less than that) and the others a token, so they decode after one, two, three and
    four steps -- none waits for the prompts after it -- and each decodes as alone."""
    model = ToyCausalLM(V, seed=3)
    config = DecodeConfig(max_new_tokens=24, eos_token_ids=(0,))
    prompts = [LONG, LONG[::-1], LONG[3:] + LONG[:3], LONG[::-1][5:] + LONG[:5]]
    alone = [decode(model, p, config, matcher=grammars[0].matcher())[0] for p in prompts]
    first = [batch_row(PROMPTS[1], grammars[1].matcher(), None, 0, config)]
    joining = [(batch_row(p, grammars[0].matcher(), None, 0, config), None) for p in prompts]
    feed = ListFeed(joining, delay=1)
    cached: dict[int, list[int]] = {1: [], 2: [], 3: [], 4: []}

    def on_step(rows, kv):
        for row in rows:
            if row.index in cached:
                cached[row.index].append(row.cached)

    decode_batch(model, first, config, max_batch_size=5, feed=feed, on_step=on_step, step_cost=float)
    assert [feed.ended[i][0] for i in (1, 2, 3, 4)] == alone
    reading = [sum(1 for c in cached[i] if c < len(p)) for i, p in zip((1, 2, 3, 4), prompts)]
    assert reading == [0, 1, 2, 3]  # the first read whole at once; each later one a token a step until its turn


def test_the_prompt_budget_goes_to_the_row_that_came_first_whatever_its_slot():
    """A leave can move a later request into a lower slot; the budget still goes first to the request that came
    first (its ``index``), and every other reading row progresses by a token."""
    from grammarspec.engine.step import prompt_plan

    def row(index, prompt_length, cached):
        return SimpleNamespace(
            index=index, prompt_length=prompt_length, cached=cached, pending=[5] * (prompt_length - cached)
        )

    decoding = row(0, 4, 3)
    later, earlier = row(7, 40, 0), row(3, 30, 0)
    plan = prompt_plan(None, [decoding, later, earlier], SimpleNamespace(), chunk=30)
    assert plan == [None, 1, None]  # the earlier request's whole prompt; the later one's first token
    plan = prompt_plan(None, [decoding, later, earlier], SimpleNamespace(), chunk=20)
    assert plan == [None, 1, 20]  # neither fits: the earlier reads the budget
    # The derived budget on a steep curve: of three prompts that joined together, the earliest whole, the others a
    # token each (not a share of a budget that reads them all within a few steps: each would wait for all).
    arrived = [row(9, 30, 0), row(8, 30, 0), row(4, 30, 0)]  # in slot order; they came 4, 8, 9
    plan = prompt_plan(None, [decoding, *arrived], SimpleNamespace(step_cost=float), None)
    assert plan == [None, 1, 1, None]


def test_joins_and_leaves_copy_no_other_row_s_cache():
    """Rows live in slots allocated once: a join writes only its own columns, a leave moves only the rows that must
    change slot, and every row's next logits equal those of the row alone."""
    model = tiny_llama(V, seed=4)
    prompts = [[2, 5, 9], [4, 4, 2, 7], [6, 1], [7, 1, 3, 3, 5]]
    kv = BatchKV(model, 0, slots=4, columns=32)
    kv.add_rows(3)
    kv.forward(prompts[:3], [()] * 3)
    kv.keep([list(range(len(p))) for p in prompts[:3]])
    pointers = kv.storage_pointers()
    assert kv.copied_bytes == 0
    assert kv.add_rows(1) == [3]  # a join: a free slot, nothing copied
    kv.forward([[8], [8], [8], prompts[3]], [()] * 4)
    kv.keep([[0], [0], [0], list(range(len(prompts[3])))])
    assert kv.storage_pointers() == pointers and kv.copied_bytes == 0
    assert kv.select([0, 2, 3]) == [0, 3, 2]  # row 1 leaves: the last row takes its slot
    layer = kv.cache.layers[0]
    row_bytes = 2 * len(kv.cache.layers) * layer.keys[0, :, : len(prompts[3])].nbytes
    assert kv.storage_pointers() == pointers and kv.copied_bytes == row_bytes  # one row's columns, once
    contexts = [prompts[0] + [8], prompts[3], prompts[2] + [8]]
    logits = kv.forward([[9]] * 3, [()] * 3)
    for context, row in zip(contexts, logits):
        alone = BatchKV(model, 1)
        expected = alone.forward([context + [9]], [()])[0]
        torch.testing.assert_close(row, expected, rtol=1e-4, atol=1e-4)


def test_a_prompt_chunk_below_one_token_is_refused_by_the_loop_and_the_engine():
    from grammarspec.serve import Engine

    model, config = tiny_llama(V, seed=0), DecodeConfig(max_new_tokens=2)
    with pytest.raises(ValueError, match="prompt_chunk must be >= 1"):
        decode_batch(model, [batch_row(PROMPTS[0], None, None, 0, config)], config, prompt_chunk=0)
    with pytest.raises(ValueError, match="prompt_chunk must be >= 1"):
        Engine(model, None, prompt_chunk=0)  # refused before anything else is built
