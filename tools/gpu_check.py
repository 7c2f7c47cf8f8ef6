"""GPU check: greedy parity and a small throughput table on a CUDA machine, in a few minutes.

Two steps, because the GPU machine reaches no network and cannot hold the
embedded model's weights (540 MB; 64 MiB travel):

    python tools/gpu_check.py --prepare          # here: SmolLM2's config + tokenizer and the wheels -> .gpu/
    python3 tools/gpu_check.py                    # there (carry .gpu): installs the wheels, runs, prints one table

The model is SmolLM2-135M's architecture with random weights (LM head scaled
so greedy choices are not near-ties), in float32 for the parity rows and
bfloat16 for the throughput rows.  Parity: grammarspec (``assistant="auto"``,
batch 1 and a left-padded batch of 4 with one schema per row) must equal Hugging
Face ``generate`` + xgrammar's HF logits processor token for token.  Throughput:
committed tokens per second over the same requests at batch 1, 4 and 16, both
arms.  ``--device cpu`` runs the same check here (slowly) to test the script.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PREPARED = ROOT / ".gpu"
#: What grammarspec needs beyond the GPU image's torch/transformers/numpy (pip download, Python 3.12, manylinux).
WHEELS = ["xgrammar==0.2.9", "jsonschema", "jsonschema-specifications", "referencing", "rpds-py", "attrs",
          "outlines-core==0.2.14", "llguidance", "gguf", "ninja", "pydantic==2.14.4", "pydantic-core==2.50.5",
          "annotated-types", "typing-inspection", "apache-tvm-ffi==0.1.15.post2"]  # fmt: skip
SCHEMAS = [
    {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
     "required": ["city", "days"], "additionalProperties": False},
    {"type": "array", "items": {"type": "object", "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
                                "required": ["sku", "qty"]}, "maxItems": 4},
    {"type": "object", "properties": {"status": {"enum": ["open", "closed", "pending"]}, "note": {"type": "string"}},
     "required": ["status"]},
    {"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
     "required": ["name", "tags"]},
]  # fmt: skip
PROMPTS = ["Plan 3 days in Lisbon.", "Order: two A-1 and one B-7.", "Ticket 41 was fixed yesterday.",
           "Describe the Rust language with tags."]  # fmt: skip


def prepare() -> None:
    """Here: copy SmolLM2's config and tokenizer files and download the wheels into .gpu/."""
    from grammarspec.loading import (
        cache_dir,
        load_tokenizer,  # noqa: F401 - ensures the model cache exists
    )

    source = next(cache_dir().glob("smollm2-135m-v*"), None)
    if source is None:
        from grammarspec import load_model

        load_model("smollm2-135m")
        source = next(cache_dir().glob("smollm2-135m-v*"))
    model_dir = PREPARED / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                 "chat_template.jinja"):  # fmt: skip
        if (source / name).exists():
            shutil.copy(source / name, model_dir / name)
    platforms = [f"--platform=manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34)] + [
        "--platform=manylinux2014_x86_64"
    ]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(PREPARED / "wheels"),
                    *WHEELS], check=True)  # fmt: skip
    print(f"prepared {PREPARED}: carry '.gpu' and run `python3 tools/gpu_check.py` on the GPU machine")


def install() -> None:
    """There: install the carried wheels into /tmp/site (no network), unless the packages are importable."""
    import importlib.util

    wheels = sorted((PREPARED / "wheels").glob("*.whl"))
    if wheels and importlib.util.find_spec("xgrammar") is None:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--target", "/tmp/site", *map(str, wheels)], check=True)  # fmt: skip
        sys.path.insert(0, "/tmp/site")
    sys.path.insert(0, str(ROOT))


def build_model(device: str, dtype: object) -> object:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig.from_pretrained(PREPARED / "model" if (PREPARED / "model").exists() else None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.copy_(
            model.model.embed_tokens.weight if config.tie_word_embeddings else model.lm_head.weight
        )
        model.lm_head.weight.mul_(30.0)
    return model.to(device=device, dtype=dtype).eval()


def hf_generate(model: object, tokenizer: object, ids: object, mask: object, schemas: list, max_new: int) -> list:
    import torch
    import xgrammar as xgr
    from transformers import LogitsProcessorList
    from xgrammar.contrib.hf import LogitsProcessor

    from grammarspec.decoding import logits_width

    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=logits_width(model),
                                              stop_token_ids=[tokenizer.eos_token_id])  # fmt: skip
    compiler = xgr.GrammarCompiler(info)
    grammars = [
        compiler.compile_json_schema(json.dumps(s), any_whitespace=False, separators=(",", ":")) for s in schemas
    ]
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, logits_processor=LogitsProcessorList([LogitsProcessor(grammars)]),
                             max_new_tokens=max_new, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.eos_token_id)  # fmt: skip
    rows = []
    for row in out[:, ids.shape[1] :].tolist():
        eos = tokenizer.eos_token_id
        rows.append(row[: row.index(eos) + 1] if eos in row else row)
    return rows


def ours(model: object, tokenizer: object, ids: object, mask: object, schemas: list, max_new: int) -> list:
    import grammarspec

    out = grammarspec.generate(model, ids, attention_mask=mask, tokenizer=tokenizer, schema=schemas, assistant="auto",
                               max_new_tokens=max_new, do_sample=False, return_dict_in_generate=True)  # fmt: skip
    return [out.sequences[i, ids.shape[1] :].tolist()[: s.new_tokens] for i, s in enumerate(out.stats)]


def batch_inputs(tokenizer: object, prompts: list[str], device: str) -> tuple[object, object]:
    import torch

    rows = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    width = max(map(len, rows))
    pad = tokenizer.eos_token_id
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
    return ids, mask


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prepare", action="store_true", help="here: fetch what the GPU machine needs into .gpu/")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args(argv)
    if args.prepare:
        prepare()
        return 0
    install()
    import torch
    from transformers import AutoTokenizer

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run on the GPU machine, or pass --device cpu")
        return 2
    tokenizer = AutoTokenizer.from_pretrained(PREPARED / "model")
    rows = []
    model = build_model(args.device, torch.float32)
    for size in (1, 4):
        same = total = 0
        for first in range(0, len(PROMPTS), size):
            prompts, schemas = PROMPTS[first : first + size], SCHEMAS[first : first + size]
            ids, mask = batch_inputs(tokenizer, prompts, args.device)
            reference = [hf_generate(model, tokenizer, *batch_inputs(tokenizer, [p], args.device), [s],
                                     args.max_new_tokens)[0] for p, s in zip(prompts, schemas)]  # fmt: skip
            got = ours(model, tokenizer, ids, mask, schemas, args.max_new_tokens)
            same += sum(a == b for a, b in zip(reference, got))
            total += len(prompts)
        rows.append(f"| parity fp32, batch {size} | {same}/{total} rows identical to HF + xgrammar | |")
    model = build_model(args.device, torch.bfloat16)
    for size in (1, 4, 16):
        prompts = (PROMPTS * 4)[:size]
        schemas = (SCHEMAS * 4)[:size]
        ids, mask = batch_inputs(tokenizer, prompts, args.device)
        rates = {}
        for arm, run in (("hf", hf_generate), ("grammarspec", ours)):
            run(model, tokenizer, ids, mask, schemas, 8)  # warm-up
            if args.device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            outputs = run(model, tokenizer, ids, mask, schemas, args.max_new_tokens)
            if args.device == "cuda":
                torch.cuda.synchronize()
            rates[arm] = sum(map(len, outputs)) / (time.perf_counter() - t0)
        rows.append(f"| throughput bf16, batch {size} | HF {rates['hf']:.0f} tok/s | grammarspec "
                    f"{rates['grammarspec']:.0f} tok/s ({rates['grammarspec'] / rates['hf']:.2f}x) |")  # fmt: skip
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"\n| check ({name}, random SmolLM2-135M weights) | result | |\n|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
