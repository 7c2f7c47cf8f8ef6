"""Free prose in one static batch: ``grammarspec.generate`` with each assistant, by batch size.

    .venv/bin/python tools/prose_batch.py                          # B = 4, 8, 16; none and auto; 2 repeats
    .venv/bin/python tools/prose_batch.py --batch-sizes 16 --max-new-tokens 96

Every row is one of the load sweep's prose prompts (no schema; nothing in the
prompt predicts the answer), the batch is left-padded as a Hugging Face user
passes it, and the call returns when its last row ends.  For each batch size
and arm it prints the wall seconds of each repeat, the target passes of the
longest row, the passes in which some row verified a draft, and the draft
tokens the rows proposed and had accepted, so a loss can be told from its
cause: a static batch ends with its slowest row, and tokens accepted on the
other rows shorten no pass of the call.  Arms run alternately,
repeat by repeat; run it alone on the machine (it measures wall-clock time).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grammarspec  # noqa: E402
from grammarspec.bench.sweep import PROSE_PROMPTS  # noqa: E402


def batch_inputs(tokenizer: Any, batch_size: int) -> dict[str, Any]:
    """``input_ids`` and ``attention_mask`` of ``batch_size`` prose chats, left-padded (the prompts cycle)."""
    chats = [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
        for p in PROSE_PROMPTS
    ]
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        encoded = tokenizer([chats[i % len(chats)] for i in range(batch_size)], return_tensors="pt", padding=True)
    finally:
        tokenizer.padding_side = side
    return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}


def run(model: Any, tokenizer: Any, batch_size: int, arm: str, max_new_tokens: int) -> dict[str, float]:
    """One static batch through ``grammarspec.generate``: wall seconds, passes, tokens proposed and accepted."""
    inputs = batch_inputs(tokenizer, batch_size)
    start = time.perf_counter()
    out = grammarspec.generate(
        model,
        inputs["input_ids"],
        attention_mask=inputs["attention_mask"],
        tokenizer=tokenizer,
        assistant=arm,
        max_new_tokens=max_new_tokens,
        return_dict_in_generate=True,
    )
    seconds = time.perf_counter() - start
    stats = out.stats
    longest = max(len(s.steps) for s in stats)  # the rows start together: a row's i-th pass is the batch's
    drafted = sum(1 for i in range(longest) if any(i < len(s.steps) and s.steps[i][0] for s in stats))
    return {
        "seconds": seconds,
        "passes": max(s.target_forwards for s in stats),
        "drafted": drafted,
        "proposed": sum(sum(s.proposed.values()) for s in stats),
        "accepted": sum(sum(s.accepted.values()) for s in stats),
        "tokens": sum(s.new_tokens for s in stats),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="an embedded model or a local model directory")
    parser.add_argument("--batch-sizes", default="4,8,16", help="comma-separated rows a batch")
    parser.add_argument("--arms", default="none,auto", help="comma-separated assistants (the first is the baseline)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(argv)
    sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if not sizes or min(sizes) < 1 or args.max_new_tokens < 1 or args.repeat < 1:
        parser.error("--batch-sizes, --max-new-tokens and --repeat need positive numbers")
    if not arms:
        parser.error("--arms needs at least one assistant")
    model, tokenizer = grammarspec.load_model(args.model)
    run(model, tokenizer, 2, arms[-1], 8)  # warm: the pass profile, the kernels' first calls
    print(f"prose, static batches, max_new_tokens {args.max_new_tokens}, {args.repeat} repeat(s), arms alternate")
    columns = ["B", "arm", "seconds (each repeat)", "x first arm", "passes", "passes drafting"]
    print("| " + " | ".join(columns + ["draft tokens proposed / accepted"]) + " |")
    print("|---|---|---|---|---|---|---|")
    for size in sizes:
        results: dict[str, list[dict[str, float]]] = {arm: [] for arm in arms}
        for _ in range(args.repeat):
            for arm in arms:
                results[arm].append(run(model, tokenizer, size, arm, args.max_new_tokens))
        base = sum(r["seconds"] for r in results[arms[0]])
        for arm in arms:
            rs = results[arm]
            each = ", ".join(f"{r['seconds']:.2f}" for r in rs)
            last = rs[-1]
            ratio = base / sum(r["seconds"] for r in rs)
            print(
                f"| {size} | {arm} | {each} | {ratio:.2f}x | {last['passes']:.0f} | {last['drafted']:.0f} | "
                f"{last['proposed']:.0f} / {last['accepted']:.0f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
