"""What the drafters learn in a conversation carries into its next turn (issue #25), and changes no output.

``Conversation`` keeps one :class:`~grammarspec.policy.allocation.Calibration` for the
whole conversation; the server keeps a copy beside each prefix-cache entry and
hands a copy to a request that hits it.  The earlier turns' JSON documents
reach the schema n-gram drafter as ``Request.documents``.  Toy tokenizer with a
chat template and a tiny random Llama: fast.
"""

from __future__ import annotations

import copy
import queue

import pytest
import torch

import grammarspec
from grammarspec.engine import row_requests
from grammarspec.policy.adaptive import AdaptiveController
from grammarspec.policy.allocation import Calibration
from grammarspec.serve import Engine
from grammarspec.serve.protocol import ChatRequest
from grammarspec.tool_calls import earlier_documents
from proposers.base import Draft, Request
from proposers.schema_ngram import SchemaNgramProposer
from tests.helpers import TRIP_SCHEMA
from tests.toy import toy_vocab_size
from tests.toy_models import ToyCausalLM

TURNS = ["the trip goes to oslo for three days", "and then to bergen for two", "finally rome, one day"]


def _counts(calibration: Calibration) -> dict:
    return copy.deepcopy(calibration._counts)


@pytest.fixture()
def started(monkeypatch):
    """Every AdaptiveController the one row builder makes: (it, a snapshot of its records at the start)."""
    seen: list[tuple[AdaptiveController, dict]] = []

    class Recording(AdaptiveController):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen.append((self, _counts(self.calibration)))

    monkeypatch.setattr(row_requests, "AdaptiveController", Recording)
    return seen


def _plain(model, tok, ids, max_new_tokens=24):
    out = grammarspec.generate(
        model,
        torch.tensor([ids]),
        tokenizer=tok,
        schema=TRIP_SCHEMA,
        assistant=None,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        return_dict_in_generate=True,
    )
    return out.sequences[0, len(ids) : len(ids) + out.stats[0].new_tokens].tolist()


def test_a_conversation_s_second_turn_starts_from_what_the_first_learned(chat_model, chat, started):
    conv = grammarspec.Conversation(chat_model, chat, assistant="auto", do_sample=False)
    conv.add_user(TURNS[0])
    conv.reply(schema=TRIP_SCHEMA, max_new_tokens=24)
    after_first = _counts(conv.calibration)
    source, opens, bin_ = next(key for key in after_first if key[1])  # a record of a draft's first token
    probe = Draft(tokens=(2,), sources=(source,), confidence=None if bin_ < 0 else ((bin_ + 0.5) / 8,))
    learned = conv.calibration.estimate(probe)
    assert learned != Calibration().estimate(probe)  # turn 1 learned something about that source
    conv.add_user(TURNS[1])
    conv.reply(schema=TRIP_SCHEMA, max_new_tokens=24)
    (first, at_first), (second, at_second) = started
    assert at_first == {} and at_second == after_first  # turn 2 began with turn 1's records
    assert first.calibration is second.calibration is conv.calibration  # one object, one turn at a time


def test_greedy_turns_are_identical_with_and_without_the_carry(chat_model, chat):
    carried = grammarspec.Conversation(chat_model, chat, assistant="auto", do_sample=False)
    reset = grammarspec.Conversation(chat_model, chat, assistant="auto", do_sample=False)
    for turn in TURNS:
        for conv in (carried, reset):
            conv.add_user(turn)
        reset.calibration = Calibration()  # no carry of the records
        ids = carried.prompt_ids()
        expected = _plain(chat_model, chat, ids)
        assert carried.reply(schema=TRIP_SCHEMA, max_new_tokens=24).tokens == expected
        assert reset.reply(schema=TRIP_SCHEMA, max_new_tokens=24).tokens == expected
    assert carried.calibration._counts != reset.calibration._counts  # the carry did change the records


class _Recorder(SchemaNgramProposer):
    def __init__(self):
        super().__init__()
        self.requests: list[Request] = []

    def start(self, request: Request) -> None:
        self.requests.append(request)
        super().start(request)


def test_the_previous_turn_s_document_is_offered_as_a_source(chat_model, chat):
    recorder = _Recorder()
    conv = grammarspec.Conversation(chat_model, chat, assistant=recorder, do_sample=False)
    conv.add_user(TURNS[0])
    first = conv.reply(schema=TRIP_SCHEMA, max_new_tokens=40)
    conv.messages[-1]["content"] = '{"city":"oslo","days":3}'  # a valid answer, as an agent would keep it
    conv.add_user(TURNS[1])
    conv.reply(schema=TRIP_SCHEMA, max_new_tokens=40)
    assert recorder.requests[0].documents == ()
    assert recorder.requests[1].documents == ('{"city":"oslo","days":3}',)
    assert first.tokens  # (the toy model's own answer need not be JSON)
    # The drafter proposes from it: after '{"city":' the earlier value, after a value the earlier key.
    tok = chat
    ngram = SchemaNgramProposer()
    prompt = tok.encode("u:and then to bergen\na:", add_special_tokens=False)
    ngram.start(Request(prompt_ids=tuple(prompt), tokenizer=tok, documents=('{"city":"oslo","days":3}',)))
    for typed, source, text in [('{"city":', "past_value", '"oslo"'), ('{"city":"x",', "past", '"days":')]:
        draft = ngram.propose(prompt + tok.encode(typed, add_special_tokens=False), None, 8)
        assert draft.kind == source and tok.decode(list(draft.tokens)).startswith(text)
    alone = SchemaNgramProposer()
    alone.start(Request(prompt_ids=tuple(prompt), tokenizer=tok))
    assert alone.propose(prompt + tok.encode('{"city":', add_special_tokens=False), None, 8).kind != "past_value"


def test_earlier_documents_are_the_assistant_json():
    messages = [
        {"role": "user", "content": '{"not": "mine"}'},
        {"role": "assistant", "content": "plain text"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}],
        },
        {"role": "tool", "tool_call_id": "c", "content": '{"y": 2}'},
        {"role": "assistant", "content": '{"answer": [1, 2]}'},
        {"role": "assistant", "content": "{broken"},
    ]
    assert earlier_documents(messages) == ('{"name":"f","arguments":{"x":1}}', '{"answer": [1, 2]}')


# --- the server ----------------------------------------------------------------------------------


def _ask(engine, messages, n=1):
    events: queue.Queue = queue.Queue()
    job = engine.prepare(
        ChatRequest(messages=messages, schema=TRIP_SCHEMA, temperature=0.0, max_tokens=20, n=n), events.put
    )
    engine.submit(job)
    return job, events


def _wait(job, events):
    got = []
    while len(got) < len(job.choices):
        kind, payload = events.get(timeout=120)
        assert kind == "choice", payload
        got.append(payload)
    return got


def test_the_server_carries_records_with_the_prefix_cache(chat_model, chat):
    engine = Engine(chat_model, chat, max_batch_size=4, max_tokens=20)
    joined: list[list[tuple[object, dict]]] = []
    original = engine.more

    def more(free):
        given = original(free)
        live = [c.row_request.controller for c in engine._rows.values() if c.row_request.controller is not None]
        assert len({id(c.calibration) for c in live}) == len(live)  # rows decoding at once never share one
        joined.append([(r.controller.calibration, _counts(r.controller.calibration)) for r, _ in given])
        return given

    engine.more = more  # type: ignore[method-assign]
    try:
        user = [{"role": "user", "content": "plan a trip to oslo for three days and then bergen"}]
        first, events = _ask(engine, user)
        ((choice, _message, _finish),) = _wait(first, events)
        learned = _counts(choice.row_request.controller.calibration)
        assert learned  # the first request learned something
        stored = [e.extra for e in engine.prefix._entries.values()]
        assert any(isinstance(x, Calibration) and x._counts == learned for x in stored)
        # The next turn re-renders the first and adds a message: it extends the stored entry.
        follow = user + [{"role": "assistant", "content": choice.text}, {"role": "user", "content": "and rome"}]
        second, events = _ask(engine, follow, n=2)  # two rows join together from the same entry
        results = _wait(second, events)
        starts = [item for batch in joined[1:] for item in batch]
        assert len(starts) == 2 and all(counts == learned for _, counts in starts)  # from the first's records
        objects = [c.row_request.controller.calibration for c in second.choices]
        assert objects[0] is not objects[1]
        assert all(o is not x for o in objects for x in stored)  # copies, never the stored records
        assert second.reused_tokens > len(first.prompt) // 2
        # Outputs are those of a fresh engine (no carry).
        fresh = Engine(chat_model, chat, max_batch_size=4, max_tokens=20, prefix_cache_bytes=0)
        try:
            job, events = _ask(fresh, follow, n=2)
            assert sorted(c.tokens for c, _, _ in _wait(job, events)) == sorted(c.tokens for c, _, _ in results)
        finally:
            fresh.close()
    finally:
        engine.close()


def test_generate_refuses_the_internal_carry_arguments():
    model = ToyCausalLM(toy_vocab_size(), seed=0)
    for name, value in (("calibration", Calibration()), ("documents", ('{"a":1}',))):
        with pytest.raises(TypeError, match=f"unknown arguments: {name}"):
            grammarspec.generate(model, [[1, 2]], **{name: value})
