"""tools/gpu_check.py: refuses without CUDA; its CPU dry run passes on a tiny model, and fails when an arm is broken."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM

from tests.toy import toy_tokenizer
from tests.toy_models import tiny_llama
from tools import gpu_check


def test_without_cuda_it_says_so(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(["--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().out


def test_chi_square_tells_one_distribution_from_another():
    same_a = Counter({"a": 300, "b": 200, "c": 100})
    same_b = Counter({"a": 290, "b": 210, "c": 100})
    p, dof = gpu_check.chi_square_p(same_a, same_b)
    assert dof == 2 and p > 0.3
    p, _ = gpu_check.chi_square_p(same_a, Counter({"a": 600}))
    assert p < 1e-9


def toy_parts(device: str):
    tok = toy_tokenizer()

    def make(dtype, sliding_window=None, seed=0):
        if sliding_window is None:
            model = tiny_llama(len(tok), seed=4 + seed)
        else:
            torch.manual_seed(4)
            config = MistralConfig(
                vocab_size=len(tok),
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                sliding_window=sliding_window,
                bos_token_id=None,
                eos_token_id=0,
                pad_token_id=1,
                tie_word_embeddings=False,
            )
            model = gpu_check.scale_head(MistralForCausalLM(config), 20.0).eval()
        return model.to(dtype=dtype)

    return tok, make


@pytest.fixture
def toy_run(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_check, "load_parts", toy_parts)
    monkeypatch.setattr(gpu_check, "install", lambda: None)

    def run(*extra):
        code = gpu_check.main(
            [
                "--device",
                "cpu",
                "--out",
                str(tmp_path),
                "--max-new-tokens",
                "14",
                "--samples",
                "150",
                "--throughput-tokens",
                "0",
                "--sweep-levels",
                "",
                "--profile-levels",
                "",
                *extra,
            ]
        )
        return code, json.loads((tmp_path / "gpu_check.json").read_text()), (tmp_path / "gpu_check.md").read_text()

    return run


def test_the_cpu_dry_run_passes_every_check_and_writes_its_report(toy_run):
    code, report, table = toy_run()
    failed = [c for c in report["checks"] if not c["ok"]]
    assert code == 0 and report["ok"] and not failed, failed
    assert len(report["checks"]) == 16 and table.count("| PASS |") == 16
    assert any("slot leaves" in c["detail"] and not c["detail"].endswith("; 0 slot leaves") for c in report["checks"])


@pytest.mark.parametrize("broken", ["parity", "exactness"])
def test_a_broken_arm_makes_the_check_fail(toy_run, broken):
    code, report, table = toy_run("--break", broken)
    assert code == 1 and report["ok"] is False and "| FAIL |" in table
    failed = [c["check"] for c in report["checks"] if not c["ok"]]
    if broken == "exactness":
        assert failed == ["exactness: chi-square against HF sampling (enum schema)"]
    else:
        assert "greedy parity, batch 1" in failed and "greedy parity, bf16 target, batch 4" in failed


def test_a_check_that_raises_fails_alone_and_says_where(toy_run, monkeypatch):
    def broken(*args, **kwargs):
        raise AssertionError("the matcher refused the token")

    monkeypatch.setattr(gpu_check, "trees_against_chains", broken)
    code, report, _ = toy_run()
    failed = [c for c in report["checks"] if not c["ok"]]
    assert code == 1 and [c["check"] for c in failed] == ["trees against chains, greedy, batch 1"]
    assert "raised AssertionError: the matcher refused the token at test_gpu_check.py" in failed[0]["detail"]
    assert len(report["checks"]) == 16  # the checks after it still ran


def test_the_throughput_arm_times_both_arms(monkeypatch):
    tok = toy_tokenizer()
    monkeypatch.setattr(gpu_check, "build_model", lambda device, dtype, **kw: tiny_llama(len(tok), seed=4).to(dtype))
    readings = itertools.count(0.0, 0.5)  # the tool's clock: each reading half a second after the one before
    monkeypatch.setattr(gpu_check, "time", SimpleNamespace(perf_counter=lambda: next(readings)))
    made: dict[str, list[int]] = {"hf_generate": [], "ours": []}  # each call's new tokens, by arm
    for name, arm in list(vars(gpu_check).items()):
        if name in made:

            def counted(*args, _arm=arm, _name=name, **kwargs):
                outputs = _arm(*args, **kwargs)
                made[_name].append(sum(map(len, outputs)))
                return outputs

            monkeypatch.setattr(gpu_check, name, counted)
    rows = gpu_check.throughput(tok, "cpu", 6, (1, 2), "small")
    assert [r["batch"] for r in rows] == [1, 2]
    # per batch each arm runs twice, a warm-up and then the timed run: its tokens over the 0.5 s between two readings
    timed = {name: calls[1::2] for name, calls in made.items()}
    assert [r["hf_tok_s"] for r in rows] == [n / 0.5 for n in timed["hf_generate"]] and all(timed["hf_generate"])
    assert [r["grammarspec_tok_s"] for r in rows] == [n / 0.5 for n in timed["ours"]] and all(timed["ours"])
    assert all(r["speedup"] == r["grammarspec_tok_s"] / r["hf_tok_s"] and r["host_syncs"] is None for r in rows)


def test_the_sweep_serves_a_saved_random_model_on_the_device_and_keeps_its_profile(monkeypatch, tmp_path):
    import subprocess
    from pathlib import Path

    tok = toy_tokenizer()
    prepared = tmp_path / "prepared"
    (prepared / "model").mkdir(parents=True)
    tok.save_pretrained(prepared / "model")
    monkeypatch.setattr(gpu_check, "PREPARED", prepared)
    monkeypatch.setattr(gpu_check, "build_model", lambda device, dtype, **kw: tiny_llama(len(tok), seed=4).to(dtype))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    seen = {}

    def fake_run(command, env, timeout):
        seen.update(command=command, env=env)
        cache = Path(env["GRAMMARSPEC_CACHE"])
        cache.mkdir(parents=True)
        (cache / "pass_cost.json").write_text("{}")
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(gpu_check.subprocess, "run", fake_run)
    result = gpu_check.serve_sweep(tmp_path / "out", "cpu", "1,4", "small", 60.0)
    command = seen["command"]
    assert result["returncode"] == 0 and command[2:5] == ["grammarspec.cli.main", "bench-serve", "--sweep"]
    options = dict(zip(command[5::2], command[6::2]))
    assert options["--device"] == "cpu" and options["--dtype"] == "bfloat16" and options["--levels"] == "1,4"
    from grammarspec import load_model

    model, loaded = load_model(options["--model"], dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16 and len(loaded) == len(tok)
    assert (tmp_path / "out" / "pass_cost.json").exists()  # the server's measured profile, beside the report


def test_the_step_profile_times_plain_and_drafted_steps_inside_the_step(monkeypatch, smol):
    """On the CPU (perf_counter's clock): at each level, plain and drafted runs whose every step has its phases
    timed, the drafted ones drafting and ragged; on the random-weight model and on the trained SmolLM2."""
    model, tok = smol
    monkeypatch.setattr(gpu_check, "build_model", lambda device, dtype, **kw: tiny_llama(len(tok), seed=4).to(dtype))
    monkeypatch.setattr(gpu_check, "trained_model", lambda device: (model, tok))
    profile = gpu_check.profiles(tok, "cpu", (1, 2), 2, 6, "small")
    assert sorted(profile) == ["random small", "trained smollm2-135m"]
    for levels in profile.values():
        assert [level["C"] for level in levels] == [1, 2]
        for level in levels:
            assert level["pairs"] == 2 and len(level["drafted_in_plain_steps"]) == 2
            assert all(r is not None and r > 0 for r in level["drafted_in_plain_steps"])
            plain, drafted = level["plain"], level["drafted"]
            assert plain["steps"] > 0 and drafted["steps"] > 0
            for arm in (plain, drafted):
                assert arm["step_ms"] > 0 and arm["device_ms"]["forward"] > 0 and arm["host_ms"]["forward"] > 0
                assert set(arm["device_ms"]) >= {"forward", "walk", "verify", "commit", "propose"}
                assert arm["host_syncs_per_step"] is None  # counted on CUDA only
            assert plain["drafted_per_step"] == 0 and drafted["drafted_per_step"] > 0
            if level["C"] > 1:
                assert drafted["ragged_steps"] > 0  # rows of different lengths: the packed forward
    table = "\n".join(gpu_check.profile_lines(profile))
    assert table.count("| trained smollm2-135m |") == 4 and table.count("| random small |") == 4


def test_the_step_clock_reads_cuda_events_and_sync_counts(monkeypatch):
    """On CUDA the clock reads each lap's event pair and counts the step's synchronisation warnings (faked here:
    the arithmetic, not the device, is what a CPU can check)."""
    import warnings

    class Event:
        def __init__(self, at):
            self.at = at

        def elapsed_time(self, other):
            return other.at - self.at

    class Phases:
        seconds = {"walk": 0.001, "forward": 0.002}
        events = [("", Event(0.0)), ("walk", Event(1.5)), ("forward", Event(4.0))]

    class Row:
        class stats:
            proposed = {"x": 3}

    class KV:
        last_pass = (2, 4, True)

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    clock = gpu_check.StepClock("cuda")
    clock._current = Phases()
    clock._caught = [warnings.WarningMessage("called a synchronizing CUDA operation", UserWarning, "x", 1)]
    clock.on_step([Row(), Row()], KV())
    (step,) = clock.steps
    assert step["device_ms"] == {"walk": 1.5, "forward": 2.5} and step["host_ms"] == {"walk": 1.0, "forward": 2.0}
    assert step["host_syncs"] == 1 and step["rows"] == 2 and step["ragged"] and clock._caught == []
