"""Resident memory over many consecutive generations: it must not grow.

    .venv/bin/python tools/memory_check.py               # 300 with one schema, then 300 with different ones
    .venv/bin/python tools/memory_check.py --n 50        # a shorter run

Loads the embedded model, warms up (one schema a few times, then enough
different schemas to fill grammarspec's bounded grammar cache), then runs
``--n`` generations with the same schema and ``--n`` with different schemas
(production schemas from the corpus: ``--schemas DIR``, else
``$GRAMMARSPEC_SCHEMAS``, else the repository's ``data/schemas`` sample; topped
up with generated ones when the corpus has fewer), ``max_new_tokens`` small, the ``auto`` proposers on.  Prints resident
memory (psutil RSS) after loading, after the warm-up, after each phase and at
the end.  Exits 1 if memory grew by ``--limit-mb`` (50) or more after the
warm-up.  A script, not a timed test: run it when the decoding path changes.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from typing import Any

import psutil

SAME_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


def rss_mb() -> float:
    gc.collect()
    return psutil.Process().memory_info().rss / 2**20


def generated_schemas(n: int) -> list[dict[str, Any]]:
    """``n`` different small schemas (deterministic)."""
    kinds = [{"type": "string"}, {"type": "integer"}, {"type": "boolean"}, {"type": "number"}]
    schemas = []
    for i in range(n):
        properties = {f"field_{i}_{j}": kinds[(i + j) % 4] for j in range(2 + i % 4)}
        properties[f"choice_{i}"] = {"enum": [f"v{i}_{k}" for k in range(3 + i % 5)]}
        schemas.append(
            {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}
        )
    return schemas


def corpus_schemas(folder: str | None, n: int) -> list[dict[str, Any]]:
    """Up to ``n`` production schemas, interleaved across categories (deterministic)."""
    from grammarspec.bench.tasks import read_schema_records

    by_category: dict[str, list[dict[str, Any]]] = {}
    for record in read_schema_records(folder):
        by_category.setdefault(record["category"], []).append(record["schema"])
    groups = list(by_category.values())
    interleaved = [group[i] for i in range(max(map(len, groups), default=0)) for group in groups if i < len(group)]
    return interleaved[:n]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="RSS over consecutive generations (see the module docstring).")
    parser.add_argument("--n", type=int, default=300, help="generations per phase (default 300)")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--limit-mb", type=float, default=50.0)
    parser.add_argument("--schemas", default=None,
                        help="corpus folder for the different-schema phase (default: $GRAMMARSPEC_SCHEMAS, else "
                             "data/schemas; topped up with generated schemas)")  # fmt: skip
    parser.add_argument("--assistant", default="auto")
    args = parser.parse_args(argv)

    import torch

    import grammarspec
    from grammars import GrammarError
    from grammars.compile import GRAMMAR_CACHE_SIZE

    start = rss_mb()
    model, tokenizer = grammarspec.load_model("smollm2-135m")
    loaded = rss_mb()
    warm_count = GRAMMAR_CACHE_SIZE + 8  # fills the bounded grammar cache
    pool = corpus_schemas(args.schemas, warm_count + args.n)
    source = f"{len(pool)} production schemas"
    if len(pool) < warm_count + args.n:
        extra = warm_count + args.n - len(pool)
        pool += generated_schemas(extra)
        source += f" and {extra} generated ones"
    warm_up, different = pool[:warm_count], pool[warm_count:]
    prompt = torch.tensor([grammarspec.build_prompt(tokenizer, "Write one example JSON document.", describe=False)])
    refused = 0

    def generate(schema: dict[str, Any]) -> None:
        nonlocal refused
        try:
            grammarspec.generate(
                model, prompt, tokenizer=tokenizer, schema=schema, assistant=args.assistant,
                max_new_tokens=args.max_new_tokens,
            )  # fmt: skip
        except GrammarError:
            refused += 1

    began = time.perf_counter()
    for _ in range(8):
        generate(SAME_SCHEMA)
    for schema in warm_up:
        generate(schema)
    warmed = rss_mb()
    print(f"after loading the model: {loaded:8.1f} MB RSS (process start: {start:.1f} MB)", flush=True)
    print(f"after warm-up ({8 + len(warm_up)} generations): {warmed:8.1f} MB", flush=True)

    readings = []
    for i in range(args.n):
        generate(SAME_SCHEMA)
        if (i + 1) % 100 == 0 or i + 1 == args.n:
            readings.append((f"same schema, {i + 1}", rss_mb()))
            print(f"  {readings[-1][0]:>28}: {readings[-1][1]:8.1f} MB", flush=True)
    after_same = rss_mb()
    for i, schema in enumerate(different):
        generate(schema)
        if (i + 1) % 100 == 0 or i + 1 == len(different):
            readings.append((f"different schemas, {i + 1}", rss_mb()))
            print(f"  {readings[-1][0]:>28}: {readings[-1][1]:8.1f} MB", flush=True)
    end = rss_mb()
    growth = end - warmed
    minutes = (time.perf_counter() - began) / 60
    print()
    print(f"memory check: {args.n} generations with one schema, then {len(different)} with different ones "
          f"({source}); max_new_tokens={args.max_new_tokens}, assistant={args.assistant!r}; "
          f"{refused} schemas refused with GrammarError; {minutes:.1f} min")  # fmt: skip
    print(f"RSS after warm-up {warmed:.1f} MB, after the same-schema phase {after_same:.1f} MB "
          f"({after_same - warmed:+.1f}), at the end {end:.1f} MB ({growth:+.1f})")  # fmt: skip
    verdict = "OK" if growth < args.limit_mb else "FAIL"
    print(f"growth after warm-up: {growth:+.1f} MB (limit {args.limit_mb:.0f} MB): {verdict}")
    return 0 if verdict == "OK" else 1


if __name__ == "__main__":
    sys.exit(main())
