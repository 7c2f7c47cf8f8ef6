"""The speculative decoding loop, for a batch of requests.

One step for the whole batch (numbers match the comments in :func:`_step`)::

    (+) forced  -- while a row's grammar allows exactly one token, commit it without
                   sampling; it reaches the target in the next forward pass
    1. propose  -- each row's proposer offers up to k tokens (+ their draft distributions);
                   one allocation over the batch cuts each draft to what pays at this batch
    2. mask     -- each row's matcher walks its draft: one bitmask per target row, the
                   draft is cut at its first grammar-illegal token, the matcher is restored
    3. verify   -- ONE target forward over every row's pending tokens plus its draft
    4. accept   -- the row's own processing for each of its rows (mask, processors,
                   temperature, top-k, top-p, ...), then exact rejection sampling (or
                   greedy match), every row of the batch at once
    5. commit   -- :func:`commit`, the one place state moves: each matcher advances by
                   its committed tokens, every proposer is told what was accepted (a
                   draft model crops its own cache there), the target cache keeps each
                   row's accepted prefix; rejected positions leave no trace
    6. adapt    -- the batch's pass cost model learns the pass; each row's calibration
                   learns what its draft brought (grammarspec/policy.py)

Rows finish independently (grammar end, EOS, stop string, token limit) and leave
the batch, so the batch never waits for its longest row.  With no proposer every
step is a plain constrained decoding step; the output distribution of every row is
the same either way, and the same as at batch 1.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from grammars.base import Matcher, allocate_bitmask
from proposers.base import EMPTY_DRAFT, GrammarView, Proposer
from proposers.tree import DraftTree

from .bookkeeping import account, account_tree, finish, record_scores
from .kv import BatchKV
from .masking import apply_masks, forced_token, walk_draft
from .policy import batch_cost_model, plan_drafts
from .processing import LogitsPipeline
from .rejection import Segment, verify_greedy, verify_sampled
from .rows import DecodeConfig, DecodeState, Processing, Row, RowRequest, Shared, Step
from .sampling import LogitsProcessorFn, probabilities
from .stats import GenerationStats
from .stopping import stop_reason
from .tree_verify import verify_tree

if TYPE_CHECKING:
    from .adaptive import AdaptiveController

__all__ = [
    "DecodeConfig", "DecodeState", "RowRequest", "Row", "decode", "decode_batch", "commit", "logits_width",
    "sampling_processing",
]  # fmt: skip


def decode(
    model: torch.nn.Module,
    prompt_ids: Sequence[int],
    config: DecodeConfig,
    *,
    matcher: Matcher | None = None,
    proposer: Proposer | None = None,
    controller: AdaptiveController | None = None,
    tokenizer: Any = None,
    generator: torch.Generator | None = None,
    processors: Sequence[LogitsProcessorFn] = (),
    on_commit: Callable[[list[int]], None] | None = None,
    on_step: Callable[[DecodeState], None] | None = None,
    prompt_cache: Any = None,
    step_cost: Callable[[int], float] | None = None,
    processing: Processing | None = None,
) -> tuple[list[int], GenerationStats]:
    """Generate after ``prompt_ids`` (one request); returns ``(new_tokens, stats)``.

    ``matcher`` constrains the output (``None``: unconstrained); it must be fresh.
    ``proposer`` drafts (``None``: plain decoding).  ``on_commit`` receives each run
    of committed tokens (streamers); ``on_step`` sees the row after every step.
    ``prompt_cache``: a KV cache already holding the first tokens of the prompt
    (it is extended and cropped in place).  ``step_cost(rows)``: what the
    controller is told a target pass of ``rows`` rows costs, instead of the
    measured time (replays against an oracle target model the cost).
    ``processing``: the row's processing (a :class:`~grammarspec.processing.LogitsPipeline`);
    default: ``config``'s sampling settings plus ``processors``.
    """
    processing = processing or sampling_processing(config, processors, len(prompt_ids))
    request = RowRequest(prompt_ids, matcher, proposer, controller, processing)
    (row,) = decode_batch(
        model, [request], config, tokenizer=tokenizer, generator=generator, prompt_cache=prompt_cache,
        step_cost=step_cost, on_commit=(lambda index, tokens: on_commit(tokens)) if on_commit is not None else None,
        on_step=(lambda rows, kv: on_step(DecodeState(rows[0].tokens, rows[0].prompt_length, kv.cache, rows[0].cached)))
        if on_step is not None
        else None,
    )  # fmt: skip
    return row.generated, row.stats


@torch.inference_mode()
def decode_batch(
    model: torch.nn.Module,
    requests: Sequence[RowRequest],
    config: DecodeConfig,
    *,
    tokenizer: Any = None,
    generator: torch.Generator | None = None,
    pad_token_id: int = 0,
    prompt_cache: Any = None,
    max_batch_size: int | None = None,
    step_cost: Callable[[int], float] | None = None,
    on_commit: Callable[[int, list[int]], None] | None = None,
    on_step: Callable[[list[Row], BatchKV], None] | None = None,
) -> list[Row]:
    """Generate for every request; returns the finished rows in request order.

    One target forward per step serves every unfinished row.  With
    ``max_batch_size`` at most that many rows decode together and the others
    wait; a waiting request joins as soon as a row finishes (its prompt pass
    runs as a batch of its own, then its cache rows join the batch's).
    ``on_commit(index, tokens)`` receives each run of committed tokens of request
    ``index``; ``on_step(rows, kv)`` sees the batch after every step (tests check rollback).
    """
    rows = [_new_row(i, request, config) for i, request in enumerate(requests)]
    if config.stop_strings and tokenizer is None:
        raise ValueError("stop_strings need the tokenizer: pass tokenizer=...")
    if max_batch_size is not None and max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1 (or None for the whole batch), got {max_batch_size}")
    if prompt_cache is not None and len(rows) != 1:
        raise ValueError("a prompt cache (past_key_values) serves one request; pass batch size 1")
    vocab = logits_width(model)
    shared = Shared(config, tokenizer, generator, frozenset(config.eos_token_ids),
                     allocate_bitmask(sum(_max_rows(row) for row in rows), vocab), allocate_bitmask(1, vocab),
                     time.perf_counter(), step_cost, on_commit, on_step)  # fmt: skip
    for row in rows:
        if config.max_new_tokens <= 0:
            row.finish_reason = "length"
    waiting = deque(row for row in rows if row.finish_reason is None)
    limit = max_batch_size or max(1, len(waiting))
    speculating = any(row.proposer is not None for row in rows)
    active: list[Row] = []
    kv: BatchKV | None = None
    while active or waiting:
        # (0) Join: waiting requests take the free places; their prompt pass runs as a batch of its own.
        free = limit - sum(row.finish_reason is None for row in active)
        if waiting and free > 0:
            joining = [waiting.popleft() for _ in range(min(free, len(waiting)))]
            side = _new_kv(model, joining, prompt_cache, pad_token_id, speculating)
            joined = _step(model, joining, side, shared)
            if kv is None or not active:
                kv, active = side, joined
            else:
                kv.extend(side)
                active = active + joined
            continue
        assert kv is not None
        active = _step(model, active, kv, shared)
    return rows


def _step(model: torch.nn.Module, active: list[Row], kv: BatchKV, shared: Shared) -> list[Row]:
    """One decoding step for the rows of ``kv``; returns the rows still in the batch."""
    config, eos, masks = shared.config, shared.eos, shared.masks
    # (+) Forced: a grammar that allows exactly one token needs no sampling.
    if not config.record_scores:
        for row in active:
            _commit_forced(row, shared.scratch, eos, config, shared.tokenizer, shared.on_commit)
    active = _leave(active, kv, shared.started)
    if not active:
        return active

    # 1. Propose up to k tokens per row (k leaves room for the token the target adds).
    steps = [_propose(row, config, trees=len(active) == 1) for row in active]
    if steps[0].tree is not None:  # batch 1, a token tree: one pass over the tree (grammarspec/tree_verify.py)
        return _tree_step(model, active, kv, steps[0], shared)
    # (policy) One allocation over the batch cuts each draft to what pays at this batch (grammarspec/policy.py).
    cost = shared.step_cost or batch_cost_model(model).cost
    lengths = plan_drafts(
        [s.draft for s in steps], [r.controller for r in active], sum(map(len, [r.pending for r in active])), cost
    )
    for row, step, n in zip(active, steps, lengths):
        step.draft = step.draft.truncate(n)
        if row.controller is not None:
            row.controller.allocated(n)

    # 2. Masks for every target row; each draft is cut at its first illegal token.
    start = 0
    for row, step in zip(active, steps):
        t0 = time.perf_counter()
        step.draft, n_rows = walk_draft(row.matcher, masks, start, step.draft, eos)
        step.segment = Segment(start, step.draft.tokens, n_rows == len(step.draft) + 1, step.draft.probs)
        step.grammar_seconds += time.perf_counter() - t0
        start += n_rows
    segments = [step.segment for step in steps if step.segment is not None]

    # 3. One target forward over every row's pending + draft tokens.
    t0 = time.perf_counter()
    chunks = [row.pending + list(step.draft.tokens) for row, step in zip(active, steps)]
    wanted = [range(len(row.pending) - 1, len(row.pending) - 1 + seg.rows) for row, seg in zip(active, segments)]
    logits = kv.forward(chunks, wanted)  # [N, V]

    # 4. Each row's processing for its rows, then exact verification of the whole batch.
    scores = logits.clone() if config.record_scores else logits
    apply_masks(scores, masks[:start])
    for row, step, seg in zip(active, steps, segments):
        prefixes = [row.tokens + list(step.draft.tokens[:i]) for i in range(seg.rows)]
        scores[seg.start : seg.start + seg.rows] = row.processing(scores[seg.start : seg.start + seg.rows], prefixes)
    if config.sampling.greedy:
        results = verify_greedy(scores, segments)
    else:
        results = verify_sampled(probabilities(scores), segments, shared.generator)
    verify_seconds = time.perf_counter() - t0
    if shared.step_cost is None and all(row.stats.target_forwards for row in active):  # (policy) not a prompt pass
        batch_cost_model(model).update(sum(map(len, chunks)), verify_seconds)

    # 5. Commit: matchers, proposers and every KV cache move to the committed tokens together.
    t0 = time.perf_counter()
    committed = commit(active, steps, results, kv, eos, config, shared.tokenizer, shared.on_commit)
    if config.record_scores:
        record_scores(active, steps, committed, logits, scores)
    commit_seconds = time.perf_counter() - t0

    # 6. Adapt: statistics and the controllers learn what the step cost and brought.
    for row, step, (num_accepted, _) in zip(active, steps, results):
        account(row, step, num_accepted, verify_seconds, commit_seconds, shared.started, shared.step_cost,
                len(active) == 1)  # fmt: skip
    if shared.on_step is not None:
        shared.on_step(active, kv)
    return active


def _new_kv(model: torch.nn.Module, rows: list[Row], prompt_cache: Any, pad: int, speculating: bool) -> BatchKV:
    """The cache for rows starting their prompt pass (a user's prompt cache for a single request)."""
    if prompt_cache is not None:
        kv = BatchKV.from_cache(model, prompt_cache, _cached_prefix(prompt_cache, rows[0]))
        rows[0].cached = kv.lengths[0]
    else:
        kv = BatchKV(model, len(rows), pad_token_id=pad)
    if speculating:
        kv.require_croppable()
    return kv


def commit(
    rows: Sequence[Row],
    steps: Sequence[Step],
    results: Sequence[tuple[int, int | None]],
    kv: BatchKV,
    eos: frozenset[int],
    config: DecodeConfig,
    tokenizer: Any,
    on_commit: Callable[[int, list[int]], None] | None,
) -> list[int]:
    """The one commit path after verification.  Changes every stateful part.

    Row ``r`` commits its first ``num_accepted`` draft tokens and the target's own
    next token: its matcher accepts them, its proposer is told (``commit``), and
    the target cache keeps the row's pending tokens plus the accepted drafts --
    the next token is fed in the next pass.  A stop condition met inside the run
    ends the row there.  Returns how many tokens each row committed.
    """
    kept, counts = [], []
    for row, step, (num_accepted, next_token) in zip(rows, steps, results):
        pending = len(row.pending)
        new = list(step.draft.tokens[:num_accepted]) + ([next_token] if next_token is not None else [])
        committed = _commit_row(row, new, eos, config, tokenizer, on_commit)
        if row.proposer is not None:
            row.proposer.commit(step.draft, num_accepted, committed)
        keep = min(pending + num_accepted, len(row.tokens) - row.cached)
        row.cached += keep
        kept.append(keep)
        counts.append(len(committed))
    kv.keep(kept)
    return counts


def _commit_row(
    row: Row,
    new: Sequence[int],
    eos: frozenset[int],
    config: DecodeConfig,
    tokenizer: Any,
    on_commit: Callable[[int, list[int]], None] | None,
) -> list[int]:
    """Append ``new`` token by token until a stop condition; advance the matcher.  Returns what was appended."""
    emitted: list[int] = []
    for token in new:
        if row.matcher is not None and not row.matcher.accept(token):
            raise RuntimeError(f"internal error: committed token {token} is illegal for the grammar")
        row.tokens.append(token)
        emitted.append(token)
        row.finish_reason = stop_reason(
            row.generated, row.matcher, eos, config.max_new_tokens, config.stop_strings, tokenizer
        )
        if row.finish_reason:
            break
    row.stats.new_tokens += len(emitted)
    if on_commit is not None and emitted:
        on_commit(row.index, emitted)
    return emitted


def _commit_forced(
    row: Row,
    scratch: torch.Tensor,
    eos: frozenset[int],
    config: DecodeConfig,
    tokenizer: Any,
    on_commit: Callable[[int, list[int]], None] | None,
) -> None:
    """Commit every token the grammar forces (no target pass; the proposer is told)."""
    while row.matcher is not None and row.finish_reason is None:
        t0 = time.perf_counter()
        token = forced_token(row.matcher, scratch)
        row.stats.grammar_seconds += time.perf_counter() - t0
        if token is None:
            return
        committed = _commit_row(row, [token], eos, config, tokenizer, on_commit)
        row.stats.forced_tokens += len(committed)
        if row.proposer is not None:
            row.proposer.commit(EMPTY_DRAFT, 0, committed)


def _propose(row: Row, config: DecodeConfig, trees: bool) -> Step:
    """Ask the row's proposer for up to ``k`` tokens (a proposer with ``propose_tree`` may give a tree if ``trees``)."""
    step = Step()
    controller = row.controller
    budget = config.max_new_tokens - len(row.generated)
    k = min(controller.ask() if controller is not None else 0, budget - 1)
    if row.proposer is not None and k > 0:
        t0 = time.perf_counter()
        view = GrammarView(row.matcher) if row.matcher is not None else None
        propose_tree = getattr(row.proposer, "propose_tree", None) if trees else None
        drafted = (
            propose_tree(row.tokens, view, k) if propose_tree is not None else row.proposer.propose(row.tokens, view, k)
        )
        if isinstance(drafted, DraftTree):
            step.tree = drafted
        else:
            step.draft = drafted.truncate(k)
        step.draft_seconds = time.perf_counter() - t0
    return step


def _tree_step(model: torch.nn.Module, active: list[Row], kv: BatchKV, step: Step, shared: Shared) -> list[Row]:
    """Steps 2-6 for a token tree (batch 1): walk, one pass, the target's draws down the tree, commit, adapt.

    The commit is the chain's (:func:`_commit_row`, the proposer told through
    ``commit_tree``); the target cache keeps only the accepted path
    (``tree_verify.commit_path`` gathers it into place).
    """
    (row,) = active
    tree = step.tree
    assert tree is not None
    config = shared.config
    t0 = time.perf_counter()
    masks = allocate_bitmask(len(tree) + 1, shared.masks.shape[1] * 32) if row.matcher is not None else None
    before = len(row.tokens)
    result = verify_tree(model, kv.cache, row.tokens, row.cached, tree, config.sampling, matcher=row.matcher,
                         masks=masks, eos=shared.eos, processing=row.processing, generator=shared.generator)  # fmt: skip
    verify_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    new = list(result.accepted) + ([result.next_token] if result.next_token is not None else [])
    committed = _commit_row(row, new, shared.eos, config, shared.tokenizer, shared.on_commit)
    row.proposer.commit_tree(result.tree, committed)  # type: ignore[union-attr]
    row.cached = min(before + len(result.accepted), len(row.tokens))  # the cache holds the context + the path
    kv.keep_prefix(row.cached)
    account_tree(row, step, result, verify_seconds + time.perf_counter() - t0, shared.started)
    if shared.on_step is not None:
        shared.on_step(active, kv)
    return active


def _leave(active: list[Row], kv: BatchKV, started: float) -> list[Row]:
    """Finished rows leave the batch (their cache rows are dropped)."""
    now = time.perf_counter()
    keep = []
    for slot, row in enumerate(active):
        if row.finish_reason is None:
            keep.append(slot)
        else:
            finish(row, now - started)
    if keep and len(keep) < len(active):  # the last rows keep their cache (a caller's prompt cache stays whole)
        kv.select(keep)
    return [active[slot] for slot in keep]


def _new_row(index: int, request: RowRequest, config: DecodeConfig) -> Row:
    if not request.prompt_ids:
        raise ValueError("the prompt is empty: pass at least one token (e.g. the BOS token or a chat template)")
    processing = request.processing or sampling_processing(config, (), len(request.prompt_ids))
    return Row(index, list(request.prompt_ids), len(request.prompt_ids), request.matcher, request.proposer,
               request.controller, processing)  # fmt: skip


def _max_rows(row: Row) -> int:
    return (row.controller.k_max if row.controller is not None else 0) + 1


def _cached_prefix(cache: Any, row: Row) -> int:
    length = int(cache.get_seq_length())
    if length >= len(row.tokens):
        raise ValueError(
            f"the prompt cache holds {length} tokens but the prompt has only {len(row.tokens)}: the model must read "
            "at least the last prompt token; crop the cache (or pass a longer prompt)"
        )
    return length


def sampling_processing(
    config: DecodeConfig, processors: Sequence[LogitsProcessorFn], prompt_length: int
) -> Processing:
    """The row processing for ``config``'s sampling settings (and min_new_tokens) plus user ``processors``."""
    return LogitsPipeline.from_sampling(config.sampling, processors, min_new_tokens=config.min_new_tokens,
                                        eos_token_ids=config.eos_token_ids, prompt_length=prompt_length)  # fmt: skip


def logits_width(model: torch.nn.Module) -> int:
    """Width of the model's logits (may exceed len(tokenizer): padded vocabularies)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and getattr(head, "out_features", None):
        return int(head.out_features)
    return int(model.config.vocab_size)
