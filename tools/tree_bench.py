"""Chain versus token-tree verification on task-file tasks, against HF generate + xgrammar's processor.

    .venv/bin/python tools/tree_bench.py --per-category 3 --trees 2x16 --out tree-bench.json
    .venv/bin/python tools/tree_bench.py --per-category 3 --trees 2x16 --temperature 0.7 --top-p 0.95

Arms, interleaved per task (same prompt ids, grammar, settings and seed):
``baseline`` (Hugging Face ``generate`` with ``xgrammar.contrib.hf.LogitsProcessor``,
as in ``grammarspec bench``), ``chain`` (``assistant="auto"``) and ``tree WxS``
(:class:`proposers.tree.TreeProposer` over ``"auto"``, ``W`` branches, ``S``
nodes).  Counts come first: target passes and tokens per pass do not depend
on the machine's load; seconds do (the machine is shared), so they are
reported but only as medians of what one run saw.  Under greedy decoding every
arm must produce the baseline's tokens (checked and reported).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tasks", default=None, help="task file (default: $GRAMMARSPEC_TASKS, else data/tasks/tasks.jsonl)"
    )
    parser.add_argument("--per-category", type=int, default=3, help="first N tasks of each category")
    parser.add_argument("--categories", default=None, help="only these categories (comma-separated)")
    parser.add_argument("--trees", default="2x16", help="tree shapes WxS[xB][s] (s: TreeSizer), comma-separated")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-baseline", action="store_true", help="skip the HF generate arm")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--out", default=None, help="write the runs (with output tokens) to this JSON file")
    args = parser.parse_args(argv)

    import torch

    import grammarspec
    from grammarspec.bench.arms import (
        BaselineGrammars,
        GenerationSettings,
        PreparedTask,
        generate_one,
        prepare_grammars,
        run_arm,
    )
    from grammarspec.bench.runner import _prompt_ids
    from grammarspec.bench.tasks import default_tasks_path, load_tasks
    from grammarspec.engine.decoding import logits_width
    from proposers.presets import resolve_assistant
    from proposers.tree import TreeProposer

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = grammarspec.load_model("smollm2-135m")
    tasks = load_tasks(args.tasks or default_tasks_path())
    wanted = set(args.categories.split(",")) if args.categories else None
    chosen, per = [], defaultdict(int)
    for task in tasks:
        if (wanted is None or task.category in wanted) and per[task.category] < args.per_category:
            chosen.append(task)
            per[task.category] += 1
    shapes = [s for s in args.trees.split(",") if s]
    baseline_grammars = BaselineGrammars(tokenizer, logits_width(model), tokenizer.eos_token_id)
    greedy = args.temperature <= 0
    sampling = (
        {"do_sample": False}
        if greedy
        else {"do_sample": True, "temperature": args.temperature, "top_p": args.top_p, "top_k": 0}
    )
    arms = ([] if args.no_baseline else ["baseline"]) + ["chain"] + [f"tree {s}" for s in shapes]
    runs: list[dict[str, Any]] = []
    for task in chosen:
        prompt = _prompt_ids(tokenizer, task)
        prepared = PreparedTask(prompt, task.schema, prepare_grammars(model, tokenizer, baseline_grammars, task.schema))
        reference: list[int] | None = None
        for arm in arms:
            torch.manual_seed(args.seed)
            generator_seed = args.seed
            if arm == "baseline":
                settings = GenerationSettings(args.max_new_tokens, args.temperature)
                if not greedy and args.top_p < 1.0:  # the bench's baseline has no top-p: call HF generate here
                    result = _baseline_top_p(
                        model, prompt, prepared.xgr_grammar, tokenizer.eos_token_id, args.max_new_tokens, sampling
                    )
                else:
                    result = run_arm("baseline", model, tokenizer, prepared, settings, seed=generator_seed)
                record = {"tokens": result.tokens, "seconds": result.seconds, "passes": len(result.tokens)}
            else:
                if arm == "chain":
                    assistant: Any = "auto"
                else:
                    assistant = TreeProposer.from_shape(resolve_assistant("auto"), arm.split()[1])
                tokens, stats, seconds = generate_one(
                    model, tokenizer, prompt, task.schema, assistant, max_new_tokens=args.max_new_tokens, **sampling
                )
                record = {
                    "tokens": tokens,
                    "seconds": seconds,
                    "passes": stats.target_forwards,
                    "forced": stats.forced_tokens,
                    "rows": sum(p + 1 for p, _ in stats.steps),
                }
            record.update(task=task.id, category=task.category, arm=arm, new_tokens=len(record["tokens"]))
            if reference is None:
                reference = record["tokens"]
            record["agrees"] = record["tokens"] == reference
            runs.append(record)
            print(
                f"{task.id:36s} {arm:10s} {record['new_tokens']:4d} tokens {record['passes']:4d} passes "
                f"{record['new_tokens'] / max(1, record['passes']):5.2f} per pass {record['seconds']:7.1f} s"
                + ("" if record["agrees"] or not greedy else "  DIFFERS"),
                flush=True,
            )
    mode = "greedy" if greedy else f"T={args.temperature}, top-p {args.top_p}, seed {args.seed}"
    print(
        f"\n{mode}, {len(chosen)} tasks, max_new_tokens {args.max_new_tokens}; per category (sums of counts, "
        "median seconds ratio over the baseline)"
    )
    print("| category | arm | tasks | tokens | target passes | tokens per pass | agrees | median speedup (s) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for category in sorted({r["category"] for r in runs}):
        base = {r["task"]: r for r in runs if r["category"] == category and r["arm"] == "baseline"}
        for arm in arms:
            rows = [r for r in runs if r["category"] == category and r["arm"] == arm]
            tokens, passes = sum(r["new_tokens"] for r in rows), sum(r["passes"] for r in rows)
            ratios = [base[r["task"]]["seconds"] / r["seconds"] for r in rows if r["task"] in base]
            speed = f"{statistics.median(ratios):.2f}x" if ratios else "-"
            print(
                f"| {category} | {arm} | {len(rows)} | {tokens} | {passes} | {tokens / max(1, passes):.2f} | "
                f"{sum(r['agrees'] for r in rows)}/{len(rows)} | {speed} |"
            )
    if args.out:
        Path(args.out).write_text(json.dumps({"mode": mode, "runs": runs}, indent=1))
    return 0


def _baseline_top_p(model: Any, prompt: list[int], compiled: Any, eos: int, max_new: int, sampling: dict) -> Any:
    """HF generate + xgrammar's processor with top-p (the bench's own baseline samples without it)."""
    import torch
    from transformers import LogitsProcessorList
    from xgrammar.contrib.hf import LogitsProcessor

    from grammarspec.bench.arms import RunResult

    ids = torch.tensor([prompt])
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            logits_processor=LogitsProcessorList([LogitsProcessor(compiled)]),
            eos_token_id=eos,
            pad_token_id=eos,
            max_new_tokens=max_new,
            **sampling,
        )
    tokens = out[0, len(prompt) :].tolist()
    if eos in tokens:
        tokens = tokens[: tokens.index(eos) + 1]
    return RunResult(tokens=tokens, seconds=time.perf_counter() - t0, finish_reason="stop")


if __name__ == "__main__":
    sys.exit(main())
