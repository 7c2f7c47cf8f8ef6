"""Resident memory over many calls on every grammar backend: after a warm-up it must stay flat.

    .venv/bin/python tools/memory_check.py --schemas /path/to/corpus --calls 1000 --plot docs/memory.png
    .venv/bin/python tools/memory_check.py --generate --calls 84   # with the embedded model, 16 new tokens a call
    .venv/bin/python tools/memory_check.py --calls 100             # a short run over data/schemas

One process cycles through the schemas (``--schemas DIR``, else
``$GRAMMARSPEC_SCHEMAS``, else the repository's ``data/schemas`` sample) and
the backends (``--backends``, default xgrammar, outlines, llguidance and
auto), one call per (schema, backend): compile with ``compile_timeout``
(timeouts and refusals count as calls: they must not leak either), then, for
a grammar that compiled, a matcher that walks the schema's first example and
fills a mask per token -- or, with ``--generate``, a 16-token generation with
the embedded model.  The grammar cache is bounded (``--cache-mb``), so the
calls keep compiling.

Resident memory (psutil RSS) is read after every call; the peak is the
kernel's high-water mark (``ru_maxrss``); ``--csv`` also writes the caches'
entries and estimated MB (``grammars.cache_info``) and glibc's heap in use and
free (``mallinfo2``; free pages may or may not be resident).  At the end of
the warm-up (``--warm-up`` calls, default: the first tenth) and at the end,
the caches are emptied (``clear_grammar_cache``) and RSS read: that floor
growing by ``--limit-mb`` (50) or more fails (exit 1), as does a reading after
the warm-up more than ``--limit-mb`` above the floor plus the caches'
estimated bytes for two calls in a row (the caches' contents move RSS within
their bound; nothing else may), and a peak over ``--peak-limit-mb`` when
given.  ``--plot FILE`` draws RSS against calls (matplotlib), with the floor
plus the caches' estimate.  A script, not a timed test: tests/grammars/test_memory.py
runs a short version of the same loop.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import resource
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grammars.registry import BACKEND_CHOICES  # noqa: E402 (after the path set-up)

#: Every registered backend, and "auto".
BACKENDS = BACKEND_CHOICES


def rss_mb() -> float:
    gc.collect()
    return psutil.Process().memory_info().rss / 2**20


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def heap_mb() -> tuple[float, float]:
    """glibc's heap (``mallinfo2``, every arena): MB in use (``uordblks + hblkhd``), MB free but kept (``fordblks``).

    ``(nan, nan)`` where there is no ``mallinfo2`` (not glibc, or glibc before 2.33).
    """
    try:
        info = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return float("nan"), float("nan")
    info.restype = _Mallinfo2
    m = info()
    return (m.uordblks + m.hblkhd) / 2**20, m.fordblks / 2**20


#: The columns ``--csv`` writes after every call.
CSV_COLUMNS = (
    "call",
    "rss_mb",
    "backend",
    "grammars",
    "grammar_mb",
    "tokenizers",
    "tokenizer_mb",
    "heap_used_mb",
    "heap_free_mb",
)


def csv_row(call: int, rss: float, backend: str) -> str:
    """One ``--csv`` line: RSS, the caches' entries and estimated MB (``grammars.cache_info``), the glibc heap."""
    from grammars import cache_info

    info = cache_info()
    used, free = heap_mb()
    return (
        f"{call},{rss:.1f},{backend},{info['grammars']},{info['grammar_bytes'] / 2**20:.1f},"
        f"{info['tokenizers']},{info['tokenizer_bytes'] / 2**20:.1f},{used:.1f},{free:.1f}"
    )


@dataclass
class Outcome:
    """What one call did."""

    compiled: int = 0
    refused: int = 0
    timed_out: int = 0


def schema_records(folder: str | None, limit: int | None = None) -> list[dict[str, Any]]:
    """Schema records of the corpus, interleaved across categories (deterministic)."""
    from grammarspec.bench.tasks import read_schema_records

    by_category: dict[str, list[dict[str, Any]]] = {}
    for record in read_schema_records(folder):
        by_category.setdefault(record["category"], []).append(record)
    groups = list(by_category.values())
    interleaved = [group[i] for i in range(max(map(len, groups), default=0)) for group in groups if i < len(group)]
    return interleaved[:limit] if limit else interleaved


def grammar_call(
    record: dict[str, Any], backend: str, tokenizer: Any, compile_timeout: float, outcome: Outcome
) -> None:
    """Compile one schema on one backend, then walk its first example with a matcher, filling masks."""
    from grammars import CompileTimeout, GrammarError, allocate_bitmask, compile_grammar, grammar_spec

    try:
        with warnings.catch_warnings():  # unknown-keyword and unenforced-feature warnings: not the subject here
            warnings.simplefilter("ignore")
            spec = grammar_spec(schema=record["schema"])
            compiled = compile_grammar(spec, tokenizer, backend=backend, compile_timeout=compile_timeout)
    except CompileTimeout:
        outcome.timed_out += 1
        return
    except GrammarError:
        outcome.refused += 1
        return
    outcome.compiled += 1
    examples = record.get("examples") or []
    text = json.dumps(examples[0], separators=(",", ":")) if examples else ""
    matcher = compiled.matcher(max_rollback=8)
    mask = allocate_bitmask(1, compiled.vocab_size)
    for token in tokenizer.encode(text, add_special_tokens=False)[:64]:
        matcher.fill_mask(mask, 0)
        if not matcher.accept(token):
            break


def slow_schema(i: int) -> dict[str, Any]:
    """A schema outlines-core takes seconds to compile (300 patterned strings); ``i`` makes it new each time.

    300, not 30: a quiet machine compiled 30 of them on the toy vocabulary within the 0.05 s deadline.
    """
    pattern = {"type": "string", "pattern": "^[a-z]{2,9}$"}
    return {"type": "object", "properties": {f"k{i}_{j}": pattern for j in range(300)}}


def calls(records: list[dict[str, Any]], backends: tuple[str, ...], n: int) -> Iterator[tuple[dict[str, Any], str]]:
    """``n`` (record, backend) pairs: every backend on a schema, then the next schema, round and round."""
    i = 0
    while i < n:
        for record in records:
            for backend in backends:
                if i == n:
                    return
                yield record, backend
                i += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="RSS over many grammar calls (see the module docstring).")
    parser.add_argument("--calls", type=int, default=1000, help="calls in all (default 1000)")
    parser.add_argument(
        "--schemas", default=None, help="corpus folder (default: $GRAMMARSPEC_SCHEMAS, else data/schemas)"
    )
    parser.add_argument("--max-schemas", type=int, default=None, help="use only the first N schemas")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--compile-timeout", type=float, default=20.0)
    parser.add_argument("--cache-mb", type=float, default=256.0, help="grammar cache bound in MiB (default 256)")
    parser.add_argument("--cache-count", type=int, default=None, help="grammar cache bound in entries (default 64)")
    parser.add_argument(
        "--slow-every",
        type=int,
        default=0,
        help="every Nth call also compiles a new slow grammar on outlines with a 0.05 s deadline "
        "(a timeout that kills a worker; default: never)",
    )
    parser.add_argument("--warm-up", type=int, default=None, help="calls before the baseline (default: a tenth)")
    parser.add_argument("--limit-mb", type=float, default=50.0)
    parser.add_argument("--peak-limit-mb", type=float, default=None)
    parser.add_argument("--generate", action="store_true", help="generate 16 tokens with the embedded model instead")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--plot", default=None, help="write RSS against calls to this image (matplotlib)")
    parser.add_argument("--csv", default=None, help="write a line after every call to this file (columns: CSV_COLUMNS)")
    parser.add_argument(
        "--plot-from",
        default=None,
        help="only plot a --csv file written by an earlier (possibly unfinished) run into --plot",
    )
    parser.add_argument("--tokenizer", default="smollm2-135m", help="'smollm2-135m' (default) or 'toy' (tests)")
    args = parser.parse_args(argv)
    backends = tuple(b for b in args.backends.split(",") if b)
    if args.plot_from:
        rows = [line.split(",") for line in Path(args.plot_from).read_text().split()[1:]]
        readings_from = [float(row[1]) for row in rows]
        warm_from = args.warm_up if args.warm_up is not None else max(1, len(readings_from) // 10)
        plot(readings_from, warm_from, args.plot, f"{len(readings_from)} calls ({args.plot_from})")
        return 0

    from grammars import CompileTimeout, GrammarError, cache_info, clear_grammar_cache, set_cache_limits

    set_cache_limits(grammar_mb=args.cache_mb, grammar_count=args.cache_count)
    start = rss_mb()
    model = prompt = None
    if args.generate:
        import torch

        import grammarspec

        model, tokenizer = grammarspec.load_model("smollm2-135m")
        prompt = torch.tensor([grammarspec.build_prompt(tokenizer, "Write one example JSON document.", describe=False)])
    elif args.tokenizer == "toy":
        sys.path.insert(0, str(ROOT / "tests"))
        from toy import toy_byte_level_tokenizer

        tokenizer = toy_byte_level_tokenizer()
    else:
        from grammarspec.model.loading import load_tokenizer

        tokenizer = load_tokenizer(args.tokenizer)
    loaded = rss_mb()
    records = schema_records(args.schemas, args.max_schemas)
    outcome = Outcome()
    readings: list[float] = []
    held: list[float] = []  # the caches' estimated MB after each call
    warm = max(1, min(args.warm_up if args.warm_up is not None else args.calls // 10, args.calls))
    floor_warm = floor_end = 0.0
    first_eviction = None
    began = time.perf_counter()
    log = open(args.csv, "w") if args.csv else None  # closed below
    if log:
        log.write(",".join(CSV_COLUMNS) + "\n")
    for i, (record, backend) in enumerate(calls(records, backends, args.calls)):
        before = cache_info()
        if args.generate:
            import grammarspec

            try:
                grammarspec.generate(
                    model,
                    prompt,
                    tokenizer=tokenizer,
                    schema=record["schema"],
                    grammar_backend=backend,
                    compile_timeout=args.compile_timeout,
                    max_new_tokens=args.max_new_tokens,
                )
                outcome.compiled += 1
            except CompileTimeout:
                outcome.timed_out += 1
            except GrammarError:
                outcome.refused += 1
        else:
            grammar_call(record, backend, tokenizer, args.compile_timeout, outcome)
        if args.slow_every and (i + 1) % args.slow_every == 0:
            slow = {"schema": slow_schema(i), "examples": []}
            grammar_call(slow, "outlines", tokenizer, 0.05, outcome)
        readings.append(rss_mb())
        info = cache_info()
        held.append((info["grammar_bytes"] + info["tokenizer_bytes"]) / 2**20)
        shrank = info["grammars"] < before["grammars"] or info["grammar_bytes"] < before["grammar_bytes"]
        if first_eviction is None and shrank:  # the grammar cache reached a bound
            first_eviction = i + 1
        if log:
            log.write(csv_row(i + 1, readings[-1], backend) + "\n")
            log.flush()
        if (i + 1) % 50 == 0:
            print(f"  call {i + 1:5d}: {readings[-1]:8.1f} MB RSS, peak {peak_mb():8.1f} MB", flush=True)
        if i + 1 == warm:  # the memory that is not the caches': what must not grow from here on
            clear_grammar_cache()
            floor_warm = rss_mb()
    clear_grammar_cache()
    floor_end = rss_mb()
    if log:
        log.close()
    n = len(readings)
    baseline = readings[warm - 1]
    end = readings[-1]
    after = readings[warm:] or [end]
    # After the warm-up every reading should be the emptied floor plus the caches' contents, which their estimate
    # covers: what stays above that for two readings in a row (a grammar the call itself still held, such as one
    # larger than the whole cache bound -- returned, not kept -- is trimmed by the next call).
    above = [r - floor_warm - h for r, h in zip(readings[warm:], held[warm:])]
    beyond = max((min(a, b) for a, b in zip(above, above[1:])), default=above[0] if above else 0.0)
    minutes = (time.perf_counter() - began) / 60
    print()
    print(
        f"memory check: {n} calls over {len(records)} schemas x {', '.join(backends)}; "
        f"{'generate ' + str(args.max_new_tokens) + ' tokens' if args.generate else 'compile + matcher walk'}; "
        f"compile_timeout={args.compile_timeout:g} s, grammar cache {args.cache_mb:g} MiB; "
        f"{outcome.compiled} compiled, {outcome.refused} refused, {outcome.timed_out} timed out; {minutes:.1f} min"
    )
    print(
        f"RSS: process start {start:.1f} MB, after loading {loaded:.1f} MB, after the warm-up ({warm} calls) "
        f"{baseline:.1f} MB, max after it {max(after):.1f} MB, at the end {end:.1f} MB; peak {peak_mb():.1f} MB"
    )
    print(
        f"grammar cache: first eviction at call {first_eviction or '-'}; caches' estimate after the warm-up "
        f"{min(held[warm:] or [0]):.1f} to {max(held[warm:] or [0]):.1f} MB"
    )
    print(
        f"RSS with the caches emptied (clear_grammar_cache): after the warm-up {floor_warm:.1f} MB, "
        f"at the end {floor_end:.1f} MB"
    )
    growth = floor_end - floor_warm
    bounded = beyond < args.limit_mb
    ok = growth < args.limit_mb and bounded and (args.peak_limit_mb is None or peak_mb() < args.peak_limit_mb)
    print(
        f"after the warm-up, RSS above the emptied floor plus the caches' estimated bytes: at most {max(above or [0]):+.1f} MB, "
        f"{beyond:+.1f} MB for two calls in a row (limit {args.limit_mb:.0f} MB): {'OK' if bounded else 'FAIL'}"
    )
    print(
        f"growth after warm-up: {growth:+.1f} MB (limit {args.limit_mb:.0f} MB)"
        + (f"; peak limit {args.peak_limit_mb:.0f} MB" if args.peak_limit_mb else "")
        + f": {'OK' if ok else 'FAIL'}"
    )
    if args.plot:
        ceiling = [floor_warm + h for h in held]
        plot(readings, warm, args.plot, f"{n} calls, {len(records)} schemas x {len(backends)} backends", ceiling)
    return 0 if ok else 1


def plot(readings: list[float], warm: int, path: str, title: str, ceiling: list[float] | None = None) -> None:
    """RSS against calls, the warm-up shaded; ``ceiling``: the emptied floor plus the caches' estimated bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot(range(1, len(readings) + 1), readings, lw=1.2, label="RSS")
    if ceiling:
        calls_after = range(warm + 1, len(ceiling) + 1)
        ax.plot(
            calls_after, ceiling[warm:], lw=0.8, ls="--", color="0.4", label="floor after warm-up + caches' estimate"
        )
    ax.axvspan(0, warm, color="0.9", label="warm-up")
    ax.set_xlabel("call")
    ax.set_ylabel("resident memory (MB)")
    ax.set_ylim(0, max(readings + (ceiling or [])) * 1.15)
    ax.set_title(f"tools/memory_check.py: {title}")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
