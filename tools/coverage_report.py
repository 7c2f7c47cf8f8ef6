"""Schema coverage in JSONSchemaBench's terms, per category and grammar backend.

    python tools/coverage_report.py --corpus /path/to/schemas --out docs/COVERAGE.md \
        --generate-per-category 4 --max-new-tokens 96

Two passes over the corpus records (``<category>.jsonl`` files; each has
``schema``, ``examples`` and ``invalid_examples``), with the SmolLM2
tokenizer, for xgrammar, outlines, llguidance and auto:

* **grammar pass** (no model, every record, or ``--per-category N``): declared
  coverage (the schema compiles within ``--compile-timeout`` seconds; each
  (record, backend) runs in a worker process that is killed past it), compile
  time, mask time per token (``fill_mask`` + ``accept`` over the tokens of
  the first valid example, first walk on a fresh matcher), the invalid
  examples each backend accepts, and the unenforced features it reports;
* **generation pass** (``--generate-per-category N`` records per category):
  SmolLM2-135M, greedy, ``max_new_tokens``; empirical coverage = the
  finished output validates against the full schema
  (:func:`grammars.validation.output_errors`); an output cut by the token
  limit counts as not covered and is counted separately.  Compliance =
  empirical / declared (over the generated records).

Writes the markdown tables, a JSONL of every measurement and a plot.  This is
a tool, not part of the runtime package.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grammars.registry import BACKEND_CHOICES  # noqa: E402
from grammarspec.bench.tasks import default_schemas_path  # noqa: E402 (after the path set-up)

#: Every registered backend, and "auto".
BACKENDS = BACKEND_CHOICES


def load_records(folder: Path, per_category: int | None) -> list[dict[str, Any]]:
    """Records of ``folder/*.jsonl``; with ``per_category``, an evenly spaced slice of each category."""
    records: list[dict[str, Any]] = []
    for path in sorted(folder.glob("*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if per_category is not None and len(rows) > per_category:
            step = len(rows) / per_category
            rows = [rows[int(i * step)] for i in range(per_category)]
        records += rows
    return records


# --- grammar pass (worker process) ------------------------------------------------------


def _grammar_measure(record: dict[str, Any], backend: str, tokenizer: Any, timeout: float = 30.0) -> dict[str, Any]:
    import warnings

    import torch

    from grammars import GrammarError, allocate_bitmask, compile_grammar, grammar_spec

    out: dict[str, Any] = {"id": record["id"], "category": record["category"], "backend": backend}
    started = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            spec = grammar_spec(schema=record["schema"])
            # auto: each backend it tries gets a third of the budget, so a slow one is given up for the next
            per_backend = timeout / 3 if backend == "auto" else None
            compiled = compile_grammar(spec, tokenizer, backend=backend, compile_timeout=per_backend)
    except GrammarError as e:
        out.update(declared=False, error=str(e)[:300], compile_s=time.perf_counter() - started)
        return out
    out.update(
        declared=True,
        compile_s=time.perf_counter() - started,
        chosen=compiled.backend,
        reason=compiled.backend_reason,
        unenforced=list(compiled.unenforced),
    )
    eos = compiled.stop_token_ids[0]
    examples = record.get("examples") or []
    if examples:
        tokens = tokenizer.encode(
            json.dumps(examples[0], separators=(",", ":"), ensure_ascii=False), add_special_tokens=False
        )
        matcher = compiled.matcher()
        mask = allocate_bitmask(1, compiled.vocab_size)
        times = []
        for token in tokens:
            t0 = time.perf_counter()
            matcher.fill_mask(mask, 0)
            ok = matcher.accept(token)
            times.append(time.perf_counter() - t0)
            if not ok:
                break
        out["mask_us"] = [round(t * 1e6, 1) for t in times]
    accepted = 0
    for bad in record.get("invalid_examples") or []:
        tokens = tokenizer.encode(json.dumps(bad, separators=(",", ":"), ensure_ascii=False), add_special_tokens=False)
        if compiled.matcher().validate(tokens + [eos]) == len(tokens) + 1:
            accepted += 1
    out["invalid_total"] = len(record.get("invalid_examples") or [])
    out["invalid_accepted"] = accepted
    del torch
    return out


def _worker(conn: Any) -> None:
    from grammarspec.model.loading import load_tokenizer

    tokenizer = load_tokenizer("smollm2-135m")
    conn.send("ready")
    while True:
        job = conn.recv()
        if job is None:
            return
        record, backend, timeout = job
        try:
            conn.send(_grammar_measure(record, backend, tokenizer, timeout))
        except Exception as e:  # noqa: BLE001 - reported as a crash row
            conn.send(
                {
                    "id": record["id"],
                    "category": record["category"],
                    "backend": backend,
                    "declared": False,
                    "error": f"crash: {type(e).__name__}: {e}"[:300],
                }
            )


def grammar_pass(records: list[dict[str, Any]], backends: tuple[str, ...], timeout: float) -> list[dict[str, Any]]:
    """One worker process; a job past ``timeout`` seconds kills it (declared False, ``timeout``)."""
    ctx = mp.get_context("spawn")
    rows: list[dict[str, Any]] = []
    worker = None
    parent = None

    def start() -> tuple[Any, Any]:
        a, b = ctx.Pipe()
        p = ctx.Process(target=_worker, args=(b,), daemon=True)
        p.start()
        assert a.recv() == "ready"
        return p, a

    for backend in backends:
        for record in records:
            if worker is None:
                worker, parent = start()
            parent.send((record, backend, timeout))
            if parent.poll(timeout):
                rows.append(parent.recv())
            else:
                worker.kill()
                worker.join()
                worker = None
                rows.append(
                    {
                        "id": record["id"],
                        "category": record["category"],
                        "backend": backend,
                        "declared": False,
                        "error": f"timeout: no compile within {timeout:g} s",
                        "compile_s": timeout,
                        "timeout": True,
                    }
                )
            print(f"[grammar] {backend} {len(rows)}/{len(records) * len(backends)}", file=sys.stderr, flush=True)
    if worker is not None:
        parent.send(None)
        worker.join(5)
    return rows


# --- generation pass ----------------------------------------------------------------------


def generation_pass(
    records: list[dict[str, Any]], backends: tuple[str, ...], max_new_tokens: int, log: Any = None
) -> list[dict[str, Any]]:
    """Generate once per (record, backend); every row is also written to ``log`` (a text file) as it is made."""
    import warnings

    import torch

    from grammars import GrammarError, compile_grammar, grammar_spec
    from grammars.validation import output_errors
    from grammarspec import complete, load_model
    from tools.fuzz.corpus import fuzz_prompt

    model, tokenizer = load_model("smollm2-135m")
    rows = []
    done: dict[tuple[str, str], dict[str, Any]] = {}
    order = sorted(backends, key=lambda b: b == "auto")  # auto last: it reuses the run of the backend it picks
    for backend in order:
        for record in records:
            row: dict[str, Any] = {"id": record["id"], "category": record["category"], "backend": backend}
            if backend == "auto":  # greedy and the same grammar: the chosen backend's run is auto's run
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        chosen = compile_grammar(
                            grammar_spec(schema=record["schema"]),
                            tokenizer,
                            vocab_size=model.config.vocab_size,
                            backend="auto",
                            compile_timeout=60,
                        ).backend
                except GrammarError as e:
                    row.update(declared=False, error=str(e)[:200])
                    rows.append(row)
                    continue
                if (record["id"], chosen) in done:
                    rows.append({**done[record["id"], chosen], "backend": "auto", "chosen": chosen, "reused": True})
                    if log is not None:
                        log.write(json.dumps({"pass": "generate", **rows[-1]}) + "\n")
                        log.flush()
                    continue
            prompt, system, quote = fuzz_prompt(record)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    c = complete(
                        model,
                        tokenizer,
                        prompt,
                        system=system,
                        schema=record["schema"],
                        describe=quote,
                        max_new_tokens=max_new_tokens,
                        grammar_backend=backend,
                        compile_timeout=60,
                    )
            except GrammarError as e:
                row.update(declared=False, error=str(e)[:200])
                rows.append(row)
                continue
            s = c.stats
            errors = output_errors(record["schema"], c.text) if c.finish_reason == "stop" else ["cut"]
            row.update(declared=True, finish=c.finish_reason, valid=not errors, errors=errors[:3])
            row.update({column: getattr(s, field) for column, field in _STATS_COLUMNS.items()})
            rows.append(row)
            done[record["id"], backend] = row
            if log is not None:
                log.write(json.dumps({"pass": "generate", **row}) + "\n")
                log.flush()
            print(
                f"[generate] {backend} {record['id'][:50]} {c.finish_reason} valid={row['valid']}",
                file=sys.stderr,
                flush=True,
            )
    del torch
    return rows


def auto_from_chosen(grammar_rows: list[dict[str, Any]], gen_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Auto's generation rows from the backend auto chose in the grammar pass.

    Greedy decoding with the same compiled grammar gives the same output, so
    auto's run on a record is the chosen backend's run; this replaces the
    auto rows of the generation pass (which used the capability tables of the
    time it ran) with those of the final tables.  Records auto does not
    compile stay undeclared.
    """
    chosen = {r["id"]: r.get("chosen") for r in grammar_rows if r["backend"] == "auto"}
    if not chosen:
        return gen_rows
    by_key = {(r["id"], r["backend"]): r for r in gen_rows if r["backend"] != "auto"}
    out = [r for r in gen_rows if r["backend"] != "auto"]
    for record_id in dict.fromkeys(r["id"] for r in gen_rows):
        base = next(r for r in gen_rows if r["id"] == record_id)
        pick = chosen.get(record_id)
        if pick is None:
            out.append({"id": record_id, "category": base["category"], "backend": "auto", "declared": False})
        elif (record_id, pick) in by_key:
            out.append({**by_key[record_id, pick], "backend": "auto", "chosen": pick})
    return out


def target_step_seconds(tokens: int = 64) -> float:
    """Median seconds of one plain decoding step of SmolLM2-135M (KV cache, batch 1) on this machine."""
    import torch

    from grammarspec import load_model

    model, tokenizer = load_model("smollm2-135m")
    ids = torch.tensor([tokenizer.encode("Write a JSON object about a cat:")])
    times = []
    with torch.no_grad():
        out = model(ids, use_cache=True)
        past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        for _ in range(tokens):
            t0 = time.perf_counter()
            out = model(nxt, past_key_values=past, use_cache=True)
            times.append(time.perf_counter() - t0)
            past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
    return statistics.median(times)


# --- report --------------------------------------------------------------------------------


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


#: A generation row's columns read from its GenerationStats: column -> stats field.
_STATS_COLUMNS = {
    "stats_valid": "valid",
    "tokens": "new_tokens",
    "forwards": "target_forwards",
    "grammar_s": "grammar_seconds",
    "verify_s": "verify_seconds",
    "total_s": "total_seconds",
    "chosen": "grammar_backend",
    "unenforced": "unenforced_keywords",
}


def _heading(title: str, columns: str) -> list[str]:
    """A markdown table's title, header row and separator row; ``columns`` are separated by `` | ``."""
    return [f"### {title}", "", f"| {columns} |", "|" + "---|" * len(columns.split(" | "))]


def _groups(rows: list[dict[str, Any]], cats: list[str]) -> Iterator[tuple[str, str, list[dict[str, Any]]]]:
    """(category, backend, its rows) for each category and then "all", each backend, where there are rows."""
    for cat in cats + ["all"]:
        for backend in BACKENDS:
            group = [r for r in rows if r["backend"] == backend and (cat == "all" or r["category"] == cat)]
            if group:
                yield cat, backend, group


def tables(
    grammar_rows: list[dict[str, Any]],
    gen_rows: list[dict[str, Any]],
    step_s: float | None,
    reference_step_s: float | None = None,
) -> str:
    cats = sorted({r["category"] for r in grammar_rows} | {r["category"] for r in gen_rows})
    out = _heading(
        "Grammar pass (no model)",
        "category | backend | schemas | declared | timeouts | compile p50 ms | compile p99 ms | "
        "mask+accept p50 µs/token | p99 µs/token | invalid accepted | reports unenforced",
    )
    for cat, backend, rows in _groups(grammar_rows, cats):
        ok = [r for r in rows if r.get("declared")]
        comp = [r["compile_s"] * 1e3 for r in ok]
        mask = [t for r in ok for t in r.get("mask_us", [])]
        inv_total = sum(r.get("invalid_total", 0) for r in ok)
        inv_acc = sum(r.get("invalid_accepted", 0) for r in ok)
        out.append(
            f"| {cat} | {backend} | {len(rows)} | {len(ok)} ({len(ok) / len(rows):.0%}) | "
            f"{sum(1 for r in rows if r.get('timeout'))} | {_pct(comp, 0.5):.0f} | {_pct(comp, 0.99):.0f} | "
            f"{_pct(mask, 0.5):.0f} | {_pct(mask, 0.99):.0f} | {inv_acc}/{inv_total} | "
            f"{sum(1 for r in ok if r.get('unenforced'))} |"
        )
    if gen_rows:
        out += [""] + _heading(
            "Generation pass (SmolLM2-135M, greedy)",
            "category | backend | schemas | declared | empirical (valid) | compliance | cut by the limit | "
            "finished but invalid | stats.valid agrees",
        )
        for cat, backend, rows in _groups(gen_rows, cats):
            dec = [r for r in rows if r.get("declared")]
            valid = [r for r in dec if r.get("valid")]
            cut = [r for r in dec if r.get("finish") != "stop"]
            bad = [r for r in dec if r.get("finish") == "stop" and not r.get("valid")]
            agree = sum(1 for r in dec if bool(r.get("stats_valid")) == bool(r.get("valid")))
            out.append(
                f"| {cat} | {backend} | {len(rows)} | {len(dec)} | {len(valid)} ({len(valid) / len(rows):.0%}) | "
                f"{(len(valid) / len(dec) if dec else 0):.0%} | {len(cut)} | {len(bad)} | {agree}/{len(dec)} |"
            )
    for label, step in (("measured during this run", step_s), ("reference", reference_step_s)):
        if not step:
            continue
        out += [""] + _heading(
            f"Grammar share of a target step ({label}: plain SmolLM2-135M step {step * 1e3:.1f} ms)",
            "backend | mask+accept mean µs/token | share (mean) | p50 µs | share p50 | p99 µs | share p99",
        )
        for backend in BACKENDS:
            mask = [
                t for r in grammar_rows if r["backend"] == backend and r.get("declared") for t in r.get("mask_us", [])
            ]
            if mask:
                mean, p50, p99 = statistics.fmean(mask), _pct(mask, 0.5), _pct(mask, 0.99)
                us = step * 1e6
                out.append(
                    f"| {backend} | {mean:.0f} | {mean / us:.2%} | {p50:.0f} | {p50 / us:.2%} | {p99:.0f} | "
                    f"{p99 / us:.2%} |"
                )
    return "\n".join(out) + "\n"


def plot(grammar_rows: list[dict[str, Any]], gen_rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cats = sorted({r["category"] for r in grammar_rows})
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.2
    for i, backend in enumerate(BACKENDS):
        declared = []
        for cat in cats:
            rows = [r for r in grammar_rows if r["backend"] == backend and r["category"] == cat]
            declared.append(sum(1 for r in rows if r.get("declared")) / len(rows) if rows else 0)
        axes[0].bar([x + i * width for x in range(len(cats))], declared, width, label=backend)
        if gen_rows:
            empirical = []
            for cat in cats:
                rows = [r for r in gen_rows if r["backend"] == backend and r["category"] == cat]
                empirical.append(sum(1 for r in rows if r.get("valid")) / len(rows) if rows else 0)
            axes[1].bar([x + i * width for x in range(len(cats))], empirical, width, label=backend)
    for ax, title in zip(axes, ("declared coverage (compiles)", "empirical coverage (valid output)")):
        ax.set_xticks([x + 1.5 * width for x in range(len(cats))], cats, rotation=30, ha="right")
        ax.set_ylim(0, 1.05)
        ax.set_title(title)
    axes[0].legend(loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--corpus",
        default=str(default_schemas_path()),
        help="folder of <category>.jsonl (default: $GRAMMARSPEC_SCHEMAS or data/schemas)",
    )
    parser.add_argument("--per-category", type=int, default=None, help="grammar pass on N records per category")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--compile-timeout", type=float, default=30.0)
    parser.add_argument("--generate-per-category", type=int, default=0)
    parser.add_argument("--generate-backends", default=",".join(BACKENDS))
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--results", default="/tmp/coverage.jsonl", help="every measurement, one JSON per line")
    parser.add_argument("--plot", default=None, help="PNG path for the plot")
    parser.add_argument("--out", default=None, help="markdown file for the tables (default: stdout)")
    parser.add_argument(
        "--reference-step-ms",
        type=float,
        default=None,
        help="also give the grammar's share of a plain step of this many ms",
    )
    parser.add_argument(
        "--from-results",
        nargs="*",
        default=None,
        help="only render the tables (and plot) from these JSONL result files",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.from_results is not None:
        rows = [json.loads(line) for path in args.from_results for line in open(path) if line.strip()]
        grammar_rows = [r for r in rows if r.get("pass") == "grammar"]
        gen_rows = [r for r in rows if r.get("pass") == "generate"]
        steps = [r["seconds"] for r in rows if r.get("pass") == "step"]
        gen_rows = auto_from_chosen(grammar_rows, gen_rows)
        reference = args.reference_step_ms / 1e3 if args.reference_step_ms else None
        return _report(args, grammar_rows, gen_rows, steps[0] if steps else None, reference)
    corpus = Path(args.corpus)
    backends = tuple(b for b in args.backends.split(",") if b)
    grammar_rows = grammar_pass(load_records(corpus, args.per_category), backends, args.compile_timeout)
    gen_rows: list[dict[str, Any]] = []
    step_s = None
    if args.generate_per_category:
        gen_backends = tuple(b for b in args.generate_backends.split(",") if b)
        with open(args.results + ".partial", "w") as log:
            step_s = target_step_seconds()
            log.write(json.dumps({"pass": "step", "seconds": step_s}) + "\n")
            gen_rows = generation_pass(
                load_records(corpus, args.generate_per_category), gen_backends, args.max_new_tokens, log
            )
    with open(args.results, "w") as f:
        for row in grammar_rows:
            f.write(json.dumps({"pass": "grammar", **row}) + "\n")
        for row in gen_rows:
            f.write(json.dumps({"pass": "generate", **row}) + "\n")
        if step_s:
            f.write(json.dumps({"pass": "step", "seconds": step_s}) + "\n")
    return _report(args, grammar_rows, gen_rows, step_s)


def _report(
    args: argparse.Namespace,
    grammar_rows: list[dict[str, Any]],
    gen_rows: list[dict[str, Any]],
    step_s: float | None,
    reference_step_s: float | None = None,
) -> int:
    """Write the tables to ``--out`` (else print them) and the plot to ``--plot``; the exit status."""
    text = tables(grammar_rows, gen_rows, step_s, reference_step_s)
    if args.plot:
        plot(grammar_rows, gen_rows, Path(args.plot))
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
