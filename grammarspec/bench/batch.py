"""Throughput at batch size B: grammarspec's batched loop against batched plain constrained decoding.

For each batch size the task list is cut, in order, into batches of ``B``
requests.  Every batch is run by both arms back to back (the order alternates
from batch to batch, so machine noise hits both alike):

* ``baseline`` -- Hugging Face ``model.generate`` on the left-padded batch with
  xgrammar's HF logits processor holding one compiled grammar per row (what
  users run today; the batch runs until its longest row ends);
* ``auto`` -- :func:`grammarspec.generate` on the same batch, ``assistant="auto"``
  (rows leave the batch as they finish).

Throughput is committed tokens (each row's tokens up to and including its
stop token) over the summed wall time of all batches; a request's latency is
the time from its batch's start to its own end (the batch's end for the
baseline, the row's finish for grammarspec).  Greedy outputs of the two arms
are compared row by row.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

import grammarspec
from grammarspec.decoding import logits_width

from .arms import BaselineGrammars, prepare_grammars
from .tasks import BenchTask

__all__ = ["BatchRun", "run_batch_bench", "batch_table"]

ARMS = ("baseline", "auto")


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
    categories: dict[str, list[float]] = field(default_factory=dict)  # category -> [tokens, seconds share]

    @property
    def throughput(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def tokens_per_pass(self) -> float:
        """Committed tokens per target pass of a request (1 for plain decoding)."""
        return self.tokens / self.row_passes if self.row_passes else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"arm": self.arm, "batch_size": self.batch_size, "seconds": round(self.seconds, 3),
                "tokens": self.tokens, "throughput": round(self.throughput, 2), "target_passes": self.target_passes,
                "tokens_per_pass": round(self.tokens_per_pass, 3),
                "latency_p50": round(statistics.median(self.latencies), 3) if self.latencies else 0.0,
                "latency_max": round(max(self.latencies), 3) if self.latencies else 0.0,
                "categories": {c: round(v[0] / v[1], 2) if v[1] else 0.0 for c, v in self.categories.items()}}  # fmt: skip


def _prompt(tokenizer: Any, task: BenchTask) -> list[int]:
    return grammarspec.build_prompt(tokenizer, task.prompt, system=task.system,
                                    schema=task.schema if not task.tools else None, tools=task.tools)  # fmt: skip


def _left_pad(prompts: Sequence[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def _cut(tokens: list[int], eos: int) -> list[int]:
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def _run_baseline(model: Any, ids: torch.Tensor, mask: torch.Tensor, grammars: list[Any], eos: int,
                  max_new: int) -> tuple[list[list[int]], float, int]:  # fmt: skip
    from transformers import LogitsProcessorList
    from xgrammar.contrib.hf import LogitsProcessor

    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, logits_processor=LogitsProcessorList([LogitsProcessor(grammars)]),
                             eos_token_id=eos, pad_token_id=eos, max_new_tokens=max_new, do_sample=False)  # fmt: skip
    seconds = time.perf_counter() - t0
    new = out[:, ids.shape[1] :]
    return [_cut(row.tolist(), eos) for row in new], seconds, int(new.shape[1])


def _run_auto(model: Any, tokenizer: Any, ids: torch.Tensor, mask: torch.Tensor, schemas: list[Any],
              max_new: int) -> tuple[list[list[int]], float, list[float], int, int]:  # fmt: skip
    t0 = time.perf_counter()
    out = grammarspec.generate(model, ids, attention_mask=mask, tokenizer=tokenizer, schema=schemas, assistant="auto",
                               max_new_tokens=max_new, do_sample=False, return_dict_in_generate=True)  # fmt: skip
    seconds = time.perf_counter() - t0
    setup = seconds - max(s.total_seconds for s in out.stats)
    outputs = [out.sequences[i, ids.shape[1] :].tolist()[: s.new_tokens] for i, s in enumerate(out.stats)]
    latencies = [setup + s.total_seconds for s in out.stats]
    steps = max(s.target_forwards for s in out.stats)  # one batch pass per step
    return outputs, seconds, latencies, steps, sum(s.target_forwards for s in out.stats)


def run_batch_bench(
    model: torch.nn.Module,
    tokenizer: Any,
    tasks: Sequence[BenchTask],
    batch_sizes: Sequence[int],
    max_new_tokens: int,
    progress: Callable[[str], None] | None = None,
) -> list[BatchRun]:
    """Both arms at every batch size over ``tasks`` (greedy); one :class:`BatchRun` per arm and size."""
    eos = tokenizer.eos_token_id
    baseline = BaselineGrammars(tokenizer, logits_width(model), eos)
    prepared = []
    for task in tasks:
        try:
            prepared.append((task, _prompt(tokenizer, task), prepare_grammars(model, tokenizer, baseline, task.schema)))
        except grammarspec.GrammarError:
            continue
    runs = []
    for size in batch_sizes:
        arms = {arm: BatchRun(arm, size) for arm in ARMS}
        for b, first in enumerate(range(0, len(prepared), size)):
            chunk = prepared[first : first + size]
            ids, mask = _left_pad([p for _, p, _ in chunk], eos)
            order = ARMS if b % 2 == 0 else ARMS[::-1]
            for arm in order:
                run = arms[arm]
                if arm == "baseline":
                    outputs, seconds, steps = _run_baseline(model, ids, mask, [g for _, _, g in chunk], eos,
                                                            max_new_tokens)  # fmt: skip
                    latencies = [seconds] * len(chunk)
                    row_passes = sum(len(o) for o in outputs)
                else:
                    outputs, seconds, latencies, steps, row_passes = _run_auto(model, tokenizer, ids, mask,
                                                                   [t.schema for t, _, _ in chunk], max_new_tokens)  # fmt: skip
                run.seconds += seconds
                run.target_passes += steps
                run.row_passes += row_passes
                run.latencies += latencies
                total = sum(len(o) for o in outputs)
                run.tokens += total
                for (task, _, _), out in zip(chunk, outputs):
                    run.outputs[task.id] = out
                    share = run.categories.setdefault(task.category, [0.0, 0.0])
                    share[0] += len(out)
                    share[1] += seconds * len(out) / max(total, 1)
                if progress is not None:
                    progress(f"B={size} batch {b + 1} {arm}: {total} tokens in {seconds:.1f}s")
        runs += list(arms.values())
    return runs


def batch_table(runs: Sequence[BatchRun]) -> str:
    """Markdown: throughput, latency, tokens per pass and ratios per batch size."""
    by = {(r.arm, r.batch_size): r for r in runs}
    sizes = sorted({r.batch_size for r in runs})
    auto1 = by.get(("auto", 1))
    lines = ["| B | baseline tok/s | auto tok/s | auto / baseline | auto / auto at B=1 | auto tokens per pass "
             "| latency p50 baseline / auto (s) | lowest category (auto / baseline) | identical outputs |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for size in sizes:
        base, auto = by[("baseline", size)], by[("auto", size)]
        same = sum(base.outputs.get(k) == v for k, v in auto.outputs.items())
        ratios = {c: (auto.categories[c][0] / auto.categories[c][1]) / (base.categories[c][0] / base.categories[c][1])
                  for c in auto.categories if base.categories.get(c, [0, 0])[1] and auto.categories[c][1]}  # fmt: skip
        low = min(ratios.items(), key=lambda kv: kv[1]) if ratios else ("-", 0.0)
        vs1 = f"{auto.throughput / auto1.throughput:.2f}x" if auto1 and auto1.throughput else "-"
        lines.append(
            f"| {size} | {base.throughput:.1f} | {auto.throughput:.1f} | {auto.throughput / base.throughput:.2f}x | "
            f"{vs1} | {auto.tokens_per_pass:.2f} | "
            f"{statistics.median(base.latencies):.2f} / {statistics.median(auto.latencies):.2f} | "
            f"{low[0]} {low[1]:.2f}x | {same}/{len(auto.outputs)} |"
        )
    return "\n".join(lines)
