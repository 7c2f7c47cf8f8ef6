"""Replay greedy outputs through a proposer preset, offline: target passes without the target.

    .venv/bin/python scripts/replay_bench.py bench-out/results.json            # the baseline's outputs, "auto"
    .venv/bin/python scripts/replay_bench.py bench-out/results.json --assistant schema_ngram
    .venv/bin/python scripts/replay_bench.py --references                      # the task file's reference answers

Under greedy decoding the output does not depend on the proposer, so a recorded
output shows exactly what each draft would have got. The replay follows
:func:`grammarspec.decoding.decode` step by step. Tokens the grammar forces are
committed without a pass. Otherwise the preset drafts up to ``k`` tokens (the
same :class:`~grammarspec.adaptive.AdaptiveController`), the grammar cuts the
draft, the longest prefix that matches the output is accepted, and one more
token comes from the target. It prints the target passes per task and category,
and a modelled speedup in which a pass of ``r`` rows costs ``--pass-base +
--row-cost * max(r, 4)`` plain steps (measured with 2 threads on this CPU at an
850-token context: 85 ms for 1 row, about 125 ms for 4-8 rows, 146 ms for 16,
190 ms for 24; fewer than 4 rows cost as much as 4, because the BLAS takes a
slower path for the 2-3 row LM-head product). Seconds, not counts, come from
``grammarspec bench``. Use this to compare
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
import functools
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def pass_cost(rows: int, base: float = 1.3, per_row: float = 0.03) -> float:
    """Cost of a target pass over ``rows`` rows, in plain (1-row) steps."""
    return 1.0 if rows <= 1 else base + per_row * max(rows, 4)


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


def replay(
    tokenizer: Any,
    prompt: list[int],
    schema: dict,
    output: list[int],
    assistant: str,
    cost: Callable[[int], float] = pass_cost,
    split_oracle: bool = False,
) -> dict[str, float] | None:
    """Counts for one output; ``None`` when the grammar rejects the output.

    ``split_oracle``: a rejected draft token whose text the output spells
    with other tokens counts as accepted (a bound; see the module doc).
    """
    from grammarspec.adaptive import AdaptiveController
    from grammarspec.api import _k_min
    from grammarspec.decoding import _forced_token
    from grammars import compile_grammar, grammar_spec
    from grammars.base import allocate_bitmask
    from proposers.base import EMPTY_DRAFT, GrammarView, Request
    from proposers.presets import resolve_assistant
    from proposers.text import token_text

    eos = tokenizer.eos_token_id
    vocab = max(len(tokenizer), tokenizer.vocab_size)
    spec = grammar_spec(schema=schema)
    compiled = compile_grammar(spec, tokenizer, vocab_size=vocab, stop_token_ids=(eos,))
    check = compiled.matcher()
    if any(not check.accept(t) for t in output):
        return None
    k_max = 16
    matcher = compiled.matcher(max_rollback=k_max + 1)
    view = GrammarView(matcher)
    proposer = resolve_assistant(assistant)
    controller = AdaptiveController(k_min=_k_min(proposer, k_max), k_max=k_max)
    proposer.start(Request(prompt_ids=tuple(prompt), tokenizer=tokenizer, schema=spec.schema,
                           extra={"target_vocab_size": vocab}))  # fmt: skip
    masks = allocate_bitmask(k_max + 1, vocab)
    context, done, passes, spent, forced = list(prompt), 0, 0, 0.0, 0
    while done < len(output) and not matcher.is_terminated():
        token = _forced_token(matcher, masks, vocab)
        if token is not None:
            matcher.accept(token)
            context.append(token)
            done, forced = done + 1, forced + 1
            proposer.commit(EMPTY_DRAFT, 0, [token])
            continue
        k = min(controller.k if controller.speculate else 0, len(output) - done - 1)
        draft = proposer.propose(context, view, k).truncate(k) if k > 0 else None
        length = matcher.validate(draft.tokens) if draft else 0
        accepted = 0
        while accepted < length and draft.tokens[accepted] == output[done + accepted]:  # type: ignore[union-attr]
            accepted += 1
        learned = accepted
        if split_oracle and accepted < length:
            table = token_text(tokenizer).vocab_bytes
            rest = b"".join(table[t] for t in draft.tokens[accepted:length])  # type: ignore[union-attr]
            accepted += same_text_tokens(rest, [table[t] for t in output[done + accepted : len(output) - 1]])
        step_cost = cost(length + 1)
        passes, spent = passes + 1, spent + step_cost
        new = output[done : done + accepted + 1]
        for t in new:
            matcher.accept(t)
        context += new
        done += len(new)
        proposer.commit(draft.truncate(length) if draft else EMPTY_DRAFT, learned, new)  # type: ignore[union-attr]
        if length:
            if passes > 1:
                controller.record_speculative_step(length, min(accepted, length), step_cost)
        elif passes > 1:
            controller.record_plain_step(step_cost)
    return {"tokens": done, "passes": passes, "per_pass": done / max(1, passes),
            "speedup": done / spent if spent else 0.0, "forced": forced}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", help="a results.json of grammarspec bench (its baseline outputs)")
    parser.add_argument("--references", action="store_true", help="replay the task file's reference answers")
    parser.add_argument("--tasks", default=None, help="task file (default: ../shared/tasks/tasks.jsonl)")
    parser.add_argument("--assistant", default="auto")
    parser.add_argument("--pass-base", type=float, default=1.3, help="fixed cost of a pass with drafts, in plain steps")
    parser.add_argument("--row-cost", type=float, default=0.03, help="cost of each row of such a pass (4 at least)")
    parser.add_argument("--split-oracle", action="store_true",
                        help="bound: count a rejected draft's text as accepted where the output spells it otherwise")
    args = parser.parse_args(argv)
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
    cost = functools.partial(pass_cost, base=args.pass_base, per_row=args.row_cost)
    for task_id, output in outputs:
        task = tasks[task_id]
        counts = replay(tokenizer, _prompt_ids(tokenizer, task), task.schema, output, args.assistant, cost,
                        args.split_oracle)  # fmt: skip
        if counts is None:
            print(f"{task_id:40s} skipped: the grammar rejects this output")
            continue
        measured = runs.get((task_id, args.assistant))
        if measured is not None and "error" not in measured:  # the bench ran this preset: its prompt pass is known
            counts["end_to_end"] = end_to_end(runs[(task_id, "baseline")], measured, counts["speedup"])
        per_category[task.category].append(counts)
        print(f"{task_id:40s} {counts['tokens']:4.0f} tokens {counts['passes']:4.0f} passes "
              f"{counts['per_pass']:5.2f} per pass, modelled {counts['speedup']:4.2f}x")  # fmt: skip
    oracle = ", split oracle" if args.split_oracle else ""
    print(f"\nassistant={args.assistant!r}{oracle}, pass cost {args.pass_base} + {args.row_cost} per row (plain steps); "
          "medians per category:")
    for category, rows in per_category.items():
        whole = [r["end_to_end"] for r in rows if "end_to_end" in r]
        print(f"  {category:12s} {len(rows):3d} tasks  {statistics.median(r['per_pass'] for r in rows):5.2f} tokens "
              f"per pass  modelled {statistics.median(r['speedup'] for r in rows):4.2f}x"
              + (f" (end to end {statistics.median(whole):4.2f}x with the bench's prompt passes)" if whole else ""))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
