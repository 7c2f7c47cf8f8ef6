"""Time one ragged step of the batch cache, packed against padded under a 4-D mask.

    .venv/bin/python tools/ragged_step_bench.py                 # 12 decoding rows of 700-1,100 tokens
    .venv/bin/python tools/ragged_step_bench.py --rows 4 --repeats 9

The shape of a busy JSON server's step: ``--rows`` rows whose caches hold 700
to 1,100 tokens (random ids on the embedded model) each feed one token, and
one more row feeds a chunk of ``--chunks`` tokens (a prompt being read, or a
draft being verified).  Each shape runs through
:meth:`grammarspec.kv.batch.BatchKV.forward` both ways, interleaved repeat by repeat:
``packed`` (every row's new tokens as one sequence,
:mod:`grammarspec.kv.packed_attention`) and ``padded`` (every row padded to the
widest, a long chunk folded into extra rows as the decoding loop does); a
step of single tokens takes the padded call either way.  Prints
the median seconds of each and the largest difference of their logits.  Run it
alone on the machine: it measures wall-clock time.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from grammarspec.kv.batch import BatchKV
from grammarspec.model.loading import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=12, help="decoding rows beside the chunk (default: 12)")
    parser.add_argument(
        "--chunks", default="1,4,16,250", help="the last row's chunk sizes to time (default: 1,4,16,250)"
    )
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

    def step(chunk: int, packed: bool, seed: int) -> tuple[float, torch.Tensor]:
        ids = random.Random(seed)
        chunks = [[ids.randrange(vocab)] for _ in range(rows)] + [[ids.randrange(vocab) for _ in range(chunk)]]
        width = -(-chunk // rows) if chunk > rows else None  # the loop's fold: about as wide as the decoding rows
        kv.packed = packed
        start = time.perf_counter()
        logits = kv.forward(chunks, [()] * (rows + 1), width=width)
        seconds = time.perf_counter() - start
        kv.keep([[]] * (rows + 1))
        return seconds, logits

    print(f"{rows} decoding rows of {lengths[0]}-{lengths[rows - 1]} cached tokens, one row feeding a chunk")
    print("| chunk | packed s | padded s | padded / packed | largest logit difference |")
    print("|---:|---:|---:|---:|---:|")
    for chunk in (int(c) for c in args.chunks.split(",")):
        times: dict[bool, list[float]] = {True: [], False: []}
        outputs = {}
        for repeat in range(args.repeats + 1):  # the first repeat warms up and is not counted
            for packed in (True, False):
                seconds, outputs[packed] = step(chunk, packed, repeat)
                if repeat:
                    times[packed].append(seconds)
        packed_s, padded_s = statistics.median(times[True]), statistics.median(times[False])
        difference = float((outputs[True] - outputs[False]).abs().max())
        print(f"| {chunk} | {packed_s:.3f} | {padded_s:.3f} | {padded_s / packed_s:.2f} | {difference:.1e} |")


if __name__ == "__main__":
    main()
