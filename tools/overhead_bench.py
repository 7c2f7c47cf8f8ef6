"""Drafting overhead on a near-free target: what the loop itself costs per target pass.

    .venv/bin/python tools/overhead_bench.py --out bench-overhead                  # B = 1 and 16, the task file
    .venv/bin/python tools/overhead_bench.py --limit 2 --max-new-tokens 8 --batch-sizes 1,2   # a tiny dry run

The target is a 1-layer random Llama (hidden 64) with the embedded
tokenizer's vocabulary, built here (no download): it stands for a small model
on a GPU, where the host is the limit.  Arms, interleaved (the order
alternates from batch to batch): ``baseline`` (Hugging Face
``generate`` with xgrammar's logits processor), grammarspec ``none`` and
``auto``.  The task list is cut, in order, into batches of ``B``; each batch is
one call of each arm, the three calls back to back, so a slow spell of the
machine falls on every arm alike.  The whole run is repeated ``--repeat``
times; the table gives medians over the repeats (and every repeat's ratio).
Reported per arm and ``B``: tokens/s, ms per target pass, and for grammarspec
the seconds of each phase of the step (forced, propose, walk, forward,
verify, commit: ``GenerationStats.phases``, taken from the row that stayed
longest in each call, which took part in every step).
Greedy outputs of the arms are compared row by row (they must be identical).
Grammars are compiled before timing, for every arm, and each arm makes one
untimed warm-up call (the pass cost profile of :mod:`grammarspec.drafting.pass_profile`
is taken there).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import grammarspec  # noqa: E402
from grammarspec.bench.arms import (  # noqa: E402
    BaselineGrammars,
    generate_rows,  # noqa: E402
    prepare_grammars,
)
from grammarspec.bench.batch import _left_pad, _prompt, _run_baseline  # noqa: E402
from grammarspec.bench.tasks import load_tasks  # noqa: E402
from grammarspec.bench.tiny_llama import tiny_llama  # noqa: E402
from grammarspec.engine.decoding import logits_width  # noqa: E402
from grammarspec.model.loading import load_tokenizer  # noqa: E402

ARMS = ("baseline", "none", "auto")
PHASES = ("forced", "propose", "walk", "forward", "verify", "commit")


def tiny_target(vocab_size: int, seed: int = 0) -> torch.nn.Module:
    """The 1-layer random Llama (hidden 64) over ``vocab_size`` tokens."""
    return tiny_llama(
        vocab_size,
        seed,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=8192,
        bos_token_id=1,
        tie_word_embeddings=False,
    )


def run_arm(arm: str, model: Any, tokenizer: Any, chunk: list[Any], eos: int, max_new: int) -> dict[str, Any]:
    """One call of ``arm`` over ``chunk`` (task, prompt ids, baseline grammar) -> its measurements."""
    ids, mask = _left_pad([p for _, p, _ in chunk], eos)
    if arm == "baseline":
        outputs, seconds, passes = _run_baseline(model, ids, mask, [g for _, _, g in chunk], eos, max_new)
        return {"outputs": outputs, "seconds": seconds, "passes": passes, "phases": {}}
    outputs, stats, seconds = generate_rows(
        model,
        tokenizer,
        [p for _, p, _ in chunk],
        [t.schema for t, _, _ in chunk],
        None if arm == "none" else arm,
        pad=eos,
        max_new_tokens=max_new,
        do_sample=False,
    )
    longest = max(stats, key=lambda s: s.target_forwards)
    return {"outputs": outputs, "seconds": seconds, "passes": longest.target_forwards, "phases": dict(longest.phases)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default=None, help="a tasks.jsonl file (default: the bench's task file)")
    parser.add_argument("--limit", type=int, default=None, help="the first N tasks only")
    parser.add_argument("--batch-sizes", default="1,16")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3, help="repeats of the whole run (the table: medians)")
    parser.add_argument("--out", default=None, help="directory for overhead.json and overhead.md")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    sizes = [int(x) for x in args.batch_sizes.split(",")]
    tokenizer = load_tokenizer()
    eos = tokenizer.eos_token_id
    model = tiny_target(len(tokenizer))
    baseline = BaselineGrammars(tokenizer, logits_width(model), eos)
    items = []
    for task in load_tasks(args.tasks)[: args.limit]:
        try:
            items.append((task, _prompt(tokenizer, task), prepare_grammars(model, tokenizer, baseline, task.schema)))
        except grammarspec.GrammarError:
            continue
    results: dict[str, list[dict[str, Any]]] = {}
    for arm in ARMS:  # warm-up, untimed: first calls pay one-off costs (kernels, tables, the pass cost profile)
        run_arm(arm, model, tokenizer, items[:1], eos, 8)
    turn = 0
    for repeat in range(args.repeat):
        for size in sizes:
            totals = {
                arm: {"tokens": 0, "seconds": 0.0, "passes": 0, "phases": dict.fromkeys(PHASES, 0.0), "outputs": []}
                for arm in ARMS
            }
            for first in range(0, len(items), size):
                for arm in ARMS if turn % 2 == 0 else ARMS[::-1]:
                    got = run_arm(arm, model, tokenizer, items[first : first + size], eos, args.max_new_tokens)
                    total = totals[arm]
                    total["tokens"] += sum(map(len, got["outputs"]))
                    total["seconds"] += got["seconds"]
                    total["passes"] += got["passes"]
                    total["outputs"] += got["outputs"]
                    for phase, seconds in got["phases"].items():
                        total["phases"][phase] = total["phases"].get(phase, 0.0) + seconds
                turn += 1
            for arm in ARMS:
                results.setdefault(f"{arm}@{size}", []).append(totals[arm])
            print(
                f"repeat {repeat + 1} B={size}: "
                + ", ".join(f"{arm} {totals[arm]['tokens']} tokens in {totals[arm]['seconds']:.2f}s" for arm in ARMS),
                file=sys.stderr,
            )
    table = overhead_table(results, sizes)
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "overhead.json").write_text(json.dumps(results, indent=1))
        (out / "overhead.md").write_text(table + "\n")
    return 0


def _rate(run: dict[str, Any]) -> float:
    return run["tokens"] / run["seconds"] if run["seconds"] else 0.0


def _per_pass(run: dict[str, Any]) -> float:
    """Milliseconds per target pass."""
    return 1e3 * run["seconds"] / run["passes"] if run["passes"] else 0.0


def _phases(runs: list[dict[str, Any]]) -> str:
    """Each phase's milliseconds per target pass, over all repeats."""
    passes = sum(r["passes"] for r in runs) or 1
    return " / ".join(f"{1e3 * sum(r['phases'].get(p, 0.0) for r in runs) / passes:.2f}" for p in PHASES)


def overhead_table(results: dict[str, list[dict[str, Any]]], sizes: list[int]) -> str:
    """Markdown: medians over the repeats of tokens/s per arm and ms per target pass; phases; identical outputs."""
    lines = [
        "| B | baseline tok/s | none tok/s | auto tok/s | ms/pass none | ms/pass auto | auto / none per pass "
        "| each repeat | none: " + " / ".join(PHASES) + " (ms/pass) | auto: same | identical |",
        "|---:|---:|---:|---:|---:|---:|---:|---|---|---|---:|",
    ]
    for size in sizes:
        r = {arm: results[f"{arm}@{size}"] for arm in ARMS}
        ratios = [_per_pass(a) / _per_pass(n) if _per_pass(n) else 0.0 for a, n in zip(r["auto"], r["none"])]
        same = total = 0
        for base, none, auto in zip(r["baseline"], r["none"], r["auto"]):
            same += sum(a == b == c for a, b, c in zip(base["outputs"], none["outputs"], auto["outputs"]))
            total += len(auto["outputs"])
        rate = {arm: statistics.median([_rate(x) for x in r[arm]]) for arm in ARMS}
        per_pass = {arm: statistics.median([_per_pass(x) for x in r[arm]]) for arm in ("none", "auto")}
        lines.append(
            f"| {size} | {rate['baseline']:.1f} | {rate['none']:.1f} | {rate['auto']:.1f} | "
            f"{per_pass['none']:.2f} | {per_pass['auto']:.2f} | {statistics.median(ratios):.2f}x | "
            f"{', '.join(f'{x:.2f}' for x in ratios)} | {_phases(r['none'])} | {_phases(r['auto'])} | "
            f"{same}/{total} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
