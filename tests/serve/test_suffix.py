"""The server's index of earlier outputs: a later request drafts from an earlier one, through the real client.

An in-process server (uvicorn in a thread, the embedded SmolLM2-135M, the
profiled step cost so draft lengths do not follow the clock) driven by the
``openai`` client; the per-source statistics in each answer's ``grammarspec``
key count the tokens drafted from earlier outputs (source ``suffix``).
``--draft-memory-mb 0`` turns the index off, and outputs never change.  The
``repeat`` workload's counts show fewer target passes with the index on.
"""

from __future__ import annotations

import json
import queue

import pytest

pytest.importorskip("openai")
pytest.importorskip("uvicorn")
import openai

from grammars import grammar_spec
from grammarspec.bench.drafts import repeat_requests, run_drafts_bench
from grammarspec.serve import Engine
from grammarspec.serve.engine import draft_scope
from grammarspec.serve.protocol import ChatRequest
from tests.serve_process import MODEL, engine_server

pytestmark = pytest.mark.slow

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "country": {"type": "string", "maxLength": 20},
        "famous_for": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 2},
    },
    "required": ["city", "country", "famous_for"],
    "additionalProperties": False,
}
QUESTION = "Describe {} as JSON."


@pytest.fixture(scope="module")
def server(smol):
    model, tokenizer = smol
    engine = Engine(model, tokenizer, max_batch_size=4, max_tokens=96, prefix_cache_bytes=0, step_cost="profile")
    with engine_server(engine) as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=0, timeout=3600), engine


def _ask(client, city):
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": QUESTION.format(city)}],
        temperature=0,
        max_tokens=64,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}},
    )
    return r.choices[0].message.content, r.model_extra["grammarspec"]["choices"][0]


def _ask_engine(engine, city):
    events: queue.Queue = queue.Queue()
    request = ChatRequest(
        messages=[{"role": "user", "content": QUESTION.format(city)}], schema=SCHEMA, temperature=0.0, max_tokens=64
    )
    job = engine.prepare(request, events.put)
    engine.submit(job)
    kind, payload = events.get(timeout=3600)
    assert kind == "choice", payload
    return payload[0].text, payload[0].row.stats


def test_the_second_request_of_a_kind_drafts_from_the_first(server, smol):
    client, engine = server
    first_text, first = _ask(client, "Oslo")
    second_text, second = _ask(client, "Oslo")  # another request, the same question: the same answer
    assert second_text == first_text
    assert second["accepted"].get("suffix", 0) >= 10  # most of it drafted from the first answer
    assert second["target_forwards"] < first["target_forwards"]
    # Other inputs, the same schema: the keys and punctuation they share are drafted from the earlier answers.
    later = [_ask(client, city)[1] for city in ("Lima", "Cairo")]
    assert sum(s["accepted"].get("suffix", 0) for s in later) > 0
    assert engine.drafts is not None and engine.drafts.as_dict()["outputs"] >= 4
    # Off (``--draft-memory-mb 0``): nothing drafted from earlier outputs, and the same answers.
    model, tokenizer = smol
    off = Engine(model, tokenizer, max_batch_size=4, max_tokens=96, prefix_cache_bytes=0, draft_memory_bytes=0)
    try:
        assert off.drafts is None
        for city in ("Oslo", "Oslo"):
            text, stats = _ask_engine(off, city)
            assert text == first_text and "suffix" not in stats.proposed
        assert stats.target_forwards > second["target_forwards"]
    finally:
        off.close()


def test_scopes_are_the_traffic_kind_and_the_schema():
    spec = grammar_spec(schema=SCHEMA)
    assert draft_scope(spec, {}) == draft_scope(grammar_spec(schema=json.loads(json.dumps(SCHEMA))), {})
    assert draft_scope(spec, {}).startswith("schema/schema:")
    assert draft_scope(grammar_spec(schema={"type": "array"}), {}) != draft_scope(spec, {})
    assert draft_scope(None, {}) == "text/text"


def test_draft_memory_mb_reaches_the_engine_and_zero_turns_the_index_off(monkeypatch):
    import grammarspec.cli.common as cli_common
    import grammarspec.serve as serve_package
    from grammarspec.cli.main import main

    built: list[dict] = []
    monkeypatch.setattr(cli_common, "load", lambda *a, **k: (None, None))
    monkeypatch.setattr(serve_package, "Engine", lambda model, tokenizer, **kw: built.append(kw) or object())
    monkeypatch.setattr(serve_package, "serve", lambda *a, **k: None)
    assert main(["serve", "--draft-memory-mb", "0"]) == 0
    assert main(["serve", "--draft-memory-mb", "1.5"]) == 0
    assert main(["serve"]) == 0
    assert [kw["draft_memory_bytes"] for kw in built] == [0, 3 << 19, 256 << 20]
    assert Engine.__init__.__kwdefaults__["draft_memory_bytes"] == 256 << 20  # the engine's default is the flag's
    with pytest.raises(SystemExit):
        main(["serve", "--draft-memory-mb", "-1"])


@pytest.mark.bench
def test_the_repeat_workload_takes_fewer_target_passes_with_the_index_on(smol, tasks):
    from grammarspec.bench.tasks import load_tasks

    model, tokenizer = smol
    chosen = [t for t in load_tasks() if t.category == "extraction"][:2]
    assert len(repeat_requests(chosen, 3, 32)) == 6
    result = run_drafts_bench(model, tokenizer, "repeat", concurrency=1, repeat=3, max_tokens=32, tasks=chosen)
    none, on, off = (result["arms"][arm] for arm in ("none", "on", "off"))
    assert on["identical"] == off["identical"] == (6, 6)  # outputs never change, plain decoding's included
    assert none["proposed"] == {} and none["passes"] == none["tokens"] - sum(
        r["forced_tokens"] for r in none["records"]
    )
    assert on["tokens"] == off["tokens"] and on["accepted"].get("suffix", 0) > 0
    assert on["passes"] < off["passes"] < none["passes"]
    # the index pays on the requests whose schema the server has seen: more tokens per pass than without it
    ratios = result["ratios"]
    assert ratios["on"]["warm"]["tokens_per_pass"] > ratios["off"]["warm"]["tokens_per_pass"] > 1
