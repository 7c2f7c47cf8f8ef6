"""The speculative decoding loop, for a batch of requests.

The loop (:func:`decode_batch`), one iteration for the whole batch::

    1. admit   -- requests from the feed (``grammarspec serve``) wait for a place
    2. join    -- waiting requests take free slots of the batch's cache (no other row's
                  cache is copied; :meth:`BatchKV.add_rows`); their prompts are read by
                  the coming steps, in chunks while other rows are decoding
    3. step    -- one step (:func:`grammarspec.engine.step.run_step`) for every row
    4. report  -- the feed hears which rows joined and ended, and cancels rows

One step for the whole batch (numbers match the comments in :func:`grammarspec.engine.step.run_step`)::

    (0) plan    -- a row that joined a busy batch reads a chunk of its prompt (within the
                   step's prompt budget, derived from the pass cost); it neither takes
                   forced tokens, drafts nor samples until the step that reads the rest
    (+) forced  -- while a row's grammar allows exactly one token, commit it without
                   sampling; it reaches the target in the next forward pass
    1. propose  -- each row's proposer offers a draft tree of up to k levels: a chain
                   (parents -1, 0, 1, ...; + its draft distributions when sampled) or,
                   from a :class:`~proposers.base.TreeDrafter`, a branching tree; one
                   allocation over the batch cuts each chain to what pays at this batch
    2. walk     -- each row's matcher walks its tree: one bitmask per scored row, a
                   grammar-illegal node is dropped with its subtree, the matcher is restored
    3. forward  -- ONE target forward over every row's pending tokens plus its tree and
                   every reading row's prompt chunk (:meth:`BatchKV.forward`: each row
                   writes its own columns; a long prompt is folded into extra batch rows)
    4. accept   -- the row's own processing for each of its rows (mask, processors,
                   temperature, top-k, top-p, ...), then the target's choice at every
                   row at once (argmax; a draw; residual rejection for sampled chains)
                   in one host transfer, and each row descends its tree along them
    5. commit   -- :func:`grammarspec.engine.commit.commit`: each matcher advances by its
                   committed tokens, every proposer is told what was accepted (a draft
                   model crops its own cache there), and ``kv.keep`` -- the one KV
                   rollback -- keeps each row's pending tokens and accepted path
    6. adapt    -- each row's calibration learns what its draft brought (grammarspec/policy/allocation.py);
                   the pass cost is profiled once per model/device/dtype/thread count at
                   first use and fixed within a call, so draft lengths do not drift within
                   one; a lone row's passes are checked against it, and it is measured
                   again before the next call where they disagree (the loop's caller hands
                   it the cost and the check: grammarspec/policy/cost.py, resolved by
                   grammarspec/drafting/cost_model.py; GRAMMARSPEC_PASS_COST=prior: draft
                   lengths that never depend on the machine); a loop given a cost learner
                   (the server's) prices steps by what its own steps took instead
                   (grammarspec/policy/step_cost.py)

Where state moves.  A row's committed state -- its tokens, matcher, proposer,
``cached`` count, the target cache's columns, ``finish_reason`` and a draft
model's cache -- moves in :mod:`grammarspec.engine.commit` (verified steps,
forced tokens and prompt chunks all go through :func:`~grammarspec.engine.commit.commit`),
or in a place :data:`grammarspec.engine.commit.OTHER_MOVERS` names with what it
moves and why: the join and the leave (slots of the cache), the forward (scratch
columns), drafting (a proposer's scratch), the walk (the matcher, restored), a
cancel or a failure (``finish_reason``) and the controllers' learning.

Rows finish independently (grammar end, EOS, stop string, token limit) and leave
the batch, so the batch never waits for its longest row.  A row whose own work
raises (its matcher, its proposer, its stop check) ends alone the same way, with
``finish_reason="error"`` (:mod:`grammarspec.engine.isolation`).  With no proposer every
step is a plain constrained decoding step; the output distribution of every row is
the same either way, and the same as at batch 1.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from grammars.base import Matcher, allocate_bitmask
from grammarspec.engine.commit import commit
from grammarspec.engine.isolation import GenerationError
from grammarspec.engine.processing import LogitsPipeline
from grammarspec.engine.prompt_reading import checked_prompt_chunk
from grammarspec.engine.rows import DecodeConfig, DecodeState, Processing, Row, RowRequest, StepResources
from grammarspec.engine.sampling import LogitsProcessorFn
from grammarspec.engine.step import end_row, leave, run_step
from grammarspec.kv.batch import BatchKV
from grammarspec.kv.cache import logits_device as _logits_device
from grammarspec.policy.cost import FixedCost, PassCostSource
from grammarspec.stats import GenerationStats
from proposers.base import CostModelled, Proposer, members

if TYPE_CHECKING:
    from grammarspec.engine.step_trace import StepTrace
    from grammarspec.policy.adaptive import AdaptiveController
    from grammarspec.policy.step_cost import StepCostLearner

__all__ = [
    "DecodeConfig",
    "DecodeState",
    "RowRequest",
    "Row",
    "Feed",
    "decode",
    "decode_batch",
    "commit",
    "logits_width",
    "sampling_processing",
]


class Feed(Protocol):
    """Continuous batching (``grammarspec serve``): requests that arrive while :func:`decode_batch` runs.

    The loop polls :meth:`more` whenever places are free, asks :meth:`cancelled`
    about every unfinished row after each step (a cancelled row ends with
    ``finish_reason="cancelled"`` and leaves like a finished one), and reports each
    row that ends to :meth:`finished` exactly once (and each whose prompt is in the
    cache to :meth:`joined`, once: a row that ends inside a step's forced tokens has
    left with its cache by the time the loop sees it).  Rows from the feed get the
    indices ``len(requests)``, ``len(requests) + 1``, ... in the order given.
    """

    def more(self, free: int) -> Sequence[tuple[RowRequest, Any]]:
        """Up to ``free`` new ``(request, prompt cache or None)``; must not block.  May change the feed."""
        ...

    def cancelled(self, index: int) -> bool:
        """Whether row ``index`` should stop now.  Does not change state."""
        ...

    def joined(self, row: Row, kv: BatchKV, slot: int) -> None:
        """Row ``row``'s prompt is in: ``kv`` holds its cache at ``slot``.  Must not change ``kv``."""
        ...

    def finished(self, row: Row, kv: BatchKV | None, slot: int) -> None:
        """Row ``row`` ended.  ``kv`` still holds its cache at ``slot`` (``None``: already dropped)."""
        ...


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
    clock: Callable[[], float] | None = None,
    pass_cost: PassCostSource | None = None,
) -> tuple[list[int], GenerationStats]:
    """Generate after ``prompt_ids`` (one request); returns ``(new_tokens, stats)``.

    ``matcher`` constrains the output (``None``: unconstrained); it must be fresh.
    ``proposer`` drafts (``None``: plain decoding).  ``on_commit`` receives each run
    of committed tokens (streamers); ``on_step`` sees the row after every step.
    ``prompt_cache``: a KV cache already holding the first tokens of the prompt
    (it is extended and cropped in place).  ``step_cost(rows)``: what the
    controller is told a target pass of ``rows`` rows costs, instead of the
    measured time (replays against an oracle target model the cost).
    ``processing``: the row's processing (a :class:`~grammarspec.engine.processing.LogitsPipeline`);
    default: ``config``'s sampling settings plus ``processors``.  ``clock``: what the steps are timed by and
    ``pass_cost``: the target's pass cost (both :func:`decode_batch`).
    Raises :class:`~grammarspec.engine.isolation.GenerationError` when the row's own work
    raised (its ``output`` holds what was committed before, and the stats).
    """
    processing = processing or sampling_processing(config, processors, len(prompt_ids), device=_logits_device(model))
    request = RowRequest(prompt_ids, matcher, proposer, controller, processing)
    (row,) = decode_batch(
        model,
        [request],
        config,
        tokenizer=tokenizer,
        generator=generator,
        prompt_cache=prompt_cache,
        step_cost=step_cost,
        clock=clock,
        pass_cost=pass_cost,
        on_commit=(lambda index, tokens: on_commit(tokens)) if on_commit is not None else None,
        on_step=(lambda rows, kv: on_step(DecodeState(rows[0].tokens, rows[0].prompt_length, kv.cache, rows[0].cached)))
        if on_step is not None
        else None,
    )
    if row.failure is not None:
        raise GenerationError({0: row.failure}, (row.generated, row.stats), rows=1) from row.failure.error
    return row.generated, row.stats


@dataclass
class Batch:
    """What the loop holds between steps: the rows in the cache (in slot order), those waiting, what the feed heard."""

    limit: int  # the most rows decoding at once
    waiting: deque[Row] = field(default_factory=deque)
    active: list[Row] = field(default_factory=list)  # row r of the list lives in slot r of ``kv``
    kv: BatchKV | None = None
    prompt_caches: dict[int, Any] = field(default_factory=dict)  # a waiting row's prompt cache, by row index
    told_joined: set[int] = field(default_factory=set)  # rows the feed heard joined ...
    told_ended: set[int] = field(default_factory=set)  # ... and ended
    next_index: int = 0  # the index of the feed's next row
    speculating: bool = False  # some row has a proposer: the cache must roll back exactly

    @property
    def free(self) -> int:
        return self.limit - sum(row.finish_reason is None for row in self.active)


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
    feed: Feed | None = None,
    prompt_chunk: int | None = None,
    trace: StepTrace | None = None,
    cost_learner: StepCostLearner | None = None,
    clock: Callable[[], float] | None = None,
    pass_cost: PassCostSource | None = None,
) -> list[Row]:
    """Generate for every request; returns the finished rows in request order.

    One target forward per step serves every unfinished row.  With
    ``max_batch_size`` at most that many rows decode together and the others
    wait; a waiting request joins as soon as a row finishes: it takes a free slot
    of the cache and its prompt is read in the steps that follow, next to the
    decoding rows.  ``prompt_chunk``: the most prompt tokens one step reads while
    other rows decode (default: what keeps a step within twice its cost without
    them, on the target's pass cost model; :func:`grammarspec.engine.prompt_reading.prompt_budget`).
    ``on_commit(index, tokens)`` receives each run of committed tokens of request
    ``index``; ``on_step(rows, kv)`` sees the batch after every step (tests check rollback).
    ``feed``: requests joining while the loop runs, and cancellation (:class:`Feed`);
    the loop then returns when the feed has nothing more and every row ended.
    ``trace``: records every step and join (:class:`~grammarspec.engine.step_trace.StepTrace`; bookkeeping only).
    ``cost_learner``: the drafting policy prices steps by what this loop's steps took
    (:class:`~grammarspec.policy.step_cost.StepCostLearner`; a server keeps one across its loops) instead of the
    fixed profile; draft lengths then depend on measured times.
    ``clock``: what the steps are timed by (seconds; default: the cost learner's, else ``time.perf_counter``).
    ``pass_cost``: the target's pass cost (:class:`~grammarspec.policy.cost.PassCostSource`; ``generate`` and
    the server hand in the profiled one, :class:`grammarspec.drafting.cost_model.ProfiledCost`; default: the
    CPU prior, :class:`~grammarspec.policy.cost.FixedCost`), read where a step is priced, a prompt joins a
    busy batch or a proposer sizes its choices by it.  Rows that draft on it (no ``step_cost``, learner or
    feed) have it ready before the first step (:meth:`~grammarspec.policy.cost.PassCostSource.checked`: a
    profile is measured again first where an earlier call's passes disagreed with it), and this call's
    passes of a lone row are checked against it.

    A row whose own work raises -- its grammar matcher, its proposer, its stop
    check, ``on_commit`` for it (:mod:`grammarspec.engine.isolation`) -- ends alone with
    ``finish_reason="error"`` and the exception in ``row.failure``; the other
    rows decode on as they would without it.  The call raises only for what the
    rows share (the target forward, the batch cache).
    """
    clock = clock or (cost_learner.clock if cost_learner is not None else time.perf_counter)
    pass_cost = pass_cost if pass_cost is not None else FixedCost()
    check = None
    if step_cost is None and cost_learner is None and feed is None and any(r.proposer is not None for r in requests):
        check = pass_cost.checked(clock)
    rows = [_new_row(i, request, config, model, pass_cost, step_cost) for i, request in enumerate(requests)]
    _check_own_proposers(rows)
    if feed is not None and max_batch_size is None:
        raise ValueError("a feed (continuous batching) needs max_batch_size")
    if tokenizer is None and any(row.settings.stop_strings for row in rows):
        raise ValueError("stop_strings need the tokenizer: pass tokenizer=...")
    if max_batch_size is not None and max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1 (or None for the whole batch), got {max_batch_size}")
    if prompt_cache is not None and len(rows) != 1:
        raise ValueError("a prompt cache (past_key_values) serves one request; pass batch size 1")
    checked_prompt_chunk(prompt_chunk)
    shared = StepResources(
        config,
        tokenizer,
        generator,
        frozenset(config.eos_token_ids),
        allocate_bitmask(sum(_max_rows(row) for row in rows), logits_width(model)),
        time.perf_counter(),
        step_cost,
        pass_cost,
        on_commit,
        on_step,
        trace=trace,
        cost_learner=cost_learner,
        clock=clock,
        profile_check=check,
    )
    for row in rows:
        if row.settings.max_new_tokens <= 0:
            row.finish_reason = "length"
    batch = Batch(max_batch_size or max(1, len(rows)), deque(row for row in rows if row.finish_reason is None))
    batch.next_index = len(rows)
    batch.speculating = any(row.proposer is not None for row in rows)
    if prompt_cache is not None and batch.waiting:
        batch.prompt_caches[batch.waiting[0].index] = prompt_cache
    while True:
        # 1. Admit: the feed's new requests wait for a place.
        if feed is not None:
            _admit(feed, batch, config, model, pass_cost, step_cost)
        if not (batch.active or batch.waiting):
            return rows
        # 2. Join: waiting requests take free slots; their prompts are read by the steps.
        joined_at, waiting = time.perf_counter(), len(batch.waiting)
        _join(batch, model, shared, pad_token_id, caller_cache=prompt_cache)
        if trace is not None and len(batch.waiting) < waiting:
            trace.join(waiting - len(batch.waiting), time.perf_counter() - joined_at)
        # 3. Step: one forward for every row in the cache.
        assert batch.kv is not None
        before = batch.active
        finishing = feed is None and not batch.waiting  # the batch ends with its last row
        batch.active = run_step(model, batch.active, batch.kv, shared, prompt_chunk, finishing=finishing)
        # 4. Report: the feed hears which rows joined and ended; it may cancel rows.
        if feed is not None:
            _report(feed, batch, before, shared.started)


def _admit(
    feed: Feed,
    batch: Batch,
    config: DecodeConfig,
    model: torch.nn.Module,
    pass_cost: PassCostSource,
    step_cost: Callable[[int], float] | None,
) -> None:
    """New requests from the feed take the places that are free (they wait to join).  Changes ``batch``."""
    free = batch.free - len(batch.waiting)
    for request, cache in feed.more(free) if free > 0 else ():
        row = _new_row(batch.next_index, request, config, model, pass_cost, step_cost)
        batch.next_index += 1
        batch.speculating = batch.speculating or row.proposer is not None
        batch.prompt_caches[row.index] = cache
        batch.waiting.append(row)


def _join(batch: Batch, model: torch.nn.Module, shared: StepResources, pad: int, caller_cache: Any) -> None:
    """Waiting rows take the free slots (a prompt cache is copied into its row's slot).  Changes ``batch``.

    The first join makes the cache (a caller's prompt cache becomes it); a later
    join copies no other row's columns.
    """
    joining = [batch.waiting.popleft() for _ in range(min(max(batch.free, 0), len(batch.waiting)))]
    if not joining:
        return
    if batch.kv is not None and any(row.finish_reason is not None for row in batch.active):
        batch.active = leave(batch.active, batch.kv, shared.started)  # their slots are free for the joining rows
    caches = [batch.prompt_caches.pop(row.index, None) for row in joining]
    columns = max(row.prompt_length + row.settings.max_new_tokens + _max_rows(row) for row in joining)
    if batch.kv is None and caller_cache is not None:
        batch.kv = BatchKV.from_cache(model, caller_cache, _cached_prefix(caller_cache, joining[0]), columns=columns)
        caches = [None]
        joining[0].cached = batch.kv.lengths[0]
        slots = [0]
    else:
        if batch.kv is None:
            batch.kv = BatchKV(model, 0, pad_token_id=pad, slots=batch.limit, columns=columns)
        elif not batch.active:
            batch.kv.select([])  # the rows that ended all left: their slots are free
        for row, cache in zip(joining, caches):
            if cache is not None:
                _cached_prefix(cache, row)
        batch.kv.reserve(columns)
        slots = batch.kv.add_rows(len(joining), caches)
        for row, slot in zip(joining, slots):
            row.cached = batch.kv.lengths[slot]
    shared.trees = batch.kv.supports_trees()
    if batch.speculating:
        batch.kv.require_croppable()
    batch.active = batch.active + joining


def _report(feed: Feed, batch: Batch, before: list[Row], started: float) -> None:
    """Tell the feed about rows whose prompt is in and rows that ended (once each); cancel the rows it cancels.

    Sets ``finish_reason="cancelled"`` on a cancelled row (it leaves at the next step).  Changes the rows.
    """
    still = {id(row) for row in batch.active}
    for row in before:
        if id(row) not in still and row.index not in batch.told_ended:  # left at the start of the step: no cache
            batch.told_ended.add(row.index)
            feed.finished(row, None, -1)
    kv = batch.kv
    for slot, row in enumerate(batch.active):
        if row.index not in batch.told_joined and kv is not None and row.cached >= row.prompt_length:
            batch.told_joined.add(row.index)
            feed.joined(row, kv, slot)
        if row.finish_reason is None and feed.cancelled(row.index):
            row.finish_reason = "cancelled"
        if row.finish_reason is not None and row.index not in batch.told_ended:
            batch.told_ended.add(row.index)
            end_row(row, time.perf_counter() - started)
            feed.finished(row, kv, slot)


def _check_own_proposers(rows: Sequence[Row]) -> None:
    """Refuse one proposer object drafting for several rows: a proposer holds one request's state."""
    owner: dict[int, int] = {}
    for row in rows:
        if row.proposer is None:
            continue
        for member in members(row.proposer):
            first = owner.setdefault(id(member), row.index)
            if first != row.index:
                raise ValueError(
                    f"requests {first} and {row.index} share one proposer object ({member.name!r}); a proposer "
                    "holds the state of one request (its draft cache, its document, its records). Pass a preset "
                    "name or a Hugging Face draft model as assistant= (each row then gets its own drafter), or "
                    "give every row its own proposer instance"
                )


def _new_row(
    index: int,
    request: RowRequest,
    config: DecodeConfig,
    model: torch.nn.Module,
    pass_cost: PassCostSource,
    step_cost: Callable[[int], float] | None,
) -> Row:
    """The row of ``request``.  A proposer that sizes its choices by the pass cost gets the target's
    (``pass_cost``; a replay's ``step_cost`` models costs instead)."""
    if not request.prompt_ids:
        raise ValueError("the prompt is empty: pass at least one token (e.g. the BOS token or a chat template)")
    if step_cost is None and isinstance(request.proposer, CostModelled):
        request.proposer.use_cost_model(pass_cost.cost())
    processing = request.processing or sampling_processing(
        config, (), len(request.prompt_ids), device=_logits_device(model)
    )
    return Row(
        index,
        list(request.prompt_ids),
        len(request.prompt_ids),
        request.matcher,
        request.proposer,
        request.controller,
        processing,
        request.settings or config.row_settings,
    )


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
    config: DecodeConfig,
    processors: Sequence[LogitsProcessorFn],
    prompt_length: int,
    device: str | torch.device = "cpu",
) -> Processing:
    """The row processing for ``config``'s sampling settings (and min_new_tokens) plus user ``processors``.

    ``device``: the logits' device (the EOS tensor of ``min_new_tokens`` is built there).
    """
    return LogitsPipeline.from_sampling(
        config.sampling,
        processors,
        min_new_tokens=config.min_new_tokens,
        eos_token_ids=config.eos_token_ids,
        prompt_length=prompt_length,
        device=device,
    )


def logits_width(model: torch.nn.Module) -> int:
    """Width of the model's logits (may exceed len(tokenizer): padded vocabularies)."""
    hf: Any = model  # a Hugging Face model (or a toy speaking its protocol)
    head = hf.get_output_embeddings() if hasattr(hf, "get_output_embeddings") else None
    if head is not None and getattr(head, "out_features", None):
        return int(head.out_features)
    return int(hf.config.vocab_size)
