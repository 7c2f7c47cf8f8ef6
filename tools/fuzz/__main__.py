"""``python -m tools.fuzz``: fuzz grammarspec over a schema corpus (see :mod:`tools.fuzz`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, fields
from pathlib import Path

from grammarspec.bench.tasks import TaskFileError, read_schema_records

from .checks import Check
from .corpus import stratified_slice
from .enforced import BACKENDS
from .report import read_results, summarize
from .runner import Job, RunOptions, run_isolated


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tools.fuzz",
        description="Fuzz grammarspec over a schema corpus: compile, grammar soundness, generation.",
    )
    parser.add_argument(
        "--schemas",
        default=None,
        help="corpus folder or .jsonl file (default: $GRAMMARSPEC_SCHEMAS, else the repository's data/schemas sample)",
    )
    parser.add_argument("--categories", default=None, help="comma-separated categories (default: all)")
    parser.add_argument("--per-category", type=int, default=None, help="a stratified slice: N schemas per category")
    parser.add_argument("--max-bytes", type=int, default=None, help="skip schemas larger than this (compact bytes)")
    parser.add_argument("--backends", default="xgrammar,outlines", help="comma-separated (default: both)")
    parser.add_argument(
        "--outlines-per-category",
        type=int,
        default=None,
        help="run outlines only on a stratified slice of N per category (it compiles slowly)",
    )
    parser.add_argument("--outlines-max-bytes", type=int, default=None, help="outlines only on schemas up to this size")
    parser.add_argument("--generations", type=int, default=2, help="generations per schema with xgrammar (default 2)")
    parser.add_argument("--outlines-generations", type=int, default=1, help="generations per schema with outlines")
    parser.add_argument(
        "--outlines-generate-per-category",
        type=int,
        default=None,
        help="generate with outlines only on a stratified slice of N per category",
    )
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compile-timeout", type=float, default=180.0, help="seconds per compile (default 180)")
    parser.add_argument("--job-timeout", type=float, default=900.0, help="seconds per schema and backend")
    parser.add_argument("--threads", type=int, default=0, help="torch threads in the worker (default: torch's)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--results", default="fuzz-results.jsonl", help="every check, one JSON per line")
    parser.add_argument("--out", default="FUZZ.md", help="the markdown summary")
    parser.add_argument(
        "--from-results",
        nargs="+",
        default=None,
        metavar="JSONL",
        help="only summarise existing results files (no run); a later file's run of a schema "
        "and backend replaces an earlier one's",
    )
    return parser


def _jobs(args: argparse.Namespace) -> list[Job]:
    categories = args.categories.split(",") if args.categories else None
    try:
        records = read_schema_records(args.schemas, categories)
    except TaskFileError as e:
        raise SystemExit(f"error: {e}") from None
    if args.per_category is not None or args.max_bytes is not None:
        records = stratified_slice(records, args.per_category or len(records), max_bytes=args.max_bytes)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(backends) - set(BACKENDS)
    if unknown:
        raise SystemExit(f"error: unknown backend(s) {sorted(unknown)}; choose from {', '.join(BACKENDS)}")

    def ids(per_category: int | None, max_bytes: int | None) -> set[str] | None:
        if per_category is None and max_bytes is None:
            return None
        return {r["id"] for r in stratified_slice(records, per_category or len(records), max_bytes=max_bytes)}

    outlines_ids = ids(args.outlines_per_category, args.outlines_max_bytes)
    outlines_generate = ids(args.outlines_generate_per_category, None)
    index: Counter[str] = Counter()
    jobs = []
    for backend in backends:
        for record in records:
            if backend == "outlines" and outlines_ids is not None and record["id"] not in outlines_ids:
                continue
            if backend == "xgrammar":
                count = args.generations
            else:
                count = (
                    args.outlines_generations if outlines_generate is None or record["id"] in outlines_generate else 0
                )
            key = record["category"] + backend
            jobs.append(Job(record, backend, index[key] * max(count, 1), count))
            index[key] += 1
    return jobs


def _preamble(args: argparse.Namespace, command: str, seconds: float | None) -> str:
    import importlib.metadata as md

    versions = []
    for package in ("xgrammar", "outlines-core", "transformers", "torch", "jsonschema"):
        try:
            versions.append(f"{package} {md.version(package)}")
        except md.PackageNotFoundError:
            pass
    text = f"Command: `{command}`\n\nVersions: {', '.join(versions)}."
    if seconds is not None:
        text += f" Wall time: {seconds / 60:.1f} min on {os.cpu_count()} CPU cores."
    return text


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = "python -m tools.fuzz " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.from_results:
        checks = read_results(args.from_results)
        Path(args.out).write_text(summarize(checks, preamble=_preamble(args, command, None)), encoding="utf-8")
        print(f"wrote {args.out} ({len(checks)} checks)")
        return 1 if any(c.is_bug for c in checks) else 0
    jobs = _jobs(args)
    options = RunOptions(**{f.name: getattr(args, f.name) for f in fields(RunOptions)})  # each has its flag
    results_path = Path(args.results)
    started = time.monotonic()
    done = Counter()
    with results_path.open("w", encoding="utf-8") as sink:

        def record_checks(checks: list[Check]) -> None:
            for c in checks:
                sink.write(json.dumps(asdict(c), ensure_ascii=False) + "\n")
                if c.is_bug or c.outcome == "timeout":
                    print(f"  !! {c.record} {c.backend} {c.kind}: {c.outcome} {c.detail[:200]}", file=sys.stderr)
            sink.flush()
            if checks and checks[0].kind == "compile":
                done[checks[0].backend] += 1
                n = sum(done.values())
                print(
                    f"[{n}/{len(jobs)} {time.monotonic() - started:.0f}s] {checks[0].record} {checks[0].backend}: "
                    f"{checks[0].outcome} ({checks[0].seconds:.1f}s)",
                    file=sys.stderr,
                    flush=True,
                )

        checks = run_isolated(jobs, options, record_checks)
    report = summarize(checks, preamble=_preamble(args, command, time.monotonic() - started))
    Path(args.out).write_text(report, encoding="utf-8")
    bugs = sum(c.is_bug for c in checks)
    print(f"wrote {args.out} and {results_path}: {len(checks)} checks, {bugs} bugs")
    return 1 if bugs else 0


if __name__ == "__main__":
    sys.exit(main())
