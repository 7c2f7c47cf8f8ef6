"""Where a row's committed tokens move its matcher, proposer and target cache together, and every other mover.

Three kinds of step commit through :func:`commit`: a verified step (the
accepted path and the target's own token), a token the grammar forces (no
target pass: ``kv`` is ``None`` and the token is fed in the next pass), and a
chunk of a prompt a joining row read (``fed``: its columns are kept, nothing
is generated).  :func:`tell` belongs to the same path: it hands the proposer
the committed tokens it has not heard yet.

The invariant.  A row's state -- its ``tokens``, its matcher, its proposer
(and what it has not heard, ``untold``), its ``cached`` count, its columns of
the target cache, its ``finish_reason`` and a draft model's cache -- moves in
this module (and in a proposer's own ``commit`` / ``commit_tree``, which only
this module calls), or in one of the places :data:`OTHER_MOVERS` names, each
with what it moves and why it is not here.  A controller holds no committed
state, but its movers are listed too: it decides the draft lengths.
``tests/engine/test_commit_invariant.py`` reads the loop's source and fails on a
mover that is in neither, and on a listed one that is gone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from grammarspec.engine.isolation import contained
from grammarspec.engine.rows import Row, Step, StepResources
from grammarspec.engine.stopping import stop_reason
from grammarspec.kv.batch import BatchKV
from proposers.base import EMPTY_DRAFT

__all__ = ["OTHER_MOVERS", "Mover", "commit", "tell"]


@dataclass(frozen=True)
class Mover:
    """A place outside :func:`commit` that moves a row's state: ``where`` (``module:function``), what it ``moves``
    (``tokens``, ``cached``, ``finish_reason``, ``matcher``, ``proposer``, ``kv``, ``draft_cache``,
    ``controller``) and ``why`` it is not in the commit path."""

    where: str
    moves: tuple[str, ...]
    why: str


#: Every place outside the commit path that moves a row's state (tests/engine/test_commit_invariant.py keeps it whole).
OTHER_MOVERS: tuple[Mover, ...] = (
    Mover(
        "grammarspec.engine.row_requests:row_request",
        ("proposer",),
        "builds the row: binds a draft model to the row's processing and starts the proposer on the prompt, before "
        "anything is committed",
    ),
    Mover(
        "grammarspec.engine.decoding:_new_row",
        ("proposer",),
        "a proposer that sizes its choices by the pass cost gets the target's cost model before the row's first step "
        "(configuration, no committed token)",
    ),
    Mover(
        "grammarspec.engine.decoding:decode_batch",
        ("finish_reason",),
        "a row asked for no new token ends as 'length' before it joins: it never reaches a step",
    ),
    Mover(
        "grammarspec.engine.decoding:_join",
        ("cached", "kv"),
        "a joining row takes a slot of the batch cache (a prompt cache is copied in), and ``cached`` counts what the "
        "slot holds: the row's columns start, nothing is committed",
    ),
    Mover(
        "grammarspec.engine.decoding:_report",
        ("finish_reason",),
        "the feed cancels a row between steps ('cancelled'): no token moves, the row leaves at the next step",
    ),
    Mover(
        "grammarspec.engine.isolation:fail",
        ("finish_reason",),
        "a row whose own work raised ends with 'error' and keeps the exception; it is reached from inside commit too "
        "(contained), so it cannot live here",
    ),
    Mover(
        "grammarspec.engine.step:leave",
        ("kv",),
        "a finished row's slot is freed (kv.select); the rows that stay keep their columns and positions",
    ),
    Mover(
        "grammarspec.engine.step:run_step",
        ("kv",),
        "the one target forward writes each row's pending tokens and draft into new columns (scratch); commit's "
        "kv.keep then keeps the committed ones and drops the rest",
    ),
    Mover(
        "grammarspec.engine.step:_ask",
        ("controller",),
        "a resting controller wakes where the grammar forces text: draft lengths, no committed state",
    ),
    Mover(
        "grammarspec.engine.step:_propose",
        ("proposer",),
        "the proposer drafts (propose / propose_tree): a draft is scratch after the committed tokens, which the "
        "commit path rolls back to what was accepted",
    ),
    Mover(
        "grammarspec.engine.step:_allocate",
        ("controller",),
        "each controller hears how much of its draft the batch's allocation admitted: draft lengths, no committed "
        "state",
    ),
    Mover(
        "grammarspec.engine.bookkeeping:account",
        ("controller",),
        "each controller learns what its verified draft brought, after the commit: draft lengths, no committed state",
    ),
    Mover(
        "grammarspec.engine.masking:prune_and_fill_masks",
        ("matcher",),
        "the walk accepts a draft tree's nodes depth first and rolls every one back: the matcher ends as it began",
    ),
    Mover(
        "grammarspec.drafting.draft_model:DraftModelProposer.start",
        ("draft_cache",),
        "a new request keeps the longest cached prefix of its prompt (a conversation starts it every turn)",
    ),
    Mover(
        "grammarspec.drafting.draft_model:DraftModelProposer.propose",
        ("draft_cache", "matcher"),
        "drafting appends its draft to the draft cache (scratch, cropped by its commit); it crops only to re-sync a "
        "context that does not extend what commit left; the matcher it walks is its own fork",
    ),
    Mover(
        "grammarspec.drafting.draft_model:DraftModelProposer._sync",
        ("draft_cache",),
        "the crop that start, propose and commit share",
    ),
    Mover(
        "grammarspec.drafting.draft_model:DraftModelProposer._forward",
        ("draft_cache",),
        "the draft model's pass that propose runs: it appends the fed tokens to the draft cache",
    ),
)


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
