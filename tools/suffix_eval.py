"""Our index of earlier outputs against arctic-inference's suffix tree (vLLM's ``suffix`` method), same streams.

Feeds :class:`proposers.suffix_index.SuffixIndex` and Snowflake's
``SuffixDecodingCache`` the same token streams: JSON answers for every schema
of the task file (seeded variations of each task's reference answer; for a
tool set, now and then another of its tools drawn from the schema), tokenized
with the embedded model's tokenizer and interleaved across schemas the way a
server's traffic arrives.  It reports microseconds to add a finished output and
per lookup (a proposal of up to 8 tokens at every position of held-out outputs,
decoded token by token); how many tokens each first proposal gets right (the
accepted length of a greedy chain) and the target passes that makes; the
resident-set growth at 1k, 5k and 10k outputs, each structure in a fresh
process (arctic's tree lives in C++, where ``tracemalloc`` cannot see it), ours
under a small byte cap against arctic under count bounds (its only bound); and
arctic's licence and install weight.  Drafts are not cut by a grammar here (the
loop cuts every source's the same way).  Timings depend on the machine's load,
which the report records.  Needs ``arctic-inference`` (in the vLLM environment)::

    PYTHONPATH=$PWD /work/main/.venv-vllm/bin/python tools/suffix_eval.py --out suffix_eval.md
    PYTHONPATH=$PWD /work/main/.venv-vllm/bin/python tools/suffix_eval.py --quick
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grammarspec.bench.tasks import load_tasks  # noqa: E402
from proposers.suffix_index import SuffixIndex  # noqa: E402
from tools.suffix_eval_data import Stream, documents, streams  # noqa: E402

#: How long a chain each structure proposes (the speculative step's draft length).
DRAFT_TOKENS = 8
#: vLLM's defaults for its ``suffix`` method (SpeculativeConfig.suffix_decoding_*).
ARCTIC_DEPTH, ARCTIC_CACHED, ARCTIC_SPEC_FACTOR, ARCTIC_MIN_PROB = 24, 10_000, 1.0, 0.1
#: How many answers one "long output" of the count-bound check strings together.
LONGER = 4
#: The server's default byte cap for our index (``grammarspec serve --draft-memory-mb``).
OURS_DEFAULT_BYTES = 256 << 20

MISSING_ARCTIC = (
    "suffix_eval needs arctic-inference, not importable here ({error}). It is in the vLLM environment: run "
    "PYTHONPATH=$PWD /work/main/.venv-vllm/bin/python tools/suffix_eval.py. To install it (an sdist only, built with "
    "cmake, ninja, nanobind and torch): PIP_CONSTRAINT=<file pinning your torch> CMAKE_ARGS='-DPython_EXECUTABLE="
    "<python> -DPython_INCLUDE_DIR=<its include dir>' pip install --no-deps arctic-inference==0.3.0"
)

#: What building arctic-inference takes (measured once when it was installed; this tool does not build it).
BUILD_NOTES = [
    "ships only as an sdist (no wheels on PyPI): every fresh machine compiles it",
    "build-system requires: setuptools, wheel, ninja, cmake>=3.12, nanobind==2.9.2, protobuf==5.29.6, "
    "grpcio-tools, torch>=2.10.0 (setup.py imports torch, so pip pulls a torch wheel into the isolated build "
    "unless PIP_CONSTRAINT pins the environment's own)",
    "CMake finds Python's headers only when told: CMAKE_ARGS=\"-DPython_EXECUTABLE=<python> "
    '-DPython_INCLUDE_DIR=<include dir>"; without them the build fails',
    "the wheel build (pip wheel --no-deps, torch pinned to the environment's 2.13.0) took 1 min 13 s wall "
    "(44 s user, 25 s system) on this 2-core machine; the wheel is 356 kB",
    "the package is a whole inference library (vLLM plugin, SwiftKV, embedding server, dynasor); the suffix "
    "tree is one nanobind module (csrc/suffix_decoding: about 1,700 lines of C++)",
]


# -- counting ----------------------------------------------------------------------------------------


def accepted(proposal: Sequence[int], actual: Sequence[int]) -> int:
    """How many tokens of ``proposal`` a greedy verifier accepts: its longest prefix equal to ``actual``'s.  Pure."""
    n = 0
    for p, a in zip(proposal, actual, strict=False):
        if p != a:
            break
        n += 1
    return n


def passes(accepted_at: Sequence[int]) -> int:
    """Target passes to decode an output whose position ``i`` drafts ``accepted_at[i]`` correct tokens: each
    pass commits the accepted draft plus one token of its own.  Pure."""
    count = i = 0
    while i < len(accepted_at):
        i += accepted_at[i] + 1
        count += 1
    return count


def quantiles(values_ns: Sequence[int]) -> tuple[float, float]:
    """(median, p90) of nanosecond readings, in microseconds.  Pure."""
    if not values_ns:
        return 0.0, 0.0
    ordered = sorted(values_ns)
    return statistics.median(ordered) / 1e3, ordered[int(0.9 * (len(ordered) - 1))] / 1e3


# -- the structures, behind one interface ------------------------------------------------------------


class Ours:
    """Our :class:`SuffixIndex`, fed as :class:`proposers.suffix.SuffixProposer` feeds it."""

    def __init__(self, max_bytes: int) -> None:
        self.index = SuffixIndex(max_bytes)
        self.active: dict[int, list[Any]] = {}  # request -> [scope, prompt tail, output or None]

    def start(self, rid: int, scope: str, prompt: Sequence[int]) -> None:
        self.active[rid] = [scope, prompt[-self.index.orders[0] :], None]

    def add(self, rid: int, tokens: Sequence[int]) -> None:
        entry = self.active[rid]
        out = entry[2] if entry[2] is not None else self.index.open(entry[0], entry[1])
        entry[2] = self.index.extend(out, tokens)

    def stop(self, rid: int) -> None:
        del self.active[rid]

    def propose(self, rid: int, context: Sequence[int], k: int) -> list[int]:
        return self.index.walk(self.active[rid][0], context, k)[0]

    def held(self) -> dict[str, int]:
        d = self.index.as_dict()
        return {"held": d["outputs"], "bytes": d["bytes"], "evictions": d["evictions"]}


class Arctic:
    """arctic-inference's ``SuffixDecodingCache`` as vLLM's ``suffix`` method calls it; ``per_scope``: one cache
    (one global tree) per schema instead of one for all traffic."""

    def __init__(self, max_cached: int = ARCTIC_CACHED, per_scope: bool = False) -> None:
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.make = lambda: SuffixDecodingCache(max_tree_depth=ARCTIC_DEPTH, max_cached_requests=max_cached)
        self.per_scope = per_scope
        self.caches: dict[str, Any] = {}
        self.active: dict[int, Any] = {}

    def start(self, rid: int, scope: str, prompt: Sequence[int]) -> None:
        key = scope if self.per_scope else ""
        self.active[rid] = cache = self.caches.get(key) or self.caches.setdefault(key, self.make())
        cache.start_request(rid, prompt)

    def add(self, rid: int, tokens: Sequence[int]) -> None:
        self.active[rid].add_active_response(rid, tokens)

    def stop(self, rid: int) -> None:
        self.active.pop(rid).stop_request(rid)

    def propose(self, rid: int, context: Sequence[int], k: int) -> list[int]:
        # (request, pattern, max_spec_tokens, max_spec_factor, max_spec_offset, min_token_prob), as vLLM calls it
        draft = self.active[rid].speculate(rid, context[-ARCTIC_DEPTH:], k, ARCTIC_SPEC_FACTOR, 0.0, ARCTIC_MIN_PROB)
        return list(draft.token_ids)

    def held(self) -> dict[str, int]:
        held = sum(len(c.cached_requests) for c in self.caches.values())
        return {"held": held, "bytes": sum(c._global_tree.estimate_memory() for c in self.caches.values())}


def require_arctic() -> None:
    """Return if arctic-inference's suffix cache imports; else exit naming where it lives and how to install it."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache  # noqa: F401
    except ImportError as error:
        raise SystemExit(MISSING_ARCTIC.format(error=error)) from error


# -- measuring ---------------------------------------------------------------------------------------


def insert_times(structure: Any, items: Sequence[Stream], first_id: int = 0) -> list[int]:
    """Nanoseconds to add each finished output of ``items`` (start, the whole answer, stop).  Changes it."""
    times = []
    clock = time.perf_counter_ns
    for rid, s in enumerate(items, start=first_id):
        start = clock()
        structure.start(rid, s.scope, s.prompt)
        structure.add(rid, s.tokens)
        structure.stop(rid)
        times.append(clock() - start)
    return times


def decode_held_out(structure: Any, items: Sequence[Stream], first_id: int) -> dict[str, Any]:
    """Decode each held-out output token by token: at every position a timed proposal of up to
    :data:`DRAFT_TOKENS` from the context so far (the prompt's tail, then the output), its accepted length, then
    the true token added (timed).  Changes ``structure``."""
    lookups: list[int] = []
    adds: list[int] = []
    accepted_at: list[int] = []
    proposed = total_passes = 0
    clock = time.perf_counter_ns
    for rid, s in enumerate(items, start=first_id):
        structure.start(rid, s.scope, s.prompt)
        context = list(s.prompt)
        row: list[int] = []
        for i, token in enumerate(s.tokens):
            window = context[-ARCTIC_DEPTH:]
            start = clock()
            proposal = structure.propose(rid, window, DRAFT_TOKENS)
            lookups.append(clock() - start)
            proposed += bool(proposal)
            row.append(accepted(proposal, s.tokens[i : i + DRAFT_TOKENS]))
            start = clock()
            structure.add(rid, [token])
            adds.append(clock() - start)
            context.append(token)
        structure.stop(rid)
        accepted_at += row
        total_passes += passes(row)
    n = max(1, len(accepted_at))
    out = {"lookup_us": quantiles(lookups), "add_token_us": quantiles(adds), "positions": len(accepted_at)}
    return {
        **out,
        "proposed": proposed / n,
        "mean_accepted": sum(accepted_at) / n,
        "tokens_per_pass": n / max(1, total_passes),
    }


def rss_bytes() -> int:
    """This process's resident set (``/proc/self/statm``), in bytes, after a garbage collection and glibc's
    ``malloc_trim`` (freed heap pages handed back, so memory a later allocation reuses counts again).  Reads the
    OS."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the reading may undercount reused heap
        pass
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def write_streams(data: Sequence[Stream], path: str) -> None:
    """``data`` as JSON for :func:`memory_worker`: the distinct scopes and prompts, each output's (scope, prompt,
    length), and every token in one hex string of 4-byte ints.  Writes a file."""
    scopes, prompts = list(dict.fromkeys(s.scope for s in data)), list(dict.fromkeys(s.prompt for s in data))
    rows = [[scopes.index(s.scope), prompts.index(s.prompt), len(s.tokens)] for s in data]
    tokens = array("i", [t for s in data for t in s.tokens]).tobytes().hex()
    with open(path, "w") as f:
        json.dump({"scopes": scopes, "prompts": prompts, "rows": rows, "tokens": tokens}, f)


def memory_worker(spec: str, path: str, checkpoints: Sequence[int]) -> dict[str, Any]:
    """In this (fresh) process: add the streams of ``path`` to the structure ``spec`` names (``ours:<bytes>``,
    ``arctic:<max cached requests>``) and read the resident set at each checkpoint.  The tokens wait in one
    packed array and become Python ints one output at a time, so the heap holds little else to reuse.  Changes
    the process."""
    kind, _, bound = spec.partition(":")
    with open(path) as f:
        saved = json.load(f)
    every = array("i", bytes.fromhex(saved.pop("tokens")))
    prompts = [tuple(p) for p in saved["prompts"]]
    structure: Any = Ours(int(bound)) if kind == "ours" else Arctic(int(bound))
    base = rss_bytes()
    rows = []
    done = offset = 0
    for point in checkpoints:
        for rid in range(done, point):
            scope, prompt, length = saved["rows"][rid]
            tokens = tuple(every[offset : offset + length])
            insert_times(structure, [Stream(saved["scopes"][scope], prompts[prompt], tokens)], first_id=rid)
            offset += length
        done = point
        rows.append({"added": point, "tokens": offset, "rss": rss_bytes() - base, **structure.held()})
    return {"spec": spec, "rows": rows}


def run_worker(spec: str, data: Sequence[Stream], checkpoints: Sequence[int]) -> dict[str, Any]:
    """:func:`memory_worker` in a fresh interpreter (a heap no earlier phase has grown).  Runs a subprocess."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        write_streams(data, f.name)
    try:
        cmd = [sys.executable, __file__, "--worker", spec, "--streams", f.name]
        cmd += ["--checkpoints", ",".join(map(str, checkpoints))]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        os.unlink(f.name)


def licence_and_weight() -> list[str]:
    """The installed arctic-inference: its version, licence and files on disk, then :data:`BUILD_NOTES`.  Reads
    the installation."""
    from importlib.metadata import version

    import arctic_inference

    root = Path(arctic_inference.__path__[0])
    files = [p for p in root.rglob("*") if p.is_file()]
    native = ", ".join(f"{p.relative_to(root)} {p.stat().st_size // 1024:,} kB" for p in files if p.suffix == ".so")
    spdx = re.search(r"SPDX-License-Identifier:\s*(\S+)", (root / "suffix_decoding" / "cache.py").read_text())
    return [
        f"version {version('arctic_inference')}; licence {spdx.group(1) if spdx else 'not found'} (the SPDX line "
        "of its sources; the sdist's LICENSE is the Apache License, Version 2.0)",
        f"installed: {sum(p.stat().st_size for p in files) // 1024:,} kB in {root}; native: {native or 'none'}",
        *BUILD_NOTES,
    ]


# -- the report ------------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table; floats with two decimals.  Pure."""

    def cell(v: Any) -> str:
        return f"{v:,.2f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


SPEED_COLUMNS = (
    "structure|add output median us|p90|add us/token|lookup median us|p90|add 1 token median us|positions proposed"
    "|mean accepted|tokens/pass|outputs held|own estimate MB"
).split("|")
MEMORY_COLUMNS = ["structure", "outputs added", "tokens added", "RSS growth MB", "outputs held", "own estimate MB"]


def render(result: dict[str, Any]) -> str:
    """The markdown report of one run's ``result`` (as :func:`evaluate` returns it).  Pure."""
    meta, mb = result["meta"], 1 << 20
    speed = [
        [r["name"], *r["insert_us"], r["insert_per_token_us"], *r["lookup_us"], r["add_token_us"][0]]
        + [f"{100 * r['proposed']:.0f}%", r["mean_accepted"], r["tokens_per_pass"], r["held"], r["bytes"] / mb]
        for r in result["speed"]
    ]
    memory = [
        [m["name"], row["added"], row["tokens"], row["rss"] / mb, row["held"], row["bytes"] / mb]
        for m in result["memory"]
        for row in m["rows"]
    ]
    parts = [
        "# Suffix structures: ours (SuffixIndex) against arctic-inference's suffix tree",
        f"Run: `{meta['command']}` on {meta['machine']}; load average at start {meta['load']}. "
        "Timings are provisional unless the load was near zero.",
        f"Data: {meta['outputs']:,} outputs ({meta['tokens']:,} tokens, {meta['mean_len']:.0f} per output on "
        f"average) over {meta['schemas']} schemas of the task file, interleaved; {meta['train']:,} added first, "
        f"then {meta['held_out']:,} held out and decoded token by token ({meta['positions']:,} positions). "
        f"Proposals of up to {DRAFT_TOKENS} tokens, not cut by a grammar. Arctic as vLLM runs it: depth "
        f"{ARCTIC_DEPTH}, max_spec_factor {ARCTIC_SPEC_FACTOR}, min_token_prob {ARCTIC_MIN_PROB}.",
        "## Speed and usefulness",
        table(SPEED_COLUMNS, speed),
        "## Memory (resident-set growth, a fresh process each)",
        table(MEMORY_COLUMNS, memory),
        "## Licence and install weight (arctic-inference)",
        "\n".join(f"- {line}" for line in result["licence"]),
        "## Notes",
        "\n".join(f"- {line}" for line in result["notes"]),
    ]
    return "\n\n".join(parts) + "\n"


def log(line: str) -> None:
    """A progress line on stderr."""
    print(line, file=sys.stderr, flush=True)


def speed_phase(train: Sequence[Stream], test: Sequence[Stream]) -> list[dict[str, Any]]:
    """Each structure fed ``train`` (timed per output), then decoding ``test``.  Runs the structures."""
    makers: list[tuple[str, Callable[[], Any]]] = [
        (f"ours ({OURS_DEFAULT_BYTES >> 20} MB cap, the server's default)", lambda: Ours(OURS_DEFAULT_BYTES)),
        (f"arctic (one tree, max_cached_requests {ARCTIC_CACHED:,}: vLLM's default)", Arctic),
        (f"arctic (one tree per schema, {ARCTIC_CACHED:,} each)", lambda: Arctic(per_scope=True)),
    ]
    rows = [measure(name, make(), train, test) for name, make in makers]
    bound = max(1, rows[0]["held"])  # arctic holding what ours held: usefulness at equal history
    name = f"arctic (one tree, max_cached_requests {bound:,}: what ours held)"
    return [*rows, measure(name, Arctic(bound), train, test)]


def measure(name: str, structure: Any, train: Sequence[Stream], test: Sequence[Stream]) -> dict[str, Any]:
    """One structure fed ``train`` (timed per output), then decoding ``test``: one row.  Changes ``structure``."""
    log(f"speed and usefulness: {name}")
    times = insert_times(structure, train)
    per_token = sum(times) / max(1, sum(len(s.tokens) for s in train)) / 1e3
    row = {"name": name, "insert_us": quantiles(times), "insert_per_token_us": per_token}
    return {**row, **decode_held_out(structure, test, first_id=len(train)), **structure.held()}


def memory_phase(data: Sequence[Stream], checkpoints: Sequence[int], cap_mb: int) -> list[dict[str, Any]]:
    """Resident-set growth of ours under ``cap_mb``, of arctic under count bounds (what ours held, what fits its
    estimate in ``cap_mb``, vLLM's default; the first over :data:`LONGER`-fold outputs).  Runs subprocesses."""
    log(f"memory: ours at {cap_mb} MB")
    ours = run_worker(f"ours:{cap_mb << 20}", data[: checkpoints[-1]], checkpoints)["rows"]
    out = [{"name": f"ours, {cap_mb} MB cap", "rows": ours}]
    comparable = max(1, int(ours[-1]["held"]))
    log(f"memory: arctic with max_cached_requests {ARCTIC_CACHED:,}")
    free = run_worker(f"arctic:{ARCTIC_CACHED}", data[: checkpoints[-1]], checkpoints)["rows"]
    per_output = free[-1]["bytes"] / max(1, free[-1]["held"])
    same_bytes = max(1, int((cap_mb << 20) / per_output))
    for bound, label in ((comparable, "the outputs ours held at its cap"), (same_bytes, f"its estimate ~{cap_mb} MB")):
        log(f"memory: arctic with max_cached_requests {bound:,}")
        rows = run_worker(f"arctic:{bound}", data[: checkpoints[-1]], checkpoints)["rows"]
        out.append({"name": f"arctic, max_cached_requests {bound:,} ({label})", "rows": rows})
    out.append({"name": f"arctic, max_cached_requests {ARCTIC_CACHED:,} (vLLM's default)", "rows": free})
    # The same count bound over outputs several times as long: a count of requests does not bound bytes.
    starts = range(0, min(LONGER * 2 * comparable, len(data) - LONGER + 1), LONGER)
    long = [Stream(data[j].scope, data[j].prompt, sum((s.tokens for s in data[j : j + LONGER]), ())) for j in starts]
    log(f"memory: arctic with max_cached_requests {comparable:,}, outputs {LONGER}x as long")
    rows = run_worker(f"arctic:{comparable}", long, [len(long)])["rows"]
    out.append({"name": f"arctic, max_cached_requests {comparable:,}, outputs {LONGER}x as long", "rows": rows})
    return out


def evaluate(args: argparse.Namespace, tokenizer: Any) -> dict[str, Any]:
    """Every measurement of one run, as the dict :func:`render` reports.  Runs the structures."""
    load = os.getloadavg()
    tasks = [t for t in load_tasks() if t.reference is not None]
    total = max(args.train + args.held_out, max(args.checkpoints))
    log(f"load {load}; building {total:,} outputs")
    data = streams(tasks, documents(tasks, total, args.seed), tokenizer, ARCTIC_DEPTH)
    train, test = data[: args.train], data[args.train : args.train + args.held_out]
    speed = speed_phase(train, test)
    memory = memory_phase(data, sorted(args.checkpoints), args.cap_mb)
    tokens = sum(len(s.tokens) for s in data)
    meta = dict(command=args.command, load=", ".join(f"{x:.2f}" for x in load), outputs=len(data), tokens=tokens)
    meta.update(machine=f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    meta.update(schemas=len({s.scope for s in data}), train=len(train), held_out=len(test))
    meta.update(mean_len=tokens / max(1, len(data)), positions=speed[0]["positions"])
    return {"meta": meta, "speed": speed, "memory": memory, "licence": licence_and_weight(), "notes": NOTES}


#: What the C++ shows about scoping and bounding arctic's tree (read from csrc/suffix_decoding and cache.py).
NOTES = [
    "arctic bounds its global tree by max_cached_requests, a count of requests evicted FIFO (cache.py "
    "_maybe_evict_requests); nothing in the C++ counts bytes (SuffixTree::estimate_memory walks every node and "
    "is documented as for debugging only), so its memory grows with the length of the cached outputs",
    "arctic has one global tree for all traffic; scoping by schema means one SuffixDecodingCache per scope, each "
    "with its own count bound, so the total is bounded only by scopes x count x output length",
    "tokens/pass: the tokens a decode commits per target pass if each pass takes the first proposal's accepted "
    "prefix and one token of its own; mean accepted: that prefix's length averaged over every position",
    "RSS growth is read after a garbage collection and malloc_trim, in a worker whose streams wait in one packed "
    "array, so it counts what the structure holds rather than freed heap it reuses",
    "'own estimate' is SuffixIndex.bytes (its byte accounting, the cap it enforces) for ours and "
    "SuffixTree.estimate_memory() summed over the global trees for arctic",
    "arctic also keeps a local tree per active request (its prompt and output); it is given only the prompt's "
    f"last {ARCTIC_DEPTH} tokens here, as ours sees the prompt's tail, so both measure cross-request drafting",
]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the markdown report here (else print it)")
    parser.add_argument("--quick", action="store_true", help="a small run (under a minute)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cap-mb", type=int, default=8, help="our byte cap in the memory runs")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--streams", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoints", default=None, help="outputs added at each memory reading (1000,5000,10000)")
    args = parser.parse_args(argv)
    if args.worker:  # one memory run, in the fresh process run_worker started
        print(json.dumps(memory_worker(args.worker, args.streams, [int(x) for x in args.checkpoints.split(",")])))
        return 0
    require_arctic()
    points = args.checkpoints or ("300,1000,1500" if args.quick else "1000,5000,10000")
    args.checkpoints = [int(x) for x in points.split(",")]
    args.train, args.held_out = (600, 36) if args.quick else (5000, 288)
    args.command = "tools/suffix_eval.py " + " ".join(argv if argv is not None else sys.argv[1:])
    from grammarspec.model.loading import load_tokenizer

    report = render(evaluate(args, load_tokenizer("smollm2-135m")))
    if args.out:
        Path(args.out).write_text(report)
        log(f"wrote {args.out}")
    else:
        print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
