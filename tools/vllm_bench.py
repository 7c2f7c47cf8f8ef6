"""The vLLM arms alone (no Hugging Face arms): inside-vLLM counts and throughput on many tasks.

    python tools/vllm_bench.py [--tasks FILE] [--limit N] [--max-new-tokens 128] [--out DIR]
    python tools/vllm_bench.py --levels 1,8,24 --rounds 2 [--arms vllm,vllm-grammarspec] [--out DIR]

``grammarspec bench --arms ...,vllm-ngram,vllm-grammarspec`` puts the vLLM arms beside the Hugging Face
ones in one report, but always runs the HF baseline, which takes minutes per task on a loaded CPU.  This
script runs the same vLLM worker on the same prompts (built here, in the main environment) and writes the
vLLM tables (``vllm.md``) and the records (``vllm.json``).  Needs ``.venv-vllm`` (``make vllm-env``).

``--levels``: instead, the load sweep (:mod:`grammarspec.bench.vllm_load`): closed loops of C requests in
flight over the tasks, every arm at every level, the arms interleaved over ``--rounds``; writes
``vllm-load.md`` and ``vllm-load.json``.
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
    parser.add_argument("--levels", metavar="C,C", help="the load sweep: requests in flight per level")
    parser.add_argument("--rounds", type=int, default=2, metavar="N", help="interleaved rounds of the load sweep")
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
    command = "python tools/vllm_bench.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.levels:
        return _load_sweep(args, arms, prepared, command)
    config = BenchConfig(arms=("baseline", *arms), max_new_tokens=args.max_new_tokens, model=args.model)
    started = time.perf_counter()
    records, throughput = run_vllm_arms(prepared, arms, config, tokenizer, str(_resolve(args.model)))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
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


def _load_sweep(args: argparse.Namespace, arms: list[str], prepared: list, command: str) -> int:
    from grammarspec.bench.vllm_load import load_markdown, run_vllm_load

    try:
        levels = [int(x) for x in args.levels.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--levels: give whole numbers, like 1,8,24 (got {args.levels!r})") from None
    if not levels or min(levels) < 1 or args.rounds < 1:
        raise SystemExit("--levels needs numbers >= 1 and --rounds at least 1")
    tasks = [{"task": t.id, "prompt_ids": list(p.prompt_ids), "schema": p.schema} for t, p in prepared]
    started = time.perf_counter()
    result = run_vllm_load(
        tasks,
        arms,
        levels,
        str(_resolve(args.model)),
        rounds=args.rounds,
        max_tokens=args.max_new_tokens,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    loads = [r["load_average"] for r in result["runs"] if r.get("load_average") is not None]
    summary = (
        f"{len(tasks)} tasks, max_new_tokens {args.max_new_tokens}, greedy, {args.rounds} interleaved rounds; "
        f"wall time {(time.perf_counter() - started) / 60:.1f} min; load average at each engine's start "
        f"{min(loads, default=0):.2f} to {max(loads, default=0):.2f}."
    )
    text = "\n".join([f"Command: `{command}`", "", summary, "", *load_markdown(result)]) + "\n"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vllm-load.md").write_text(text, encoding="utf-8")
    (out / "vllm-load.json").write_text(json.dumps(result) + "\n", encoding="utf-8")
    print(text)
    return 1 if any("error" in r for r in result["runs"]) else 0


if __name__ == "__main__":
    sys.exit(main())
