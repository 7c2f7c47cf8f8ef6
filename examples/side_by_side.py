"""Speculative vs plain constrained decoding, side by side, on the embedded model.

Every task runs once per arm -- plain constrained decoding (no proposer),
each proposer alone, and the ``"auto"`` preset -- greedily, so every arm must
produce the same tokens (the guarantee: speculation changes the speed, never
the output).  The table shows what each arm took: target forward passes,
tokens per pass, acceptance, time.

    .venv/bin/python examples/side_by_side.py
    .venv/bin/python examples/side_by_side.py --quick    # one task, plain vs auto (CI smoke test)

Timings on a busy machine are noisy; tokens per forward pass are not.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Any

import grammarspec

TASKS: list[dict[str, Any]] = [
    {
        "name": "extraction",
        "prompt": "Order #A-5531 from Lena Fischer (lena.fischer@example.org): 3 x USB-C cable at 9.99, "
        "1 x laptop stand at 39.50, shipped to Graz. Extract the order.",
        "schema": {
            "type": "object",
            "properties": {
                "order_id": {"type": "string"},
                "customer": {"type": "string"},
                "email": {"type": "string"},
                "city": {"type": "string"},
                "items": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "product": {"type": "string"},
                            "quantity": {"type": "integer"},
                            "price": {"type": "number"},
                        },
                        "required": ["product", "quantity", "price"],
                        "additionalProperties": False,
                    },
                    "minItems": 1,
                    "maxItems": 4,
                },
            },
            "required": ["order_id", "customer", "email", "city", "items"],
            "additionalProperties": False,
        },
    },
    {
        "name": "tool call",
        "prompt": "Book a table for 4 at Trattoria Roma tomorrow at 19:30, under the name Karim.",
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "book_table",
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "restaurant": {"type": "string"},
                            "people": {"type": "integer", "minimum": 1},
                            "time": {"type": "string"},
                            "name": {"type": "string"},
                        },
                        "required": ["restaurant", "people", "time", "name"],
                    },
                },
            },
            {
                "type": "function",
                "function": {
                    "name": "cancel_booking",
                    "parameters": {
                        "type": "object",
                        "properties": {"booking_id": {"type": "string"}},
                        "required": ["booking_id"],
                    },
                },
            },
        ],
    },
    {
        "name": "generation",
        "prompt": "List three European capitals with their country and a famous landmark.",
        "schema": {
            "type": "object",
            "properties": {
                "capitals": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "city": {"type": "string"},
                            "country": {"type": "string"},
                            "landmark": {"type": "string"},
                        },
                        "required": ["city", "country", "landmark"],
                        "additionalProperties": False,
                    },
                    "minItems": 3,
                    "maxItems": 3,
                }
            },
            "required": ["capitals"],
            "additionalProperties": False,
        },
    },
]

ARMS: list[tuple[str, Any]] = [
    ("plain", None),
    ("jump_forward", "jump_forward"),
    ("prompt_lookup", "prompt_lookup"),
    ("schema_ngram", "schema_ngram"),
    ("auto", "auto"),
]


@dataclass
class Row:
    task: str
    arm: str
    completion: Any  # grammarspec.Completion


def compare(model: Any, tokenizer: Any, tasks=TASKS, arms=ARMS, *, max_new_tokens: int = 160) -> list[Row]:
    """Run every task under every arm (greedy); returns one row per (task, arm)."""
    rows = []
    for task in tasks:
        for arm, assistant in arms:
            completion = grammarspec.complete(
                model,
                tokenizer,
                task["prompt"],
                schema=task.get("schema"),
                tools=task.get("tools"),
                assistant=assistant,
                max_new_tokens=max_new_tokens,
            )
            rows.append(Row(task["name"], arm, completion))
    return rows


def table(rows: list[Row]) -> str:
    """A plain-text table of the rows; ``same`` compares each arm's tokens with the plain arm's."""
    plain = {r.task: r.completion.tokens for r in rows if r.arm == "plain"}
    header = (
        f"{'task':<11} {'arm':<14} {'tokens':>6} {'passes':>6} {'tok/pass':>8} {'tok/s':>6} "
        f"{'accepted/proposed':>18}  same  finish"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        s = r.completion.stats
        proposed, accepted = sum(s.proposed.values()), sum(s.accepted.values())
        same = "yes" if plain.get(r.task) == r.completion.tokens else ("-" if r.task not in plain else "NO")
        lines.append(
            f"{r.task:<11} {r.arm:<14} {s.new_tokens:>6} {s.target_forwards:>6} {s.accepted_per_forward:>8.2f} "
            f"{s.tokens_per_second:>6.1f} {f'{accepted}/{proposed}':>18}  {same:<4}  {s.finish_reason}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one task, plain vs auto, fewer tokens")
    args = parser.parse_args(argv)
    quick = args.quick or os.environ.get("GRAMMARSPEC_EXAMPLES_QUICK", "") not in ("", "0")
    model, tokenizer = grammarspec.load_model("smollm2-135m")
    tasks, arms = (TASKS[1:2], [ARMS[0], ARMS[-1]]) if quick else (TASKS, ARMS)
    rows = compare(model, tokenizer, tasks, arms, max_new_tokens=64 if quick else 160)
    for task in tasks:
        print(f"{task['name']}: {next(r.completion.text for r in rows if r.task == task['name'])}")
    print()
    print(table(rows))
    diverged = [
        r
        for r in rows
        if r.completion.tokens != next(p.completion.tokens for p in rows if p.task == r.task and p.arm == "plain")
    ]
    if diverged:
        print(f"\n{len(diverged)} arm(s) diverged from plain greedy decoding (near-tied logits can do this)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
