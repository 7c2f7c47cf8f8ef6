"""tools/gpu_check.py: refuses without CUDA; its CPU dry run passes on a tiny model, and fails when an arm is broken."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from toy import toy_tokenizer
from toy_models import tiny_llama
from transformers import MistralConfig, MistralForCausalLM

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
    rows = gpu_check.throughput(tok, "cpu", 6, (1, 2), "small")
    assert [r["batch"] for r in rows] == [1, 2]
    assert all(r["hf_tok_s"] > 0 and r["grammarspec_tok_s"] > 0 and r["host_syncs"] is None for r in rows)


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
    assert result["returncode"] == 0 and command[2:5] == ["grammarspec.cli", "bench-serve", "--sweep"]
    options = dict(zip(command[5::2], command[6::2]))
    assert options["--device"] == "cpu" and options["--dtype"] == "bfloat16" and options["--levels"] == "1,4"
    from grammarspec import load_model

    model, loaded = load_model(options["--model"], dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16 and len(loaded) == len(tok)
    assert (tmp_path / "out" / "pass_cost.json").exists()  # the server's measured profile, beside the report
