"""The vLLM arms' side in the main environment: no vLLM here, a canned worker answer instead."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from grammarspec.bench.arms import PreparedTask, check_arms
from grammarspec.bench.runner import BenchConfig
from grammarspec.bench.tasks import BenchTask
from grammarspec.bench.vllm_arms import collect, vllm_markdown

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_vllm_arms_need_the_vllm_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("GRAMMARSPEC_VLLM_PYTHON", str(tmp_path / "missing" / "python"))
    with pytest.raises(ValueError, match="make vllm-env"):
        check_arms(["vllm-ngram"], draft_model_given=False)
    assert check_arms(["auto"], draft_model_given=False) == ["baseline", "auto"]  # no vLLM arm: no check
    (tmp_path / "python").write_text("")
    monkeypatch.setenv("GRAMMARSPEC_VLLM_PYTHON", str(tmp_path / "python"))
    assert check_arms(["vllm-grammarspec", "vllm"], draft_model_given=False) == ["baseline", "vllm", "vllm-grammarspec"]


def _run(tokens, seconds, accepted, drafts, draft_tokens):
    return {
        "tokens": tokens,
        "seconds": seconds,
        "first_token_seconds": 0.1,
        "finish_reason": "stop",
        "accepted_tokens": accepted,
        "drafts": drafts,
        "draft_tokens": draft_tokens,
    }


def test_worker_answer_becomes_records_and_tables(smol_tokenizer):
    tok = smol_tokenizer
    body = tok.encode('{"a":1}', add_special_tokens=False) + [tok.eos_token_id]
    tasks = [
        (
            BenchTask(id=f"t{i}", category="extraction", prompt="p", schema=SCHEMA),
            PreparedTask(prompt_ids=[1, 2, 3], schema=SCHEMA, xgr_grammar=None),
        )
        for i in range(2)
    ]
    answer = {
        "vllm": "0.32.0",
        "arms": {
            "vllm-ngram": {
                "batch1": [{"task": "t0", **_run(body, 2.0, 1, 2, 8)}, {"task": "t1", **_run(body, 2.0, 1, 2, 8)}],
                "all": {
                    "seconds": 2.0,
                    "requests": [{"task": "t0", **_run(body, 2, 0, 0, 0)}, {"task": "t1", **_run(body, 2, 0, 0, 0)}],
                    "accepted_tokens": 2,
                    "draft_tokens": 16,
                    "drafts": 4,
                },
            },
            "vllm-grammarspec": {
                "batch1": [{"task": "t0", **_run(body, 1.0, 3, 2, 6)}, {"task": "t1", **_run(body, 1.0, 3, 2, 6)}],
                "all": {
                    "seconds": 1.0,
                    "requests": [{"task": "t0", **_run(body, 1, 0, 0, 0)}, {"task": "t1", **_run(body, 1, 0, 0, 0)}],
                    "accepted_tokens": 6,
                    "draft_tokens": 12,
                    "drafts": 4,
                },
            },
            "vllm": {"error": "RuntimeError: engine died"},
        },
    }
    config = BenchConfig(arms=("baseline", "vllm", "vllm-ngram", "vllm-grammarspec"), max_new_tokens=32)
    records, throughput = collect(answer, tasks, ["vllm", "vllm-ngram", "vllm-grammarspec"], config, tok)
    by = {(r["arm"], r["task"]): r for r in records}
    assert by[("vllm", "t0")]["error"] == "RuntimeError: engine died"
    ours = by[("vllm-grammarspec", "t0")]
    assert ours["new_tokens"] == len(body) and ours["target_forwards"] == len(body) - 3
    assert ours["valid"] and ours["proposed"] == {"vllm-grammarspec": 6} and ours["accepted"] == {"vllm-grammarspec": 3}
    assert throughput["arms"]["vllm-grammarspec"]["tokens_per_second"] == 2 * len(body)
    assert throughput["arms"]["vllm-ngram"]["valid"] == 1.0
    text = "\n".join(vllm_markdown(records, throughput))
    ngram_pass, ours_pass = 1 / (len(body) - 1), 3 / (len(body) - 3)
    assert f"{ours_pass / ngram_pass:.2f}x" in text  # accepted draft tokens per pass, ours over n-gram
    assert "vllm-grammarspec / vllm-ngram throughput: 2.00x" in text
    json.dumps(throughput)  # results.json holds it


def test_a_worker_past_its_time_is_stopped_and_the_arms_it_finished_are_kept(tmp_path):
    from grammarspec.bench.vllm_arms import launch_worker

    worker = tmp_path / "python"  # stands in for .venv-vllm's python: writes one arm's answer, then hangs
    answer = {"arms": {"vllm-grammarspec": {"batch1": []}}}
    pid_file = tmp_path / "engine.pid"  # a child of its own, as vLLM's engine processes are
    worker.write_text(f"#!/bin/sh\necho '{json.dumps(answer)}' > \"$4\"\nsleep 600 &\necho $! > {pid_file}\nwait\n")
    worker.chmod(0o755)
    got = launch_worker(worker, {"arms": ["vllm-grammarspec", "vllm"]}, timeout=10)
    assert got["arms"] == answer["arms"]
    assert "ran past 10 s" in got["failure"]
    engine = Path(f"/proc/{int(pid_file.read_text())}/stat")
    for _ in range(50):  # stopped with the worker, not left running (a zombie not yet reaped counts as stopped)
        if not engine.exists() or engine.read_text().split(")")[-1].split()[0] == "Z":
            break
        time.sleep(0.1)
    else:
        pytest.fail("the worker's child was left running after the worker was stopped")
