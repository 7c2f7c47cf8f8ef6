"""tools/suffix_eval.py (and its traffic, tools/suffix_eval_data.py): the data it replays, what it counts, the
report it writes, and its refusal where arctic-inference is missing.  The arctic side itself runs only in the
vLLM environment; here a stand-in cache checks how the tool drives it."""

from __future__ import annotations

import datetime
import json
import random
import re
import sys
import types
from collections import Counter

import jsonschema
import pytest

from grammarspec.bench.tasks import load_tasks
from grammarspec.completion import build_prompt
from proposers.suffix_index import scope_of
from tests.helpers import load_tool
from tools.suffix_eval_data import Stream, documents, number, streams, vary_text, vocabulary

HEAD = (90, 91, 92)  # a prompt's last tokens


@pytest.fixture(scope="module")
def tool():
    return load_tool("suffix_eval")


@pytest.fixture(scope="module")
def references():
    return [t for t in load_tasks() if t.reference is not None]


# -- data ------------------------------------------------------------------------------------------


def test_requests_are_seeded_interleaved_and_follow_their_schemas(references):
    docs = documents(references, 20 * len(references), seed=3)
    assert docs == documents(references, 20 * len(references), seed=3)  # the same traffic every run
    assert docs != documents(references, 20 * len(references), seed=4)
    assert set(Counter(i for i, _ in docs).values()) == {20}  # every schema, many times
    first = [i for i, _ in docs[: len(references)]]
    assert len(set(first)) > len(references) // 3  # interleaved, not one schema after another
    parsed = [(references[i], json.loads(text)) for i, text in docs]
    assert len({text for _, text in docs}) > 0.9 * len(docs)  # varied values, not one answer repeated
    valid = 0
    for task, doc in parsed:
        try:
            jsonschema.validate(doc, task.schema)
            valid += 1
        except jsonschema.ValidationError:
            pass  # a tool drawn from its schema alone may miss a pattern
    assert valid >= 0.95 * len(parsed)
    for task, doc in parsed:  # an answer keeps its schema's required keys
        if task.category == "extraction":
            assert set(task.schema.get("required", [])) <= set(doc)


def test_a_varied_string_keeps_its_shape_and_its_pattern(references):
    words = vocabulary(references)
    assert words == sorted(set(words)) and all(w.islower() and len(w) >= 3 for w in words)
    rng = random.Random(0)
    ids = {vary_text("INV-20417", rng, words, r"^INV-\d{5}$") for _ in range(20)}
    assert all(re.fullmatch(r"INV-\d{5}", x) for x in ids) and len(ids) > 10
    assert vary_text("living_room", rng, words) == "living_room"  # identifiers stay
    for _ in range(20):
        stamp = vary_text("2025-03-14 at 15:30", rng, words)
        date, _, time = stamp.split(" ")
        datetime.date.fromisoformat(date)
        datetime.time.fromisoformat(time)
    # a pattern no variation matches: the value as it was
    assert vary_text("Lisbon", rng, words, r"^Lisbon$") == "Lisbon"


def test_numbers_are_drawn_within_the_schemas_bounds():
    rng = random.Random(0)
    years = [number({"minimum": 1950, "maximum": 2030}, 1999, rng) for _ in range(200)]
    assert all(isinstance(y, int) and 1950 <= y <= 2030 for y in years)
    halves = [number({"minimum": 0, "maximum": 5, "multipleOf": 0.5}, 4.5, rng) for _ in range(200)]
    assert all(0 <= h <= 5 and (2 * h).is_integer() for h in halves)
    above = [number({"exclusiveMinimum": 0}, 3, rng) for _ in range(200)]
    assert min(above) >= 1


def test_streams_carry_the_prompts_tail_and_end_the_turn(references, smol_tokenizer):
    docs = documents(references, 8, seed=0)
    out = streams(references, docs, smol_tokenizer, 24)
    for (i, text), stream in zip(docs, out, strict=True):
        task = references[i]
        full = build_prompt(smol_tokenizer, task.prompt, system=task.system, schema=task.schema, tools=task.tools)
        assert stream.prompt == tuple(full[-24:])
        assert stream.scope == scope_of(task.schema)
        assert stream.tokens[-1] == smol_tokenizer.eos_token_id
        assert smol_tokenizer.decode(list(stream.tokens[:-1])) == text


# -- counting ----------------------------------------------------------------------------------------


def test_accepted_length_is_the_proposals_prefix_that_matches(tool):
    assert tool.accepted([1, 2, 3], [1, 2, 4]) == 2
    assert tool.accepted([1, 2], [1]) == 1  # the output ended
    assert tool.accepted([], [1, 2]) == 0
    assert tool.accepted([5, 2], [1, 2]) == 0  # a wrong first token rejects the rest


def test_passes_commit_the_accepted_draft_and_one_token_each():
    tool = load_tool("suffix_eval")
    assert tool.passes([0, 0, 0]) == 3  # no draft: one token a pass
    assert tool.passes([3, 9, 9, 9, 0]) == 2  # 4 tokens, then the fifth
    assert tool.passes([]) == 0
    assert tool.quantiles([1000 * k for k in range(1, 11)]) == (5.5, 9.0)  # microseconds


def test_a_repeated_output_is_drafted_in_full_from_its_first_token(tool):
    ours = tool.Ours(1 << 20)
    answer = Stream("s", HEAD, tuple(range(100, 120)))
    assert len(tool.insert_times(ours, [answer, answer])) == 2
    row = tool.decode_held_out(ours, [answer], first_id=2)
    assert row["positions"] == 20 and row["proposed"] == 1.0
    assert row["mean_accepted"] == sum(min(8, 20 - i) for i in range(20)) / 20  # 8 at a time, to the end
    assert row["tokens_per_pass"] == 20 / 3  # passes at 0, 9 and 18
    assert ours.held()["held"] == 3
    other = tool.decode_held_out(ours, [Stream("t", HEAD, answer.tokens)], first_id=3)
    assert other["mean_accepted"] < 1  # another scope drafts nothing from it


class FakeCache:
    """arctic's SuffixDecodingCache, recording how the tool calls it."""

    made: list[FakeCache] = []

    def __init__(self, max_tree_depth, max_cached_requests):
        self.args = (max_tree_depth, max_cached_requests)
        self.calls: list[tuple] = []
        self.cached_requests: set[int] = set()
        self._global_tree = types.SimpleNamespace(estimate_memory=lambda: 100)
        FakeCache.made.append(self)

    def start_request(self, rid, prompt):
        self.calls.append(("start", rid, tuple(prompt)))
        self.cached_requests.add(rid)

    def add_active_response(self, rid, tokens):
        self.calls.append(("add", rid, tuple(tokens)))

    def stop_request(self, rid):
        self.calls.append(("stop", rid))

    def speculate(self, rid, context, *args):
        self.calls.append(("speculate", rid, tuple(context), args))
        return types.SimpleNamespace(token_ids=[7, 8])


@pytest.fixture
def fake_arctic(monkeypatch):
    FakeCache.made = []
    module = types.ModuleType("arctic_inference.suffix_decoding")
    module.SuffixDecodingCache = FakeCache
    monkeypatch.setitem(sys.modules, "arctic_inference", types.ModuleType("arctic_inference"))
    monkeypatch.setitem(sys.modules, "arctic_inference.suffix_decoding", module)


def test_arctic_is_driven_as_vllm_drives_it_one_cache_per_scope_when_asked(tool, fake_arctic):
    arctic = tool.Arctic(50, per_scope=True)
    tool.insert_times(arctic, [Stream("a", HEAD, (1, 2)), Stream("b", HEAD, (3,)), Stream("a", HEAD, (4,))])
    a, b = FakeCache.made
    assert a.args == b.args == (tool.ARCTIC_DEPTH, 50)
    first, third = [("start", 0, HEAD), ("add", 0, (1, 2)), ("stop", 0)], [("start", 2, HEAD), ("add", 2, (4,))]
    assert a.calls == [*first, *third, ("stop", 2)]  # scope "a"'s requests, and only those, in its cache
    arctic.start(9, "b", HEAD)
    assert arctic.propose(9, list(range(40)), 8) == [7, 8]
    spec = (tool.DRAFT_TOKENS, tool.ARCTIC_SPEC_FACTOR, 0.0, tool.ARCTIC_MIN_PROB)
    assert b.calls[-1] == ("speculate", 9, tuple(range(40 - tool.ARCTIC_DEPTH, 40)), spec)
    assert arctic.held() == {"held": 4, "bytes": 200}  # every request started, over both trees
    shared = tool.Arctic(50)
    shared.start(1, "a", HEAD)
    shared.start(2, "b", HEAD)
    assert len(FakeCache.made) == 3  # one tree for all traffic


# -- memory ------------------------------------------------------------------------------------------


def test_the_memory_run_keeps_ours_under_its_cap(tool, tmp_path):
    rng = random.Random(0)
    data = [Stream("s", HEAD, tuple(rng.randrange(1000) for _ in range(50))) for _ in range(40)]
    path = tmp_path / "streams.json"
    tool.write_streams(data, str(path))
    out = tool.memory_worker("ours:60000", str(path), [10, 40])
    assert [r["added"] for r in out["rows"]] == [10, 40] and [r["tokens"] for r in out["rows"]] == [500, 2000]
    assert all(r["bytes"] <= 60000 for r in out["rows"]) and out["rows"][-1]["held"] < 40
    assert out["rows"][-1]["evictions"] > 0
    fresh = tool.run_worker("ours:60000", data, [40])  # the same run in a fresh interpreter
    assert fresh["rows"][0]["held"] == out["rows"][-1]["held"]


# -- the report and the refusal ----------------------------------------------------------------------


def test_the_report_is_markdown_tables_with_every_row(tool):
    assert tool.table(["a", "b"], [[1234, 2.5]]) == "| a | b |\n|---|---|\n| 1,234 | 2.50 |"
    speed = {"insert_us": (500.0, 900.0), "insert_per_token_us": 3.25, "lookup_us": (12.0, 15.0)}
    speed |= {"add_token_us": (4.0, 5.0), "proposed": 0.8, "mean_accepted": 2.0, "tokens_per_pass": 2.2}
    speed |= {"held": 636, "bytes": 80 << 20}
    memory_row = {"added": 1000, "tokens": 250_000, "rss": 6 << 20, "held": 35, "bytes": 8 << 20}
    meta = dict(command="tools/suffix_eval.py --quick", machine="x86_64, 2 CPUs", load="2.80, 1.73, 1.62")
    meta |= dict(outputs=1500, tokens=372_839, mean_len=249.0, schemas=36, train=600, held_out=36, positions=8899)
    result = {
        "meta": meta,
        "speed": [{"name": "ours", **speed}, {"name": "arctic", **speed}],
        "memory": [{"name": "ours, 8 MB cap", "rows": [memory_row, memory_row]}],
        "licence": ["Apache-2.0"],
        "notes": ["a note"],
    }
    report = tool.render(result)
    assert "load average at start 2.80, 1.73, 1.62" in report and "`tools/suffix_eval.py --quick`" in report
    assert "| ours | 500.00 | 900.00 | 3.25 | 12.00 | 15.00 | 4.00 | 80% | 2.00 | 2.20 | 636 | 80.00 |" in report
    assert report.count("| ours, 8 MB cap | 1,000 | 250,000 | 6.00 | 35 | 8.00 |") == 2
    assert "- Apache-2.0" in report and "- a note" in report
    header = next(line for line in report.splitlines() if line.startswith("| structure | add output"))
    assert header.count("|") == report.splitlines()[report.splitlines().index(header) + 2].count("|")


def test_without_arctic_it_refuses_naming_where_it_lives_and_how_to_install_it(tool, monkeypatch):
    monkeypatch.setitem(sys.modules, "arctic_inference", None)  # not importable, whatever is installed
    monkeypatch.setitem(sys.modules, "arctic_inference.suffix_decoding", None)
    monkeypatch.setattr(tool, "evaluate", lambda *a: pytest.fail("measured without arctic"))
    with pytest.raises(SystemExit) as refused:
        tool.main(["--quick"])
    message = str(refused.value.code)
    assert ".venv-vllm" in message and "pip install" in message and "arctic-inference" in message
