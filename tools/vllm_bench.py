"""The vLLM arms alone (no Hugging Face arms): inside-vLLM counts and throughput on many tasks.

    python tools/vllm_bench.py [--tasks FILE] [--limit N] [--max-new-tokens 128] [--out DIR]

``grammarspec bench --arms ...,vllm-ngram,vllm-grammarspec`` puts the vLLM arms beside the Hugging Face
ones in one report, but always runs the HF baseline, which takes minutes per task on a loaded CPU.  This
script runs the same vLLM worker on the same prompts (built here, in the main environment) and writes the
vLLM tables (``vllm.md``) and the records (``vllm.json``).  Needs ``.venv-vllm`` (``make vllm-env``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from grammarspec.bench.arms import PreparedTask
from grammarspec.bench.runner import BenchConfig, _prompt_ids
from grammarspec.bench.tasks import default_tasks_path, load_tasks, select_tasks
from grammarspec.bench.vllm_arms import VLLM_ARMS, run_vllm_arms, vllm_markdown
from grammarspec.model.loading import _resolve, load_tokenizer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default=str(default_tasks_path()), metavar="FILE")
    parser.add_argument("--limit", type=int, metavar="N", help="at most N tasks, round-robin over categories")
    parser.add_argument("--categories", metavar="A,B")
    parser.add_argument("--arms", default=",".join(VLLM_ARMS), metavar="A,B")
    parser.add_argument("--max-new-tokens", type=int, default=128, metavar="N")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--out", default="bench-vllm", metavar="DIR")
    args = parser.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in VLLM_ARMS]
    if unknown:
        parser.error(f"unknown vLLM arm(s) {', '.join(unknown)}; choose from {', '.join(VLLM_ARMS)}")
    tokenizer = load_tokenizer(args.model)
    categories = args.categories.split(",") if args.categories else None
    tasks = select_tasks(load_tasks(args.tasks), categories, args.limit)
    prepared = [
        (t, PreparedTask(prompt_ids=_prompt_ids(tokenizer, t), schema=t.schema, xgr_grammar=None)) for t in tasks
    ]
    config = BenchConfig(arms=("baseline", *arms), max_new_tokens=args.max_new_tokens, model=args.model)
    started = time.perf_counter()
    records, throughput = run_vllm_arms(prepared, arms, config, tokenizer, str(_resolve(args.model)))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python tools/vllm_bench.py " + " ".join(argv if argv is not None else sys.argv[1:])
    summary = (
        f"{len(tasks)} tasks, max_new_tokens {args.max_new_tokens}, greedy; wall time "
        f"{(time.perf_counter() - started) / 60:.1f} min; load average {throughput['load_average']}."
    )
    header = [f"Command: `{command}`", "", summary]
    text = "\n".join(header + vllm_markdown(records, throughput)) + "\n"
    (out / "vllm.md").write_text(text, encoding="utf-8")
    (out / "vllm.json").write_text(json.dumps({"runs": records, "throughput": throughput}, default=str) + "\n")
    print(text)
    failures = [r for r in records if "error" in r]
    for r in failures[:5]:
        print(f"failed: {r['task']} / {r['arm']}: {r['error']}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
