"""tools/engine_loop.py: the server's engine in-process, as BENCHMARKS.md quotes it."""

from __future__ import annotations

import collections
from types import SimpleNamespace

import pytest

from grammarspec.bench.sweep import workload
from grammarspec.serve.engine import Engine
from tests.helpers import load_tool


def test_a_run_splits_its_time_between_forwards_the_rest_of_the_steps_and_the_loop(smol, monkeypatch):
    tool = load_tool("engine_loop")
    # the collector's clock: what it counted before a run is dropped, what it counted during the run is reported
    takes = iter([(9.0, 9), (0.25, 2), (9.0, 9), (0.5, 0)])
    monkeypatch.setattr(tool, "GC", SimpleNamespace(take=lambda: next(takes)))
    model, tokenizer = smol
    engine = Engine(model, tokenizer, max_batch_size=16, prefix_cache_bytes=0, trace_steps=True)
    try:
        plain = tool.run(engine, workload("prose"), "none", 2, 3, max_tokens=6)
        drafted = tool.run(engine, workload("json"), "auto", 1, 1, max_tokens=6)
    finally:
        engine.close()
    assert plain["steps"] >= 6 and plain["admitted"] == 0 and plain["tok/s"] > 0
    assert plain["forward s"] > 0 and plain["rest of steps s"] > 0 and plain["outside s"] >= 0
    assert (plain["gc s"], plain["full gc"], drafted["gc s"], drafted["full gc"]) == (0.25, 2, 0.5, 0)
    # both clients' rows decode together once the second prompt is read: steps of the one shape both arms share
    assert 1 <= plain["full plain steps"] < plain["steps"] and plain["their forward ms"] > 0
    # the JSON arm drafts: its forced text is admitted and verified in its steps
    assert drafted["steps"] >= 1 and drafted["admitted"] > 0 and 1 <= drafted["drafted steps"] <= drafted["steps"]


def test_the_host_functions_it_times_exist_and_count_their_seconds(monkeypatch):
    tool = load_tool("engine_loop")
    import importlib

    for module_name, attribute, _ in tool.TIMED:  # each replaced only for this test
        owner = importlib.import_module(module_name)
        *path, name = attribute.split(".")
        for part in path:
            owner = getattr(owner, part)
        monkeypatch.setattr(owner, name, getattr(owner, name))
    seconds = collections.Counter()
    tool.wrap_functions(seconds)
    from grammarspec.policy.step_cost import StepCostLearner
    from proposers.cost import PassCost

    StepCostLearner(PassCost()).observe(rows=1, batch=1, tokens=0, drafting=0, seconds=0.01)
    assert set(seconds) == {"learner observe"} and seconds["learner observe"] > 0


def test_bad_arguments_are_refused(capsys):
    tool = load_tool("engine_loop")
    with pytest.raises(SystemExit) as stop:
        tool.main(["--pairs", "0"])
    assert stop.value.code == 2
    assert "--pairs" in capsys.readouterr().err


def test_the_garbage_collector_s_time_and_full_collections_are_counted_between_takes():
    import gc

    tool = load_tool("engine_loop")
    clock = tool.GcClock()
    try:
        clock.take()
        gc.collect()  # a full collection
        seconds, full = clock.take()
        assert seconds > 0 and full >= 1
        assert clock.take()[1] == 0  # a take starts the count again
    finally:
        gc.callbacks.remove(clock._on)
