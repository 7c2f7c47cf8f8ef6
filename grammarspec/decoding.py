"""The speculative decoding loop, for a batch of requests.

One step for the whole batch (numbers match the comments in :func:`_step`)::

    (+) forced  -- while a row's grammar allows exactly one token, commit it without
                   sampling; it reaches the target in the next forward pass
    1. propose  -- each row's proposer offers a draft tree of up to k levels: a chain
                   (parents -1, 0, 1, ...; + its draft distributions when sampled) or,
                   from a :class:`~proposers.base.TreeDrafter`, a branching tree; one
                   allocation over the batch cuts each chain to what pays at this batch
    2. walk     -- each row's matcher walks its tree: one bitmask per scored row, a
                   grammar-illegal node is dropped with its subtree, the matcher is restored
    3. forward  -- ONE target forward over every row's pending tokens plus its tree
                   (:meth:`BatchKV.forward`: each row's mask from its columns and parents)
    4. accept   -- the row's own processing for each of its rows (mask, processors,
                   temperature, top-k, top-p, ...), then the target's choice at every
                   row at once (argmax; a draw; residual rejection for sampled chains)
                   in one host transfer, and each row descends its tree along them
    5. commit   -- :func:`commit`, the one place state moves: each matcher advances by
                   its committed tokens, every proposer is told what was accepted (a
                   draft model crops its own cache there), and ``kv.keep`` -- the one
                   KV rollback -- keeps each row's pending tokens and accepted path
    6. adapt    -- each row's calibration learns what its draft brought (grammarspec/policy.py);
                   the pass cost is not learned from wall time here: it is profiled once per
                   model/device/dtype/thread count at first use and fixed afterwards, so draft
                   lengths do not drift within a process (GRAMMARSPEC_PASS_COST=prior: draft
                   lengths that never depend on the machine)

Rows finish independently (grammar end, EOS, stop string, token limit) and leave
the batch, so the batch never waits for its longest row.  With no proposer every
step is a plain constrained decoding step; the output distribution of every row is
the same either way, and the same as at batch 1.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch

from grammars.base import Matcher, allocate_bitmask, fill_masks
from proposers.base import EMPTY_DRAFT, CostModelled, Draft, GrammarView, Proposer, members
from proposers.tree import DraftTree

from .bookkeeping import account, finish, record_scores
from .cache import logits_device as _logits_device
from .kv import BatchKV
from .masking import apply_masks, forced_token, walk
from .policy import batch_cost_model, plan_drafts
from .processing import LogitsPipeline, prefix_tensors
from .rejection import Segment, target_choices
from .rows import DecodeConfig, DecodeState, Processing, Row, RowRequest, Shared, Step
from .sampling import LogitsProcessorFn
from .stats import GenerationStats
from .stopping import stop_reason
from .tree_layout import descend

if TYPE_CHECKING:
    from .adaptive import AdaptiveController

__all__ = [
    "DecodeConfig", "DecodeState", "RowRequest", "Row", "Feed", "decode", "decode_batch", "commit", "logits_width",
    "sampling_processing",
]  # fmt: skip


class Feed(Protocol):
    """Continuous batching (``grammarspec serve``): requests that arrive while :func:`decode_batch` runs.

    The loop polls :meth:`more` whenever places are free, asks :meth:`cancelled`
    about every unfinished row after each step (a cancelled row ends with
    ``finish_reason="cancelled"`` and leaves like a finished one), and reports each
    row that ends to :meth:`finished` exactly once (and each that ran its prompt pass
    to :meth:`joined`, once: a row that ends inside a step's forced tokens has left
    with its cache by the time the loop sees it).  Rows from the feed get the
    indices ``len(requests)``, ``len(requests) + 1``, ... in the order given.
    """

    def more(self, free: int) -> Sequence[tuple[RowRequest, Any]]:
        """Up to ``free`` new ``(request, prompt cache or None)``; must not block.  May change the feed."""
        ...

    def cancelled(self, index: int) -> bool:
        """Whether row ``index`` should stop now.  Does not change state."""
        ...

    def joined(self, row: Row, kv: BatchKV, slot: int) -> None:
        """Row ``row`` ran its prompt pass: ``kv`` holds its cache at ``slot``.  Must not change ``kv``."""
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
    processing = processing or sampling_processing(config, processors, len(prompt_ids), device=_logits_device(model))
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
    feed: Feed | None = None,
) -> list[Row]:
    """Generate for every request; returns the finished rows in request order.

    One target forward per step serves every unfinished row.  With
    ``max_batch_size`` at most that many rows decode together and the others
    wait; a waiting request joins as soon as a row finishes (its prompt pass
    runs as a batch of its own, then its cache rows join the batch's).
    ``on_commit(index, tokens)`` receives each run of committed tokens of request
    ``index``; ``on_step(rows, kv)`` sees the batch after every step (tests check rollback).
    ``feed``: requests joining while the loop runs, and cancellation (:class:`Feed`);
    the loop then returns when the feed has nothing more and every row ended.
    """
    rows = [_new_row(i, request, config, model, step_cost) for i, request in enumerate(requests)]
    _check_own_proposers(rows)
    if feed is not None and max_batch_size is None:
        raise ValueError("a feed (continuous batching) needs max_batch_size")
    if config.stop_strings and tokenizer is None:
        raise ValueError("stop_strings need the tokenizer: pass tokenizer=...")
    if max_batch_size is not None and max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1 (or None for the whole batch), got {max_batch_size}")
    if prompt_cache is not None and len(rows) != 1:
        raise ValueError("a prompt cache (past_key_values) serves one request; pass batch size 1")
    vocab = logits_width(model)
    shared = Shared(config, tokenizer, generator, frozenset(config.eos_token_ids),
                     allocate_bitmask(sum(_max_rows(row) for row in rows), vocab), time.perf_counter(), step_cost,
                     on_commit, on_step)  # fmt: skip
    for row in rows:
        if config.max_new_tokens <= 0:
            row.finish_reason = "length"
    waiting = deque(row for row in rows if row.finish_reason is None)
    limit = max_batch_size or max(1, len(waiting))
    speculating = any(row.proposer is not None for row in rows)
    active: list[Row] = []
    kv: BatchKV | None = None
    caches: dict[int, Any] = {}  # serve25: feed rows' prompt caches, by row index
    seen: set[int] = set()  # serve25: feed rows told to the feed as joined
    reported: set[int] = set()  # ... and as ended
    next_index = len(rows)
    while True:
        if feed is not None:  # serve25: new requests take the places that are free
            free = limit - sum(row.finish_reason is None for row in active) - len(waiting)
            for request, cache in feed.more(free) if free > 0 else ():
                row = _new_row(next_index, request, config, model, step_cost)
                next_index += 1
                speculating = speculating or row.proposer is not None
                caches[row.index] = cache
                waiting.append(row)
        if not (active or waiting):
            return rows
        before = active
        # (0) Join: waiting requests take the free places; their prompt pass runs as a batch of its own.
        free = limit - sum(row.finish_reason is None for row in active)
        if waiting and free > 0:
            joining = [waiting.popleft() for _ in range(min(free, len(waiting)))]
            if feed is None:
                groups = [(joining, prompt_cache)]
            else:  # serve25: one prompt pass per request, each on its own prompt cache (a prefix hit)
                groups = [([row], caches.pop(row.index, None)) for row in joining]
                before = active + joining
            for group, cache in groups:
                side = _new_kv(model, group, cache, pad_token_id, speculating)
                shared.trees = side.supports_trees()
                joined = _step(model, group, side, shared)
                if kv is None or not active:
                    kv, active = side, joined
                else:
                    kv.extend(side)
                    active = active + joined
        else:
            assert kv is not None
            active = _step(model, active, kv, shared)
        if feed is not None:
            _poll(feed, before, active, kv, seen, reported, shared.started)


def _poll(feed: Feed, before: list[Row], active: list[Row], kv: BatchKV | None, seen: set[int],
          reported: set[int], started: float) -> None:  # fmt: skip
    """serve25: tell the feed about rows that ended (once each); cancel the rows it cancels.  Changes the rows."""
    still = {id(row) for row in active}
    for row in before:
        if id(row) not in still and row.index not in reported:  # left at the start of the step: no cache now
            reported.add(row.index)
            feed.finished(row, None, -1)
    for slot, row in enumerate(active):
        if row.index not in seen and kv is not None:
            seen.add(row.index)
            feed.joined(row, kv, slot)
        if row.finish_reason is None and feed.cancelled(row.index):
            row.finish_reason = "cancelled"
        if row.finish_reason is not None and row.index not in reported:
            reported.add(row.index)
            finish(row, time.perf_counter() - started)
            feed.finished(row, kv, slot)


def _step(model: torch.nn.Module, active: list[Row], kv: BatchKV, shared: Shared) -> list[Row]:
    """One decoding step for the rows of ``kv``; returns the rows still in the batch."""
    config, eos = shared.config, shared.eos
    phases = Phases()
    # (+) Forced: a grammar that allows exactly one token needs no sampling.
    if not config.record_scores:
        _fill_roots(active, shared)
        for row in active:
            _commit_forced(row, shared)
    active = _leave(active, kv, shared.started)
    if not active:
        return active
    phases.lap("forced")

    # 1. Propose: a draft tree of up to k levels per row (k leaves room for the token the target adds).
    steps = [_propose(row, config, shared.trees) for row in active]
    phases.lap("propose")
    # (policy) One allocation over the batch cuts each chain to what pays at this batch (grammarspec/policy.py).
    _allocate(model, active, steps, shared)

    # 2. Walk: one mask per scored row; each tree loses its grammar-illegal nodes.
    masks = _masks(shared, sum(1 + len(step.tree) for step in steps))
    start = 0
    for row, step in zip(active, steps):
        t0 = time.perf_counter()
        step.tree, step.ends = walk(row.matcher, masks, start, step.tree, eos, row.root if row.root_ready else None)
        row.root_ready = False
        step.start = start
        step.grammar_seconds += time.perf_counter() - t0
        start += 1 + len(step.tree)
    phases.lap("walk")

    # 3. One target forward over every row's pending tokens + tree.
    t0 = time.perf_counter()
    logits = kv.forward([row.pending + list(step.tree.tokens) for row, step in zip(active, steps)],
                        [step.tree.parents for step in steps])  # [N, V]  # fmt: skip
    phases.lap("forward")

    # 4. Accept: each row's processing for its rows, the target's choices in one transfer, each row descends.
    scores = logits.clone() if config.record_scores else logits
    apply_masks(scores, masks[:start])
    _process(active, steps, scores[:start])
    sampled = [_segment(step) for step in steps if step.draft.probs is not None and len(step.tree)]
    choices = target_choices(scores, config.sampling.greedy, sampled, shared.generator)
    results = [descend(step.tree, step.ends, choices[step.start : step.start + 1 + len(step.tree)]) for step in steps]
    verify_seconds = time.perf_counter() - t0
    phases.lap("verify")

    # 5. Commit: matchers, proposers and every KV cache move to the committed tokens together.
    t0 = time.perf_counter()
    committed = commit(active, steps, results, kv, eos, config, shared.tokenizer, shared.on_commit)
    if config.record_scores:
        record_scores(active, steps, results, committed, logits, scores)
    commit_seconds = time.perf_counter() - t0
    phases.lap("commit")

    # 6. Adapt: statistics and the controllers learn what the step cost and brought.
    for row, step, (path, next_token) in zip(active, steps, results):
        account(row, step, path, next_token, verify_seconds, commit_seconds, shared.started)
        phases.add_to(row.stats.phases)
    if shared.on_step is not None:
        shared.on_step(active, kv)
    return active


class Phases:
    """Seconds per phase of one step (a lap timer: each lap ends the named phase).  Bookkeeping only."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._last
        self._last = now

    def add_to(self, totals: dict[str, float]) -> None:
        for name, seconds in self.seconds.items():
            totals[name] = totals.get(name, 0.0) + seconds


def _masks(shared: Shared, rows: int) -> torch.Tensor:
    """The step's mask rows (the buffer grows when a step has more rows than any before: trees)."""
    if shared.masks.shape[0] < rows:
        shared.masks = allocate_bitmask(rows, shared.masks.shape[1] * 32)
    return shared.masks


def _process(active: Sequence[Row], steps: Sequence[Step], scores: torch.Tensor) -> None:
    """Each row's processing on its scored rows of ``scores`` (changed in place).

    Pipelines that read no prefix and process alike (:attr:`LogitsPipeline.batch_key`:
    the rows of one ``generate`` call with sampling warpers) run once over all the
    step's rows; otherwise each row's pipeline runs on its own rows, with their
    prefixes: for every pipeline that reads them, views of one tensor built once
    a step (:func:`processing.prefix_tensors`), so one copy to the device serves them all.
    """
    first = active[0].processing
    if isinstance(first, LogitsPipeline) and first.batch_key is not None:
        if all(isinstance(r.processing, LogitsPipeline) and r.processing.batch_key == first.batch_key for r in active):
            if not first.is_identity:  # greedy with no processor: the masked float32 logits are the scores
                scores[:] = first(scores, [[]] * scores.shape[0])
            return
    todo = [(row, step) for row, step in zip(active, steps)
            if not (isinstance(row.processing, LogitsPipeline) and row.processing.is_identity)]  # fmt: skip
    prefixes = [_prefixes(row, step) for row, step in todo]
    readers = [isinstance(row.processing, LogitsPipeline) and row.processing.reads_prefixes for row, _ in todo]
    flat = [p for rows, reads in zip(prefixes, readers) if reads for p in rows]
    views = iter(prefix_tensors(flat, scores.device) if flat else [])  # every reader's prefixes: one copy a step
    for (row, step), rows, reads in zip(todo, prefixes, readers):
        block = slice(step.start, step.start + 1 + len(step.tree))
        given: list[Any] = [next(views) for _ in rows] if reads else rows
        scores[block] = row.processing(scores[block], given)


def _prefixes(row: Row, step: Step) -> list[list[int]]:
    """The context each scored row of ``row`` conditions on (root: the row's tokens; node: + its path).

    Only built when the row's processing reads prefixes (a prefix-free pipeline gets empty ones).
    """
    tree = step.tree
    if isinstance(row.processing, LogitsPipeline) and not row.processing.reads_prefixes:
        return [[]] * (1 + len(tree))
    return [list(row.tokens)] + [list(row.tokens) + [tree.tokens[j] for j in tree.path(i)] for i in range(len(tree))]


def _segment(step: Step) -> Segment:
    """A sampled chain's rows for residual rejection (its bonus row unless its last node ends generation)."""
    n = len(step.tree)
    probs = step.draft.probs
    assert probs is not None
    return Segment(step.start, step.tree.tokens, not step.ends[-1], probs[:n])


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
    results: Sequence[tuple[list[int], int | None]],
    kv: BatchKV,
    eos: frozenset[int],
    config: DecodeConfig,
    tokenizer: Any,
    on_commit: Callable[[int, list[int]], None] | None,
) -> list[int]:
    """The one commit path after verification.  Changes every stateful part.

    Row ``r`` commits the tokens of its accepted ``path`` through its tree and
    the target's own next token: its matcher accepts them, its proposer is told
    (``commit``, or ``commit_tree`` for a tree it drafted), and ``kv.keep`` --
    the one KV rollback -- keeps the row's pending tokens plus the accepted
    nodes (gathered into place off a tree's first branch); the next token is fed
    in the next pass.  A stop condition met inside the run ends the row there.
    Returns how many tokens each row committed.
    """
    kept, counts = [], []
    for row, step, (path, next_token) in zip(rows, steps, results):
        pending = len(row.pending)
        new = [step.tree.tokens[i] for i in path] + ([next_token] if next_token is not None else [])
        committed = _commit_row(row, new, eos, config, tokenizer, on_commit)
        if row.proposer is not None:
            if step.is_tree:
                assert row.tree_drafter is not None
                row.tree_drafter.commit_tree(step.tree, committed)
            else:
                row.proposer.commit(step.draft.truncate(len(step.tree)), len(path), committed)
        keep = min(pending + len(path), len(row.tokens) - row.cached)
        row.cached += keep
        kept.append((list(range(pending)) + [pending + i for i in path])[:keep])
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


def _fill_roots(active: Sequence[Row], shared: Shared) -> None:
    """Each constrained row's mask for its current state, in one batched call per grammar backend.

    :func:`grammars.base.fill_masks` (xgrammar: ``BatchGrammarMatcher``).  The
    forced check reads it, and the walk reuses it as the tree's root row, so
    no state's mask is filled twice.  Changes each row's ``root``.
    """
    pairs = [(row, row.matcher) for row in active if row.matcher is not None and row.finish_reason is None]
    if not pairs:
        return
    t0 = time.perf_counter()
    roots = torch.empty((len(pairs), shared.masks.shape[1]), dtype=torch.int32, device="cpu")  # host, as backends fill
    fill_masks([matcher for _, matcher in pairs], roots, range(len(pairs)))
    share = (time.perf_counter() - t0) / len(pairs)
    for i, (row, _) in enumerate(pairs):
        row.root, row.root_ready = roots[i : i + 1], True
        row.stats.grammar_seconds += share


def _commit_forced(row: Row, shared: Shared) -> None:
    """Commit every token the grammar forces (no target pass; the proposer is told).

    The last check's mask -- the row's state now -- stays in ``row.root`` for the walk.
    """
    while row.matcher is not None and row.finish_reason is None:
        t0 = time.perf_counter()
        if row.root is None:
            row.root = torch.zeros((1, shared.masks.shape[1]), dtype=torch.int32, device="cpu")  # host, as xgrammar
        token = forced_token(row.matcher, row.root, filled=row.root_ready)
        row.stats.grammar_seconds += time.perf_counter() - t0
        if token is None:
            row.root_ready = True
            return
        row.root_ready = False
        committed = _commit_row(row, [token], shared.eos, shared.config, shared.tokenizer, shared.on_commit)
        row.stats.forced_tokens += len(committed)
        if row.proposer is not None:
            row.proposer.commit(EMPTY_DRAFT, 0, committed)


def _propose(row: Row, config: DecodeConfig, trees: bool) -> Step:
    """Ask the row's proposer for a draft of up to ``k`` levels: the one place a row's draft length is decided.

    A :class:`~proposers.base.TreeDrafter` is asked for a tree when ``trees``
    (the model and cache can run a tree pass, :meth:`BatchKV.supports_trees`);
    anything else drafts a chain, which becomes the one-branch tree.
    """
    step = Step()
    controller = row.controller
    budget = config.max_new_tokens - len(row.generated)
    k = min(controller.ask() if controller is not None else 0, budget - 1)
    if row.proposer is not None and k > 0:
        t0 = time.perf_counter()
        view = GrammarView(row.matcher) if row.matcher is not None else None
        if trees and row.tree_drafter is not None:
            drafted: Draft | DraftTree = row.tree_drafter.propose_tree(row.tokens, view, k)
        else:
            drafted = row.proposer.propose(row.tokens, view, k)
        if isinstance(drafted, DraftTree):
            step.tree, step.is_tree = drafted, True
        else:
            step.draft = step.offered = drafted.truncate(k)
            step.tree = _chain(step.draft)
        step.draft_seconds = time.perf_counter() - t0
    return step


def _allocate(model: torch.nn.Module, active: list[Row], steps: list[Step], shared: Shared) -> None:
    """Cut each row's chain to its share of one goodput allocation over the batch (:func:`policy.plan_drafts`).

    A proposer's token tree is verified whole; its rows count in the batch's cost.  Changes ``steps``.
    """
    chains = [i for i, step in enumerate(steps) if not step.is_tree]
    if not any(len(steps[i].draft) for i in chains):
        return
    base = sum(len(row.pending) for row in active) + sum(len(step.tree) for step in steps if step.is_tree)
    cost = shared.step_cost or batch_cost_model(model).cost
    lengths = plan_drafts([steps[i].draft for i in chains], [active[i].controller for i in chains], base, cost)
    for i, n in zip(chains, lengths):
        offered = len(steps[i].draft)
        steps[i].draft = steps[i].draft.truncate(n)
        steps[i].tree = _chain(steps[i].draft)
        controller = active[i].controller
        if controller is not None:
            controller.allocated(n, offered)


def _chain(draft: Draft) -> DraftTree:
    """``draft`` as the one-branch tree (its distributions stay on the step)."""
    return DraftTree(draft.tokens, tuple(range(-1, len(draft) - 1)), draft.sources, draft.kind)


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


def _new_row(index: int, request: RowRequest, config: DecodeConfig, model: torch.nn.Module,
             step_cost: Callable[[int], float] | None) -> Row:  # fmt: skip
    """The row of ``request``.  A proposer that sizes its choices by the pass cost gets the target's
    profiled one (:func:`policy.batch_cost_model`; a replay's ``step_cost`` models costs instead)."""
    if not request.prompt_ids:
        raise ValueError("the prompt is empty: pass at least one token (e.g. the BOS token or a chat template)")
    if step_cost is None and isinstance(request.proposer, CostModelled):
        request.proposer.use_cost_model(batch_cost_model(model))
    processing = request.processing or sampling_processing(
        config, (), len(request.prompt_ids), device=_logits_device(model)
    )
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
    config: DecodeConfig, processors: Sequence[LogitsProcessorFn], prompt_length: int,
    device: str | torch.device = "cpu",
) -> Processing:  # fmt: skip
    """The row processing for ``config``'s sampling settings (and min_new_tokens) plus user ``processors``.

    ``device``: the logits' device (the EOS tensor of ``min_new_tokens`` is built there).
    """
    return LogitsPipeline.from_sampling(config.sampling, processors, min_new_tokens=config.min_new_tokens,
                                        eos_token_ids=config.eos_token_ids, prompt_length=prompt_length,
                                        device=device)  # fmt: skip


def logits_width(model: torch.nn.Module) -> int:
    """Width of the model's logits (may exceed len(tokenizer): padded vocabularies)."""
    hf: Any = model  # a Hugging Face model (or a toy speaking its protocol)
    head = hf.get_output_embeddings() if hasattr(hf, "get_output_embeddings") else None
    if head is not None and getattr(head, "out_features", None):
        return int(head.out_features)
    return int(hf.config.vocab_size)
