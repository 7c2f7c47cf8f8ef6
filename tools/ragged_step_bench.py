"""Time one ragged step of the batch cache, packed against padded under a 4-D mask.

    .venv/bin/python tools/ragged_step_bench.py                 # 12 decoding rows of 700-1,100 tokens
    .venv/bin/python tools/ragged_step_bench.py --rows 4 --repeats 9
    .venv/bin/python tools/ragged_step_bench.py --drafted 8      # 8 of the rows verify a 6-token draft chain

The shape of a busy JSON server's step: ``--rows`` rows whose caches hold 700
to 1,100 tokens (random ids on the embedded model) each feed one token, and
one more row feeds a chunk of ``--chunks`` tokens (a prompt being read, or a
draft being verified).  Each shape runs through
:meth:`grammarspec.kv.BatchKV.forward` both ways, interleaved repeat by repeat:
``packed`` (every row's new tokens as one sequence,
:mod:`grammarspec.packed_attention`) and ``padded`` (every row padded to the
widest, a long chunk folded into extra rows as the decoding loop does); a
step of single tokens takes the padded call either way.  With ``--drafted N``,
the first N decoding rows feed a chain of ``--draft`` tokens instead of one
(drafts being verified), and the packed step is also timed with every
multi-token row attending on its own (``one by one``) against the short rows'
batched call.  Prints the median seconds of each and the largest difference
of their logits.  Run it alone on the machine: it measures wall-clock time.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from grammarspec import packed_attention
from grammarspec.kv import BatchKV
from grammarspec.loading import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=12, help="decoding rows beside the chunk (default: 12)")
    parser.add_argument(
        "--chunks", default="1,4,16,250", help="the last row's chunk sizes to time (default: 1,4,16,250)"
    )
    parser.add_argument("--drafted", type=int, default=0, help="decoding rows that verify a draft chain (default: 0)")
    parser.add_argument("--draft", type=int, default=6, help="the drafted rows' chain length (default: 6)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    rng = random.Random(0)
    model = load_model("smollm2-135m")[0]
    vocab = int(model.config.vocab_size)
    rows = args.rows
    lengths = [700 + 400 * i // max(rows - 1, 1) for i in range(rows)] + [300]
    kv = BatchKV(model, 0, slots=rows + 1, columns=1200)
    kv.add_rows(rows + 1)
    prompts = [[rng.randrange(vocab) for _ in range(n)] for n in lengths]
    kv.forward(prompts, [()] * (rows + 1), scored=[False] * (rows + 1))
    kv.keep([list(range(n)) for n in lengths])

    drafted = min(args.drafted, rows)
    parents = [tuple(range(-1, args.draft - 2)) if r < drafted else () for r in range(rows)] + [()]

    def step(chunk: int, way: str, seed: int) -> tuple[float, torch.Tensor]:
        ids = random.Random(seed)
        chunks = [[ids.randrange(vocab) for _ in range(1 + len(p))] for p in parents[:rows]]
        chunks.append([ids.randrange(vocab) for _ in range(chunk)])
        width = -(-chunk // rows) if chunk > rows else None  # the loop's fold: about as wide as the decoding rows
        kv.packed = way != "padded"
        packed_attention.SHORT_ROW = 1 if way == "one by one" else short
        start = time.perf_counter()
        logits = kv.forward(chunks, parents, width=width)
        seconds = time.perf_counter() - start
        kv.keep([[]] * (rows + 1))
        return seconds, logits

    short = packed_attention.SHORT_ROW
    ways = ["packed", "padded"] + (["one by one"] if drafted else [])
    print(f"{rows} decoding rows of {lengths[0]}-{lengths[rows - 1]} cached tokens, one row feeding a chunk")
    if drafted:
        print(f"{drafted} of the decoding rows verify a {args.draft}-token draft chain")
    print("| chunk | " + " | ".join(f"{w} s" for w in ways) + " | padded / packed | largest logit difference |")
    print("|---:|" + "---:|" * (len(ways) + 2))
    for chunk in (int(c) for c in args.chunks.split(",")):
        times: dict[str, list[float]] = {way: [] for way in ways}
        outputs = {}
        for repeat in range(args.repeats + 1):  # the first repeat warms up and is not counted
            for way in ways:
                seconds, outputs[way] = step(chunk, way, repeat)
                if repeat:
                    times[way].append(seconds)
        medians = [statistics.median(times[way]) for way in ways]
        difference = max(float((outputs[way] - outputs["packed"]).abs().max()) for way in ways)
        cells = " | ".join(f"{m:.3f}" for m in medians)
        print(f"| {chunk} | {cells} | {medians[1] / medians[0]:.2f} | {difference:.1e} |")
    packed_attention.SHORT_ROW = short


if __name__ == "__main__":
    main()
