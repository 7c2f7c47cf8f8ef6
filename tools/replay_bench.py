"""Replay greedy outputs through a proposer preset, offline: target passes without the target.

    .venv/bin/python tools/replay_bench.py bench-out/results.json            # the baseline's outputs, "auto"
    .venv/bin/python tools/replay_bench.py bench-out/results.json --assistant schema_ngram
    .venv/bin/python tools/replay_bench.py --references                      # the task file's reference answers
    .venv/bin/python tools/replay_bench.py --references --gpu-flat 64 --per-token 0.01   # a modelled GPU

Under greedy decoding the output does not depend on the proposer, so a recorded
output shows exactly what each draft would have got. The replay runs the real
loop, :func:`grammarspec.engine.decoding.decode`, against an oracle target whose greedy
choice is the recorded output (:class:`tools.oracle.OracleLM`), with the same
:class:`~grammarspec.policy.adaptive.AdaptiveController` fed the modelled pass costs
instead of wall time. It prints the target passes per task and category,
the draft tokens verified per step, and a *modelled* speedup: every figure
but the passes and tokens comes from the cost model given, never from a
clock. A pass of ``r`` rows verifying ``d`` draft tokens costs
``--pass-base + --row-cost * max(r, --min-rows)`` plain steps plus
``--per-token * d`` (:meth:`proposers.cost.PassCost.drafted`; the CPU prior
by default, or a profiled curve given by its numbers); ``--gpu-flat N``
models a GPU instead, a pass costing one plain step up to ``N`` rows. The
drafting policy sizes drafts on the same model. Seconds, not counts, come
from ``grammarspec bench``. Use this to compare
drafter changes in a few seconds, on recorded outputs or on reference answers.
On a results.json that holds the preset's own runs, the modelled decode
speedup is also turned into an end-to-end one: the baseline's prompt pass is
replaced by the preset's measured one and its decode phase is divided by the
modelled speedup.

``--split-oracle`` gives a bound, not a drafter: where a draft is rejected but
the output goes on with the same text split into other tokens (SmolLM2 writes
``":`` ``"`` as often as ``":"``), the tokens that spell that text count as
accepted, at the draft's cost -- what a perfect predictor of the target's
splits would add.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from proposers.cost import PRIOR_BASE, PRIOR_MIN_ROWS, PRIOR_PER_ROW, PassCost, flat_until  # noqa: E402


def pass_cost(rows: int, base: float = PRIOR_BASE, per_row: float = PRIOR_PER_ROW) -> float:
    """Cost of a target pass over ``rows`` rows, in plain (1-row) steps: the model of :mod:`proposers.cost`."""
    return PassCost(base, per_row).cost(rows)


def same_text_tokens(drafted: bytes, output: list[bytes]) -> int:
    """How many leading ``output`` tokens (their bytes) spell a prefix of ``drafted``.

    >>> same_text_tokens(b'":"IN', [b'":', b'"', b'IN', b'V'])
    3
    """
    n, used = 0, 0
    for piece in output:
        if not piece or drafted[used : used + len(piece)] != piece:
            break
        used, n = used + len(piece), n + 1
    return n


def end_to_end(baseline: dict[str, Any], arm: dict[str, Any], decode_speedup: float) -> float:
    """Speedup of ``arm`` over ``baseline`` (two bench records of one task) if its decode phase ran
    ``decode_speedup`` times faster than the baseline's: the arm's own prompt pass is kept."""
    decode = baseline["seconds"] - baseline["first_step_seconds"]
    return baseline["seconds"] / (arm["first_step_seconds"] + decode / decode_speedup)


def _grammar_for(tokenizer: Any, schema: dict, output: list[int]) -> tuple[Any, Any, int, int] | None:
    """``(spec, compiled grammar, eos, vocab)`` for a replay of ``output``; ``None`` when the grammar rejects it."""
    from grammars import compile_grammar, grammar_spec

    eos = tokenizer.eos_token_id
    vocab = max(len(tokenizer), tokenizer.vocab_size)
    spec = grammar_spec(schema=schema)
    assert spec is not None, "a schema always makes a grammar spec"
    compiled = compile_grammar(spec, tokenizer, vocab_size=vocab, stop_token_ids=(eos,))
    check = compiled.matcher()
    if any(not check.accept(t) for t in output):
        return None
    return spec, compiled, eos, vocab


def replay(
    tokenizer: Any,
    prompt: list[int],
    schema: dict,
    output: list[int],
    assistant: str,
    cost: Callable[[int], float] = pass_cost,
    split_oracle: bool = False,
) -> dict[str, float] | None:
    """Counts for one output, from the real decoding loop against an oracle target; ``None`` when the
    grammar rejects the output.

    ``split_oracle``: the oracle takes a drafted token wherever it spells the
    output's text with other tokens (a bound; see the module doc).
    """
    from grammarspec.engine.decoding import DecodeConfig, decode
    from grammarspec.policy.adaptive import AdaptiveController
    from grammarspec.policy.adaptive import k_min as _k_min
    from proposers.base import Request
    from proposers.presets import resolve_assistant
    from proposers.text import token_text
    from tools.oracle import OracleLM

    grammar = _grammar_for(tokenizer, schema, output)
    if grammar is None:
        return None
    spec, compiled, eos, vocab = grammar
    k_max = 16
    table = token_text(tokenizer).vocab_bytes if split_oracle else None
    oracle = OracleLM(prompt, output, vocab, eos_token_id=eos, split_bytes=table)
    proposer = resolve_assistant(assistant)
    assert proposer is not None, f"--assistant {assistant!r} drafts nothing: name a preset"
    controller = AdaptiveController(k_min=_k_min(proposer, k_max), k_max=k_max)
    proposer.start(Request(prompt_ids=tuple(prompt), tokenizer=tokenizer, schema=spec.schema))
    # the output's own length bounds the drafts as it bounds the real run (a split bound may take more tokens)
    config = DecodeConfig(max_new_tokens=len(output) * (2 if split_oracle else 1), eos_token_ids=(eos,))
    new, stats = decode(
        oracle,
        prompt,
        config,
        matcher=compiled.matcher(max_rollback=k_max + 1),
        proposer=proposer,
        controller=controller,
        tokenizer=tokenizer,
        step_cost=cost,
    )
    passes = stats.target_forwards
    spent = sum(_spent(cost, proposed) for proposed, _ in stats.steps)
    tokens = oracle.spelled_tokens(new)
    drafted = sum(proposed for proposed, _ in stats.steps[1:]) / max(1, len(stats.steps) - 1)  # after the prompt
    return {
        "tokens": tokens,
        "passes": passes,
        "per_pass": tokens / max(1, passes),
        "speedup": tokens / spent if spent else 0.0,
        "forced": stats.forced_tokens,
        "drafted": drafted,
    }


def _spent(cost: Callable[[int], float], drafted: int) -> float:
    """Plain steps of a batch-1 pass verifying ``drafted`` draft tokens (with a :class:`PassCost`'s host term)."""
    return cost.drafted(drafted + 1, drafted) if isinstance(cost, PassCost) else cost(drafted + 1)


def time_passes(
    model: Any, context: list[int], rows: list[int], repeats: int = 7, tree_width: int = 4
) -> dict[int, dict[str, float]]:
    """Seconds of one target pass over ``r`` new rows on top of a cached ``context``, and its cost in plain steps.

    Two kinds per ``r``: ``chain`` (causal rows, the default mask) and
    ``tree`` (a ``tree_width``-branch tree of ``r - 1`` nodes plus the pending
    token, under the 4-D tree mask).  Each timed pass is paired with a 1-row
    step run just before it, and its cost is the median over repeats of
    the ratio within each pair (``chain_steps`` / ``tree_steps``): the machine
    is shared, and pairing cancels slow changes in its load.  ``chain`` /
    ``tree`` / ``plain`` are median seconds.  The cache is cropped back after every pass.
    """
    import time

    from grammarspec.kv.batch import BatchKV
    from grammarspec.kv.cache import crop_cache, forward_with_cache, new_cache
    from proposers.tree import DraftTree

    cache = new_cache(model)
    forward_with_cache(model, context[:-1], cache, 1)
    base = len(context) - 1

    def timed(r: int, kind: str) -> float:
        nodes = r - 1
        t0 = time.perf_counter()
        if kind == "chain":
            forward_with_cache(model, context[-1:] + list(range(1000, 1000 + nodes)), cache, r)
        else:
            branch = max(1, -(-nodes // tree_width))  # ceil: branches of about equal length
            paths = [[1000 + 100 * b + j for j in range(min(branch, nodes - b * branch))] for b in range(tree_width)]
            tree = DraftTree.from_paths([p for p in paths if p])
            BatchKV.from_cache(model, cache, base).forward([context[-1:] + list(tree.tokens)], [tree.parents])
        seconds = time.perf_counter() - t0
        crop_cache(cache, base)
        return seconds

    samples: dict[tuple[int, str], list[float]] = defaultdict(list)
    for _ in range(repeats):
        for r in rows:
            for kind in ("chain", "tree"):
                plain = timed(1, "chain")
                seconds = timed(r, kind)
                samples[(r, kind)].append(seconds)
                samples[(r, kind + "_steps")].append(seconds / plain)
                samples[(1, "plain")].append(plain)
    out: dict[int, dict[str, float]] = {}
    for (r, kind), values in samples.items():
        out.setdefault(r, {})[kind] = statistics.median(values)
    return out


# --- tree shapes on recorded outputs ------------------------------------------------------------------


def measured_cost(table: dict[int, float]) -> Callable[[int], float]:
    """A pass-cost model from measured ``rows -> plain steps`` (:func:`proposers.tree.interpolated_cost`)."""
    from proposers.tree import interpolated_cost

    return interpolated_cost(table)


class _CountTrees:
    """Wraps a :class:`proposers.tree.TreeProposer` and counts the (pruned) trees the loop verified."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.trees, self.nodes = inner, inner.name, 0, 0
        self.cost_model = getattr(inner, "cost_model", None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def commit_tree(self, tree: Any, committed: Any) -> None:
        self.trees += not tree.is_chain
        self.nodes += len(tree)
        self.inner.commit_tree(tree, committed)

    def commit(self, draft: Any, num_accepted: int, committed: Any) -> None:
        self.nodes += len(draft)
        self.inner.commit(draft, num_accepted, committed)


def replay_tree(
    tokenizer: Any,
    prompt: list[int],
    schema: dict,
    output: list[int],
    assistant: str,
    shape: str,
    cost: Callable[[int], float] = pass_cost,
) -> dict[str, float] | None:
    """:func:`replay` with :class:`proposers.tree.TreeProposer` of ``shape`` (``"4x32"``, ``"4x32x4s"``:
    :meth:`~proposers.tree.TreeProposer.from_shape`), through the real loop's tree step.

    The oracle target sees each node's own context under the tree mask, so the
    deepest path the output follows is accepted; a pass costs ``cost(1 + nodes)``.
    ``None`` when the grammar rejects the output.
    """
    from grammarspec.engine.decoding import DecodeConfig, decode
    from grammarspec.policy.adaptive import AdaptiveController
    from grammarspec.policy.adaptive import k_min as _k_min
    from proposers.base import Request
    from proposers.presets import resolve_assistant
    from proposers.tree import TreeProposer
    from tools.oracle import OracleLM

    grammar = _grammar_for(tokenizer, schema, output)
    if grammar is None:
        return None
    spec, compiled, eos, vocab = grammar
    k_max = 16
    drafter = resolve_assistant(assistant)
    assert drafter is not None, f"--assistant {assistant!r} drafts nothing: name a preset"
    tree_proposer = TreeProposer.from_shape(drafter, shape)
    proposer = _CountTrees(tree_proposer)
    controller = AdaptiveController(k_min=_k_min(tree_proposer, k_max), k_max=k_max)
    proposer.start(Request(prompt_ids=tuple(prompt), tokenizer=tokenizer, schema=spec.schema))
    oracle = OracleLM(prompt, output, vocab, eos_token_id=eos)
    config = DecodeConfig(max_new_tokens=len(output), eos_token_ids=(eos,))
    rows: list[int] = []

    def step_cost(r: int) -> float:
        return cost(r)

    def on_step(state: Any) -> None:
        rows.append(proposer.nodes)

    new, stats = decode(
        oracle,
        prompt,
        config,
        matcher=compiled.matcher(max_rollback=max(tree_proposer.size, k_max) + 1),
        proposer=proposer,
        controller=controller,
        tokenizer=tokenizer,
        step_cost=step_cost,
        on_step=on_step,
    )
    passes = stats.target_forwards
    per_pass_nodes = [b - a for a, b in zip([0] + rows[:-1], rows)]  # nodes verified in each pass
    spent = sum(cost(1 + n) for n in per_pass_nodes)
    return {
        "tokens": len(new),
        "passes": passes,
        "per_pass": len(new) / max(1, passes),
        "speedup": len(new) / spent if spent else 0.0,
        "forced": stats.forced_tokens,
        "trees": proposer.trees,
        "rows": (proposer.nodes + passes) / max(1, passes),
    }


def tree_shapes(
    tokenizer: Any,
    jobs: list[tuple[str, str, list[int], dict, list[int]]],
    shapes: list[str],
    cost: Callable[[int], float],
    assistant: str = "auto",
) -> dict[str, dict[str, dict[str, float]]]:
    """Medians per category of tokens per pass and modelled speedup for each tree shape (``"4x32"``...).

    ``jobs``: ``(task id, category, prompt ids, schema, output ids)``; width 1 is the chain.
    """
    out: dict[str, dict[str, dict[str, float]]] = {}
    for shape in shapes:
        per_category: dict[str, list[dict[str, float]]] = defaultdict(list)
        for _, category, prompt, schema, output in jobs:
            counts = replay_tree(tokenizer, prompt, schema, output, assistant, shape, cost)
            if counts is not None:
                per_category[category].append(counts)
        out[shape] = {
            category: {
                "tasks": len(rows),
                "tokens": sum(r["tokens"] for r in rows),
                "passes": sum(r["passes"] for r in rows),
                "per_pass": statistics.median(r["per_pass"] for r in rows),
                "speedup": statistics.median(r["speedup"] for r in rows),
                "rows": statistics.median(r["rows"] for r in rows),
                "trees": sum(r["trees"] for r in rows),
            }
            for category, rows in per_category.items()
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", help="a results.json of grammarspec bench (its baseline outputs)")
    parser.add_argument("--references", action="store_true", help="replay the task file's reference answers")
    parser.add_argument("--gpu-flat", type=int, default=0, help="model a GPU: passes cost one step up to N rows")
    parser.add_argument("--tasks", default=None, help="default: $GRAMMARSPEC_TASKS or data/tasks/tasks.jsonl")
    parser.add_argument("--assistant", default="auto")
    parser.add_argument(
        "--pass-base", type=float, default=PRIOR_BASE, help="fixed cost of a pass with drafts, in plain steps"
    )
    parser.add_argument("--row-cost", type=float, default=PRIOR_PER_ROW, help="cost of each row of such a pass")
    parser.add_argument("--min-rows", type=int, default=PRIOR_MIN_ROWS, help="a pass costs at least this many rows")
    parser.add_argument("--per-token", type=float, default=0.0, help="host cost of each draft token, plain steps")
    parser.add_argument("--switch", type=float, default=0.0, help="masked-path cost of a drafted pass at batch > 1")
    parser.add_argument(
        "--split-oracle",
        action="store_true",
        help="bound: count a rejected draft's text as accepted where the output spells it otherwise",
    )
    # tree shapes: width x size, with a measured cost table (see --time-rows)
    parser.add_argument(
        "--trees", default=None, help="tree shapes to replay: WxS[xB][s], e.g. 1x16,2x16,4x32,4x32x4s (s: TreeSizer)"
    )
    parser.add_argument(
        "--cost-table",
        default=None,
        help="JSON {rows: plain steps}: the measured curve (from --time-rows, or a pass_cost.json entry's table)",
    )
    parser.add_argument("--time-rows", default=None, help="time passes over these row counts, e.g. 1,2,4,8,16,32,64")
    parser.add_argument("--repeats", type=int, default=7, help="repeats per row count for --time-rows (median)")
    parser.add_argument("--context", type=int, default=850, help="context length for --time-rows")
    parser.add_argument("--threads", type=int, default=0, help="torch threads for --time-rows (0: torch's default)")
    args = parser.parse_args(argv)
    if args.time_rows:
        return _time_rows_main(args)
    if not args.results and not args.references:
        parser.error("give a results.json or --references")

    from grammarspec import load_model
    from grammarspec.bench.runner import _prompt_ids
    from grammarspec.bench.tasks import default_tasks_path, load_tasks

    _, tokenizer = load_model("smollm2-135m")
    tasks = {t.id: t for t in load_tasks(args.tasks or default_tasks_path())}
    outputs: list[tuple[str, list[int]]] = []
    if args.references:
        for task in tasks.values():
            if task.reference is not None:  # outputs the grammar rejects are skipped below
                text = json.dumps(task.reference, separators=(",", ":"), ensure_ascii=False)
                outputs.append((task.id, tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]))
    runs: dict[tuple[str, str], dict[str, Any]] = {}
    if args.results:
        runs = {(r["task"], r["arm"]): r for r in json.loads(Path(args.results).read_text())["runs"]}
        outputs = [(task, r["tokens"]) for (task, arm), r in runs.items() if arm == "baseline" and "error" not in r]
    per_category: dict[str, list[dict[str, float]]] = defaultdict(list)
    cost: Callable[[int], float] = PassCost(
        args.pass_base, args.row_cost, args.min_rows, switch=args.switch, per_token=args.per_token
    )
    curve = f"{args.pass_base} + {args.row_cost} * max(rows, {args.min_rows})"
    if args.gpu_flat:  # a modelled GPU: a pass costs one plain step up to this many rows
        cost = flat_until(args.gpu_flat, switch=args.switch, per_token=args.per_token)
        curve = f"flat to {args.gpu_flat} rows (a GPU)"
    elif args.cost_table and not args.trees:  # a profiled curve: its measured points, the line beyond them
        table = {int(k): float(v) for k, v in json.loads(Path(args.cost_table).read_text()).items()}
        cost = PassCost(
            args.pass_base, args.row_cost, args.min_rows, switch=args.switch, per_token=args.per_token, table=table
        )
        curve = f"the table {args.cost_table}, then {args.row_cost} a row"
    curve += f", + {args.per_token} per draft token"
    if args.trees:
        return _trees_main(args, tokenizer, tasks, outputs, cost)
    for task_id, output in outputs:
        task = tasks[task_id]
        counts = replay(
            tokenizer, _prompt_ids(tokenizer, task), task.schema, output, args.assistant, cost, args.split_oracle
        )
        if counts is None:
            print(f"{task_id:40s} skipped: the grammar rejects this output")
            continue
        measured = runs.get((task_id, args.assistant))
        if measured is not None and "error" not in measured:  # the bench ran this preset: its prompt pass is known
            counts["end_to_end"] = end_to_end(runs[(task_id, "baseline")], measured, counts["speedup"])
        per_category[task.category].append(counts)
        print(
            f"{task_id:40s} {counts['tokens']:4.0f} tokens {counts['passes']:4.0f} passes "
            f"{counts['per_pass']:5.2f} per pass, {counts['drafted']:5.2f} drafted per step, "
            f"{counts['speedup']:4.2f}x modelled"
        )
    oracle = ", split oracle" if args.split_oracle else ""
    print(
        f"\nassistant={args.assistant!r}{oracle}; modelled pass cost (plain steps): {curve}; "
        "medians per category (drafted: mean draft tokens verified per step):"
    )
    for category, rows in per_category.items():
        whole = [r["end_to_end"] for r in rows if "end_to_end" in r]
        print(
            f"  {category:12s} {len(rows):3d} tasks  {statistics.median(r['per_pass'] for r in rows):5.2f} tokens "
            f"per pass  {statistics.mean(r['drafted'] for r in rows):5.2f} drafted per step  "
            f"{statistics.median(r['speedup'] for r in rows):4.2f}x modelled"
            + (f" (end to end {statistics.median(whole):4.2f}x with the bench's prompt passes)" if whole else "")
        )
    return 0


def _time_rows_main(args: argparse.Namespace) -> int:
    import torch

    from grammarspec import load_model
    from grammarspec.bench.runner import _prompt_ids
    from grammarspec.bench.tasks import default_tasks_path, load_tasks

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_model("smollm2-135m")
    tasks = load_tasks(args.tasks or default_tasks_path())
    context = max((_prompt_ids(tokenizer, t) for t in tasks), key=len)
    context = (context * (1 + args.context // len(context)))[: args.context]
    rows = [int(r) for r in args.time_rows.split(",")]
    timed = time_passes(model, context, sorted(set(rows) - {1}), repeats=args.repeats)
    print(
        f"context {len(context)} tokens, {torch.get_num_threads()} threads, {args.repeats} repeats; "
        f"plain 1-row step: median {timed[1]['plain'] * 1e3:.1f} ms"
    )
    print("| rows | chain pass (ms) | tree pass (ms) | chain, plain steps | tree, plain steps |")
    print("|---:|---:|---:|---:|---:|")
    table = {1: 1.0}
    for r in sorted(timed):
        if r == 1:
            continue
        t = timed[r]
        table[r] = round(t["tree_steps"], 3)
        print(
            f"| {r} | {t['chain'] * 1e3:.1f} | {t['tree'] * 1e3:.1f} | {t['chain_steps']:.2f} | {t['tree_steps']:.2f} |"
        )
    print("cost table (tree passes, plain steps):", json.dumps(table))
    return 0


def _trees_main(args: argparse.Namespace, tokenizer: Any, tasks: dict, outputs: list, cost: Callable) -> int:
    from grammarspec.bench.runner import _prompt_ids

    if args.cost_table:
        cost = measured_cost({int(k): v for k, v in json.loads(Path(args.cost_table).read_text()).items()})
    shapes = [s for s in args.trees.split(",") if s]
    jobs = [
        (tid, tasks[tid].category, _prompt_ids(tokenizer, tasks[tid]), tasks[tid].schema, out) for tid, out in outputs
    ]
    result = tree_shapes(tokenizer, jobs, shapes, cost, args.assistant)
    print(
        f"assistant={args.assistant!r}, cost {'table ' + args.cost_table if args.cost_table else 'model'}; "
        "width x size [x branch] (width 1 = chain): medians per category"
    )
    print("| shape | category | tasks | passes | tokens per pass | rows per pass | tree steps | modelled speedup |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for shape, categories in result.items():
        for category, r in categories.items():
            print(
                f"| {shape} | {category} | {r['tasks']} | {r['passes']} | {r['per_pass']:.2f} | "
                f"{r['rows']:.1f} | {r['trees']} | {r['speedup']:.2f}x |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
