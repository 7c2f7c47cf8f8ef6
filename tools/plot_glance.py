"""Draw docs/bench/current.png from BENCHMARKS.md's own tables: batched ``generate`` and the server sweeps.

Usage: ``python tools/plot_glance.py [--benchmarks BENCHMARKS.md] [--out docs/bench/current.png]``.
The left panel reads the "Batched `generate`" table (tok/s per arm and batch size), the right one the
"At a glance" rows for the server (``auto`` / ``none`` per concurrency), so the plot never disagrees
with the tables it illustrates.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def table_after(text: str, heading: str) -> list[list[str]]:
    """The first Markdown table after ``heading``: its rows (header and separator dropped), cells stripped."""
    start = text.index(heading)
    rows: list[list[str]] = []
    for line in text[start:].splitlines()[1:]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            break
    return rows[2:]


def number(cell: str) -> float | None:
    """``"**2.18x**"`` -> 2.18; an empty cell -> None."""
    found = re.search(r"[0-9]+(?:\.[0-9]+)?", cell)
    return float(found.group()) if found else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmarks", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "current.png")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    text = args.benchmarks.read_text()
    batched = table_after(text, "## Batched `generate` against HF batched `generate` + xgrammar")
    sizes = [int(row[0]) for row in batched]
    arms = {"HF generate + xgrammar": 1, 'grammarspec, assistant="none"': 2, 'grammarspec, assistant="auto"': 3}
    glance = {row[0]: row[1:] for row in table_after(text, "## At a glance")}
    levels = [1, 4, 8, 16]

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.27
    colours = ["#999999", "#7fa7d4", "#1f5fa8"]
    for i, (label, column) in enumerate(arms.items()):
        values = [number(row[column]) or 0.0 for row in batched]
        bars = left.bar([x + (i - 1) * width for x in range(len(sizes))], values, width, label=label, color=colours[i])
        if i == 2:
            for bar, row in zip(bars, batched):
                left.annotate(row[4], (bar.get_x() + width / 2, bar.get_height()), ha="center", va="bottom", fontsize=9)
    left.set_ylim(0, max(number(row[3]) or 0.0 for row in batched) * 1.5)  # room for the legend
    left.set_xticks(range(len(sizes)), [str(s) for s in sizes])
    left.set_xlabel("batch size (grammarspec.generate)")
    left.set_ylabel("output tokens / s")
    left.set_title("JSON tasks, batched generate")
    left.legend(fontsize=8, loc="upper left")
    for key, label, marker, colour in (
        ("`grammarspec serve`, JSON, `auto` / `none`", "JSON (response_format; prompts repeat)", "o", "#1f5fa8"),
        ("`grammarspec serve`, free prose, `auto` / `none`", "free prose, new prompts", "s", "#d9822b"),
    ):
        points = [(c, number(cell)) for c, cell in zip(levels, glance[key])]
        points = [(c, v) for c, v in points if v is not None]
        right.plot([c for c, _ in points], [v for _, v in points], marker=marker, label=label, color=colour)
    right.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)
    right.set_xscale("log", base=2)
    right.set_xticks(levels, [str(c) for c in levels])
    right.set_xlabel("concurrent clients (grammarspec serve)")
    right.set_ylabel("auto / none, output tokens / s")
    right.set_title("Server under load")
    right.legend(fontsize=8)
    fig.suptitle("SmolLM2-135M, float32, 2 CPU cores; greedy outputs identical between arms", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
