"""What a decoding step records: statistics, the controller's inputs, the finish, the scores (bookkeeping only).

Nothing here changes generation state; the loop (:mod:`grammarspec.decoding`)
calls these after its commit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["account", "account_tree", "finish", "record_scores"]


def account(row: Any, step: Any, num_accepted: int, verify: float, commit_s: float, started: float,
            step_cost: Callable[[int], float] | None, alone: bool) -> None:  # fmt: skip
    """Statistics, the composite's cost measurement and the row's calibration after one step.

    The composite's pass cost model (``proposer.cost_model``) learns from the
    measured pass when the row had the pass to itself (``alone``: batch 1);
    ``step_cost`` (replays) means costs are modelled, so nothing is learned
    from time.  The row's controller calibrates its estimates on what was accepted.
    """
    stats = row.stats
    stats.target_forwards += 1
    if stats.target_forwards == 1:
        stats.first_step_seconds, stats.first_step_tokens = time.perf_counter() - started, stats.new_tokens
    stats.steps.append((len(step.draft), num_accepted))
    stats.draft_seconds += step.draft_seconds
    stats.verify_seconds += verify
    stats.grammar_seconds += step.grammar_seconds + commit_s
    if len(step.draft):
        stats.count(step.draft.sources or ("draft",) * len(step.draft), num_accepted)
    rows = step.segment.rows if step.segment is not None else len(step.draft) + 1
    model = getattr(row.proposer, "cost_model", None)
    decoding = stats.target_forwards > 1  # the prefill pass is no decoding step
    if model is not None and alone and decoding and verify > 0 and step_cost is None:  # a replay models its costs
        model.update(rows, verify)
    if row.controller is not None and decoding:
        row.controller.record(step.draft, num_accepted)  # (policy) the calibration learns


def finish(row: Any, seconds: float) -> None:
    stats = row.stats
    stats.total_seconds = seconds
    stats.finish_reason = row.finish_reason or "length"
    if row.controller is not None:
        stats.final_k, stats.speculating = row.controller.k, row.controller.speculate


def record_scores(rows: Sequence[Any], steps: Sequence[Any], committed: Sequence[int], logits: torch.Tensor,
            scores: torch.Tensor) -> None:  # fmt: skip
    """Keep the raw logits and processed scores of the rows whose tokens were committed."""
    for row, step, used in zip(rows, steps, committed):
        seg = step.segment
        assert seg is not None
        row.logits += list(logits[seg.start : seg.start + used])
        row.scores += list(scores[seg.start : seg.start + used])


def account_tree(row: Any, step: Any, result: Any, seconds: float, started: float) -> None:
    """Statistics and the controller's view of one tree step: the deepest path offered stands for the draft."""
    stats, tree = row.stats, result.tree
    stats.target_forwards += 1
    if stats.target_forwards == 1:
        stats.first_step_seconds, stats.first_step_tokens = time.perf_counter() - started, stats.new_tokens
    longest = max(tree.depths(), default=-1) + 1
    stats.steps.append((longest, len(result.accepted)))
    stats.draft_seconds += step.draft_seconds
    stats.verify_seconds += seconds
    if len(tree):
        sources = tree.sources or ("draft",) * len(tree)
        on_path, node = [], -1
        for token in result.accepted:  # the nodes that spell the accepted tokens, from the root
            node = tree.children(node)[token]
            on_path.append(node)
        order = on_path + [i for i in range(len(tree)) if i not in on_path]
        stats.count(tuple(sources[i] for i in order), len(on_path))
    if row.controller is not None and stats.target_forwards > 1:
        row.controller.allocated(longest)  # (policy) a tree is verified whole
