"""``grammarspec bench-serve --sweep``: every workload, level and arm runs through the openai client; the
arms' greedy outputs agree; the tables, the step trace and the plots come out.  Toy tokenizer, tiny Llama."""

from __future__ import annotations

import json

import pytest

from grammarspec.bench.sweep import level_summary, run_sweep, sweep_summary, workload, write_sweep
from grammarspec.cli.main import main
from tests.toy import toy_chat_tokenizer, toy_vocab_size
from tests.toy_models import tiny_llama

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}


@pytest.fixture()
def tasks_file(tmp_path):
    path = tmp_path / "tasks.jsonl"
    task = {
        "id": "ex-city",
        "kind": "extraction",
        "system": "reply in json",
        "prompt": "the city is oslo",
        "schema": SCHEMA,
        "reference": {"city": "oslo"},
    }
    path.write_text(json.dumps(task) + "\n", encoding="utf-8")
    return path


def test_workloads_are_the_task_file_with_its_schemas_and_free_prose(tasks_file):
    (body,) = workload("json", tasks_file)
    assert body["response_format"]["json_schema"]["schema"] == SCHEMA
    assert body["messages"][0]["role"] == "system" and body["messages"][-1]["content"] == "the city is oslo"
    prose = workload("prose")
    assert len(prose) >= 8 and all("response_format" not in b for b in prose)
    with pytest.raises(ValueError, match="unknown workload"):
        workload("poems")


def test_a_level_summary_reads_throughput_and_latency():
    records = [{"sent": 0.0, "end": 4.0, "ttft": t, "itl": 0.1, "tokens": 10} for t in (1.0, 2.0, 3.0, 4.0)]
    s = level_summary(records)
    assert s["tok_s"] == 10.0 and s["ttft_median"] == 2.5 and s["ttft_p90"] == 4.0 and s["itl_median"] == 0.1
    assert s["ttft_steady_median"] == 2.5  # no burst: every request is steady


def test_the_steady_ttft_leaves_out_the_requests_that_open_the_level():
    """A closed loop's C clients send at once; the steady TTFT reads the requests sent after them, in send order."""
    burst = [{"sent": 0.0, "end": 9.0, "ttft": 8.0, "itl": 0.1, "tokens": 4} for _ in range(2)]
    later = [{"sent": 9.0 + i, "end": 12.0, "ttft": t, "itl": 0.1, "tokens": 4} for i, t in enumerate((1.0, 2.0, 3.0))]
    s = level_summary(later[::-1] + burst, burst=2)
    assert s["ttft_median"] == 3.0 and s["ttft_steady_median"] == 2.0 and s["ttft_steady_p90"] == 3.0
    assert level_summary(burst, burst=2)["ttft_steady_median"] is None


def test_each_auto_run_is_compared_with_the_none_runs_either_side_of_it():
    def run(arm, position, tok_s):
        summary = {"tok_s": tok_s, "tokens": 1}
        return {
            "workload": "prose",
            "load": "C",
            "level": 8,
            "arm": arm,
            "position": position,
            "summary": summary,
            "outputs": ["x"],
        }

    speeds = [("none", 10.0), ("auto", 11.0), ("none", 12.0), ("auto", 9.0), ("none", 8.0)]  # the machine drifts
    result = {"runs": [run(arm, i, v) for i, (arm, v) in enumerate(speeds)]}
    lines = {line["arm"]: line for line in sweep_summary(result)}
    assert lines["auto"]["pair_ratios"] == pytest.approx([1.0, 0.9])  # 11 / mean(10, 12), 9 / mean(12, 8)
    assert lines["auto"]["pair_mean"] == pytest.approx(0.95)
    assert lines["auto"]["pair_error"] == pytest.approx(0.05)  # stdev 0.0707 of two ratios, over sqrt(2)
    assert lines["none"]["pair_mean"] is None and lines["none"]["pair_error"] is None
    one = {"runs": result["runs"][:3]}  # a single auto run: a ratio, no error to give
    alone = {line["arm"]: line for line in sweep_summary(one)}["auto"]
    assert alone["pair_mean"] == pytest.approx(1.0) and alone["pair_error"] is None
    assert lines["auto"]["tok_s"] == 10.0 and lines["none"]["tok_s"] == 10.0 and lines["none"]["pair_ratios"] == []


def test_a_request_the_server_refuses_is_counted_and_the_level_goes_on():
    """A server's error on one request (vLLM refusing a schema its backend cannot compile) is that request's record,
    not the end of the sweep; losing the server altogether still stops the arm."""
    import httpx
    import openai

    from grammarspec.bench.load import send as _send

    request = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")

    class Refusing:
        def __init__(self, error):
            self.error = error
            self.chat = self
            self.completions = self

        def create(self, **kwargs):
            def stream():
                raise self.error
                yield

            return stream()

    body = {"messages": [{"role": "user", "content": "hi"}]}
    refusal = openai.APIError("The provided JSON schema contains features not supported", request, body=None)
    record = _send(Refusing(refusal), "m", body, "vllm", 8)
    assert record["refused"].startswith("The provided JSON schema") and record["tokens"] == 0
    summary = level_summary([record, {"sent": 0.0, "end": 2.0, "ttft": 0.5, "itl": 0.1, "tokens": 10}])
    assert summary["refused"] == 1 and summary["tokens"] == 10
    with pytest.raises(openai.APIConnectionError):
        _send(Refusing(openai.APIConnectionError(request=request)), "m", body, "vllm", 8)


def test_the_clients_run_in_a_process_of_their_own_and_say_when_it_fails():
    """The load generator is a child process that imports neither torch nor grammarspec (it would compete for the
    server's interpreter lock in the server's process); a server that is not there fails the run by its arm."""
    import subprocess
    import sys

    from grammarspec.bench import load
    from grammarspec.bench.servers import free_port

    probe = "import runpy, sys; runpy.run_path(sys.argv[1]); print(sorted({'torch', 'grammarspec'} & set(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", probe, load.__file__], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"
    body = {"messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(RuntimeError, match="the auto arm's client process failed: .*Connect"):
        load.run_load(free_port(), "m", "auto", [body], concurrency=1, max_tokens=4)
    with pytest.raises(ValueError, match="exactly one of concurrency"):
        load.run_load(1, "m", "auto", [body], concurrency=1, rate=2.0, max_tokens=4)


def test_the_sweep_runs_every_level_and_arm_and_the_greedy_outputs_agree(tasks_file, tmp_path):
    tok = toy_chat_tokenizer()
    model = tiny_llama(toy_vocab_size(tok), seed=3)
    result = run_sweep(
        model,
        tok,
        "tiny",
        workloads=("json", "prose"),
        concurrency=(1, 2),
        rates=(8.0,),
        requests=2,
        rounds=2,
        pairs=2,
        max_tokens=6,
        max_batch_size=2,
        tasks_path=tasks_file,
    )
    runs = result["runs"]
    assert len(runs) == 2 * 3 * 5  # workloads x levels x (none, then auto, none twice)
    assert [(w["level"], w["requests"]) for w in result["level_warmups"]] == [(1, 1), (2, 2), (8.0, 2)] * 2
    for name in ("json", "prose"):  # C=1 is deterministic: none's runs take the same steps, the first too
        steps = [r["summary"]["step_table"]["steps"] for r in runs if r["workload"] == name and r["level"] == 1]
        assert steps[0] == steps[2] == steps[4], steps
    assert [r["arm"] for r in runs[:5]] == ["none", "auto", "none", "auto", "none"]
    for run in runs:
        assert run["summary"]["tokens"] > 0 and run["summary"]["tokens_per_pass"] >= 1.0
        if run["load"] == "C":  # rounds=2: every client sends twice, the second time into a busy batch
            assert run["summary"]["requests"] == max(2, 2 * int(run["level"]))
            assert run["summary"]["ttft_steady_median"] is not None
        assert run["summary"]["step_table"]["steps"] > 0
    learned = [run["summary"]["step_cost"] for run in runs if run["arm"] == "auto"]
    assert learned[-1]["learned"] and learned[-1]["steps"] > learned[0]["steps"] > 0  # the server's own steps
    assert result["step_cost"] == "learned"
    for line in sweep_summary(result):
        assert len(line["pair_ratios"]) == (2 if line["arm"] == "auto" else 0)  # each auto run against its neighbours
        if line["arm"] == "auto" or line["runs"] > 1:
            same, total = line["identical"]
            assert same == total > 0, line  # greedy: every arm writes what none writes
    markdown = write_sweep(result, "grammarspec bench-serve --sweep", tmp_path / "out")
    assert "| json | C=2 | auto |" in markdown and "prefill steps" in markdown and "untimed burst" in markdown
    assert "| prose | rate=8 | auto #" in markdown.split("had learned at the end of each auto run")[1]
    for name in ("sweep.md", "sweep.json", "sweep_throughput.png", "sweep_ttft.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0


def test_the_sweep_refuses_bad_flags(capsys):
    assert main(["bench-serve", "--sweep", "--arms", "none,turbo"]) == 2
    assert "unknown turbo" in capsys.readouterr().err
    assert main(["bench-serve", "--sweep", "--levels", "0,2"]) == 2
    assert "must be > 0" in capsys.readouterr().err
    assert main(["bench-serve", "--sweep", "--levels", "", "--rates", ""]) == 2
    assert "at least one load level" in capsys.readouterr().err
