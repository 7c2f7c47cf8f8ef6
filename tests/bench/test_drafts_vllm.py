"""The vLLM arms of ``bench-serve --drafts repeat`` in the main environment: no vLLM here, a canned worker answer."""

from __future__ import annotations

import pytest

from grammarspec.bench import drafts_vllm
from grammarspec.bench.drafts import drafts_markdown, repeat_requests, run_drafts_bench
from grammarspec.bench.tasks import BenchTask
from grammarspec.conversation import prompt_ids
from grammarspec.tool_calls import tool_format_for
from grammarspec.vllm.engine import ARM_SPECULATION, arm_environment, speculation, suffix_missing

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def _tasks():
    return [
        BenchTask(id=f"t{i}", category="extraction", prompt=f"Read: a is {i}.", schema=SCHEMA, system="Answer in JSON.")
        for i in range(2)
    ]


def test_each_vllm_arm_has_its_speculation_and_only_noindex_turns_the_index_off():
    assert speculation("vllm") is None
    assert speculation("vllm-suffix") == {"method": "suffix"}  # the anchor at its own draft depth
    assert speculation("vllm-grammarspec", 4) == speculation("vllm-grammarspec-noindex", 4)
    assert speculation("vllm-grammarspec", 4)["model"] == "grammarspec.vllm.GrammarspecProposer"
    assert [arm for arm in ARM_SPECULATION if arm_environment(arm)] == ["vllm-grammarspec-noindex"]
    assert arm_environment("vllm-grammarspec-noindex") == {"GRAMMARSPEC_DRAFT_MEMORY_MB": "0"}
    with pytest.raises(ValueError, match="vllm-suffix"):
        speculation("vllm-eagle")


def test_without_arctic_inference_the_suffix_arm_says_how_to_install_it():
    missing = suffix_missing()  # the main environment has no arctic-inference
    assert missing is not None and "arctic-inference" in missing and "make vllm-suffix" in missing


def test_totals_count_passes_as_tokens_less_accepted_drafts_and_keep_the_stop_token_as_the_server_does():
    runs = [
        {"task": "a", "tokens": [5, 6, 7, 2], "seconds": 1.0, "draft_tokens": 6, "accepted_tokens": 2},
        {"task": "b", "tokens": [9, 9], "seconds": 1.0, "draft_tokens": 0, "accepted_tokens": 0},
    ]
    totals = drafts_vllm.vllm_totals(runs)
    assert (totals["tokens"], totals["passes"], totals["accepted"], totals["proposed"]) == (6, 4, 2, 6)
    assert totals["tokens_per_pass"] == 1.5 and totals["tokens_per_second"] == 3.0
    assert totals["outputs"] == {"a": [5, 6, 7, 2], "b": [9, 9]} and totals["refused"] == {}
    refused = drafts_vllm.vllm_totals([*runs, {"task": "c", "error": "VLLMValidationError: multipleOf"}])
    assert (
        refused["requests"] == 2
        and refused["tokens"] == 6
        and refused["refused"] == {"c": "VLLMValidationError: multipleOf"}
    )


def test_the_worker_gets_the_servers_prompts_in_order_and_each_arm_is_reported(smol_tokenizer, monkeypatch, tmp_path):
    tok = smol_tokenizer
    python = tmp_path / "python"
    python.write_text("")
    monkeypatch.setenv("GRAMMARSPEC_VLLM_PYTHON", str(python))
    requests = repeat_requests(_tasks(), 2, 16)
    jobs = []

    def worker(python_path, job):
        jobs.append(job)
        runs = [
            {
                "task": t["task"],
                "tokens": [11, 12, tok.eos_token_id],
                "seconds": 0.5,
                "accepted_tokens": 1,
                "draft_tokens": 2,
            }
            for t in job["tasks"]
        ]
        return {"arms": {"vllm": {"batch1": runs}, "vllm-suffix": {"error": "RuntimeError: no arctic"}}}

    monkeypatch.setattr(drafts_vllm, "launch_worker", worker)
    out = drafts_vllm.vllm_repeat(tok, requests, ["vllm", "vllm-suffix"], "/models/smol")
    (job,) = jobs
    assert job["modes"] == ["batch1"] and job["model"] == "/models/smol" and job["max_tokens"] == 16
    assert [t["task"] for t in job["tasks"]] == [r["id"] for r in requests]  # the workload's order
    format_ = tool_format_for(tok, "auto")
    assert [t["prompt_ids"] for t in job["tasks"]] == [prompt_ids(tok, r["messages"], None, format_) for r in requests]
    assert out["vllm"]["passes"] == 2 * len(requests) and out["vllm"]["outputs"]["t0#0"] == [11, 12, tok.eos_token_id]
    assert out["vllm-suffix"] == {"error": "RuntimeError: no arctic"}
    with pytest.raises(ValueError, match="unknown vLLM arm on"):
        drafts_vllm.vllm_repeat(tok, requests, ["on"], "/models/smol")


def test_the_report_sets_each_vllm_arm_against_plain_vllm_and_the_servers_outputs():
    plain = {"requests": 2, "tokens": 8, "passes": 8, "tokens_per_pass": 1.0, "tokens_per_second": 10.0,
             "proposed": 0, "accepted": 0, "outputs": {"x#0": [1, 2], "x#1": [3, 4]}}  # fmt: skip
    ours = {**plain, "passes": 4, "tokens_per_pass": 2.0, "tokens_per_second": 15.0, "proposed": 6, "accepted": 4,
            "outputs": {"x#0": [1, 2], "x#1": [3, 5]}}  # fmt: skip
    server = {"records": [{"id": "x#0", "output": [1, 2]}, {"id": "x#1", "output": [3, 4]}]}
    result = {
        "workload": "repeat",
        "concurrency": 1,
        "arms": {
            "on": {
                **server,
                "requests": 2,
                "tokens": 8,
                "passes": 5,
                "tokens_per_pass": 1.6,
                "tokens_per_second": 12.0,
                "proposed": {},
                "accepted": {},
                "index": None,
            }
        },  # fmt: skip
        "identical": (0, 0),
        "vllm": {"vllm": plain, "vllm-grammarspec": ours, "vllm-suffix": {"error": "RuntimeError: no arctic"}},
    }
    text = drafts_markdown(result, "grammarspec bench-serve --drafts repeat")
    row = next(line for line in text.splitlines() if line.startswith("| `vllm-grammarspec`"))
    assert "| 1.50x |" in row and "| 4/6 |" in row and row.endswith("| 1/2 | 1/2 |")
    assert "| vllm-suffix | failed: RuntimeError: no arctic" in text
    assert "outputs identical between the arms" not in text  # one server arm: nothing compared


def test_vllm_arms_replay_the_servers_agent_turns_so_they_need_a_server_arm(smol):
    model, tok = smol
    with pytest.raises(ValueError, match="add a server arm"):
        run_drafts_bench(model, tok, "agent", arms=["vllm"], model_dir="/models/smol")
    with pytest.raises(ValueError, match="model's directory"):
        run_drafts_bench(model, tok, "repeat", arms=["vllm"], tasks=_tasks())
    with pytest.raises(ValueError, match="unknown arm fast"):
        run_drafts_bench(model, tok, "repeat", arms=["fast"], tasks=_tasks())


def test_an_agent_turn_is_replayed_with_the_servers_prompt_and_call_constraint(smol):
    from grammarspec.bench.agent_tasks import SYSTEM, TOOLS
    from grammarspec.serve.engine import Engine
    from grammarspec.serve.protocol import ChatRequest

    model, tok = smol
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Weather in Oslo?"}]
    turns = [
        {"id": "w#0/0", "messages": messages, "tool_choice": "required", "max_tokens": 40, "output": [1]},
        {"id": "w#0/1", "messages": messages, "tool_choice": "auto", "max_tokens": 30, "output": [1]},
        {"id": "w#0/2", "messages": messages, "tool_choice": "none", "max_tokens": 20, "output": [1]},
    ]
    required, auto, text = drafts_vllm.agent_tasks(tok, turns)
    engine = Engine(model, tok, max_batch_size=1)
    try:
        for task, turn in zip((required, auto, text), turns):
            request = ChatRequest(messages=messages, tools=TOOLS, tool_choice=turn["tool_choice"], max_tokens=8)
            job = engine.prepare(request, lambda event: None)
            assert task["prompt_ids"] == list(job.prompt), turn["tool_choice"]  # the server's own prompt
            assert task["max_tokens"] == turn["max_tokens"]
    finally:
        engine.close()
    names = {option["properties"]["name"]["const"] for option in required["schema"]["anyOf"]}
    assert names == {tool["function"]["name"] for tool in TOOLS} and "grammar" not in required
    assert "schema" not in auto and "root ::=" in auto["grammar"]  # a call or text: xgrammar's EBNF
    assert "schema" not in text and "grammar" not in text  # tool_choice "none": free text
