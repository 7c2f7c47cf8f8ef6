"""The server's rows: per-request settings, where drafting starts, and the step trace.

A request's ``max_tokens`` and ``stop`` end its row inside the loop (the text
ends before the stop string); a greedy request gets the tokens it gets alone
whatever sampled requests share its batch; a request without a prefix-cache hit
starts from the records and the target's splits of the last finished request
of its kind of traffic;
an engine built with ``trace_steps`` records every step.  Toy tokenizer with a
chat template and a tiny random Llama: fast.
"""

from __future__ import annotations

import copy
import queue

from grammarspec.engine.step_trace import summarize
from grammarspec.policy.allocation import Calibration
from grammarspec.serve import Engine
from grammarspec.serve.engine import TrafficRecord, traffic_kind
from grammarspec.serve.protocol import ChatRequest
from proposers.base import split_owner
from proposers.text import SplitMemory
from tests.helpers import TRIP_SCHEMA


def _ask(engine, content, **fields):
    events: queue.Queue = queue.Queue()
    request = ChatRequest(messages=[{"role": "user", "content": content}], **{"temperature": 0.0, **fields})
    job = engine.prepare(request, events.put)
    engine.submit(job)
    return job, events


def _wait(job, events):
    got = []
    while len(got) < len(job.choices):
        kind, payload = events.get(timeout=120)
        assert kind == "choice", payload
        got.append(payload)
    return got


def test_traffic_kinds():
    assert traffic_kind(None, {}) == "text"
    assert traffic_kind(object(), {}) == "schema"
    assert traffic_kind(object(), {"tools": [{}]}) == "tools"


def test_max_tokens_and_stop_end_the_row_and_greedy_rows_ignore_their_sampled_neighbours(chat_model, chat):
    engine = Engine(chat_model, chat, max_batch_size=4, max_tokens=24, prefix_cache_bytes=0)
    try:
        ((alone, _, _),) = _wait(*_ask(engine, "write about oslo", max_tokens=12))
        assert len(alone.tokens) == 12 and alone.row.finish_reason == "length"
        stop = alone.text[4:6]
        assert stop and alone.text.find(stop) >= 1
        jobs = [
            _ask(engine, "write about oslo", max_tokens=12),
            _ask(engine, "a poem", temperature=1.2, n=2),
            _ask(engine, "write about oslo", max_tokens=5),
            _ask(engine, "write about oslo", stop=(stop,)),
            _ask(engine, "a song", temperature=0.7, max_tokens=3),
        ]
        ((same, _, finish_same),) = _wait(*jobs[0])
        assert same.tokens == alone.tokens and finish_same == "length"
        for choice, _, _ in _wait(*jobs[1]):
            assert len(choice.tokens) <= 24
        ((short, _, finish_short),) = _wait(*jobs[2])
        assert short.tokens == alone.tokens[:5] and finish_short == "length"
        ((stopped, message, finish_stop),) = _wait(*jobs[3])
        assert finish_stop == "stop" and stopped.row.finish_reason == "stop_string"
        assert message["content"] == alone.text[: alone.text.find(stop)]
        assert stopped.tokens == alone.tokens[: len(stopped.tokens)] and len(stopped.tokens) < 12
        ((tiny, _, _),) = _wait(*jobs[4])
        assert len(tiny.tokens) == 3
    finally:
        engine.close()


def test_a_request_without_a_cache_hit_starts_from_its_kinds_recent_records(chat_model, chat):
    engine = Engine(chat_model, chat, max_batch_size=4, max_tokens=20, prefix_cache_bytes=0, trace_steps=True)
    starts: list[tuple[str, dict]] = []
    original = engine.more

    def more(free):
        given = original(free)
        for choice in [c for c in engine._rows.values() if c.row_request in [r for r, _ in given]]:
            starts.append((choice.kind, copy.deepcopy(choice.row_request.controller.calibration._counts)))
        return given

    engine.more = more  # type: ignore[method-assign]
    try:
        ((first, _, _),) = _wait(*_ask(engine, "plan a trip to oslo", schema=TRIP_SCHEMA))
        learned = copy.deepcopy(first.row_request.controller.calibration._counts)
        assert learned, "the first request learned something"
        assert engine._recent["schema"].calibration._counts == learned
        _wait(*_ask(engine, "tell me about bergen"))  # free text: its own kind
        ((second, _, _),) = _wait(*_ask(engine, "plan a trip to rome and naples", schema=TRIP_SCHEMA))
        assert [kind for kind, _ in starts] == ["schema", "text", "schema"]
        assert starts[0][1] == {} and starts[1][1] == {}  # nothing finished of their kind before them
        assert starts[2][1] == learned  # from the first schema request's records
        assert second.row_request.controller.calibration is not engine._recent["schema"].calibration  # a copy
        assert engine.trace is not None
        table = summarize(*engine.trace.take())
        assert table["steps"] > 0 and table["joins"] == 3 and table["rows"] >= 1
        assert table["prompt_tokens"] >= sum(len(c.prompt) for c in (first, second))
        assert engine.trace.take() == ([], [])
    finally:
        engine.close()


def test_a_request_starts_resting_where_its_kinds_last_request_ended_resting(chat_model, chat):
    """Drafts of the last finished free-text request were being cut whole (it ended with a rest of 8 steps to
    come): a new free-text request rests its first 7 steps; one of another kind starts asking at once."""
    engine = Engine(chat_model, chat, max_batch_size=4, max_tokens=12, prefix_cache_bytes=0)
    starts: list[tuple[str, bool, int]] = []
    original = engine.more

    def more(free):
        given = original(free)
        for choice in [c for c in engine._rows.values() if c.row_request in [r for r, _ in given]]:
            controller = choice.row_request.controller
            starts.append((choice.kind, controller.resting, controller.rest))
        return given

    engine.more = more  # type: ignore[method-assign]
    try:
        engine._recent["text"] = TrafficRecord(Calibration(), 8)
        ((text, _, _),) = _wait(*_ask(engine, "tell me about bergen"))
        ((schema, _, _),) = _wait(*_ask(engine, "plan a trip to oslo", schema=TRIP_SCHEMA))
        assert starts == [("text", True, 8), ("schema", False, 1)]
        assert engine._recent["text"].rest == text.row_request.controller.rest  # where the next one starts
        assert engine._recent["schema"].rest == schema.row_request.controller.rest
    finally:
        engine.close()


def test_a_request_starts_from_the_splits_its_kinds_last_request_saw(chat_model, chat):
    """The last finished schema request saw the target write token 7 where the canonical split has 9: a new
    schema request's drafts start from that; a free-text one does not; the record is the new row's at its end."""
    engine = Engine(chat_model, chat, max_batch_size=4, max_tokens=8, prefix_cache_bytes=0)
    starts: list[tuple[str, dict, dict]] = []
    owners = []
    original = engine.more

    def more(free):
        given = original(free)
        for choice in [c for c in engine._rows.values() if c.row_request in [r for r, _ in given]]:
            owner = split_owner(choice.row_request.proposer)
            owners.append(owner)
            starts.append((choice.kind, dict(owner.by_context), dict(owner.by_token)))
        return given

    engine.more = more  # type: ignore[method-assign]
    try:
        seen = SplitMemory(by_context=(((3, 9), 7),), by_token=((9, 7),))
        engine._recent["schema"] = TrafficRecord(Calibration(), 1, seen)
        _wait(*_ask(engine, "tell me about bergen"))
        _wait(*_ask(engine, "plan a trip to oslo", schema=TRIP_SCHEMA))
        assert [kind for kind, _, _ in starts] == ["text", "schema"]
        assert starts[0][1:] == ({}, {})  # nothing finished of its kind before it
        assert starts[1][1][(3, 9)] == 7 and starts[1][2][9] == 7  # from the last schema request
        assert engine._recent["schema"].splits == owners[1].memory()  # where the next one starts
        assert engine._recent["text"].splits == owners[0].memory()
    finally:
        engine.close()
