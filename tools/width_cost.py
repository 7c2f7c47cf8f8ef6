"""What one row's forward costs by width on this machine: the curve a lone request's drafts are priced on.

Times :meth:`grammarspec.kv.BatchKV.forward` of one row feeding a chain of
``w`` tokens (its pending token and ``w - 1`` draft tokens) after a prompt of
``--context`` tokens, the way the decoding loop calls it, and prints the
median milliseconds per width beside the ratio to a 1-token forward.  On a
CPU the ratio climbs steeply from 1 to about 8 tokens (the matrix kernels
change shape), which is what bounds a lone request's speedup there; on a GPU
it stays near 1.

    python tools/width_cost.py --context 600 --widths 1,2,4,7,16,32
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from grammarspec.decoding import logits_width  # noqa: E402
from grammarspec.kv import BatchKV  # noqa: E402
from grammarspec.loading import load_model  # noqa: E402


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="an embedded model or a local model directory")
    parser.add_argument("--context", type=int, default=600, help="prompt tokens cached before the timed forwards")
    parser.add_argument("--widths", default="1,2,3,4,7,8,12,16,24,32", help="comma-separated tokens per forward")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    widths = [int(w) for w in args.widths.split(",") if w.strip()]
    if not widths or min(widths) < 1 or args.context < 1 or args.repeats < 1:
        parser.error("--widths, --context and --repeats need positive numbers")
    model, _ = load_model(args.model)
    costs = width_costs(model, args.context, sorted(set(widths) | {1}), args.repeats)
    print(f"one row after {args.context} cached tokens, torch threads {torch.get_num_threads()}")
    print("| tokens fed | ms | x 1 token |\n|---|---|---|")
    for width, seconds in costs.items():
        print(f"| {width} | {1000 * seconds:.1f} | {seconds / costs[1]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
