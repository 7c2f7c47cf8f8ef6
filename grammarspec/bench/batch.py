"""Throughput at batch size B: grammarspec's batched loop against batched plain constrained decoding.

For each batch size ``B`` every arm serves the whole task list, back to back
(the arm order alternates from size to size, so machine noise hits them alike),
after one untimed warm-up call per arm (first calls pay one-off costs: kernels,
vocabulary tables, the pass cost profile of :mod:`grammarspec.drafting.pass_profile`):

* ``baseline`` -- what transformers users run today: the list cut, in order, into
  batches of ``B``, each run by Hugging Face ``model.generate`` on the
  left-padded batch with xgrammar's HF logits processor holding one compiled
  grammar per row (a batch runs until its longest row ends);
* ``none`` -- one :func:`grammarspec.generate` call over the whole list with
  ``max_batch_size=B`` and ``assistant="none"``: grammarspec's batched loop
  without speculation (at most ``B`` rows decode together, a row leaves the
  batch when it finishes and a waiting request joins);
* ``auto`` -- the same call with ``assistant="auto"``: drafts sized by the
  goodput policy over the whole batch (:mod:`grammarspec.policy.allocation`).

Throughput is committed tokens (each row's tokens up to and including its
stop token) over the arm's wall time; a request's latency is the time from
the start of the arm to its own end (its batch's end for the baseline).
Greedy outputs of the arms are compared row by row.  For ``auto`` the run
also counts the draft tokens verified per row and step (``drafted_per_row``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

import grammarspec
from grammarspec.bench.arms import BaselineGrammars, generate_rows, prepare_grammars
from grammarspec.bench.tasks import BenchTask
from grammarspec.engine.decoding import logits_width

__all__ = ["BatchRun", "run_batch_bench", "batch_table"]

ARMS = ("baseline", "none", "auto")
#: Tokens of each arm's untimed warm-up call.
WARMUP_TOKENS = 16


@dataclass
class BatchRun:
    """One arm over the whole task list at one batch size."""

    arm: str
    batch_size: int
    seconds: float = 0.0
    tokens: int = 0
    target_passes: int = 0  # forward passes of the batch (grammarspec: its steps; baseline: decoding steps)
    row_passes: int = 0  # target passes summed over requests (a request's tokens per pass = tokens / its passes)
    latencies: list[float] = field(default_factory=list)
    outputs: dict[str, list[int]] = field(default_factory=dict)
    categories: dict[str, list[float]] = field(default_factory=dict)  # category -> [tokens, seconds]
    drafted: int = 0  # draft tokens verified, over every row and step (grammarspec arms)

    @property
    def throughput(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def tokens_per_pass(self) -> float:
        """Committed tokens per target pass of a request (1 for plain decoding)."""
        return self.tokens / self.row_passes if self.row_passes else 0.0

    @property
    def drafted_per_row(self) -> float:
        """Draft tokens verified per row per step (0 without speculation)."""
        return self.drafted / self.row_passes if self.row_passes else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "arm": self.arm,
            "batch_size": self.batch_size,
            "seconds": round(self.seconds, 3),
            "tokens": self.tokens,
            "throughput": round(self.throughput, 2),
            "target_passes": self.target_passes,
            "tokens_per_pass": round(self.tokens_per_pass, 3),
            "drafted_per_row": round(self.drafted_per_row, 3),
            "latency_p50": round(statistics.median(self.latencies), 3) if self.latencies else 0.0,
            "latency_max": round(max(self.latencies), 3) if self.latencies else 0.0,
            "categories": {c: round(v[0] / v[1], 2) if v[1] else 0.0 for c, v in self.categories.items()},
        }


def _prompt(tokenizer: Any, task: BenchTask) -> list[int]:
    return grammarspec.build_prompt(
        tokenizer, task.prompt, system=task.system, schema=task.schema if not task.tools else None, tools=task.tools
    )


def _left_pad(prompts: Sequence[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def _cut(tokens: list[int], eos: int) -> list[int]:
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def _run_baseline(
    model: Any, ids: torch.Tensor, mask: torch.Tensor, grammars: list[Any], eos: int, max_new: int, **settings: Any
) -> tuple[list[list[int]], float, int]:
    """HF generate + xgrammar's HF processor (greedy unless ``settings`` say otherwise) -> each row's new tokens
    up to its EOS, the seconds and the steps."""
    from transformers import LogitsProcessorList
    from xgrammar.contrib.hf import LogitsProcessor

    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=mask,
            logits_processor=LogitsProcessorList([LogitsProcessor(grammars)]),
            eos_token_id=eos,
            pad_token_id=eos,
            max_new_tokens=max_new,
            **{"do_sample": False, **settings},
        )
    seconds = time.perf_counter() - t0
    new = out[:, ids.shape[1] :]
    return [_cut(row.tolist(), eos) for row in new], seconds, int(new.shape[1])


def run_batch_bench(
    model: torch.nn.Module,
    tokenizer: Any,
    tasks: Sequence[BenchTask],
    batch_sizes: Sequence[int],
    max_new_tokens: int,
    progress: Callable[[str], None] | None = None,
    arms: Sequence[str] | None = None,
) -> list[BatchRun]:
    """Every arm at every batch size over ``tasks`` (greedy); one :class:`BatchRun` per arm and size."""
    eos = tokenizer.eos_token_id
    baseline = BaselineGrammars(tokenizer, logits_width(model), eos)
    prepared = []
    for task in tasks:
        try:
            prepared.append((task, _prompt(tokenizer, task), prepare_grammars(model, tokenizer, baseline, task.schema)))
        except grammarspec.GrammarError:
            continue
    by_category: dict[str, list[Any]] = {}
    for item in prepared:
        by_category.setdefault(item[0].category, []).append(item)
    runs = []
    arms = tuple(a for a in ARMS if a in (arms or ARMS))
    if prepared:  # warm-up: one untimed short call per arm
        for arm in arms:
            _serve(arm)(model, tokenizer, prepared[:1], 1, eos, WARMUP_TOKENS, BatchRun(arm, 1))
    for n, size in enumerate(batch_sizes):
        order = arms if n % 2 == 0 else arms[::-1]
        for arm in order:
            run = BatchRun(arm, size)
            for category, items in by_category.items():  # each category is served on its own: its throughput
                seconds = _serve(arm)(model, tokenizer, items, size, eos, max_new_tokens, run)
                run.seconds += seconds
                run.categories.setdefault(category, [0.0, 0.0])[1] += seconds
            if progress is not None:
                progress(f"B={size} {arm}: {run.tokens} tokens in {run.seconds:.1f}s ({run.throughput:.1f} tokens/s)")
            runs.append(run)
    return runs


def _serve(arm: str) -> Callable[..., float]:
    """The function that serves a task list under ``arm``."""
    if arm == "baseline":
        return _serve_baseline
    return lambda *args: _serve_grammarspec(arm, *args)


def _serve_baseline(
    model: Any, tokenizer: Any, items: list[Any], size: int, eos: int, max_new: int, run: BatchRun
) -> float:
    """HF generate over ``items`` cut into batches of ``size``; returns the seconds."""
    elapsed = run.seconds
    start = elapsed
    for first in range(0, len(items), size):
        chunk = items[first : first + size]
        ids, mask = _left_pad([p for _, p, _ in chunk], eos)
        outputs, seconds, steps = _run_baseline(model, ids, mask, [g for _, _, g in chunk], eos, max_new)
        elapsed += seconds
        _add(run, [t for t, _, _ in chunk], outputs, [elapsed - start] * len(chunk), steps, sum(map(len, outputs)))
    return elapsed - start


def _serve_grammarspec(
    assistant: str, model: Any, tokenizer: Any, items: list[Any], size: int, eos: int, max_new: int, run: BatchRun
) -> float:
    """One grammarspec call over ``items`` with ``max_batch_size=size`` and ``assistant``; returns the seconds."""
    outputs, stats, seconds = generate_rows(
        model,
        tokenizer,
        [p for _, p, _ in items],
        [t.schema for t, _, _ in items],
        assistant,
        pad=eos,
        max_batch_size=size,
        max_new_tokens=max_new,
        do_sample=False,
    )
    setup = seconds - max(s.total_seconds for s in stats)
    _add(
        run,
        [t for t, _, _ in items],
        outputs,
        [setup + s.total_seconds for s in stats],
        max(s.target_forwards for s in stats),
        sum(s.target_forwards for s in stats),
    )
    run.drafted += sum(longest for s in stats for longest, _ in s.steps)
    return seconds


def _add(
    run: BatchRun,
    tasks: Sequence[BenchTask],
    outputs: list[list[int]],
    latencies: list[float],
    steps: int,
    row_passes: int,
) -> None:
    """Record one call's outputs in ``run``: tokens per category, latencies, passes."""
    run.target_passes += steps
    run.row_passes += row_passes
    run.latencies += latencies
    for task, out in zip(tasks, outputs):
        run.outputs[task.id] = out
        run.tokens += len(out)
        run.categories.setdefault(task.category, [0.0, 0.0])[0] += len(out)


def _rate(run: BatchRun | None) -> str:
    return f"{run.throughput:.1f}" if run is not None else "-"


def _over(auto: BatchRun, run: BatchRun | None) -> str:
    return f"{auto.throughput / run.throughput:.2f}x" if run is not None and run.throughput else "-"


def batch_table(runs: Sequence[BatchRun]) -> str:
    """Markdown: throughput, ratios, tokens per pass, drafted tokens, latency and agreement per batch size.

    An arm left out (``--arms auto``) shows ``-`` in its columns; identical outputs are counted against
    the arms that ran (``-`` when auto ran alone).
    """
    by = {(r.arm, r.batch_size): r for r in runs}
    sizes = sorted({r.batch_size for r in runs})
    auto1 = by.get(("auto", 1))
    lines = [
        "| B | baseline tok/s | none tok/s | auto tok/s | auto / baseline | auto / none | auto / auto at B=1 "
        "| auto tokens per pass | auto drafted per row-step | latency p50 baseline / auto (s) "
        "| lowest category (auto / baseline) | identical outputs |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for size in sizes:
        base, auto, none = by.get(("baseline", size)), by[("auto", size)], by.get(("none", size))
        others = [r for r in (base, none) if r is not None]
        same = sum(all(r.outputs.get(k) == v for r in others) for k, v in auto.outputs.items())
        ratios = {
            c: (auto.categories[c][0] / auto.categories[c][1]) / (base.categories[c][0] / base.categories[c][1])
            for c in auto.categories
            if base is not None and base.categories.get(c, [0, 0])[1] and auto.categories[c][1]
        }
        lowest = min(ratios.items(), key=lambda kv: kv[1]) if ratios else None
        low = f"{lowest[0]} {lowest[1]:.2f}x" if lowest else "-"
        vs1 = f"{auto.throughput / auto1.throughput:.2f}x" if auto1 and auto1.throughput else "-"
        base_latency = f"{statistics.median(base.latencies):.2f}" if base is not None and base.latencies else "-"
        lines.append(
            f"| {size} | {_rate(base)} | {_rate(none)} | {auto.throughput:.1f} | {_over(auto, base)} | {_over(auto, none)} | "
            f"{vs1} | "
            f"{auto.tokens_per_pass:.2f} | {auto.drafted_per_row:.2f} | "
            f"{base_latency} / {statistics.median(auto.latencies):.2f} | {low} | "
            f"{f'{same}/{len(auto.outputs)}' if others else '-'} |"
        )
    return "\n".join(lines)
