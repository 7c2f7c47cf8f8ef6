"""How a step reads the prompts of rows that joined a busy batch: the plan, its budget, the forward's width.

A row that joins while other rows decode reads its prompt in chunks, one chunk
a step beside the decoding rows (:func:`prompt_plan`), within the step's prompt
budget (:func:`prompt_budget`, on the target's pass cost model); the forward
folds a long chunk into extra batch rows about as wide as the decoding rows'
(:func:`fold_width`).  Nothing here changes state: the step
(:func:`grammarspec.engine.step.run_step`) feeds what the plan says and
:func:`grammarspec.engine.commit.commit` keeps it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from grammarspec.engine.rows import Row, StepResources

__all__ = ["PROMPT_STEP_COST", "checked_prompt_chunk", "fold_width", "prompt_budget", "prompt_plan"]

#: A step that reads prompt chunks costs at most this many times the step without them (on the pass cost model):
#: the decoding rows' per-token latency while a prompt is read, as a share of their latency without it.  The
#: budget is never less than the earliest joining prompt's whole rest, so a joining request's time to first token
#: is its prompt's own pass plus one of the batch's steps, whatever the pass cost's shape (a CPU's steep curve
#: would otherwise read a long prompt a few tokens a step, for tens of seconds).  It is spent first come, first
#: served, so prompts that join together are read one after another, each in a step of its own beside the
#: decoding rows, and not all in one long pass that every one of them waits for: on a pass cost that grows with
#: the tokens, a clump of k prompts then waits 1, 2, ..., k prompts' reading instead of k each, and its rows start
#: (and end) apart, so later requests do not arrive in clumps either.  Reading at least one whole prompt a step
#: keeps up with the requests that arrive as long as the batch's rows take more steps each than there are rows.
PROMPT_STEP_COST = 2.0


def checked_prompt_chunk(prompt_chunk: int | None) -> int | None:
    """``prompt_chunk`` (the most prompt tokens one step reads; ``None``: derived), or ``ValueError`` below 1."""
    if prompt_chunk is not None and prompt_chunk < 1:
        raise ValueError(f"prompt_chunk must be >= 1 prompt tokens a step (or None: derived), got {prompt_chunk}")
    return prompt_chunk


def prompt_plan(
    model: torch.nn.Module, active: Sequence[Row], shared: StepResources, chunk: int | None
) -> list[int | None]:
    """How many prompt tokens each row reads this step without stepping (``None``: a full step).

    A row that joined a busy batch reads its prompt in chunks while more of it
    is uncached than the step's prompt budget leaves it; the budget (``chunk``,
    or the larger of :func:`prompt_budget` and the earliest joining prompt's
    whole rest) is spent first come, first served, in the order the rows came
    (``Row.index``; slot order is reshuffled by leaves).  Rows that join
    together do not share it evenly: the earliest reads first, so each waits
    for the prompts before it and not for those after.  Every reading row gets
    at least one token, so every prompt progresses, and never its prompt's last
    token (the full step feeds it and samples after it).  When no row is decoding,
    every row takes a full step: its whole prompt in one pass, as at batch 1.
    Does not change state.
    """
    behind = [row.prompt_length - row.cached for row in active]
    decoding = [row for row, left in zip(active, behind) if left <= 1]
    if not decoding or len(decoding) == len(active):
        return [None] * len(active)
    joining = sorted((slot for slot, left in enumerate(behind) if left > 1), key=lambda slot: active[slot].index)
    if chunk is not None:
        budget = chunk
    else:  # the pass cost's budget, and at least the earliest joining prompt whole
        budget = max(prompt_budget(model, sum(len(r.pending) for r in decoding), shared), behind[joining[0]])
    plan: list[int | None] = [None] * len(active)
    for slot in joining:
        row, left = active[slot], behind[slot]
        if len(row.pending) <= budget:  # the rest of its prompt fits: it steps
            budget -= len(row.pending)
        else:
            read = max(1, min(budget, left - 1))
            plan[slot] = read
            budget -= read
    return plan


def prompt_budget(model: torch.nn.Module, decoding_tokens: int, shared: StepResources) -> int:
    """The most prompt tokens a step may add to ``decoding_tokens`` and cost at most :data:`PROMPT_STEP_COST` times
    the step without them, on the target's pass cost model (a flat curve -- a GPU -- reads whole prompts at once;
    a linear one -- a CPU -- reads them in chunks about as large as the decoding rows).  Does not change state."""
    cost = shared.step_cost or shared.pass_cost.cost().cost
    limit = PROMPT_STEP_COST * cost(max(decoding_tokens, 1))
    low, high = 0, 1
    while high < 1 << 20 and cost(decoding_tokens + high) <= limit:
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if cost(decoding_tokens + middle) <= limit else (low, middle)
    return max(low, 1)


def fold_width(active: Sequence[Row], chunks: Sequence[Sequence[int]], fed: Sequence[int | None]) -> int | None:
    """How wide the forward is: the decoding rows' widest chunk, or wider, so a step's prompt tokens ride as at
    most about as many folded rows as there are decoding rows.  ``None`` (nothing folded) when no row decodes."""
    decoding = [
        len(chunk)
        for row, chunk, read in zip(active, chunks, fed)
        if read is None and row.prompt_length - row.cached <= 1
    ]
    if not decoding:
        return None
    prompt = sum(
        len(chunk)
        for row, chunk, read in zip(active, chunks, fed)
        if read is not None or row.prompt_length - row.cached > 1
    )
    return max(max(decoding), -(-prompt // len(decoding)))
