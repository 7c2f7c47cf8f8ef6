"""grammarspec bench: inputs, scoring, reports and one short real run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grammarspec.bench import report
from grammarspec.bench.arms import ARMS, check_arms
from grammarspec.bench.plots import acceptance_by_length, step_histogram
from grammarspec.bench.runner import BenchConfig, BenchResult, run_bench
from grammarspec.bench.scoring import (
    agreement,
    calls_field_accuracy,
    field_accuracy,
    leaf_fields,
    median,
    pairwise_speedups,
    parse_and_validate,
)
from grammarspec.bench.tasks import (
    BenchTask,
    TaskFileError,
    default_tasks_path,
    load_schema_corpus,
    load_tasks,
    schema_prompt,
    select_tasks,
)

# --- scoring: worked examples -----------------------------------------------------------


def test_field_accuracy_counts_equal_leaves_at_the_same_path():
    reference = {"a": 1, "b": {"c": "x", "d": True}, "items": [{"k": 1}, {"k": 2}]}
    output = {"a": 1.0, "b": {"c": "y", "d": True}, "items": [{"k": 1}], "extra": 5}
    # leaves: a ok, b.c wrong, b.d ok, items.0.k ok, items.1.k missing -> 3/5
    assert field_accuracy(output, reference) == pytest.approx(3 / 5)
    assert field_accuracy(reference, reference) == 1.0
    assert field_accuracy(None, reference) == 0.0


def test_field_accuracy_keeps_json_types_apart():
    assert field_accuracy({"x": 1}, {"x": True}) == 0.0
    assert field_accuracy({"x": "1"}, {"x": 1}) == 0.0
    assert field_accuracy({"x": None}, {"x": None}) == 1.0
    assert field_accuracy({"x": []}, {"x": []}) == 1.0  # an empty container is one leaf


def test_leaf_fields_paths():
    assert leaf_fields({"a": [{"b": 1}, 2], "c": {}}) == {("a", 0, "b"): 1, ("a", 1): 2, ("c",): {}}


def test_parallel_calls_are_compared_without_regard_to_order():
    a = {"name": "set_light", "arguments": {"room": "bedroom", "on": False}}
    b = {"name": "set_alarm", "arguments": {"time": "07:00"}}
    assert calls_field_accuracy([b, a], [a, b]) == 1.0
    wrong_b = {"name": "set_alarm", "arguments": {"time": "08:00"}}
    # a: 3 leaves matched, b: 1 of 2 -> 4/5
    assert calls_field_accuracy([wrong_b, a], [a, b]) == pytest.approx(4 / 5)
    assert calls_field_accuracy([a], [a, b]) == pytest.approx(3 / 5)  # a missing call matches nothing
    assert calls_field_accuracy([a, a, b], [a, b]) == 1.0  # an extra call costs nothing
    assert calls_field_accuracy(None, [a, b]) == 0.0
    assert calls_field_accuracy(a, [a, b]) == pytest.approx(3 / 5)  # a single object counts as one call


def test_pairwise_speedup_and_median():
    arm = {("t1", 0): 30.0, ("t2", 0): 10.0, ("t3", 0): 9.0}
    base = {("t1", 0): 10.0, ("t2", 0): 20.0, ("t3", 0): 0.0}
    assert pairwise_speedups(arm, base) == {("t1", 0): 3.0, ("t2", 0): 0.5}
    assert median([3.0, 0.5, None, 1.0]) == 1.0
    assert median([None]) is None


def test_agreement_with_the_baseline():
    assert agreement([5, 6, 7], [5, 6, 7]) == (True, 1.0)
    assert agreement([5, 6], [5, 6, 7, 8]) == (False, 0.5)
    assert agreement([], []) == (True, 1.0)


def test_validity_uses_the_format_checker_and_needs_a_complete_output():
    schema = {
        "type": "object",
        "properties": {"email": {"type": "string", "format": "email"}, "day": {"type": "string", "format": "date"}},
    }
    assert parse_and_validate('{"email":"a@b.org","day":"2024-01-31"}', schema, True)[1] is True
    value, valid, errors = parse_and_validate('{"email":"nope","day":"2024-13-45"}', schema, True)
    assert value == {"email": "nope", "day": "2024-13-45"} and not valid and len(errors) == 2
    assert parse_and_validate('{"email":"a@b.org"}', schema, False)[1] is False
    assert "not JSON" in parse_and_validate("{", schema, True)[2][0]


# --- inputs -----------------------------------------------------------------------------


@pytest.mark.bench
def test_default_task_file_loads_with_its_categories():
    tasks = load_tasks(default_tasks_path())
    assert len(tasks) == 36
    assert {t.category for t in tasks} == {"extraction", "tool_call", "generation"}
    tool = next(t for t in tasks if t.category == "tool_call")
    assert tool.tools and not tool.describe_schema and tool.scored  # tools shown, task schema enforced
    assert tool.schema.get("anyOf")
    gen = next(t for t in tasks if t.category == "generation")
    assert gen.describe_schema and not gen.scored


def test_task_file_with_tools_only_gets_the_call_schema(tmp_path):
    tool = {
        "type": "function",
        "function": {"name": "ping", "parameters": {"type": "object", "properties": {"host": {"type": "string"}}}},
    }
    path = tmp_path / "t.jsonl"
    path.write_text(
        json.dumps(
            {
                "id": "x",
                "kind": "tool_call",
                "prompt": "ping a",
                "tools": [tool],
                "reference": [{"name": "ping", "arguments": {"host": "a"}}],
            }
        )
        + "\n"
    )
    (task,) = load_tasks(path)
    assert task.schema["type"] == "array"  # a list reference: parallel calls
    assert task.schema["items"]["properties"]["name"]["const"] == "ping"


def test_malformed_task_files_name_the_problem(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "prompt": "p", "schema": {}}\n{oops\n')
    with pytest.raises(TaskFileError, match=r"bad.jsonl:2: not valid JSON"):
        load_tasks(bad)
    bad.write_text('{"id": "a", "prompt": "p"}\n')
    with pytest.raises(TaskFileError, match="needs a 'schema' or 'tools'"):
        load_tasks(bad)
    with pytest.raises(TaskFileError, match="no such file"):
        load_tasks(tmp_path / "missing.jsonl")


def test_schema_corpus_records_become_tasks(tmp_path):
    prompts = [
        {"messages": [{"role": "user", "content": "find cats"}], "ground_truth": [{"q": "cats"}]},
        {"messages": [{"role": "user", "content": "find a, b"}], "ground_truth": [{"q": "a"}, {"q": "b"}]},
    ]
    fc = {
        "id": "function_calling/x/f",
        "category": "function_calling",
        "schema": {"type": "object", "properties": {"q": {"type": "string"}}},
        "tool": {"name": "f", "description": "find"},
        "prompts": prompts,
    }
    plain = {"id": "snowplow/y", "category": "snowplow", "schema": {"title": "Click", "type": "object"}}
    (tmp_path / "function_calling.jsonl").write_text(json.dumps(fc) + "\n")
    (tmp_path / "snowplow.jsonl").write_text(json.dumps(plain) + "\n")
    tasks = load_schema_corpus(tmp_path)
    assert [t.category for t in tasks] == ["function_calling", "function_calling", "snowplow"]
    first, second, click = tasks
    assert first.prompt == fc["prompts"][0]["messages"] and first.reference == {"q": "cats"} and first.scored
    assert second.reference is None and not second.scored  # two calls of one tool: no single gold answer
    assert "Click" in click.prompt and click.describe_schema and click.reference is None


def test_large_schemas_are_summarised_not_quoted():
    big = {
        "title": "Deployment",
        "type": "object",
        "properties": {f"field_{i}": {"type": "string", "description": "x" * 100} for i in range(80)},
    }
    prompt, quote = schema_prompt(big)
    assert not quote and "field_0" in prompt and "Deployment" in prompt
    assert schema_prompt({"type": "object"})[1] is True


def test_select_tasks_round_robin_and_category_errors():
    tasks = [BenchTask(str(i), c, "p", {}) for i, c in enumerate("aaabbc")]
    assert [t.id for t in select_tasks(tasks, limit=4)] == ["0", "1", "3", "5"]
    assert [t.id for t in select_tasks(tasks, ["b"])] == ["3", "4"]
    with pytest.raises(TaskFileError, match="unknown category z; the inputs have: a, b, c"):
        select_tasks(tasks, ["z"])


def test_check_arms_orders_and_refuses_unknown_arms(monkeypatch, tmp_path):
    (tmp_path / "python").write_text("")  # the vLLM arms are checked against this environment, not .venv-vllm
    monkeypatch.setenv("GRAMMARSPEC_VLLM_PYTHON", str(tmp_path / "python"))
    assert check_arms(["auto", "none"], False) == ["baseline", "none", "auto"]
    with pytest.raises(ValueError, match="unknown arm fast"):
        check_arms(["fast"], False)
    with pytest.raises(ValueError, match="needs a draft model"):
        check_arms(["draft_model"], False)
    assert set(check_arms(list(ARMS), True)) == set(ARMS)


# --- reports from a synthetic run -------------------------------------------------------


def _run(task, category, arm, tps, steps=(), repeat=0, **extra):
    new = 40
    record = {
        "task": task,
        "category": category,
        "arm": arm,
        "repeat": repeat,
        "prompt_tokens": 100,
        "new_tokens": new,
        "seconds": new / tps,
        "tokens_per_second": tps,
        "finish_reason": "stop",
        "valid": True,
        "errors": [],
        "field_accuracy": 1.0,
        "grammar_seconds": 0.0004,
        "target_forwards": new if arm == "baseline" else 10,
        "forced_tokens": 0 if arm == "baseline" else 4,
        "proposed": {} if arm == "baseline" else {"schema_ngram": 30},
        "accepted": {} if arm == "baseline" else {"schema_ngram": 24},
        "draft_seconds": 0.0 if arm == "baseline" else 0.01,
        "verify_seconds": None if arm == "baseline" else 0.5,
        "steps": [list(s) for s in steps],
        "agrees": True,
        "agreement_prefix": 1.0,
        "tokens": [],
        "text": "{}",
    }
    record.update(extra)
    return record


def _synthetic_result():
    steps = [(4, 4), (4, 2), (8, 8), (8, 3), (2, 0)] * 2
    runs = []
    for task, category, base, fast in (
        ("e1", "extraction", 10.0, 40.0),
        ("e2", "extraction", 10.0, 20.0),
        ("e3", "extraction", 10.0, 35.0),
        ("t1", "tool_call", 12.0, 24.0),
    ):
        # the decode phase: the baseline at its rate, "auto" at twice its end-to-end ratio
        runs += [
            _run(task, category, "baseline", base, decode_tokens_per_second=base),
            _run(task, category, "auto", fast, steps, decode_tokens_per_second=2 * fast),
        ]
    runs.append({"task": "t1", "category": "tool_call", "arm": "auto", "repeat": 1, "error": "RuntimeError: boom"})
    config = BenchConfig(arms=("baseline", "auto"), max_new_tokens=64, repeat=1)
    return BenchResult(
        config=config,
        runs=runs,
        tasks=[{"task": t, "category": "x", "prompt_tokens": 100} for t in ("e1", "e2", "e3", "t1")],
        skipped=[{"task": "s1", "category": "x", "reason": "grammar: nope"}],
        wall_seconds=12.0,
        machine={"cpu": "test", "cores": 2},
    )


def test_summary_takes_the_median_of_pairwise_speedups():
    summary = report.summarize(_synthetic_result())
    extraction = summary["categories"]["extraction"]["auto"]
    assert extraction["speedup"] == pytest.approx(3.5)  # median of 4.0, 2.0, 3.5
    assert extraction["speedup_min"] == pytest.approx(2.0)
    assert extraction["accepted_per_forward"] == pytest.approx(4.0)  # 120 tokens / 30 forwards
    assert extraction["acceptance"] == {"schema_ngram": pytest.approx(0.8)}
    assert extraction["forced_fraction"] == pytest.approx(0.1)
    assert extraction["grammar_us_per_token"] == pytest.approx(10.0)
    assert summary["categories"]["extraction"]["baseline"]["accepted_per_forward"] == 1.0
    tool = summary["categories"]["tool_call"]["auto"]
    assert tool["failures"] == 1 and tool["speedup"] == pytest.approx(2.0)
    assert summary["categories"][report.ALL]["auto"]["speedup"] == pytest.approx(2.75)  # median of 4, 2, 3.5, 2
    assert extraction["decode_speedup"] == pytest.approx(7.0)  # median of 8, 4, 7


def test_a_run_without_a_decode_phase_is_left_out_of_the_decode_speedup():
    result = _synthetic_result()
    for run in result.runs:
        if run.get("task") == "e1" and run.get("arm") == "auto":
            run["decode_tokens_per_second"] = None  # everything came in the first step
    extraction = report.summarize(result)["categories"]["extraction"]["auto"]
    assert extraction["decode_speedup"] == pytest.approx(5.5)  # median of 4, 7
    assert extraction["speedup"] == pytest.approx(3.5)  # the end-to-end ratio still counts e1


def test_the_ended_stratum_keeps_only_answers_that_ended_before_the_limit():
    result = _synthetic_result()
    for run in result.runs:
        if run.get("task") == "e1" and run.get("arm") == "baseline":
            run["finish_reason"] = "length"  # cut: e1 leaves the stratum, whatever its arm did
    assert report.ended_tasks(result.runs) == {"e2", "e3", "t1"}
    summary = report.summarize(result)
    extraction = summary["categories"]["extraction"]["auto"]
    assert extraction["speedup"] == pytest.approx(3.5)  # every task: median of 4, 2, 3.5
    assert extraction["ended_tasks"] == 2 and extraction["ended_speedup"] == pytest.approx(2.75)  # of 2, 3.5
    assert summary["categories"][report.ALL]["auto"]["ended_speedup"] == pytest.approx(2.0)  # of 2, 3.5, 2
    markdown = report.to_markdown(result, summary)
    assert "| extraction | 3 | 2 | 2.75x |" in markdown
    untouched = _synthetic_result()
    assert "ended by themselves" not in report.to_markdown(untouched, report.summarize(untouched))


def test_write_results_produces_json_markdown_and_plots(tmp_path):
    paths = report.write_results(_synthetic_result(), tmp_path, command="grammarspec bench --quick")
    data = json.loads(paths["json"].read_text())
    assert data["command"] == "grammarspec bench --quick"
    assert set(data["summary"]["categories"]) == {"extraction", "tool_call", "all"}
    assert data["skipped"][0]["reason"] == "grammar: nope"
    markdown = paths["markdown"].read_text()
    assert "| extraction | 3 | 10.0 | 3.50x |" in markdown
    assert "| extraction | 3 | 7.00x |" in markdown  # the decode-phase table
    assert "t1 / auto: RuntimeError: boom" in markdown
    for name in ("speedup_png", "accepted_png", "acceptance_png"):
        assert paths[name].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_helpers():
    assert step_histogram([(4, 4), (4, 1), (0, 0), (3, 1)]) == {1: 2, 4: 1}
    assert acceptance_by_length([(4, 4), (4, 0), (2, 1)]) == {2: (1, 0.5), 4: (2, 0.5)}


# --- one short real run -----------------------------------------------------------------


@pytest.mark.slow
def test_real_bench_run_on_two_tasks(smol, tmp_path):
    model, tokenizer = smol
    tasks = select_tasks(load_tasks(default_tasks_path()), ["tool_call"], limit=2)
    config = BenchConfig(arms=("baseline", "none", "auto"), max_new_tokens=8)
    result = run_bench(model, tokenizer, tasks, config)
    assert not result.skipped
    assert len(result.runs) == 2 * 3
    for run in result.runs:
        assert "error" not in run, run.get("error")
        assert 1 <= run["new_tokens"] <= 8
        assert run["finish_reason"] in ("stop", "length")
        assert run["agrees"] is True  # greedy: every arm reproduces the baseline's tokens
        assert 0 < run["first_step_seconds"] < run["seconds"]  # the prompt pass is part of the run
        if run["decode_tokens_per_second"] is not None:
            assert run["decode_tokens_per_second"] > run["tokens_per_second"]  # without the prompt pass
    auto = [r for r in result.runs if r["arm"] == "auto"]
    assert all(r["target_forwards"] <= r["new_tokens"] for r in auto)
    paths = report.write_results(result, tmp_path)
    summary = json.loads(paths["json"].read_text())["summary"]
    assert summary["categories"]["tool_call"]["auto"]["speedup"] > 0
    assert Path(paths["speedup_png"]).stat().st_size > 0


@pytest.mark.slow
def test_the_batch_bench_serves_every_task_in_both_arms_with_identical_greedy_outputs(smol):
    from grammarspec.bench.batch import batch_table, run_batch_bench

    model, tokenizer = smol
    tasks = select_tasks(load_tasks(default_tasks_path()), categories=["tool_call"], limit=3)
    runs = run_batch_bench(model, tokenizer, tasks, [1, 2], max_new_tokens=10)
    by = {(r.arm, r.batch_size): r for r in runs}
    assert set(by) == {(arm, size) for arm in ("baseline", "none", "auto") for size in (1, 2)}
    for size in (1, 2):
        base, auto, none = by[("baseline", size)], by[("auto", size)], by[("none", size)]
        assert set(auto.outputs) == {t.id for t in tasks} == set(base.outputs)
        assert auto.outputs == base.outputs == none.outputs  # greedy: the same tokens, row by row
        assert none.drafted == 0 and none.row_passes <= none.tokens  # no drafts: a token a pass (forced: none)
        assert auto.tokens == base.tokens == sum(len(o) for o in auto.outputs.values())
        assert auto.row_passes <= base.row_passes  # speculation never needs more passes than tokens
        assert len(auto.latencies) == len(tasks) and auto.categories["tool_call"][0] == auto.tokens
    table = batch_table(runs)
    assert table.count("\n") == 3 and "3/3" in table


def test_the_batch_table_reads_runs_without_the_baseline_arm_and_counts_agreement_over_the_arms_that_ran():
    from grammarspec.bench.batch import BatchRun, batch_table

    def run(arm: str, size: int, outputs: dict[str, list[int]], seconds: float) -> BatchRun:
        tokens = sum(map(len, outputs.values()))
        return BatchRun(
            arm,
            size,
            seconds=seconds,
            tokens=tokens,
            row_passes=tokens // 2,
            latencies=[seconds],
            outputs=outputs,
            categories={"tool_call": [tokens, seconds]},
            drafted=tokens,
        )

    same, other = {"a": [1, 2, 3, 4], "b": [5, 6]}, {"a": [1, 2, 3, 4], "b": [5, 7]}
    alone = batch_table([run("auto", 1, same, 2.0), run("auto", 4, same, 1.0)])
    rows = alone.splitlines()[2:]
    assert len(rows) == 2 and rows[1].startswith("| 4 | - | - | 6.0 | - | - | 2.00x | 2.00 |")
    assert rows[1].rstrip().endswith("| - | - |")  # no baseline: no category ratio, no agreement to count
    with_none = batch_table([run("auto", 1, same, 2.0), run("none", 1, other, 3.0)])
    assert "| 1 | - | 2.0 | 3.0 | - | 1.50x |" in with_none and with_none.rstrip().endswith("| - | 1/2 |")
