"""What a decoding step records: statistics, the controller's inputs, the finish, the scores (bookkeeping only).

Nothing here changes committed state (tokens, matchers, proposers, the cache);
:func:`account` lets the row's controller learn what the step brought, which
steers its later draft lengths.  The step (:mod:`grammarspec.engine.step`) calls these
after its commit.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from grammarspec.engine.rows import Row, Step

__all__ = ["account", "finish", "record_scores"]


def account(
    row: Row, step: Step, path: Sequence[int], next_token: int | None, verify: float, commit_s: float, started: float
) -> None:
    """Statistics and the row's calibration after one step (chain or tree).

    The deepest path offered stands for the draft's length (a chain: its
    length); the accepted path's nodes count first among the proposed ones.
    The row's controller calibrates its estimates on what was accepted (a
    tree is verified whole), and on the first token the policy cut, judged
    by the target's own ``next_token``
    (:meth:`grammarspec.policy.adaptive.AdaptiveController.record`).  Nothing here
    learns from measured times: draft lengths never follow the wall clock.
    """
    stats, tree, accepted = row.stats, step.tree, len(path)
    stats.target_forwards += 1
    if stats.target_forwards == 1:
        stats.first_step_seconds, stats.first_step_tokens = time.perf_counter() - started, stats.new_tokens
    longest = max(tree.depths(), default=-1) + 1
    stats.steps.append((longest, accepted))
    stats.draft_seconds += step.draft_seconds
    stats.verify_seconds += verify
    stats.grammar_seconds += step.grammar_seconds + commit_s
    if len(tree):
        sources = tree.sources or ("draft",) * len(tree)
        order = list(path) + [i for i in range(len(tree)) if i not in path]
        stats.count(tuple(sources[i] for i in order), accepted)
    decoding = stats.target_forwards > 1  # the prefill pass is no decoding step
    controller = row.controller
    if controller is not None and decoding:
        if step.is_tree:
            controller.allocated(longest)  # (policy) a tree is verified whole
        else:
            controller.record(step.draft.truncate(len(tree)), accepted, step.offered, next_token)  # (policy) it learns


def finish(row: Row, seconds: float) -> None:
    stats = row.stats
    stats.total_seconds = seconds
    stats.finish_reason = row.finish_reason or "length"
    if row.controller is not None:
        stats.final_k, stats.speculating = row.controller.k, row.controller.speculate


def record_scores(
    rows: Sequence[Row],
    steps: Sequence[Step],
    results: Sequence[tuple[list[int], int | None]],
    committed: Sequence[int],
    logits: torch.Tensor,
    scores: torch.Tensor,
) -> None:
    """Keep the raw logits and processed scores of the rows whose tokens were committed (the path's rows)."""
    for row, step, (path, _), used in zip(rows, steps, results, committed):
        on_path = ([step.start] + [step.start + 1 + i for i in path])[:used]
        row.logits += list(logits[on_path])
        row.scores += list(scores[on_path])
