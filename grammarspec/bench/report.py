"""Summaries of a bench run: per task, per category and overall; JSON and markdown.

Aggregation rules (also stated in the markdown):

* **speedup**: per task and repeat, the arm's tokens/s over the baseline's
  (same task, same repeat); per task the median over repeats; per category
  the median over its tasks.  ``all`` is the median over every task.
* **tokens/s**: median over runs.
* ratios of sums for everything else: accepted tokens per target forward =
  all new tokens / all target forwards; acceptance = accepted / proposed
  draft tokens; forced fraction = forced / new tokens; grammar us/token =
  grammar time / new tokens; draft and verify ms per target forward.
* validity, agreement: fraction of runs; field accuracy: mean over scored runs.
* **ended**: the speedups again, over the tasks whose baseline answers all
  ended by themselves (not cut by ``max_new_tokens``).  A small model often
  repeats itself until the cap, and every drafter predicts a loop well, so a
  median over cut answers can say more about the model than the decoder.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from grammarspec.bench.records import source_totals
from grammarspec.bench.runner import BenchResult
from grammarspec.bench.scoring import median, pairwise_speedups
from grammarspec.bench.vllm_arms import vllm_markdown

__all__ = ["summarize", "to_markdown", "write_results", "ended_tasks", "ALL"]

#: The pseudo-category holding every task.
ALL = "all"


def _ok(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in runs if "error" not in r]


def _ratio(num: float, den: float, scale: float = 1.0) -> float | None:
    return num / den * scale if den else None


def _aggregate(
    runs: Sequence[dict[str, Any]], speedups: dict[str, float], decode_speedups: dict[str, float] | None = None
) -> dict[str, Any]:
    """Metrics of one arm over some runs; ``speedups``: per-task speedup of those tasks (end to end),
    ``decode_speedups``: the same for the decode phase (after the prompt pass)."""
    good = _ok(runs)
    new = sum(r["new_tokens"] for r in good)
    forwards = sum(r["target_forwards"] for r in good)
    proposed, accepted = source_totals(good, "proposed"), source_totals(good, "accepted")
    verify = [r["verify_seconds"] for r in good if r["verify_seconds"] is not None]
    agrees = [r["agrees"] for r in good if r.get("agrees") is not None]
    accuracy = [r["field_accuracy"] for r in good if r.get("field_accuracy") is not None]
    return {
        "runs": len(runs),
        "failures": len(runs) - len(good),
        "tasks": len({r["task"] for r in runs}),
        "speedup": median(speedups.values()),
        "speedup_min": min(speedups.values()) if speedups else None,
        "decode_speedup": median((decode_speedups or {}).values()),
        "tokens_per_second": median(r["tokens_per_second"] for r in good),
        "new_tokens": new,
        "seconds": sum(r["seconds"] for r in good),
        "accepted_per_forward": _ratio(new, forwards),
        "acceptance": {name: _ratio(accepted.get(name, 0), n) for name, n in sorted(proposed.items())},
        "acceptance_overall": _ratio(sum(accepted.values()), sum(proposed.values())),
        "proposed": sum(proposed.values()),
        "forced_fraction": _ratio(sum(r["forced_tokens"] for r in good), new),
        "grammar_us_per_token": _ratio(sum(r["grammar_seconds"] for r in good), new, 1e6),
        "draft_ms_per_forward": _ratio(sum(r["draft_seconds"] for r in good), forwards, 1e3),
        "verify_ms_per_forward": _ratio(sum(verify), forwards, 1e3) if verify else None,
        "ms_per_forward": _ratio(sum(r["seconds"] for r in good), forwards, 1e3),
        "valid": _ratio(sum(bool(r["valid"]) for r in good), len(runs)),
        "agreement": _ratio(sum(agrees), len(agrees)) if agrees else None,
        "field_accuracy": sum(accuracy) / len(accuracy) if accuracy else None,
    }


def task_speedups(runs: Sequence[dict[str, Any]], arm: str, rate_key: str = "tokens_per_second") -> dict[str, float]:
    """Per task: the median over repeats of the arm's pairwise speedup against the baseline.

    ``rate_key``: ``"tokens_per_second"`` (end to end) or ``"decode_tokens_per_second"``.
    """
    rate = {(r["task"], r["repeat"]): r[rate_key] for r in _ok(runs) if r["arm"] == arm and r.get(rate_key)}
    base = {(r["task"], r["repeat"]): r[rate_key] for r in _ok(runs) if r["arm"] == "baseline" and r.get(rate_key)}
    per_task: dict[str, list[float]] = {}
    for (task, _), ratio in pairwise_speedups(rate, base).items():
        per_task.setdefault(task, []).append(ratio)
    return {task: median(ratios) for task, ratios in per_task.items()}  # type: ignore[misc]


def ended_tasks(runs: Sequence[dict[str, Any]]) -> set[str]:
    """The tasks whose baseline runs all ended by themselves (none was cut by the token limit)."""
    base = [r for r in _ok(runs) if r["arm"] == "baseline"]
    cut = {r["task"] for r in base if r.get("finish_reason") != "stop"}
    return {r["task"] for r in base} - cut


def summarize(result: BenchResult) -> dict[str, Any]:
    """Per-task, per-category and overall metrics of every arm (plain JSON values)."""
    runs = result.runs
    ended = ended_tasks(runs)
    arms = list(result.config.arms)
    categories = list(dict.fromkeys(r["category"] for r in runs))
    speedups = {arm: task_speedups(runs, arm) for arm in arms}
    decode = {arm: task_speedups(runs, arm, "decode_tokens_per_second") for arm in arms}
    tasks_out = []
    for task in dict.fromkeys(r["task"] for r in runs):
        task_runs = [r for r in runs if r["task"] == task]
        tasks_out.append(
            {
                "task": task,
                "category": task_runs[0]["category"],
                "prompt_tokens": task_runs[0].get("prompt_tokens"),
                "arms": {
                    arm: _aggregate(
                        [r for r in task_runs if r["arm"] == arm],
                        {task: speedups[arm][task]} if task in speedups[arm] else {},
                        {task: decode[arm][task]} if task in decode[arm] else {},
                    )
                    for arm in arms
                },
            }
        )
    cats_out = {}
    for category in categories + [ALL]:
        cat_runs = runs if category == ALL else [r for r in runs if r["category"] == category]
        cat_tasks = {r["task"] for r in cat_runs}
        cats_out[category] = {
            arm: _aggregate(
                [r for r in cat_runs if r["arm"] == arm],
                {t: s for t, s in speedups[arm].items() if t in cat_tasks},
                {t: s for t, s in decode[arm].items() if t in cat_tasks},
            )
            for arm in arms
        }
        kept = cat_tasks & ended
        for arm in arms:
            cats_out[category][arm]["ended_tasks"] = len(kept)
            cats_out[category][arm]["ended_speedup"] = median(s for t, s in speedups[arm].items() if t in kept)
    return {"arms": arms, "categories": cats_out, "tasks": tasks_out}


def _fmt(value: Any, spec: str = ".2f", suffix: str = "") -> str:
    if value is None:
        return "–"
    return f"{value:{spec}}{suffix}"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"


def _speedup_rows(
    categories: dict[str, Any],
    others: Sequence[str],
    key: str,
    extra: Callable[[dict[str, Any]], list[str]] = lambda _: [],
) -> list[str]:
    """One table row per category: name, task count, ``extra`` cells of the baseline, then each arm's ``key``."""
    rows = []
    for category, per_arm in categories.items():
        base = per_arm["baseline"]
        name = f"**{category}**" if category == ALL else category
        cells = [name, str(base["tasks"]), *extra(base), *(_fmt(per_arm[a][key], ".2f", "x") for a in others)]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def to_markdown(result: BenchResult, summary: dict[str, Any], command: str = "") -> str:
    """The tables of BENCHMARKS.md: speedup matrix, per-category details, per-task speedups."""
    config = result.config
    arms = summary["arms"]
    others = [a for a in arms if a != "baseline"]
    categories = summary["categories"]
    lines = []
    if command:
        lines += [f"Command: `{command}`", ""]
    machine = result.machine
    lines += [
        f"Model `{config.model}`, {'greedy' if config.temperature <= 0 else f'temperature {config.temperature}'}, "
        f"max_new_tokens {config.max_new_tokens}, repeat {config.repeat}, seed {config.seed}; "
        f"{len(result.tasks)} tasks ({len(result.skipped)} skipped); wall time {result.wall_seconds / 60:.1f} min.",
        f"Machine: {machine.get('cpu')}, {machine.get('cores')} cores, torch {machine.get('torch')} "
        f"({machine.get('torch_threads')} threads{''.join(f', {k}={v}' for k, v in machine.get('omp_env', {}).items())}), "
        f"transformers {machine.get('transformers')}, "
        f"xgrammar {machine.get('xgrammar')}; load average {machine.get('load_average_at_start')} at the start, "
        f"{machine.get('load_average_at_end')} at the end.",
        "",
        "### Median speedup over the baseline (HF generate + xgrammar logits processor), tokens/s ratio",
        "",
        "| category | tasks | baseline tok/s | " + " | ".join(others) + " |",
        "|---|---:|---:|" + "---:|" * len(others),
    ]
    lines += _speedup_rows(categories, others, "speedup", lambda base: [_fmt(base["tokens_per_second"], ".1f")])
    lines += [
        "",
        "### Median speedup of the decode phase (after the prompt pass), tokens/s ratio",
        "",
        "The same runs without the first step: the prompt pass costs every arm the same and "
        "speculation cannot shorten it.",
        "",
        "| category | tasks | " + " | ".join(others) + " |",
        "|---|---:|" + "---:|" * len(others),
    ]
    lines += _speedup_rows(categories, others, "decode_speedup")
    if any(per_arm["baseline"]["ended_tasks"] < per_arm["baseline"]["tasks"] for per_arm in categories.values()):
        lines += [
            "",
            "### Median speedup over the answers that ended by themselves, tokens/s ratio",
            "",
            f"Only the tasks whose baseline answer ended before max_new_tokens ({config.max_new_tokens}). "
            "An answer cut by the limit is often the model repeating itself, which every drafter predicts well.",
            "",
            "| category | tasks | ended | " + " | ".join(others) + " |",
            "|---|---:|---:|" + "---:|" * len(others),
        ]
        lines += _speedup_rows(categories, others, "ended_speedup", lambda base: [str(base["ended_tasks"])])
    lines += [
        "",
        "### Details per category and arm",
        "",
        "acc/fwd: new tokens per target forward pass; acceptance: accepted / proposed draft tokens "
        "(per proposer); forced: grammar-forced share of new tokens; grammar: us per new token; "
        "draft / verify: ms per target forward; agree: output identical to the greedy baseline; "
        "fields: field accuracy against the reference.",
        "",
        "| category | arm | speedup | tok/s | acc/fwd | acceptance | forced | grammar us/tok | draft ms | verify ms "
        "| valid | agree | fields |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for category, per_arm in categories.items():
        for arm in arms:
            m = per_arm[arm]
            acceptance = ", ".join(f"{k} {_pct(v)}" for k, v in m["acceptance"].items()) or "–"
            fails = f" ({m['failures']} failed)" if m["failures"] else ""
            lines.append(
                f"| {category} | {arm}{fails} | {_fmt(m['speedup'], '.2f', 'x')} | {_fmt(m['tokens_per_second'], '.1f')} "
                f"| {_fmt(m['accepted_per_forward'])} | {acceptance} | {_pct(m['forced_fraction'])} "
                f"| {_fmt(m['grammar_us_per_token'], '.0f')} | {_fmt(m['draft_ms_per_forward'], '.1f')} "
                f"| {_fmt(m['verify_ms_per_forward'], '.1f')} | {_pct(m['valid'])} | {_pct(m['agreement'])} "
                f"| {_pct(m['field_accuracy'])} |"
            )
    lines += [
        "",
        "### Per task: speedup (accepted tokens per forward)",
        "",
        "| task | prompt tok | new tok | baseline tok/s | " + " | ".join(others) + " |",
        "|---|---:|---:|---:|" + "---:|" * len(others),
    ]
    for task in summary["tasks"]:
        per_arm = task["arms"]
        cells = [
            f"{_fmt(per_arm[a]['speedup'], '.2f', 'x')} ({_fmt(per_arm[a]['accepted_per_forward'], '.1f')})"
            for a in others
        ]
        base_new = per_arm["baseline"]["new_tokens"] // max(1, per_arm["baseline"]["runs"])
        base_rate = _fmt(per_arm["baseline"]["tokens_per_second"], ".1f")
        lines.append(
            f"| {task['task']} | {task['prompt_tokens']} | {base_new} | {base_rate} | " + " | ".join(cells) + " |"
        )
    lines += vllm_markdown(result.runs, result.throughput)
    if result.skipped:
        lines += ["", "### Skipped", ""] + [f"- {s['task']}: {s['reason']}" for s in result.skipped]
    errors = [r for r in result.runs if "error" in r]
    if errors:
        lines += ["", "### Failed runs", ""] + [f"- {r['task']} / {r['arm']}: {r['error']}" for r in errors[:50]]
    return "\n".join(lines) + "\n"


def write_results(result: BenchResult, out_dir: str | Path, command: str = "", plots: bool = True) -> dict[str, Path]:
    """Write ``results.json``, ``results.md`` and the PNG plots into ``out_dir``; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(result)
    data = {
        "command": command,
        "config": asdict(result.config),
        "machine": result.machine,
        "wall_seconds": result.wall_seconds,
        "summary": summary,
        "skipped": result.skipped,
        "tasks": result.tasks,
        "runs": result.runs,
        "throughput": result.throughput,
    }
    paths = {"json": out / "results.json", "markdown": out / "results.md"}
    paths["json"].write_text(json.dumps(data, indent=1, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
    paths["markdown"].write_text(to_markdown(result, summary, command), encoding="utf-8")
    if plots:
        from grammarspec.bench.plots import write_plots

        paths.update(write_plots(result, summary, out))
    return paths
