"""The server's engine in-process, without HTTP: where each arm's step time goes under a closed loop.

    .venv/bin/python tools/engine_loop.py                                  # prose, C=8, 3 rounds, 2 pairs
    .venv/bin/python tools/engine_loop.py --workload json --concurrency 1 --pairs 2
    .venv/bin/python tools/engine_loop.py --concurrency 16 --functions     # also time the host functions

One :class:`grammarspec.serve.engine.Engine` (``--max-batch-size 16``, prefix
cache off, as ``bench-serve --sweep`` starts it) serves a closed loop of C
client threads that call ``prepare`` / ``submit`` directly, greedy,
``max_tokens`` 96.  Arms (``none``, ``auto``) alternate run by run after one
untimed run of each (every JSON schema is compiled before, as ``bench-serve
--sweep`` does).  Per run it prints output tokens a second, the steps,
the seconds inside steps (forward and the rest) and outside them (the loop
around the steps: joins, the feed, the step cost learner), from the engine's
step trace, the mean forward of the steps that take one shape in both arms
(all C rows decoding a token, no prompt read, no draft verified: whether an
arm's forwards themselves run slower), and the seconds the garbage collector
ran (with its full collections).  ``--functions`` wraps the loop's host functions with timers
and prints ms a step for each (the wrappers add a little to every arm).
Counts are exact; times need the machine to itself.
"""

from __future__ import annotations

import argparse
import collections
import gc
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grammars import grammar_spec  # noqa: E402
from grammarspec.bench.sweep import closed_loop, workload  # noqa: E402
from grammarspec.model.loading import load_model  # noqa: E402
from grammarspec.serve.engine import Engine  # noqa: E402
from grammarspec.serve.protocol import parse_request  # noqa: E402

#: (module, attribute, label) of the host functions ``--functions`` times.
TIMED = (
    ("grammarspec.engine.step", "_propose", "propose (all rows)"),
    ("grammarspec.engine.step", "_step_cost", "step cost"),
    ("grammarspec.engine.step", "_allocate", "allocate"),
    ("grammarspec.engine.step", "commit", "commit"),
    ("grammarspec.engine.step", "account", "account (all rows)"),
    ("grammarspec.policy.step_cost", "StepCostLearner.observe", "learner observe"),
    ("proposers.compose", "CompositeProposer.commit", "proposer told"),
)


def wrap_functions(seconds: collections.Counter[str]) -> None:
    """Replace each :data:`TIMED` function with one that adds its seconds to ``seconds[label]``."""
    import importlib

    for module_name, attribute, label in TIMED:
        owner: Any = importlib.import_module(module_name)
        *path, name = attribute.split(".")
        for part in path:
            owner = getattr(owner, part)
        setattr(owner, name, _timed(getattr(owner, name), label, seconds))


def _timed(function: Callable[..., Any], label: str, seconds: collections.Counter[str]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            seconds[label] += time.perf_counter() - start

    return timed


class GcClock:
    """Seconds the garbage collector ran, and its full collections, since the last :meth:`take` (any thread)."""

    def __init__(self) -> None:
        self.seconds, self.full, self._start = 0.0, 0, 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start
            self.full += info["generation"] == 2

    def take(self) -> tuple[float, int]:
        taken, self.seconds, self.full = (self.seconds, self.full), 0.0, 0
        return taken


GC = GcClock()


def ask(engine: Engine, body: dict[str, Any]) -> list[int]:
    """One request through ``prepare`` / ``submit``, waited for; its tokens."""
    done, answer = threading.Event(), {}

    def emit(event: tuple[str, Any]) -> None:
        if event[0] in ("choice", "error"):
            answer[event[0]] = event[1]
            done.set()

    engine.submit(engine.prepare(parse_request(body, "m"), emit))
    done.wait()
    if "error" in answer:
        raise RuntimeError(answer["error"])
    return list(answer["choice"][0].tokens)


def run(
    engine: Engine, bodies: list[dict[str, Any]], arm: str, concurrency: int, requests: int, max_tokens: int = 96
) -> dict[str, Any]:
    """One closed-loop run of ``requests`` requests: tokens a second and the trace's split of the time."""
    assert engine.trace is not None
    engine.trace.take()  # what came before belongs to no run
    GC.take()

    def send(body: dict[str, Any]) -> dict[str, Any]:
        request = dict(body, model="m", temperature=0, max_tokens=max_tokens, grammarspec={"assistant": arm})
        return {"tokens": len(ask(engine, request))}

    start = time.perf_counter()
    records = closed_loop(send, [bodies[i % len(bodies)] for i in range(requests)], concurrency)
    tokens = sum(record["tokens"] for record in records)
    wall = time.perf_counter() - start
    steps, joins = engine.trace.take()
    inside = sum(sum(s.seconds.values()) for s in steps)
    forward = sum(s.seconds.get("forward", 0.0) for s in steps)
    # forwards of one shape in both arms: every client's row decoding a token, no prompt read, no draft verified
    shaped = [
        s.seconds.get("forward", 0.0) for s in steps if s.rows == concurrency and not s.prompt_tokens and not s.admitted
    ]
    joined = sum(j.seconds for j in joins)
    collected, full = GC.take()
    return {
        "tok/s": tokens / wall,
        "steps": len(steps),
        "admitted": sum(s.admitted for s in steps),
        "drafted steps": sum(1 for s in steps if s.admitted),
        "forward s": forward,
        "full plain steps": len(shaped),
        "their forward ms": 1000 * statistics.fmean(shaped) if shaped else float("nan"),
        "rest of steps s": inside - forward,
        "outside s": wall - inside - joined,
        "gc s": collected,
        "full gc": full,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="prose", choices=("prose", "json"))
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="requests per client a run")
    parser.add_argument("--pairs", type=int, default=2, help="timed runs of each arm")
    parser.add_argument("--functions", action="store_true", help="time the loop's host functions too")
    args = parser.parse_args(argv)
    if min(args.concurrency, args.rounds, args.pairs) < 1:
        parser.error("--concurrency, --rounds and --pairs must be at least 1")
    seconds: collections.Counter[str] = collections.Counter()
    if args.functions:
        wrap_functions(seconds)
    model, tokenizer = load_model()
    engine = Engine(model, tokenizer, max_batch_size=16, prefix_cache_bytes=0, trace_steps=True)
    bodies = workload(args.workload)
    requests = args.concurrency * args.rounds
    rates: dict[str, list[float]] = {"none": [], "auto": []}
    try:
        for body in bodies:  # every schema compiled before timing, as the sweep does: no arm pays a first compile
            if "response_format" in body:
                engine.compile(grammar_spec(schema=body["response_format"]["json_schema"]["schema"]))
        for arm in rates:  # untimed: kernels and the profile warmed
            run(engine, bodies, arm, args.concurrency, args.concurrency)
        print(f"{args.workload}, C={args.concurrency}, {requests} requests a run, greedy, max_tokens 96")
        for pair in range(args.pairs):
            for arm in ("none", "auto") if pair % 2 == 0 else ("auto", "none"):
                seconds.clear()
                result = run(engine, bodies, arm, args.concurrency, requests)
                rates[arm].append(result["tok/s"])
                line = ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in result.items())
                print(f"{arm}: {line}")
                if args.functions:
                    per_step = {label: 1000 * s / max(result["steps"], 1) for label, s in sorted(seconds.items())}
                    print("   ms a step: " + ", ".join(f"{label} {ms:.3f}" for label, ms in per_step.items()))
    finally:
        engine.close()
    ratio = statistics.mean(rates["auto"]) / statistics.mean(rates["none"])
    print(
        f"auto / none: {ratio:.3f} (each pair: {', '.join(f'{a / n:.3f}' for a, n in zip(rates['auto'], rates['none']))})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
