"""GPU check: parity, exactness and throughput on a CUDA machine; exits non-zero when a check fails.

Two steps, because the GPU machine reaches only package registries (no model hub) and 64 MiB travel:

    python tools/gpu_check.py --prepare          # here: SmolLM2's config + tokenizer and the wheels -> .gpu/
    python3 tools/gpu_check.py                    # there (carry .gpu): installs the wheels, runs, writes $OUT

The one short run on an H100/H200 (about 6-8 minutes; the device tool's ``timeout_s`` 570 leaves room to read
the report)::

    python3 tools/gpu_check.py --max-new-tokens 32 --samples 400 --throughput-tokens 128 --sweep-timeout 150

Models have random weights (LM head scaled so greedy choices are not near-ties), built on the device.
Checks (each a row of the table; any failure makes the exit status 1):

- greedy parity against Hugging Face ``generate`` + xgrammar's HF processor at batch 1 and 4 (one schema
  per row, left-padded), also with a bf16 target, with ``repetition_penalty`` and ``min_new_tokens``,
  with ``max_batch_size`` < B (rows join), with a draft-model assistant, with enough columns that the
  batch's rows leave their KV slots, and on a sliding-window (Mistral) config;
- sampling (``top_p``) with a generator on the device and one on the CPU: every answer valid, the same
  seed the same answers; a draft-model assistant sampled likewise;
- exactness: a chi-square test of grammarspec's sampled answers to a small enum schema against Hugging
  Face's sampled answers (two samples, same settings);
- token trees against chains (greedy, batch 1);
- throughput (not pass/fail): tokens/s of both arms at B = 1, 4, 16 on a ~1B-parameter bf16 model,
  256 new tokens, grammars compiled and both arms warmed up outside the timed region; host
  synchronisations per target pass (``torch.cuda.set_sync_debug_mode``);
- the load sweep (its own report in ``sweep/``, fails only if it cannot run): ``grammarspec bench-serve
  --sweep`` with arms none and auto at ``--sweep-levels`` on that model saved with SmolLM2's tokenizer,
  ``--sweep-pairs`` interleaved none/auto pairs per level, and the pass-cost profile the server measured on
  the device;
- the step profile (not pass/fail; :func:`step_profile`): inside plain and drafted steps at C = 1 / 4 / 16
  (``--profile-levels``), several interleaved plain/drafted runs per level, CUDA-event times of each phase
  (forward, walk -- the grammar masks --, verify -- masks applied, processing, rejection --, commit, propose),
  the host's time per phase, host synchronisations per step and the drafted step's cost in plain steps; on the
  random-weight model and on the trained SmolLM2-135M where its package is installed (its 98 MB GGUF does not
  fit what travels, so on the GPU machine the trained rows appear only where it was installed).  On a CPU the
  times are perf_counter's.

CUDA graphs for the plain decode step are not built: whether they pay is decided by the step profile's launch
figure, the plain step's host forward time (the time to queue its kernels) against its device forward time.
Where they are about equal the GPU waits on kernel launches and a graph of the plain step would pay; where the
device time is well above the host's, the step is bound by the GPU's work and a graph would not.

Writes ``gpu_check.json`` and ``gpu_check.md`` to ``--out`` (default ``$OUT``).  ``--device cpu`` runs
the same checks here (the tests do, with a tiny model); ``--break parity|exactness`` breaks grammarspec's
arm on purpose, to show that the check fails.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PREPARED = ROOT / ".gpu"
#: Where install() puts the carried wheels on the GPU machine.
SITE = "/tmp/site"
#: What grammarspec needs beyond the GPU image's torch/numpy (pip download, Python 3.12, manylinux).
#: transformers is carried too: grammarspec needs >= 5.21 (a 2-D boolean logits_to_keep); images ship older ones.
WHEELS = [
    "transformers==5.24.0",
    "tokenizers",
    "huggingface-hub==2.4.0",
    "httpx2==2.16.2",  # huggingface-hub 2 reaches the hub through httpx2 (the image has httpx only)
    "httpcore2==2.16.2",
    "truststore==0.10.5",
    "safetensors",
    "xgrammar==0.2.9",
    "jsonschema",
    "jsonschema-specifications",
    "referencing",
    "rpds-py",
    "attrs",
    "outlines-core==0.2.14",
    "llguidance",
    "gguf",
    "ninja",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-types",
    "typing-inspection",
    "apache-tvm-ffi==0.1.15.post2",
    # the load sweep's server and client (grammarspec[serve] and openai); the image has httpx, anyio, h11, click
    "openai==3.60.0",
    "jiter==0.19.0",
    "distro==1.9.0",
    "sniffio==1.3.1",
    "starlette==1.10.0",
    "uvicorn==0.55.0",
]
SCHEMAS = [
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
        "additionalProperties": False,
    },
    {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
            "required": ["sku", "qty"],
        },
        "maxItems": 4,
    },
    {
        "type": "object",
        "properties": {"status": {"enum": ["open", "closed", "pending"]}, "note": {"type": "string"}},
        "required": ["status"],
    },
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "tags"],
    },
]
PROMPTS = [
    "Plan 3 days in Lisbon.",
    "Order: two A-1 and one B-7.",
    "Ticket 41 was fixed yesterday.",
    "Describe the Rust language with tags.",
]
ENUM_SCHEMA = {"enum": ["a", "b", "ab", "ba", "aab"]}
#: The step profile's schemas: answers longer than its steps, so every row of a level decodes to the end.
PROFILE_SCHEMAS = [
    {
        "type": "object",
        "properties": {"summary": {"type": "string", "minLength": 400}, "days": {"type": "integer"}},
        "required": ["summary", "days"],
    },
    {"type": "array", "items": {"type": "string", "minLength": 40}, "minItems": 12},
]
#: chi-square p-value below which grammarspec's samples are judged to come from another distribution.
ALPHA = 1e-3


def prepare() -> None:
    """Here: copy SmolLM2's config and tokenizer files and download the wheels into .gpu/."""
    from grammarspec.model.loading import cache_dir

    source = next(cache_dir().glob("smollm2-135m-v*"), None)
    if source is None:
        from grammarspec import load_model

        load_model("smollm2-135m")
        source = next(cache_dir().glob("smollm2-135m-v*"))
    model_dir = PREPARED / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    for name in (
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    ):
        if (source / name).exists():
            shutil.copy(source / name, model_dir / name)
    platforms = [f"--platform=manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34)] + [
        "--platform=manylinux2014_x86_64"
    ]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.12",
            "--implementation",
            "cp",
            *platforms,
            "-d",
            str(PREPARED / "wheels"),
            *WHEELS,
        ],
        check=True,
    )
    print(f"prepared {PREPARED}: carry '.gpu' and run `python3 tools/gpu_check.py` on the GPU machine")


def install() -> None:
    """There: install the carried wheels into /tmp/site (no network) unless grammarspec's needs are met."""
    import importlib.util

    wheels = sorted((PREPARED / "wheels").glob("*.whl"))
    if wheels and importlib.util.find_spec("xgrammar") is None:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-index",
                "--no-deps",
                "--no-compile",
                "--target",
                SITE,
                *map(str, wheels),
            ],
            check=True,
        )
        sys.path.insert(0, SITE)
    sys.path.insert(0, str(ROOT))


# --- models ----------------------------------------------------------------------------------------------------


def build_model(device: str, dtype: Any, *, sliding_window: int | None = None, size: str = "small") -> Any:
    """SmolLM2-135M's architecture (``size="1b"``: ~1.1B parameters) with random weights, built on ``device``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    config = LlamaConfig.from_pretrained(PREPARED / "model") if (PREPARED / "model").exists() else LlamaConfig()
    if size == "1b":
        config.update(
            {
                "hidden_size": 2048,
                "intermediate_size": 5632,
                "num_hidden_layers": 16,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "head_dim": 64,
            }
        )
    torch.manual_seed(0)
    with torch.device(device):
        if sliding_window is not None:
            mistral = MistralConfig(**{k: v for k, v in config.to_dict().items() if k != "model_type"})
            mistral.sliding_window = sliding_window
            model = MistralForCausalLM(mistral)
        else:
            model = LlamaForCausalLM(config)
    return scale_head(model).to(dtype=dtype).eval()


def scale_head(model: Any, factor: float = 30.0) -> Any:
    import torch

    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(factor)
    return model


# --- the two arms ----------------------------------------------------------------------------------------------


def compile_for_hf(tokenizer: Any, model: Any, schemas: list) -> list:
    """xgrammar grammars for the HF arm (compiled once, outside any timed region)."""
    import xgrammar as xgr

    from grammarspec.engine.decoding import logits_width

    info = xgr.TokenizerInfo.from_huggingface(
        tokenizer, vocab_size=logits_width(model), stop_token_ids=[tokenizer.eos_token_id]
    )
    compiler = xgr.GrammarCompiler(info)
    return [compiler.compile_json_schema(json.dumps(s), any_whitespace=False, separators=(",", ":")) for s in schemas]


def hf_generate(
    model: Any,
    tokenizer: Any,
    ids: Any,
    mask: Any,
    schemas: list,
    max_new: int,
    grammars: list | None = None,
    **settings: Any,
) -> list:
    """Hugging Face generate + xgrammar's HF processor; each row's new tokens up to its EOS."""
    from grammarspec.bench.batch import _run_baseline

    grammars = grammars or compile_for_hf(tokenizer, model, schemas)
    return _run_baseline(model, ids, mask, grammars, tokenizer.eos_token_id, max_new, **settings)[0]


#: what --break changes in grammarspec's arm ("parity": every row loses its last token; "exactness": samples).
BROKEN: set[str] = set()


def ours(model: Any, tokenizer: Any, ids: Any, mask: Any, schemas: list, max_new: int, **settings: Any) -> list:
    """grammarspec.generate (``assistant="auto"`` unless given); each row's new tokens."""
    import grammarspec

    settings = {"assistant": "auto", "do_sample": False, **settings}
    out = grammarspec.generate(
        model,
        ids,
        attention_mask=mask,
        tokenizer=tokenizer,
        schema=schemas,
        max_new_tokens=max_new,
        return_dict_in_generate=True,
        **settings,
    )
    rows = [out.sequences[i, ids.shape[1] :].tolist()[: s.new_tokens] for i, s in enumerate(out.stats)]
    if "parity" in BROKEN:
        rows = [row[:-1] for row in rows]
    return rows


def batch_inputs(tokenizer: Any, prompts: list[str], device: str) -> tuple[Any, Any]:
    """Left-padded ``input_ids`` and ``attention_mask`` for ``prompts`` on ``device``."""
    import torch

    rows = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    width = max(map(len, rows))
    pad = tokenizer.eos_token_id
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
    return ids, mask


# --- checks ----------------------------------------------------------------------------------------------------


def check(name: str, ok: bool, detail: str, **extra: Any) -> dict:
    return {"check": name, "ok": bool(ok), "detail": detail, **extra}


def parity(
    name: str, model: Any, tok: Any, device: str, prompts: list, schemas: list, max_new: int, size: int, **settings: Any
) -> dict:
    """grammarspec at batch ``size`` against HF at batch 1, greedy, the same ``settings``."""
    hf_settings = {k: v for k, v in settings.items() if k not in ("assistant", "assistant_model", "max_batch_size")}
    reference = [
        hf_generate(model, tok, *batch_inputs(tok, [p], device), [s], max_new, **hf_settings)[0]
        for p, s in zip(prompts, schemas)
    ]
    got = []
    for first in range(0, len(prompts), size):
        ids, mask = batch_inputs(tok, prompts[first : first + size], device)
        got += ours(model, tok, ids, mask, schemas[first : first + size], max_new, **settings)
    same = sum(a == b for a, b in zip(reference, got))
    return check(
        name, same == len(prompts) and all(reference), f"{same}/{len(prompts)} rows identical to HF + xgrammar"
    )


def valid_answers(tok: Any, rows: list, schemas: list) -> int:
    import jsonschema

    good = 0
    for row, schema in zip(rows, schemas):
        try:
            jsonschema.validate(json.loads(tok.decode(row, skip_special_tokens=True)), schema)
            good += row[-1:] == [tok.eos_token_id]
        except (ValueError, jsonschema.ValidationError):
            pass
    return good


def sampled(name: str, model: Any, tok: Any, device: str, generator_device: str, max_new: int, **settings: Any) -> dict:
    """Sampling with a generator on ``generator_device``: valid answers, and the same seed gives the same ones."""
    import torch

    ids, mask = batch_inputs(tok, PROMPTS, device)
    runs = []
    for _ in range(2):
        gen = torch.Generator(device=generator_device).manual_seed(7)
        runs.append(ours(model, tok, ids, mask, SCHEMAS, max_new, do_sample=True, top_p=0.9, generator=gen, **settings))
    good = valid_answers(tok, runs[0], SCHEMAS)
    ended = sum(row[-1:] == [tok.eos_token_id] for row in runs[0])
    ok = runs[0] == runs[1] and good == ended
    return check(name, ok, f"{good}/{ended} ended answers valid; same seed, same answers: {runs[0] == runs[1]}")


def chi_square_p(a: Counter, b: Counter) -> tuple[float, int]:
    """Two-sample chi-square homogeneity test; ``(p-value, degrees of freedom)``.  Pure.

    Categories seen fewer than 5 times in both samples together are pooled.  The p-value uses the
    Wilson-Hilferty normal approximation of the chi-square tail (no scipy on the GPU image).
    """
    na, nb = sum(a.values()), sum(b.values())
    keys = sorted(set(a) | set(b), key=repr)
    small = [k for k in keys if a[k] + b[k] < 5]
    cells = [(a[k], b[k]) for k in keys if k not in small]
    if small:
        cells.append((sum(a[k] for k in small), sum(b[k] for k in small)))
    stat = 0.0
    for x, y in cells:
        total = x + y
        for observed, n in ((x, na), (y, nb)):
            expected = total * n / (na + nb)
            stat += (observed - expected) ** 2 / expected if expected else 0.0
    dof = max(len(cells) - 1, 1)
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2)), dof


def exactness(model: Any, tok: Any, device: str, samples: int, chunk: int) -> dict:
    """grammarspec's sampled enum answers against Hugging Face's: the same distribution (chi-square)."""
    import torch

    prompt = "Pick one:"
    grammars = compile_for_hf(tok, model, [ENUM_SCHEMA])
    ours_count: Counter = Counter()
    hf_count: Counter = Counter()
    gen = torch.Generator(device=device).manual_seed(11)
    torch.manual_seed(11)
    for first in range(0, samples, chunk):
        n = min(chunk, samples - first)
        ids, mask = batch_inputs(tok, [prompt] * n, device)
        rows = ours(model, tok, ids, mask, [ENUM_SCHEMA] * n, 8, do_sample=True, temperature=1.5, generator=gen)
        if "exactness" in BROKEN:
            rows = [rows[0]] * n  # a broken sampler: always the first answer
        ours_count.update(tok.decode(r, skip_special_tokens=True) for r in rows)
        hf_rows = hf_generate(
            model, tok, ids, mask, [ENUM_SCHEMA] * n, 8, grammars=grammars * n, do_sample=True, temperature=1.5, top_k=0
        )
        hf_count.update(tok.decode(r, skip_special_tokens=True) for r in hf_rows)
    p, dof = chi_square_p(ours_count, hf_count)
    return check(
        "exactness: chi-square against HF sampling (enum schema)",
        p >= ALPHA,
        f"p = {p:.3g} ({dof} dof, {samples} samples per arm)",
        ours=dict(ours_count),
        hf=dict(hf_count),
    )


def trees_against_chains(model: Any, tok: Any, device: str, max_new: int) -> dict:
    from proposers.presets import resolve_assistant
    from proposers.tree import TreeProposer

    same = 0
    for prompt, schema in zip(PROMPTS, SCHEMAS):
        ids, mask = batch_inputs(tok, [prompt], device)
        chain = ours(model, tok, ids, mask, [schema], max_new)
        tree = ours(
            model,
            tok,
            ids,
            mask,
            [schema],
            max_new,
            assistant=TreeProposer(resolve_assistant("auto"), width=4, size=32),
        )
        same += chain == tree
    return check("trees against chains, greedy, batch 1", same == len(PROMPTS), f"{same}/{len(PROMPTS)} rows identical")


def slot_leaves(model: Any, tok: Any, device: str, max_new: int) -> dict:
    """A batch of 4 whose rows finish apart: rows leave their KV slots, and every row is still identical to HF."""
    from grammarspec.kv import batch as kv

    leaves = []
    original = kv.BatchKV.select

    def counting(self: Any, rows: Any) -> Any:
        leaves.append(self.batch_size - len(rows))
        return original(self, rows)

    kv.BatchKV.select = counting  # type: ignore[method-assign]
    try:
        row = parity("greedy parity, batch 4, rows leave their slots", model, tok, device, PROMPTS, SCHEMAS, max_new, 4)
    finally:
        kv.BatchKV.select = original  # type: ignore[method-assign]
    row["ok"] = row["ok"] and sum(leaves) > 0
    row["detail"] += f"; {sum(leaves)} slot leaves"
    return row


def throughput(tok: Any, device: str, new_tokens: int, sizes: tuple[int, ...], size: str) -> list[dict]:
    """Tokens/s of both arms (bf16, random weights), compilation and warm-up outside the timed region."""
    import warnings

    import torch

    import grammarspec

    model = build_model(device, torch.bfloat16, size=size)
    params = sum(p.numel() for p in model.parameters())
    rows = []
    for batch in sizes:
        prompts, schemas = (PROMPTS * 8)[:batch], (SCHEMAS * 8)[:batch]
        ids, mask = batch_inputs(tok, prompts, device)
        grammars = compile_for_hf(tok, model, schemas)
        arms: dict[str, Callable[[int], list]] = {
            "hf": functools.partial(hf_generate, model, tok, ids, mask, schemas, grammars=grammars),
            "grammarspec": functools.partial(ours, model, tok, ids, mask, schemas),
        }
        rates = {}
        for arm, run in arms.items():
            run(8)  # warm-up: kernels, grammarspec's compiled-grammar cache
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            outputs = run(new_tokens)  # only generation is timed: the grammars are compiled above
            if device == "cuda":
                torch.cuda.synchronize()
            rates[arm] = sum(map(len, outputs)) / (time.perf_counter() - t0)
        syncs = passes = None
        if device == "cuda":
            out = None
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    out = grammarspec.generate(
                        model,
                        ids,
                        attention_mask=mask,
                        tokenizer=tok,
                        schema=schemas,
                        assistant="auto",
                        max_new_tokens=64,
                        do_sample=False,
                        return_dict_in_generate=True,
                    )
                finally:
                    torch.cuda.set_sync_debug_mode(0)
            syncs = sum("synchroniz" in str(w.message) for w in caught)
            passes = max(s.target_forwards for s in out.stats)
        rows.append(
            {
                "batch": batch,
                "hf_tok_s": rates["hf"],
                "grammarspec_tok_s": rates["grammarspec"],
                "speedup": rates["grammarspec"] / rates["hf"],
                "host_syncs": syncs,
                "target_passes": passes,
                "parameters": params,
            }
        )
    return rows


# --- inside a step ---------------------------------------------------------------------------------------------


class GrammarWalk:
    """A drafter that needs no model: a chain of ``k`` legal tokens, each the lowest legal non-stop id, offered as a
    tree of one branch (verified whole: the policy cuts none of it, so every drafted step drafts; whether its
    tokens are accepted does not matter to the step profile)."""

    name = "grammar_walk"

    def start(self, request: Any) -> None:
        pass

    def propose_tree(self, context: Any, grammar: Any, k: int) -> Any:
        from proposers.tree import DraftTree

        if grammar is None or k < 1:
            return DraftTree()
        matcher, tokens = grammar.fork(), []
        for _ in range(k):
            allowed = [t for t in matcher.allowed_tokens().tolist() if t not in grammar.stop_token_ids]
            if not allowed or not matcher.accept(allowed[0]):
                break
            tokens.append(allowed[0])
        return DraftTree.from_paths([tokens], sources=[self.name]) if tokens else DraftTree()

    def commit_tree(self, tree: Any, committed: Any) -> None:
        pass

    def propose(self, context: Any, grammar: Any, k: int) -> Any:  # pragma: no cover - the loop asks for trees
        raise AssertionError("the loop asks GrammarWalk for trees")

    def commit(self, draft: Any, num_accepted: int, committed: Any) -> None:  # pragma: no cover
        pass


class StepClock:
    """Times each phase of every step (:class:`grammarspec.engine.step.Phases`' laps: forced, propose, walk, forward,
    verify -- the masks, processing and rejection --, commit) on the device's own clock: CUDA events recorded at
    each lap, read after the step; on a CPU the laps' perf_counter times.  Also the host's time per lap (on a GPU
    the time to queue the work: a forward whose host time is about its device time is bound by kernel launches,
    the figure that decides whether the plain decode step should become a CUDA graph) and, on CUDA, the host
    synchronisations of each step (``torch.cuda.set_sync_debug_mode``)."""

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"
        self.steps: list[dict] = []
        self._current: Any = None
        self._caught: list = []
        self._proposed: dict[int, int] = {}

    def install(self) -> Any:
        """A context that swaps the step's lap timer for one that also records device events."""
        import contextlib
        import warnings

        import torch

        from grammarspec.engine import step as step_module

        clock = self
        base = step_module.Phases

        class EventPhases(base):  # type: ignore[misc,valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:  # the step's clock passes through
                super().__init__(*args, **kwargs)
                self.events: list[tuple[str, Any]] = []
                if clock.cuda:
                    self.events.append(("", torch.cuda.Event(enable_timing=True)))
                    self.events[0][1].record()
                clock._current = self

            def lap(self, name: str) -> None:
                super().lap(name)
                if clock.cuda:
                    event = torch.cuda.Event(enable_timing=True)
                    event.record()
                    self.events.append((name, event))

        @contextlib.contextmanager
        def swapped() -> Any:
            step_module.Phases = EventPhases  # type: ignore[misc]
            try:
                if clock.cuda:
                    with warnings.catch_warnings(record=True) as caught:
                        warnings.simplefilter("always")
                        torch.cuda.set_sync_debug_mode("warn")
                        clock._caught = caught
                        try:
                            yield
                        finally:
                            torch.cuda.set_sync_debug_mode(0)
                else:
                    yield
            finally:
                step_module.Phases = base  # type: ignore[misc]

        return swapped()

    def on_step(self, rows: Any, kv: Any) -> None:
        """The end of a step: its phases' device and host times, its synchronisations, its shape."""
        import torch

        phases = self._current
        if phases is None:
            return
        syncs = None
        if self.cuda:
            syncs = sum("synchroniz" in str(w.message) for w in self._caught)
            self._caught.clear()
            torch.cuda.synchronize()  # after counting: this wait is the clock's, not the step's
            device = {}
            for (_, before), (name, after) in zip(phases.events, phases.events[1:]):
                device[name] = device.get(name, 0.0) + before.elapsed_time(after)
        else:
            device = {name: 1000 * seconds for name, seconds in phases.seconds.items()}
        batch, width, masked = kv.last_pass
        proposed = sum(sum(row.stats.proposed.values()) for row in rows)
        self.steps.append(
            {
                "drafted": proposed - self._proposed.get(id(kv), proposed),
                "device_ms": device,
                "host_ms": {name: 1000 * seconds for name, seconds in phases.seconds.items()},
                "host_syncs": syncs,
                "rows": len(rows),
                "width": width,
                "ragged": masked,
            }
        )
        self._proposed[id(kv)] = proposed
        self._current = None


def step_profile(
    model: Any, tok: Any, device: str, levels: tuple[int, ...], pairs: int, new_tokens: int, k: int = 3
) -> list[dict]:
    """Plain and drafted steps at each concurrency ``C`` of ``levels``, ``pairs`` interleaved plain/drafted runs
    each: ``C`` JSON requests decoded together (answers longer than ``new_tokens``, so the batch stays whole;
    steps with fewer rows are left out), every row of the drafted
    arm drafting ``k`` grammar-legal tokens a step (:class:`GrammarWalk`, the policy on a flat cost so none is
    cut).  Per arm and level: the median step's phases on the device's clock, its host times, host
    synchronisations per step, and the drafted step's cost in plain steps."""
    import statistics

    import torch

    from grammars import compile_grammar, grammar_spec
    from grammarspec.engine.decoding import DecodeConfig, RowRequest, decode_batch, logits_width, sampling_processing
    from grammarspec.policy.adaptive import AdaptiveController

    compiled = [
        compile_grammar(
            grammar_spec(schema=schema), tok, vocab_size=logits_width(model), stop_token_ids=(tok.eos_token_id,)
        )
        for schema in PROFILE_SCHEMAS
    ]
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    config = DecodeConfig(max_new_tokens=new_tokens, eos_token_ids=(tok.eos_token_id,))

    def run(batch: int, drafted: bool) -> list[dict]:
        requests = []
        for i in range(batch):
            proposer = GrammarWalk() if drafted else None
            controller = AdaptiveController(k_min=k, k_max=k, adaptive=False) if drafted else None
            prompt = prompts[i % len(prompts)]
            matcher = compiled[i % len(compiled)].matcher(max_rollback=k + 2)
            processing = sampling_processing(config, (), len(prompt))
            requests.append(RowRequest(prompt, matcher, proposer, controller, processing))
        clock = StepClock(device)
        with clock.install(), torch.inference_mode():
            decode_batch(model, requests, config, on_step=clock.on_step, step_cost=lambda tokens: 1.0)
        return [s for s in clock.steps[1:] if s["rows"] == batch]  # the first step reads the prompts

    def summary(steps: list[dict]) -> dict:
        names = sorted({name for s in steps for name in s["device_ms"]})
        total = [sum(s["device_ms"].values()) for s in steps]
        syncs = [s["host_syncs"] for s in steps if s["host_syncs"] is not None]
        return {
            "steps": len(steps),
            "step_ms": statistics.median(total) if total else None,
            "device_ms": {n: statistics.median(s["device_ms"].get(n, 0.0) for s in steps) for n in names},
            "host_ms": {n: statistics.median(s["host_ms"].get(n, 0.0) for s in steps) for n in names},
            "host_syncs_per_step": statistics.mean(syncs) if syncs else None,
            "ragged_steps": sum(s["ragged"] for s in steps),
            "drafted_per_step": statistics.mean(s["drafted"] for s in steps) if steps else 0.0,
        }

    run(min(levels), True)  # warm-up: kernels, the grammars' caches
    out = []
    for batch in levels:
        arms: dict[str, list[dict]] = {"plain": [], "drafted": []}
        ratios = []
        for _ in range(pairs):
            for arm in ("plain", "drafted"):
                arms[arm].append(summary(run(batch, arm == "drafted")))
            plain, drafted = arms["plain"][-1]["step_ms"], arms["drafted"][-1]["step_ms"]
            ratios.append(drafted / plain if plain and drafted else None)
        row = {"C": batch, "pairs": pairs, "drafted_in_plain_steps": ratios}
        for arm, runs in arms.items():
            row[arm] = runs[len(runs) // 2] if runs else None  # the middle run (one per pair)
        out.append(row)
    return out


# --- the load sweep --------------------------------------------------------------------------------------------


def save_random_model(directory: Path, device: str, size: str) -> Path:
    """A random-weight model (:func:`build_model`, bf16) saved with SmolLM2's tokenizer and chat template, so
    that ``grammarspec serve`` and ``bench-serve`` load it like any local model directory."""
    import torch

    model = build_model(device, torch.bfloat16, size=size)
    model.save_pretrained(directory)
    for source in (PREPARED / "model").iterdir():
        if source.name not in ("config.json", "generation_config.json"):
            shutil.copy(source, directory / source.name)
    return directory


def serve_sweep(
    out: Path, device: str, levels: str, size: str, timeout: float, *, workloads: str = "json,prose", pairs: int = 1
) -> dict:
    """``grammarspec bench-serve --sweep`` (arms none and auto, json and prose) on ``device`` in bf16 with a
    random-weight model; its report, plots and the pass profile the server measured go to ``out``.

    Random weights: acceptance on prose says nothing about a trained model's; what the run shows is the
    server and the drafting policy on this device's pass-cost curve (the profile beside the report).
    """
    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / "grammarspec-sweep"
    model_dir = save_random_model(work / "model", device, size)
    env = dict(os.environ)
    env["GRAMMARSPEC_CACHE"] = str(work / "cache")  # a fresh profile for this device, kept beside the report
    carried = [SITE] if Path(SITE).is_dir() else []  # the wheels install() put there
    env["PYTHONPATH"] = os.pathsep.join([*carried, str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    command = [
        sys.executable,
        "-m",
        "grammarspec.cli.main",
        "bench-serve",
        "--sweep",
        "--model",
        str(model_dir),
        "--device",
        device,
        "--dtype",
        "bfloat16",
        "--workloads",
        workloads,
        "--levels",
        levels,
        "--pairs",
        str(pairs),
        "--out",
        str(out),
    ]
    print("$", " ".join(command), flush=True)
    try:
        code = subprocess.run(command, env=env, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        code = -1
        print(f"the sweep ran past {timeout:.0f}s and was stopped", flush=True)
    profile = work / "cache" / "pass_cost.json"
    if profile.exists():
        shutil.copy(profile, out / "pass_cost.json")
    return {"returncode": code, "command": command, "out": str(out)}


# --- the run ---------------------------------------------------------------------------------------------------


def run_checks(
    make_model: Callable[..., Any], tok: Any, device: str, max_new: int, samples: int, draft: Any | None = None
) -> list[dict]:
    """Every pass/fail check; ``make_model(dtype, sliding_window=None)`` builds a target on ``device``.

    A check that raises is a failed row naming the exception and where it came from; the rest still run.
    """
    import torch

    model = make_model(torch.float32)
    draft = draft if draft is not None else make_model(torch.float32, seed=1)
    parity_cases: list[tuple[str, int, dict[str, Any]]] = [  # (name, batch, generate's extra settings)
        ("greedy parity, batch 1", 1, {}),
        ("greedy parity, batch 4", 4, {}),
        ("greedy parity, batch 4, max_batch_size 2 (rows join)", 4, {"max_batch_size": 2}),
        ("greedy parity, batch 4, repetition_penalty 1.3", 4, {"repetition_penalty": 1.3}),
        # a JSON grammar allows EOS only once the value is complete, where it is the only token allowed: a
        # min_new_tokens past that leaves HF + xgrammar's processor no token (it asserts; grammarspec ends the
        # answer), so the case stays below every answer's length ("[]" may be one token) and checks pass-through
        ("greedy parity, batch 4, min_new_tokens 1", 4, {"min_new_tokens": 1}),
        ("greedy parity, draft-model assistant, batch 1", 1, {"assistant_model": draft}),
    ]
    checks: list[tuple[str, Callable[[], dict]]] = [
        ("xgrammar's bitmask kernel on the device against its CPU one", lambda: bitmask_kernel(device)),
        *(
            (name, functools.partial(parity, name, model, tok, device, PROMPTS, SCHEMAS, max_new, batch, **extra))
            for name, batch, extra in parity_cases
        ),
        ("greedy parity, batch 4, rows leave their slots", lambda: slot_leaves(model, tok, device, 4 * max_new)),
        ("trees against chains, greedy, batch 1", lambda: trees_against_chains(model, tok, device, max_new)),
    ]
    for name, generator_device, extra in (
        (f"sampling, top_p 0.9, {device} generator", device, {}),
        ("sampling, top_p 0.9, cpu generator", "cpu", {}),
        (f"sampling, draft-model assistant, {device} generator", device, {"assistant_model": draft}),
    ):
        checks.append((name, functools.partial(sampled, name, model, tok, device, generator_device, max_new, **extra)))
    checks.append(
        (
            "exactness: chi-square against HF sampling (enum schema)",
            lambda: exactness(model, tok, device, samples, min(samples, 100)),
        )
    )
    rows = [guarded(name, run) for name, run in checks]
    bf16 = make_model(torch.bfloat16)
    sliding = make_model(torch.float32, sliding_window=16)
    for name, target, new, batch in (
        ("greedy parity, bf16 target, batch 4", bf16, max_new, 4),
        ("greedy parity, sliding window 16, batch 1", sliding, 2 * max_new, 1),
        ("greedy parity, sliding window 16, batch 4", sliding, 2 * max_new, 4),
    ):
        rows.append(guarded(name, functools.partial(parity, name, target, tok, device, PROMPTS, SCHEMAS, new, batch)))
    return rows


def guarded(name: str, run: Callable[[], dict]) -> dict:
    """``run()``, or a failed check saying what it raised and where (the innermost frames)."""
    import traceback

    try:
        return run()
    except Exception as e:  # noqa: BLE001 - a check that raises is a failed check, and the others still run
        frames = traceback.extract_tb(e.__traceback__)[-3:]
        where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames))
        print(f"{name}: raised\n{traceback.format_exc()}", flush=True)
        return check(name, False, f"raised {type(e).__name__}: {str(e)[:200]} at {where}")


def bitmask_kernel(device: str) -> dict:
    """xgrammar's bitmask applied on ``device`` (Triton on CUDA) against its CPU implementation: the same
    float32 and bf16 logits, a vocabulary that ends inside a 32-bit word, all rows and an ``indices`` subset."""
    import torch
    import xgrammar as xgr

    generator = torch.Generator().manual_seed(0)
    vocab = 49152 + 7
    bitmask = torch.randint(-(2**31), 2**31 - 1, (8, (vocab + 31) // 32), generator=generator, dtype=torch.int32)
    cases = []
    for dtype in (torch.float32, torch.bfloat16):
        logits = torch.randn(8, vocab, generator=generator).to(dtype)
        for indices in (None, [1, 5]):
            want = logits.clone()
            xgr.apply_token_bitmask_inplace(want, bitmask, vocab_size=vocab, indices=indices)
            got = logits.to(device)
            xgr.apply_token_bitmask_inplace(got, bitmask.to(device), vocab_size=vocab, indices=indices)
            cases.append(torch.equal(got.cpu(), want))
    return check(
        "xgrammar's bitmask kernel on the device against its CPU one",
        all(cases),
        f"{sum(cases)}/{len(cases)} cases equal (float32, bf16; all rows, indices)",
    )


def trained_model(device: str) -> tuple[Any, Any] | None:
    """The embedded SmolLM2-135M-Instruct (trained weights, no download) on ``device``, or ``None`` where its
    package is not installed (its GGUF is larger than what travels to the GPU machine unless installed there)."""
    from grammarspec.model.loading import ModelNotFoundError, load_model

    try:
        return load_model("smollm2-135m", dtype="bfloat16" if device == "cuda" else "float32", device=device)
    except (ModelNotFoundError, ImportError) as e:
        print(f"the trained workload is left out: {e}", flush=True)
        return None


def profiles(
    tok: Any, device: str, levels: tuple[int, ...], pairs: int, new_tokens: int, size: str
) -> dict[str, list[dict]]:
    """:func:`step_profile` on the random-weight model of ``size`` (bf16 on CUDA) and on the trained SmolLM2."""
    import torch

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    out = {
        f"random {size}": step_profile(build_model(device, dtype, size=size), tok, device, levels, pairs, new_tokens)
    }
    trained = trained_model(device)
    if trained is not None:
        out["trained smollm2-135m"] = step_profile(trained[0], trained[1], device, levels, pairs, new_tokens)
    return out


def profile_lines(profile: dict[str, list[dict]]) -> list[str]:
    """The step profile as a markdown table: per model, level and arm, the median step and its phases."""
    lines = [
        "",
        "| step profile (device clock, median step, ms) | C | arm | step | forward | walk | verify | commit | "
        "propose | host forward | host syncs / step | drafted / step | drafted step in plain steps |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model, levels in profile.items():
        for level in levels:
            for arm in ("plain", "drafted"):
                row = level[arm]
                if not row or row["step_ms"] is None:
                    continue
                phase = row["device_ms"]
                ratios = [f"{r:.2f}" for r in level["drafted_in_plain_steps"] if r is not None]
                lines.append(
                    f"| {model} | {level['C']} | {arm} | {row['step_ms']:.2f} | {phase.get('forward', 0):.2f} | "
                    f"{phase.get('walk', 0):.2f} | {phase.get('verify', 0):.2f} | {phase.get('commit', 0):.2f} | "
                    f"{phase.get('propose', 0):.2f} | {row['host_ms'].get('forward', 0):.2f} | "
                    f"{row['host_syncs_per_step']} | {row['drafted_per_step']:.1f} | "
                    f"{', '.join(ratios) if arm == 'drafted' else ''} |"
                )
    return lines


def write_report(
    out: Path, device_name: str, checks: list[dict], speed: list[dict], profile: dict[str, list[dict]] | None = None
) -> str:
    """``gpu_check.json`` and ``gpu_check.md`` in ``out``; returns the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    ok = all(c["ok"] for c in checks)
    report = {"device": device_name, "ok": ok, "checks": checks, "throughput": speed, "step_profile": profile or {}}
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    lines = [f"| check ({device_name}, random weights) | result | |", "|---|---|---|"]
    lines += [f"| {c['check']} | {'PASS' if c['ok'] else 'FAIL'} | {c['detail']} |" for c in checks]
    if speed:
        lines += [
            "",
            f"| throughput (bf16, {speed[0]['parameters'] / 1e9:.2f}B parameters) | HF + xgrammar tok/s | "
            "grammarspec tok/s | speedup | host syncs / target passes |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| batch {s['batch']} | {s['hf_tok_s']:.0f} | {s['grammarspec_tok_s']:.0f} | {s['speedup']:.2f}x | "
            f"{s['host_syncs']} / {s['target_passes']} |"
            for s in speed
        ]
    if profile:
        lines += profile_lines(profile)
    text = "\n".join(lines) + "\n"
    (out / "gpu_check.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--prepare", action="store_true", help="here: fetch what the GPU machine needs into .gpu/")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-check-out"), help="where the report goes")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="per parity row")
    parser.add_argument("--samples", type=int, default=600, help="per arm, for the chi-square test")
    parser.add_argument("--throughput-tokens", type=int, default=256, help="new tokens per timed row (0: skip)")
    parser.add_argument("--throughput-model", default="1b", choices=["1b", "small"])
    parser.add_argument("--no-checks", action="store_true", help="skip the pass/fail checks")
    parser.add_argument(
        "--sweep-levels",
        default="1,4,16",
        metavar="C,C",
        help="the load sweep's concurrencies (bench-serve --sweep on the --throughput-model, bf16; '' skips it)",
    )
    parser.add_argument("--sweep-workloads", default="json,prose", metavar="A,B", help="the sweep's workloads")
    parser.add_argument("--sweep-pairs", type=int, default=3, metavar="P", help="the sweep's auto/none pairs")
    parser.add_argument("--sweep-timeout", type=float, default=240.0, metavar="S", help="stop the sweep after S s")
    parser.add_argument(
        "--profile-levels", default="1,4,16", metavar="C,C", help="the step profile's concurrencies ('' skips it)"
    )
    parser.add_argument("--profile-pairs", type=int, default=3, metavar="P", help="plain/drafted runs per level")
    parser.add_argument("--profile-tokens", type=int, default=32, metavar="N", help="new tokens per profiled row")
    parser.add_argument(
        "--break",
        dest="broken",
        action="append",
        default=[],
        choices=["parity", "exactness"],
        help="break grammarspec's arm on purpose (the check must then fail)",
    )
    args = parser.parse_args(argv)
    if args.prepare:
        prepare()
        return 0
    install()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run on the GPU machine, or pass --device cpu")
        return 2
    BROKEN.clear()
    BROKEN.update(args.broken)
    tok, make_model = load_parts(args.device)
    sweep = None
    if args.sweep_levels.strip():
        sweep = serve_sweep(
            Path(args.out) / "sweep",
            args.device,
            args.sweep_levels,
            args.throughput_model,
            args.sweep_timeout,
            workloads=args.sweep_workloads,
            pairs=args.sweep_pairs,
        )
    profile = None
    if args.profile_levels.strip():
        levels = tuple(int(c) for c in args.profile_levels.split(","))
        profile = profiles(tok, args.device, levels, args.profile_pairs, args.profile_tokens, args.throughput_model)
    checks = [] if args.no_checks else run_checks(make_model, tok, args.device, args.max_new_tokens, args.samples)
    speed = []
    if args.throughput_tokens > 0:
        speed = throughput(tok, args.device, args.throughput_tokens, (1, 4, 16), args.throughput_model)
    name = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    if checks or speed or profile:
        print(write_report(Path(args.out), name, checks, speed, profile))
    failed = [c["check"] for c in checks if not c["ok"]]
    if sweep is not None and sweep["returncode"] != 0:
        failed.append(f"load sweep (exit {sweep['returncode']})")
    if failed:
        print(f"FAILED: {'; '.join(failed)}")
        return 1
    return 0


def load_parts(device: str) -> tuple[Any, Callable[..., Any]]:
    """The tokenizer and a model factory ``(dtype, sliding_window=None, seed=0) -> model`` (tests replace this)."""
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(PREPARED / "model")

    def make(dtype: Any, sliding_window: int | None = None, seed: int = 0) -> Any:
        model = build_model(device, dtype, sliding_window=sliding_window)
        if seed:
            torch.manual_seed(seed)
            model = build_model(device, dtype, sliding_window=sliding_window)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.01 * torch.randn_like(p))
        return model

    return tok, make


if __name__ == "__main__":
    sys.exit(main())
