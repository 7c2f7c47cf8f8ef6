"""vLLM's load sweep in the main environment: the interleaving, the jobs and the table, with a canned worker."""

from __future__ import annotations

import pytest

from grammarspec.bench import vllm_load

TASKS = [{"task": "a", "prompt_ids": [1, 2], "schema": None}, {"task": "b", "prompt_ids": [3], "schema": None}]


@pytest.fixture
def fake_python(monkeypatch, tmp_path):
    python = tmp_path / "python"
    python.write_text("")
    monkeypatch.setenv("GRAMMARSPEC_VLLM_PYTHON", str(python))


def test_the_arms_alternate_direction_every_round():
    assert vllm_load.interleaved_order(["x", "y", "z"], 2) == [(0, ["x", "y", "z"]), (1, ["z", "y", "x"])]


def test_each_engine_runs_one_arm_at_one_level_in_a_closed_loop(fake_python, monkeypatch):
    jobs = []
    speed = {"vllm": 2.0, "vllm-grammarspec": 1.0}  # seconds per run

    def worker(python, job):
        jobs.append(job)
        (arm,), (level,) = job["arms"], job["levels"]
        closed = {"seconds": speed[arm], "tokens": 10, "accepted_tokens": 5 if arm != "vllm" else 0,
                  "outputs": {"a": [7], "b": [8 if arm == "vllm" or level == 1 else 9]}}  # fmt: skip
        return {"arms": {arm: {"closed": {str(level): closed}}}, "load_average_at_start": 0.5}

    monkeypatch.setattr(vllm_load, "launch_worker", worker)
    result = vllm_load.run_vllm_load(TASKS, ["vllm", "vllm-grammarspec"], [1, 8], "/m", rounds=2, max_tokens=32)
    assert [(j["levels"][0], j["arms"][0]) for j in jobs] == [
        (1, "vllm"), (1, "vllm-grammarspec"), (1, "vllm-grammarspec"), (1, "vllm"),
        (8, "vllm"), (8, "vllm-grammarspec"), (8, "vllm-grammarspec"), (8, "vllm"),
    ]  # fmt: skip
    assert all(j["modes"] == ["closed"] and j["tasks"] == TASKS and j["max_tokens"] == 32 for j in jobs)
    table = "\n".join(vllm_load.load_markdown(result))
    row = next(line for line in table.splitlines() if line.startswith("| 8 | `vllm-grammarspec`"))
    assert "| 10.0 | 2.00 | **2.00x** (2.00, 2.00) | 2/4 |" in row  # b differs at C=8 in both rounds
    assert "| 1 | `vllm` | 5.0 | 1.00 | 1.00x | 4/4 |" in table


def test_a_failed_engine_is_listed_and_the_others_still_reported(fake_python, monkeypatch):
    def worker(python, job):
        arm = job["arms"][0]
        if arm == "vllm-suffix":
            return {"arms": {arm: {"error": "RuntimeError: needs arctic-inference"}}}
        return {"arms": {arm: {"closed": {"1": {"seconds": 1.0, "tokens": 4, "outputs": {}}}}}}

    monkeypatch.setattr(vllm_load, "launch_worker", worker)
    result = vllm_load.run_vllm_load(TASKS, ["vllm", "vllm-suffix"], [1], "/m", rounds=1)
    table = "\n".join(vllm_load.load_markdown(result))
    assert "| 1 | `vllm-suffix` | failed |" in table and "needs arctic-inference" in table
    assert "| 1 | `vllm` | 4.0 |" in table


def test_the_sweep_needs_the_plain_arm_to_compare_with(fake_python):
    with pytest.raises(ValueError, match="include the vllm arm"):
        vllm_load.run_vllm_load(TASKS, ["vllm-grammarspec"], [1], "/m")
