"""``grammarspec bench-serve --sweep``: a server's throughput and latency as load rises, with and without drafts.

Workloads: ``json`` (the task file's prompts, ``response_format`` json_schema)
and ``prose`` (free writing that nothing in the prompt predicts, no schema).
Load: a closed loop of C clients (each sends its next request when its last
one ends) at every concurrency of the list, and an open loop of requests
arriving at random (Poisson) at every rate of the list.  Arms: ``none`` and
``auto`` (``"grammarspec": {"assistant": ...}`` on one embedded server, prefix
cache off so every request reads its whole prompt), run ``none, auto, none``
at every level (``--pairs P``: ``none`` then ``auto, none`` P times) with each
arm's runs averaged, and each ``auto`` run's ratio to the ``none`` runs either
side of it reported too, so the table shows how far the ratio moves between
runs; ``vllm`` and ``vllm_ngram`` (``vllm serve`` from ``.venv-vllm`` without
and with its n-gram proposer) are the anchor, each its own server, at the same
levels.  Greedy.  Every run's clients are a process of their own
(:func:`grammarspec.bench.load.run_load`), apart from every server, as a
server's users are.

Per arm and level: output tokens per second, median and p90 time to first
token (and its median over the requests after a closed loop's opening burst,
each of which joins a batch that is decoding: ``--rounds``), median
inter-token latency, tokens per target pass (ours), and the
outputs compared with ``none``'s first run, request by request.  The embedded
server records every step (:class:`~grammarspec.engine.step_trace.StepTrace`): the
per-step table says where each arm's time goes.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from grammarspec.bench.load import OUR_ARMS, closed_loop, open_loop, run_load

__all__ = [
    "OUR_ARMS",
    "closed_loop",
    "open_loop",
    "PROSE_PROMPTS",
    "SWEEP_ARMS",
    "VLLM_ARMS",
    "run_sweep",
    "sweep_markdown",
    "workload",
    "write_sweep_plots",
]

VLLM_ARMS = ("vllm", "vllm_ngram")
SWEEP_ARMS = OUR_ARMS + VLLM_ARMS
WORKLOADS = ("json", "prose")

#: Free prose: what the model writes is its own, so no prompt text predicts it.
PROSE_PROMPTS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Describe a walk through a night market in a city you invent.",
    "Write a letter from a retired astronaut to her younger self.",
    "Tell the story of a village where it has not rained for seven years.",
    "Describe the first morning of spring from the point of view of a cat.",
    "Write a fable about a fox, a crow and a broken clock.",
    "Describe an imaginary museum of forgotten inventions, room by room.",
    "Write a diary entry of a sailor on the last day of a long voyage.",
    "Tell a story about two strangers stuck in an elevator during a storm.",
    "Describe a dream of a city built on the back of a giant turtle.",
    "Write a speech a robot gives on its first day of school.",
    "Tell the story of a baker who can taste people's memories.",
)


def workload(name: str, tasks_path: str | Path | None = None) -> list[dict[str, Any]]:
    """The request bodies of a workload (``messages`` and, for ``json``, ``response_format``).  Pure.

    ``json``: each task of the task file, its prompt with the sentence that
    describes the schema or tools (as ``grammarspec bench`` prompts), the schema as
    ``response_format``; ``prose``: :data:`PROSE_PROMPTS`.
    """
    if name == "prose":
        return [{"messages": [{"role": "user", "content": p}]} for p in PROSE_PROMPTS]
    if name != "json":
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    from grammarspec.bench.tasks import load_tasks
    from grammarspec.completion import describe_schema

    bodies = []
    for task in load_tasks(tasks_path):
        messages = (
            [{"role": "user", "content": task.prompt}]
            if isinstance(task.prompt, str)
            else [dict(m) for m in task.prompt]
        )
        extra = describe_schema(task.schema if task.describe_schema else None, task.tools)
        system = "\n\n".join(part for part in (task.system, extra) if part)
        if system:
            messages.insert(0, {"role": "system", "content": system})
        schema = {"name": task.id.replace("-", "_")[:64], "schema": task.schema}
        bodies.append({"messages": messages, "response_format": {"type": "json_schema", "json_schema": schema}})
    return bodies


def _percentile(values: Sequence[float], q: float) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def level_summary(records: Sequence[dict[str, Any]], burst: int = 0) -> dict[str, Any]:
    """Output tok/s over the level's wall clock, median / p90 TTFT, median inter-token latency.  Pure.

    ``burst``: how many requests open the level at once (a closed loop's C
    clients all send at its start).  Their TTFT is the burst's prefill, so the
    steady TTFT (``ttft_steady_*``) reads the requests sent after them, each
    joining a batch that is already decoding (None when there are none).

    >>> r = [{"sent": 0.0, "end": 2.0, "ttft": 0.5, "itl": 0.1, "tokens": 10},
    ...      {"sent": 1.0, "end": 3.0, "ttft": 1.0, "itl": 0.2, "tokens": 20}]
    >>> s = level_summary(r, burst=1); s["tok_s"], s["ttft_median"], s["ttft_p90"], s["ttft_steady_median"]
    (10.0, 0.75, 1.0, 1.0)
    """
    wall = max(r["end"] for r in records) - min(r["sent"] for r in records)
    ttft = [r["ttft"] for r in records if r["ttft"] is not None]
    later = sorted(records, key=lambda r: r["sent"])[burst:]
    steady = [r["ttft"] for r in later if r["ttft"] is not None]
    return {
        "requests": len(records),
        "refused": sum(1 for r in records if r.get("refused")),
        "tokens": sum(r["tokens"] for r in records),
        "seconds": wall,
        "tok_s": sum(r["tokens"] for r in records) / max(wall, 1e-9),
        "ttft_median": statistics.median(ttft) if ttft else None,
        "ttft_p90": _percentile(ttft, 0.9),
        "ttft_steady_median": statistics.median(steady) if steady else None,
        "ttft_steady_p90": _percentile(steady, 0.9),
        "itl_median": _percentile([r["itl"] for r in records if r["itl"] is not None], 0.5),
    }


def _embedded_server(
    model: torch.nn.Module, tokenizer: Any, name: str, max_batch_size: int, max_tokens: int, step_cost: str
) -> Any:
    """``grammarspec serve`` in this process (prefix cache off, every step traced), on a free localhost port."""
    from grammarspec.bench.servers import InProcessServer

    return InProcessServer(
        model,
        tokenizer,
        name,
        max_batch_size,
        prefix_cache_bytes=0,
        max_tokens=max(max_tokens, 16),
        trace_steps=True,
        step_cost=step_cost,
    )


def _levels(concurrency: Sequence[int], rates: Sequence[float]) -> list[tuple[str, float]]:
    return [("C", float(c)) for c in concurrency] + [("rate", float(r)) for r in rates]


def _bodies(pool: list[dict[str, Any]], n: int, offset: int) -> list[dict[str, Any]]:
    return [pool[(offset + i) % len(pool)] for i in range(n)]


def run_sweep(
    model: torch.nn.Module,
    tokenizer: Any,
    model_name: str,
    *,
    workloads: Sequence[str] = WORKLOADS,
    concurrency: Sequence[int] = (1, 2, 4, 8, 16, 32),
    rates: Sequence[float] = (),
    arms: Sequence[str] = OUR_ARMS,
    requests: int = 8,
    rounds: int = 1,
    pairs: int = 1,
    max_tokens: int = 96,
    max_batch_size: int = 16,
    tasks_path: str | Path | None = None,
    level_warmup: bool = True,
    step_cost: str = "learned",
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Every workload at every load level under every arm; records, summaries and step tables.

    A level sends ``max(requests, rounds * C)`` requests (open loop:
    ``requests``), the workload's bodies in turn: with ``rounds`` > 1 every
    client sends again into a busy batch, which the steady TTFT reads.
    ``none`` and ``auto`` run interleaved (``none``, then ``auto, none``
    ``pairs`` times) on one server; the vLLM arms after, each on its own.
    ``level_warmup``: before a level's timed runs, every arm answers one
    untimed burst of the level's width (C requests at once; open loop: up to
    ``requests``), so the shapes a level first reaches (a wider batch, a
    grown KV store, a device's kernels for them) are not paid by whichever
    run comes first.  ``step_cost``: what the embedded server's policy prices
    steps by (``serve --step-cost``); with ``learned`` every run of ours records
    the learned terms at its end (``summary["step_cost"]``).
    """
    if pairs < 1:
        raise ValueError(f"run_sweep needs pairs >= 1, got {pairs}")
    from grammars import grammar_spec

    unknown = [a for a in arms if a not in SWEEP_ARMS]
    if unknown:
        raise ValueError(f"unknown sweep arms {unknown}; choose from {', '.join(SWEEP_ARMS)}")
    pools = {name: workload(name, tasks_path) for name in workloads}
    levels = _levels(concurrency, rates)
    runs: list[dict[str, Any]] = []
    notes: list[str] = []
    warmups: list[dict[str, Any]] = []  # the untimed bursts that open each level, for each arm
    ours = [a for a in OUR_ARMS if a in arms]

    def load(port: int, model_id: str, arm: str, bodies: Sequence[dict[str, Any]], kind: str, value: float) -> Any:
        if kind == "C":
            return run_load(port, model_id, arm, bodies, concurrency=int(value), max_tokens=max_tokens)
        return run_load(port, model_id, arm, bodies, rate=value, max_tokens=max_tokens)  # every arm: same arrivals

    def level_runs(
        port: int,
        model_id: str,
        arm_order: Sequence[str],
        trace: Any = None,
        counters: dict[str, int] | None = None,
        learner: Any = None,
    ) -> None:
        for name, pool in pools.items():
            for kind, value in levels:
                n = max(requests, rounds * int(value)) if kind == "C" else requests
                bodies = _bodies(pool, n, 0)
                if level_warmup:
                    width = min(len(bodies), int(value) if kind == "C" else requests)
                    for arm in dict.fromkeys(arm_order):
                        load(port, model_id, arm, bodies[:width], "C", width)
                    if trace is not None:
                        trace.take()  # the warm-up's steps belong to no run
                    warmups.append({"workload": name, "load": kind, "level": value, "requests": width})
                for position, arm in enumerate(arm_order):
                    before = dict(counters) if counters is not None else None
                    records = load(port, model_id, arm, bodies, kind, value)
                    summary = level_summary(records, burst=int(value) if kind == "C" else 0)
                    refused = [r["refused"] for r in records if r.get("refused")]
                    if refused:
                        notes.append(
                            f"{arm}, {name} {kind}={value:g}: {len(refused)} of {len(records)} requests refused "
                            f"({refused[0][:200]}); its figures count the rest"
                        )
                    if counters is not None and before is not None:
                        forwards = counters["target_forwards"] - before["target_forwards"]
                        done = counters["completion_tokens"] - before["completion_tokens"]
                        summary["tokens_per_pass"] = done / forwards if forwards else None
                        summary["prompt_passes"] = counters["prompt_passes"] - before["prompt_passes"]
                    if trace is not None:
                        from grammarspec.engine.step_trace import summarize

                        summary["step_table"] = summarize(*trace.take())
                    if learner is not None:
                        summary["step_cost"] = learner.terms()
                    runs.append(
                        {
                            "workload": name,
                            "load": kind,
                            "level": value,
                            "arm": arm,
                            "position": position,
                            "summary": summary,
                            "outputs": [r["text"] for r in records],
                            "records": [{k: v for k, v in r.items() if k != "text"} for r in records],
                        }
                    )
                    progress(
                        f"{name} {kind}={value:g} {arm}: {summary['tok_s']:.1f} tok/s, TTFT median "
                        f"{summary['ttft_median'] or 0:.2f}s"
                    )

    if ours:
        server = _embedded_server(model, tokenizer, model_name, max_batch_size, max_tokens, step_cost)
        try:
            for body in pools.get("json", []):  # compile every schema before timing
                server.engine.compile(grammar_spec(schema=body["response_format"]["json_schema"]["schema"]))
            for pool in pools.values():  # warm-up, untimed, at full length: the first long passes are slower
                for arm in ours:
                    load(server.port, model_name, arm, pool[:1], "C", 1)
            assert server.engine.trace is not None
            server.engine.trace.take()
            order = ["none"] + ["auto", "none"] * pairs if ours == ["none", "auto"] else ours
            engine = server.engine
            level_runs(server.port, model_name, order, engine.trace, engine.counters, engine.cost_learner)
        finally:
            server.close()
    for arm in [a for a in VLLM_ARMS if a in arms]:
        started = _start_vllm(model_name, max_batch_size, speculative=arm == "vllm_ngram")
        if isinstance(started, str):
            notes.append(f"{arm}: {started}; its arm is left out")
            continue
        try:
            if started.error:
                notes.append(f"{arm}: did not start ({started.error}); its arm is left out")
                continue
            for pool in pools.values():
                load(started.port, model_name, arm, pool[:1], "C", 1)
            level_runs(started.port, model_name, [arm])
        finally:
            started.close()
    return {
        "runs": runs,
        "notes": notes,
        "max_tokens": max_tokens,
        "max_batch_size": max_batch_size,
        "levels": [[k, v] for k, v in levels],
        "rounds": rounds,
        "pairs": pairs,
        "workloads": list(pools),
        "level_warmups": warmups,
        "step_cost": step_cost,
    }


def _start_vllm(model_name: str, max_batch_size: int, *, speculative: bool) -> Any:
    """``vllm serve`` (the bench's settings, n-gram drafts or none), or why it cannot run."""
    from grammarspec.bench.servers import Subprocess, vllm_serve_command
    from grammarspec.bench.vllm_env import environment, vllm_python
    from grammarspec.vllm import model_path

    try:
        python = vllm_python()
    except ValueError as e:
        return str(e)
    env = {**environment(python), "HF_HUB_OFFLINE": "1"}

    def command(port: int) -> list[str]:
        return vllm_serve_command(
            python, model_path(model_name), port, model_name, speculative=speculative, max_num_seqs=max_batch_size
        )

    return Subprocess(command, env, "vllm serve", 900)


def _arm_rows(result: dict[str, Any]) -> dict[tuple[str, str, float, str], list[dict[str, Any]]]:
    out: dict[tuple[str, str, float, str], list[dict[str, Any]]] = {}
    for run in result["runs"]:
        out.setdefault((run["workload"], run["load"], run["level"], run["arm"]), []).append(run)
    return out


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _cell(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pair_ratios(runs: Sequence[dict[str, Any]], nones: Sequence[dict[str, Any]]) -> list[float]:
    """Each of ``runs``' throughput against the mean of the ``none`` runs just before and after it."""
    ratios = []
    for run in runs:
        beside = [n["summary"]["tok_s"] for n in nones if abs(n["position"] - run["position"]) == 1]
        if beside and sum(beside) > 0:
            ratios.append(run["summary"]["tok_s"] * len(beside) / sum(beside))
    return ratios


def _ratio_spread(ratios: Sequence[float]) -> tuple[float | None, float | None]:
    """The mean of ``ratios`` (``None`` without any) and its standard error (``None`` without two).  Adjacent
    runs' ratios share the ``none`` run between them, so the error understates the uncertainty a little.  Pure.

    >>> mean, error = _ratio_spread([0.98, 1.0, 1.02])
    >>> round(mean, 3), round(error, 4)
    (1.0, 0.0115)
    """
    if not ratios:
        return None, None
    mean = statistics.fmean(ratios)
    return mean, statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else None


def sweep_summary(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One line per workload, level and arm: its runs' summaries averaged, each run's throughput against the
    ``none`` runs either side of it (``pair_ratios``, the embedded arms; ``pair_mean`` and ``pair_error``, their
    mean and its standard error), and its outputs against ``none``'s first run (identical requests / requests).
    Pure."""
    grouped = _arm_rows(result)
    lines = []
    for (name, kind, value, arm), runs in grouped.items():
        reference = grouped.get((name, kind, value, "none"), [None])[0]
        same = total = 0
        if reference is not None:
            for run in runs:
                if run is reference:
                    continue
                same += sum(a == b for a, b in zip(run["outputs"], reference["outputs"]))
                total += len(run["outputs"])
        keys = ("tok_s", "ttft_median", "ttft_p90", "ttft_steady_median", "itl_median", "tokens_per_pass")
        ratios = _pair_ratios(runs, grouped.get((name, kind, value, "none"), [])) if arm == "auto" else []
        mean, error = _ratio_spread(ratios)
        line = {
            "workload": name,
            "load": kind,
            "level": value,
            "arm": arm,
            "runs": len(runs),
            **{k: _mean([r["summary"].get(k) for r in runs]) for k in keys},
            "identical": (same, total) if total else None,
            "pair_ratios": ratios,
            "pair_mean": mean,
            "pair_error": error,
        }
        lines.append(line)
    return lines


def sweep_markdown(result: dict[str, Any], command: str) -> str:
    """The load table (every arm's throughput against ``none``'s) and the per-step table of the embedded arms."""
    lines_ = sweep_summary(result)
    base = {(s["workload"], s["load"], s["level"]): s["tok_s"] for s in lines_ if s["arm"] == "none"}
    out = [
        f"`{command}`",
        "",
        f"Greedy, max_tokens {result['max_tokens']}, --max-batch-size "
        f"{result['max_batch_size']}, prefix cache off; each arm is the mean of its runs (none, then auto, none "
        f"{result.get('pairs', 1)} time(s)); 'each run' gives every auto run against the none runs either side of it, "
        "then those ratios' mean ± its standard error (neighbouring ratios share a none run: it understates a little). "
        "TTFT after the burst: the requests a closed loop sends after its C opening ones, each joining a batch "
        "that is decoding ('-': the level sent no more than C)."
        + (
            " Before each level's timed runs every arm answered one untimed burst of the level's width."
            if result.get("level_warmups")
            else ""
        ),
        "",
        "| workload | load | arm | output tok/s | x none | each run x none | median TTFT s | p90 TTFT s | median TTFT after the "
        "burst s | median ITL ms | tokens/pass | identical to none |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in lines_:
        ratio = (
            s["tok_s"] / base[(s["workload"], s["load"], s["level"])]
            if base.get((s["workload"], s["load"], s["level"]))
            else None
        )
        itl = s["itl_median"] * 1000 if s["itl_median"] is not None else None
        same = f"{s['identical'][0]}/{s['identical'][1]}" if s["identical"] else "-"
        each = ", ".join(f"{r:.2f}" for r in s["pair_ratios"]) or "-"
        if s["pair_error"] is not None:
            each += f" (mean {s['pair_mean']:.3f} ± {s['pair_error']:.3f})"
        out.append(
            f"| {s['workload']} | {s['load']}={s['level']:g} | {s['arm']} | {s['tok_s']:.1f} | {_cell(ratio)} | {each} | "
            f"{_cell(s['ttft_median'])} | {_cell(s['ttft_p90'])} | {_cell(s['ttft_steady_median'])} | {_cell(itl, 1)} | "
            f"{_cell(s['tokens_per_pass'])} | {same} |"
        )
    out += [
        "",
        "Where each step's time goes (embedded server; ms per step, mean over the level's steps; forward ms "
        "by path: steps without / with draft tokens, on the mask-free decode path / the ragged path (packed, or padded under a 4-D mask)):",
        "",
        "| workload | load | arm | steps | rows/step | drafts offered/admitted | survival | forward ms "
        "plain free/masked, drafted free/masked | masked share | forced | propose | walk | verify | commit | "
        "prefill steps (s) | joins (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in result["runs"]:
        t = run["summary"].get("step_table")
        if not t or not t["steps"]:
            continue
        per = {k: 1000 * v / t["steps"] for k, v in t["seconds"].items()}
        fw = t["forward_ms"]
        forward = ", ".join(
            _cell(fw[k], 1) for k in ("plain_maskfree", "plain_masked", "drafted_maskfree", "drafted_masked")
        )
        out.append(
            f"| {run['workload']} | {run['load']}={run['level']:g} | {run['arm']} #{run['position']} | "
            f"{t['steps']} | {t['rows']:.1f} | {t['offered']:.1f}/{t['admitted']:.1f} | "
            f"{_cell(t['survival'])} | {forward} | {t['masked_share']:.2f} | {per['forced']:.1f} | "
            f"{per['propose']:.1f} | {per['walk']:.1f} | {per['verify']:.1f} | {per['commit']:.1f} | "
            f"{t['prefill_steps']} ({t['prefill_seconds']:.2f}) | {t['joins']} ({t['join_seconds']:.3f}) |"
        )
    out += _step_cost_lines(result)
    out += [f"- {note}" for note in result["notes"]]
    return "\n".join(out) + "\n"


def _step_cost_lines(result: dict[str, Any]) -> list[str]:
    """The step cost the server's policy had learned at the end of each auto run, beside the profile's."""
    learned = [r for r in result["runs"] if r["arm"] == "auto" and (r["summary"].get("step_cost") or {}).get("learned")]
    if not learned:
        return ["", f"Step cost: {result.get('step_cost', 'profile')} (no learned terms recorded).", ""]
    out = [
        "",
        "The step cost the policy had learned at the end of each auto run (plain 1-row steps; the profile's terms in "
        "brackets): every term is what the server's real steps took (grammarspec/policy/step_cost.py).",
        "",
        "Steps held plain: steps that drafted nothing because, at their batch size and kind of rows (or the nearest "
        "size with a record where theirs was too thin), drafted steps had shown no gain in tokens a second over "
        "plain ones, or the policy had cut what the rows offered (counts so far in the server's life).",
        "",
        "| workload | load | run | steps learned from (plain probes, held plain) | unit ms | per stepping row | switch | "
        "per draft token | "
        "per drafting row | per draft token at batch 1 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in learned:
        c = run["summary"]["step_cost"]
        p = c["profile"]
        out.append(
            f"| {run['workload']} | {run['load']}={run['level']:g} | auto #{run['position']} | {c['steps']} "
            f"({c['probes']}, {c.get('holds', 0)}) | "
            f"{c['unit_ms']:.1f} | {c['per_batch_row']:.3f} | {c['switch']:.2f} ({p['switch']:.2f}) | "
            f"{c['per_token']:.3f} ({p['per_token']:.3f}) | {c['per_draft_row']:.3f} ({p['per_draft_row']:.3f}) | "
            f"{c['per_token_alone']:.3f} ({p['per_token']:.3f}) |"
        )
    return out + [""]


def write_sweep_plots(result: dict[str, Any], out: Path) -> dict[str, Path]:
    """``sweep_throughput.png`` and ``sweep_ttft.png``: each arm's output tok/s and median TTFT against load,
    one panel per workload and kind of load.  Returns ``{name: path}``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines_ = sweep_summary(result)
    panels = sorted({(s["workload"], s["load"]) for s in lines_})
    arms = list(dict.fromkeys(s["arm"] for s in lines_))
    paths: dict[str, Path] = {}
    for keys, label, file in (
        (("tok_s",), "output tokens / s", "sweep_throughput.png"),
        (("ttft_median", "ttft_steady_median"), "median time to first token (s)", "sweep_ttft.png"),
    ):
        fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(4.2 * max(1, len(panels)), 3.6), squeeze=False)
        for ax, (name, kind) in zip(axes[0], panels):
            for index, arm in enumerate(arms):
                # an arm's lines share its colour (solid: all requests, dotted: after the burst)
                color = f"C{index % 10}"
                for key, style, suffix in zip(keys, ("-", ":"), ("", " after the burst")):
                    points = sorted(
                        (s["level"], s[key])
                        for s in lines_
                        if (s["workload"], s["load"], s["arm"]) == (name, kind, arm) and s[key] is not None
                    )
                    if points:
                        ax.plot(
                            [p[0] for p in points],
                            [p[1] for p in points],
                            style,
                            color=color,
                            marker="o",
                            label=arm + suffix,
                        )
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrent clients" if kind == "C" else "requests / s")
            ax.set_ylabel(label)
            ax.set_title(f"{name}")
            ax.legend(fontsize=7)
        fig.tight_layout()
        paths[file] = out / file
        fig.savefig(paths[file], dpi=90)
        plt.close(fig)
    return paths


def write_sweep(result: dict[str, Any], command: str, out: Path, plots: bool = True) -> str:
    """Write sweep.md, sweep.json and the plots into ``out``; returns the markdown.  Changes ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    markdown = sweep_markdown(result, command)
    (out / "sweep.md").write_text(markdown, encoding="utf-8")
    (out / "sweep.json").write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")
    if plots:
        write_sweep_plots(result, out)
    return markdown
