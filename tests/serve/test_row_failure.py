"""``grammarspec serve``: one request's failure is its own.

A request whose grammar matcher raises mid-answer (a fault planted in this
process: the matcher of a schema titled ``fault`` raises at its fourth
accept) gets a 500 naming what failed, or an error event when streamed; the
requests decoding beside it in the same loop answer exactly as they do alone
(greedy), and the server serves the next request.  Driven by the ``openai``
client over HTTP (uvicorn in a thread, the embedded SmolLM2-135M).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx2 as httpx  # what the openai client ships with
import pytest

pytest.importorskip("openai")
pytest.importorskip("uvicorn")
import openai

import grammarspec.serve.engine as engine_module
from grammarspec.serve import Engine
from tests.helpers import TRIP_SCHEMA
from tests.serve_process import MODEL, engine_server

pytestmark = pytest.mark.slow

FAULT = {**TRIP_SCHEMA, "title": "fault"}
DEAD_END = {**TRIP_SCHEMA, "title": "dead end"}
COUNT = "Count from 1 to 40, separated by commas."


class Boom(RuntimeError):
    """The planted fault."""


class FaultyMatcher:
    """A matcher whose ``accept`` raises :class:`Boom` at its fourth call (mid-answer)."""

    def __init__(self, inner) -> None:
        self.inner, self.accepted = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def accept(self, token):
        self.accepted += 1
        if self.accepted == 4:
            raise Boom("planted fault: the matcher raised at its fourth token")
        return self.inner.accept(token)


class DeadEndMatcher:
    """A matcher whose every state from its fourth token on allows no token (a backend's dead end)."""

    def __init__(self, inner) -> None:
        self.inner, self.depth = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def accept(self, token):
        accepted = self.inner.accept(token)
        self.depth += bool(accepted)
        return accepted

    def rollback(self, n):
        self.inner.rollback(n)
        self.depth -= n

    def fill_mask(self, bitmask, row):
        self.inner.fill_mask(bitmask, row)
        if self.depth >= 4:
            bitmask[row] = 0


@pytest.fixture(scope="module")
def server(smol):
    real = engine_module.row_request

    def row_request(*args, **kwargs):  # the rows of a request whose schema is titled "fault" get a faulty matcher
        request = real(*args, **kwargs)
        title = (kwargs.get("schema") or {}).get("title")
        if title == "fault":
            request.matcher = FaultyMatcher(request.matcher)
        if title == "dead end":
            request.matcher = DeadEndMatcher(request.matcher)
        return request

    model, tokenizer = smol
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine_module, "row_request", row_request)
        engine = Engine(model, tokenizer, max_batch_size=8, max_tokens=256)
        with engine_server(engine) as url:
            yield url, engine


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=600)


def _ask(client, content, schema=None, **kwargs):
    kwargs.setdefault("temperature", 0)
    kwargs.setdefault("max_tokens", 48)
    if schema is not None:
        kwargs["response_format"] = {"type": "json_schema", "json_schema": {"name": "plan", "schema": schema}}
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], **kwargs)


def _fails(client, stream=False, schema=FAULT):
    """The faulty request's error message (a 500, or an error event when streamed)."""
    with pytest.raises(openai.APIError) as caught:
        reply = _ask(client, "Plan 2 days in Porto. Reply in JSON.", schema, stream=stream)
        for _ in reply if stream else ():
            pass
    if not stream:
        assert isinstance(caught.value, openai.InternalServerError)
    return caught.value.message


class _Gate:
    """Holds the jobs the engine is handed until ``n`` have come, then hands them over together, so that they
    start in one decode loop whatever the machine's speed (the first starts it; the rest join at its next step)."""

    def __init__(self, engine, n):
        self.engine, self.n, self.held, self.lock = engine, n, [], threading.Lock()
        self.submit = engine.submit

    def __call__(self, job):
        with self.lock:
            self.held.append(job)
            ready = self.held if len(self.held) == self.n else []
        for held in ready:
            self.submit(held)


def _streamed(client, content, **kwargs):
    text, finish = "", None
    for chunk in _ask(client, content, stream=True, **kwargs):
        text += chunk.choices[0].delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
    return text, finish


def test_a_failing_request_fails_alone_and_the_server_serves_on(server, client, monkeypatch):
    engine = server[1]
    count = _ask(client, COUNT, max_tokens=80).choices[0]
    plan = _ask(client, "Plan 3 days in Lisbon. Reply in JSON.", TRIP_SCHEMA).choices[0]
    loops, failed = engine.counters["loops"], engine.counters["failed"]

    # A streamed counting request, the faulty one and a good schema request decode in one loop.
    monkeypatch.setattr(engine, "submit", _Gate(engine, 3))
    with ThreadPoolExecutor(3) as pool:
        counting = pool.submit(_streamed, client, COUNT, max_tokens=80)
        fault = pool.submit(_fails, client)
        good = pool.submit(_ask, client, "Plan 3 days in Lisbon. Reply in JSON.", TRIP_SCHEMA)
        (text, finish), message, beside = counting.result(), fault.result(), good.result().choices[0]
    monkeypatch.undo()
    assert engine.counters["loops"] == loops + 1  # the three shared one decode loop
    assert "this request failed inside the server" in message and "raised Boom: planted fault" in message, message
    assert "other requests were not affected" in message
    assert (text, finish) == (count.message.content, count.finish_reason)
    assert (beside.message.content, beside.finish_reason) == (plan.message.content, plan.finish_reason)

    # The server serves on: a streamed faulty request gets an error event, the next request its answer.
    assert "Boom: planted fault" in _fails(client, stream=True)
    after = _ask(client, "Plan 3 days in Lisbon. Reply in JSON.", TRIP_SCHEMA).choices[0]
    assert after.message.content == plan.message.content and after.finish_reason == "stop"
    health = httpx.get(server[0] + "/health").json()
    assert health["status"] == "ok" and engine.counters["failed"] == failed + 2


def test_a_request_whose_grammar_reaches_a_dead_end_fails_alone(server, client):
    engine = server[1]
    plan = _ask(client, "Plan 3 days in Lisbon. Reply in JSON.", TRIP_SCHEMA).choices[0]
    loops = engine.counters["loops"]
    stream = _ask(client, COUNT, max_tokens=80, stream=True)  # a loop the other two join
    text = ""
    for chunk in stream:
        text += chunk.choices[0].delta.content or ""
        if text:
            break
    with ThreadPoolExecutor(2) as pool:
        dead = pool.submit(_fails, client, False, DEAD_END)
        good = pool.submit(_ask, client, "Plan 3 days in Lisbon. Reply in JSON.", TRIP_SCHEMA)
        message, beside = dead.result(), good.result().choices[0]
    for _ in stream:
        pass
    assert engine.counters["loops"] == loops + 1
    assert "the grammar allows no token after 4 generated tokens" in message, message
    assert "grammar_backend" in message and "other requests were not affected" in message
    assert (beside.message.content, beside.finish_reason) == (plan.message.content, plan.finish_reason)
