"""A bounded load test of ``grammarspec serve``: many requests from concurrent clients, random schemas.

16 distinct requests (a prompt and a schema from the data sample each) are first
answered one at a time; then ``GRAMMARSPEC_SERVE_LOAD`` requests (default 64)
drawn from them are sent by 16 concurrent clients (``GRAMMARSPEC_SERVE_LOAD=200`` is the
issue's full run; the default keeps the suite's time modest).  Every answer must equal its
request's solo answer (greedy: none lost, none mixed up), the process's memory
must stay within a stated bound of what it was after a warm-up round, and the
server must be healthy afterwards.
"""

from __future__ import annotations

import os
import random
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("openai")
pytest.importorskip("uvicorn")
import openai
import psutil

from grammarspec.serve import Engine
from tests.helpers import corpus_records
from tests.serve_process import MODEL, engine_server

pytestmark = pytest.mark.slow

REQUESTS = int(os.environ.get("GRAMMARSPEC_SERVE_LOAD", "64"))
CLIENTS = 16
#: RSS growth allowed between the warm-up round and the end: the prefix cache budget plus allocator slack
PREFIX_BUDGET = 64 << 20
MEMORY_BOUND = PREFIX_BUDGET + (256 << 20)


@pytest.fixture(scope="module")
def load_server(smol):
    model, tokenizer = smol
    engine = Engine(model, tokenizer, max_batch_size=8, max_tokens=64, prefix_cache_bytes=PREFIX_BUDGET)
    with engine_server(engine) as url:
        yield url, engine


def _user_text(prompt) -> str:
    """A sample prompt as one user message (the records hold a string or a chat)."""
    if isinstance(prompt, str):
        return prompt
    messages = prompt.get("messages") or []
    return next(
        (m["content"] for m in messages if m.get("role") == "user" and isinstance(m.get("content"), str)), str(prompt)
    )


def test_many_concurrent_requests_are_answered_exactly_and_memory_stays_flat(load_server):
    url, engine = load_server
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
    rng = random.Random(0)
    records = [r for r in corpus_records() if r.get("prompts")]
    chosen = rng.sample(records, min(16, len(records)))
    distinct = [(_user_text(r["prompts"][0]), r["schema"]) for r in chosen]

    def ask(job):
        prompt, schema = job
        r = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt}],
            temperature=0,
            max_tokens=12,
            response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
        )
        return r.choices[0].message.content, r.choices[0].finish_reason

    solo = [ask(job) for job in distinct]
    order = [rng.randrange(len(distinct)) for _ in range(REQUESTS)]
    process = psutil.Process()
    with ThreadPoolExecutor(CLIENTS) as pool:
        warm = list(pool.map(ask, [distinct[i] for i in order[:32]]))
        rss_before = process.memory_info().rss
        rest = list(pool.map(ask, [distinct[i] for i in order[32:]]))
    rss_after = process.memory_info().rss
    answers = warm + rest
    assert len(answers) == REQUESTS
    wrong = [(i, a, solo[i]) for i, a in zip(order, answers) if a != solo[i]]
    assert not wrong, f"{len(wrong)} answers differ from their solo answer, e.g. {wrong[0]}"
    assert rss_after - rss_before < MEMORY_BOUND, f"memory grew by {(rss_after - rss_before) >> 20} MiB"
    assert engine.prefix.nbytes <= PREFIX_BUDGET
    assert engine.counters["failed"] == 0
    health = client.with_options(timeout=30).models.list()
    assert [m.id for m in health] == [MODEL]
    assert engine._thread.is_alive()
