"""The one commit path: where a row's committed tokens move its matcher, proposer and target cache together.

Three kinds of step commit through :func:`commit`: a verified step (the
accepted path and the target's own token), a token the grammar forces (no
target pass: ``kv`` is ``None`` and the token is fed in the next pass), and a
chunk of a prompt a joining row read (``fed``: its columns are kept, nothing
is generated).
"""

from __future__ import annotations

from collections.abc import Sequence

from grammarspec.engine.isolation import contained
from grammarspec.engine.rows import Row, Step, StepResources
from grammarspec.engine.stopping import stop_reason
from grammarspec.kv.batch import BatchKV
from proposers.base import EMPTY_DRAFT

__all__ = ["commit", "tell"]


def commit(
    rows: Sequence[Row],
    steps: Sequence[Step],
    results: Sequence[tuple[list[int], int | None]],
    kv: BatchKV | None,
    shared: StepResources,
    fed: Sequence[int | None] | None = None,
) -> list[int]:
    """Commit each row's step.  Returns how many tokens each row committed.  Changes every stateful part.

    Row ``r`` commits the tokens of its accepted ``path`` through its tree and
    the target's own next token: its matcher accepts them, its proposer is told
    (``commit``, or ``commit_tree`` for a tree it drafted), and ``kv.keep`` --
    the one KV rollback -- keeps the row's pending tokens plus the accepted
    nodes (moved into place off a tree's first branch); the next token is fed
    in the next pass.  A stop condition met inside the run ends the row there
    (``finish_reason``).  ``kv=None``: a forced token, committed before any pass
    (the cache is unchanged).  ``fed[r]`` (not None): row ``r`` read that many
    tokens of its prompt this pass and keeps them; it generates nothing.
    A row whose commit raises (its matcher, its proposer, its stop check, the
    ``on_commit`` callback), or that failed earlier in the step, commits no
    more (:mod:`grammarspec.engine.isolation`): it keeps no new column of the cache.

    A row that verified no draft of its own keeps its committed tokens in
    ``row.untold`` until :func:`tell` passes them to the proposer, in one call,
    before it next drafts or when the row ends: a row resting its proposer
    (grammarspec/policy/adaptive.py) then costs its proposer nothing a step.  The
    proposer hears the same tokens in the same order; only the calls are fewer.
    """
    fed = fed if fed is not None else [None] * len(rows)
    kept, counts = [], []
    for row, step, (path, next_token), read in zip(rows, steps, results, fed):
        if read is not None:  # a prompt chunk: its columns stay, nothing is generated
            row.cached += read
            kept.append(list(range(read)))
            counts.append(0)
            continue
        pending = len(row.pending)
        committed = None
        if row.failure is None:
            committed = contained(row, "committing its tokens", None, _commit_step, row, step, path, next_token, shared)
        if committed is None:  # the row failed: it keeps no new column, and leaves the batch at the next step
            kept.append([])
            counts.append(0)
            continue
        if kv is not None:
            keep = min(pending + len(path), len(row.tokens) - row.cached)
            row.cached += keep
            kept.append((list(range(pending)) + [pending + i for i in path])[:keep])
        counts.append(len(committed))
    if kv is not None:
        kv.keep(kept)
    return counts


def tell(row: Row) -> None:
    """Pass the row's untold committed tokens to its proposer (no draft of its own verified: every earlier
    draft was cut, or none was asked for).  Before the proposer drafts again, and when the row ends (a
    conversation keeps its proposer for the next turn).  Changes the proposer."""
    if row.untold and row.proposer is not None:
        untold, row.untold = row.untold, []
        row.proposer.commit(EMPTY_DRAFT, 0, untold)


def _commit_step(row: Row, step: Step, path: Sequence[int], next_token: int | None, shared: StepResources) -> list[int]:
    """The row's accepted path and the target's token: the matcher accepts them (up to a stop condition) and the
    proposer is told.  Returns the committed tokens.  Changes the row, its matcher and its proposer."""
    new = [step.tree.tokens[i] for i in path] + ([next_token] if next_token is not None else [])
    committed = _commit_row(row, new, shared)
    if row.proposer is not None:
        if not len(step.tree):  # no draft of its own: the proposer hears these tokens when it next drafts
            row.untold += committed
        elif step.is_tree:
            assert row.tree_drafter is not None and not row.untold
            row.tree_drafter.commit_tree(step.tree, committed)
        else:
            assert not row.untold, "a row drafted before its proposer heard every committed token"
            row.proposer.commit(step.draft.truncate(len(step.tree)), len(path), committed)
    return committed


def _commit_row(row: Row, new: Sequence[int], shared: StepResources) -> list[int]:
    """Append ``new`` token by token until a stop condition; advance the matcher.  Returns what was appended."""
    emitted: list[int] = []
    settings = row.settings
    for token in new:
        if row.matcher is not None and not row.matcher.accept(token):
            raise RuntimeError(f"internal error: committed token {token} is illegal for the grammar")
        row.tokens.append(token)
        emitted.append(token)
        row.finish_reason = stop_reason(
            row.generated, row.matcher, shared.eos, settings.max_new_tokens, settings.stop_strings, shared.tokenizer
        )
        if row.finish_reason:
            break
    row.stats.new_tokens += len(emitted)
    if shared.on_commit is not None and emitted:
        shared.on_commit(row.index, emitted)
    return emitted
