"""What one row's forward costs by width on this machine: the curve a lone request's drafts are priced on.

Times :meth:`grammarspec.kv.batch.BatchKV.forward` of one row feeding a chain of
``w`` tokens (its pending token and ``w - 1`` draft tokens) after a prompt of
``--context`` tokens, the way the decoding loop calls it, and prints the
median milliseconds per width beside the ratio to a 1-token forward.  On a
CPU the ratio climbs steeply from 1 to about 8 tokens (the matrix kernels
change shape), which is what bounds a lone request's speedup there; on a GPU
it stays near 1.

``--rows B`` times a step of ``B`` rows instead, at ragged contexts around
``--context`` (the shape of a busy server's step): every row feeding its one
pending token (the plain step), against the same step with ``d`` rows drafting
``w - 1`` tokens each (the ragged pass a drafted step takes).  That is what a
draft slot costs beside other rows.

    python tools/width_cost.py --context 600 --widths 1,2,4,7,16,32
    python tools/width_cost.py --context 200 --rows 8
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from grammarspec.engine.decoding import logits_width  # noqa: E402
from grammarspec.kv.batch import BatchKV  # noqa: E402
from grammarspec.model.loading import load_model  # noqa: E402


def width_costs(model: torch.nn.Module, context: int, widths: list[int], repeats: int = 5) -> dict[int, float]:
    """Median seconds of a 1-row forward of each width after ``context`` cached tokens.  Changes nothing kept."""
    generator = torch.Generator().manual_seed(0)
    vocab = logits_width(model)
    low = min(100, vocab // 2)  # ordinary tokens, clear of the special ones at the start
    prompt = torch.randint(low, vocab, (context,), generator=generator).tolist()
    kv = BatchKV(model, 1, columns=context + max(widths) + 1)
    kv.forward([prompt], [()])
    kv.keep([list(range(context))])
    out = {}
    for width in widths:
        times = []
        for _ in range(repeats):
            tokens = torch.randint(low, vocab, (width,), generator=generator).tolist()
            start = time.perf_counter()
            kv.forward([tokens], [tuple(range(-1, width - 2))])
            times.append(time.perf_counter() - start)
            kv.keep([[0]])  # keep the pending token only: the context stays about the same
        out[width] = statistics.median(times)
    return out


def batch_costs(
    model: torch.nn.Module, rows: int, context: int, cases: list[tuple[int, int]], repeats: int = 5
) -> dict[tuple[int, int], float]:
    """Median seconds of a step of ``rows`` rows at ragged contexts (``context`` to about ``context * 1.5``
    tokens) where ``d`` rows feed ``w`` tokens and the rest one, for each ``(d, w)`` of ``cases``; ``(0, 1)``
    is the plain step.  Changes nothing kept."""
    generator = torch.Generator().manual_seed(0)
    vocab = logits_width(model)
    low = min(100, vocab // 2)
    lengths = [context + (context // 2) * i // max(1, rows - 1) for i in range(rows)]
    widest = max(w for _, w in cases)
    kv = BatchKV(model, rows, columns=max(lengths) + widest + 1)
    kv.forward([torch.randint(low, vocab, (n,), generator=generator).tolist() for n in lengths], [()] * rows)
    kv.keep([list(range(n)) for n in lengths])
    out = {}
    for drafting, width in [(0, 1), *cases]:
        widths = [width] * drafting + [1] * (rows - drafting)
        times = []
        for _ in range(repeats):
            chunks = [torch.randint(low, vocab, (w,), generator=generator).tolist() for w in widths]
            start = time.perf_counter()
            kv.forward(chunks, [tuple(range(-1, w - 2)) for w in widths])
            times.append(time.perf_counter() - start)
            kv.keep([[0]] * rows)  # keep each row's pending token only: the contexts stay about the same
        out[drafting, width] = statistics.median(times)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="an embedded model or a local model directory")
    parser.add_argument("--context", type=int, default=600, help="prompt tokens cached before the timed forwards")
    parser.add_argument("--widths", default="1,2,3,4,7,8,12,16,24,32", help="comma-separated tokens per forward")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", type=int, default=1, help="rows a step (more than 1: the batch step's costs)")
    args = parser.parse_args(argv)
    widths = [int(w) for w in args.widths.split(",") if w.strip()]
    if not widths or min(widths) < 1 or args.context < 1 or args.repeats < 1 or args.rows < 1:
        parser.error("--widths, --context, --repeats and --rows need positive numbers")
    model, _ = load_model(args.model)
    if args.rows > 1:
        cases = [(1, 2), (1, 3), (1, 5), (2, 3), (max(1, args.rows // 2), 3), (args.rows, 3)]
        steps = batch_costs(model, args.rows, args.context, cases, args.repeats)
        plain = steps[0, 1]
        print(
            f"{args.rows} rows after {args.context} to {args.context * 3 // 2} cached tokens, "
            f"torch threads {torch.get_num_threads()}"
        )
        print("| rows drafting | tokens each | ms | x plain step |\n|---|---|---|---|")
        for (drafting, width), seconds in steps.items():
            print(f"| {drafting} | {width} | {1000 * seconds:.1f} | {seconds / plain:.2f} |")
        return 0
    costs = width_costs(model, args.context, sorted(set(widths) | {1}), args.repeats)
    print(f"one row after {args.context} cached tokens, torch threads {torch.get_num_threads()}")
    print("| tokens fed | ms | x 1 token |\n|---|---|---|")
    for width, seconds in costs.items():
        print(f"| {width} | {1000 * seconds:.1f} | {seconds / costs[1]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
