"""PNG plots of a bench run (matplotlib, headless).

* ``speedup.png`` -- median speedup over the baseline by category and arm;
* ``accepted_per_step.png`` -- distribution of accepted draft tokens per
  verification step (steps that verified a draft), per arm;
* ``acceptance_vs_length.png`` -- acceptance rate (accepted / proposed)
  against the proposal length, per arm.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grammarspec.bench.runner import BenchResult

__all__ = ["write_plots", "step_histogram", "acceptance_by_length"]

#: Proposal lengths with fewer verification steps than this are left out of the acceptance plot.
MIN_STEPS_PER_LENGTH = 5


def step_histogram(steps: Sequence[Sequence[int]]) -> dict[int, int]:
    """Count of steps per number of accepted draft tokens (steps without a draft are left out).

    >>> step_histogram([(4, 4), (4, 1), (0, 0), (2, 1)])
    {1: 2, 4: 1}
    """
    counts: dict[int, int] = {}
    for proposed, accepted in steps:
        if proposed > 0:
            counts[accepted] = counts.get(accepted, 0) + 1
    return dict(sorted(counts.items()))


def acceptance_by_length(steps: Sequence[Sequence[int]]) -> dict[int, tuple[int, float]]:
    """Per proposal length: ``(steps, accepted / proposed tokens)``.

    >>> acceptance_by_length([(4, 4), (4, 0), (2, 1)])
    {2: (1, 0.5), 4: (2, 0.5)}
    """
    totals: dict[int, list[int]] = {}
    for proposed, accepted in steps:
        if proposed > 0:
            entry = totals.setdefault(proposed, [0, 0])
            entry[0] += 1
            entry[1] += accepted
    return {k: (n, acc / (n * k)) for k, (n, acc) in sorted(totals.items())}


def _steps(result: BenchResult, arm: str) -> list[list[int]]:
    return [s for r in result.runs if r["arm"] == arm and "error" not in r for s in r.get("steps", [])]


def write_plots(result: BenchResult, summary: dict[str, Any], out: Path) -> dict[str, Path]:
    """Write the three PNGs into ``out``; returns ``{name: path}``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    arms = [a for a in summary["arms"] if a != "baseline"]
    paths: dict[str, Path] = {}

    # 1. speedup by category and arm (grouped bars)
    categories = list(summary["categories"])
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(categories) * max(1, len(arms)) / 3), 4.2))
    width = 0.8 / max(1, len(arms))
    for i, arm in enumerate(arms):
        values = [summary["categories"][c][arm]["speedup"] or 0.0 for c in categories]
        xs = [j + (i - (len(arms) - 1) / 2) * width for j in range(len(categories))]
        bars = ax.bar(xs, values, width, label=arm)
        ax.bar_label(bars, fmt="%.2f", fontsize=6, padding=1)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(categories)), categories, rotation=20, ha="right")
    ax.set_ylabel("median speedup vs HF + xgrammar")
    ax.set_title("Speedup by category and arm")
    if arms:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    paths["speedup_png"] = _save(fig, out / "speedup.png")

    # 2. distribution of accepted draft tokens per step
    spec_arms = [a for a in arms if any(p for p, _ in _steps(result, a))]
    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    width = 0.8 / max(1, len(spec_arms))
    for i, arm in enumerate(spec_arms):
        hist = step_histogram(_steps(result, arm))
        total = sum(hist.values()) or 1
        xs = [k + (i - (len(spec_arms) - 1) / 2) * width for k in hist]
        ax.bar(xs, [n / total for n in hist.values()], width, label=arm)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("accepted draft tokens in one verification step (+1 token from the target)")
    ax.set_ylabel("fraction of steps with a draft")
    ax.set_title("Accepted tokens per step")
    paths["accepted_png"] = _save(fig, out / "accepted_per_step.png", legend=ax)

    # 3. acceptance against proposal length
    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    for arm in spec_arms:
        by_length = {k: v for k, v in acceptance_by_length(_steps(result, arm)).items() if v[0] >= MIN_STEPS_PER_LENGTH}
        if by_length:
            ax.plot(list(by_length), [rate for _, rate in by_length.values()], marker="o", label=arm)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("proposal length (draft tokens verified in one pass)")
    ax.set_ylabel("acceptance (accepted / proposed)")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"Acceptance against proposal length (lengths with >= {MIN_STEPS_PER_LENGTH} steps)")
    paths["acceptance_png"] = _save(fig, out / "acceptance_vs_length.png", legend=ax)
    return paths


def plot_batch_throughput(runs: Sequence[Any], path: Path) -> Path:
    """Throughput (committed tokens/s) against batch size, one line per arm (``bench --batch-size``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for arm in sorted({r.arm for r in runs}):
        points = sorted((r.batch_size, r.throughput) for r in runs if r.arm == arm)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=arm)
    ax.set_xlabel("batch size")
    ax.set_ylabel("committed tokens / s")
    ax.set_xscale("log", base=2)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path, dpi=120)


def _save(fig: Any, path: Path, dpi: int = 90, legend: Any = None) -> Path:
    """Lay out, write and close ``fig``; with ``legend`` (an axes), add its legend first when it has labelled artists."""
    import matplotlib.pyplot as plt

    if legend is not None and legend.get_legend_handles_labels()[0]:
        legend.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
