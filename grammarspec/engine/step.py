"""One decoding step for the rows of a batch (numbers match the comments in :func:`run_step`).

See :mod:`grammarspec.engine.decoding` for the step's phases and the loop around it.
A row still reading its prompt (it joined a busy batch) feeds only a chunk of
it this step (:func:`grammarspec.engine.prompt_reading.prompt_plan`): it neither
takes forced tokens, drafts nor samples until the step that reads the rest of its prompt.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from grammars.base import allocate_bitmask, fill_masks
from grammarspec.engine.bookkeeping import account, finish, record_scores
from grammarspec.engine.commit import commit, tell
from grammarspec.engine.isolation import contained, fail
from grammarspec.engine.masking import apply_masks, forced_token, prune_and_fill_masks
from grammarspec.engine.processing import LogitsPipeline, prefix_tensors
from grammarspec.engine.prompt_reading import checked_prompt_chunk, fold_width, prompt_budget, prompt_plan
from grammarspec.engine.rejection import Segment, choices_and_dead_ends
from grammarspec.engine.rows import Row, Step, StepResources
from grammarspec.engine.sampling import NoLegalTokenError
from grammarspec.engine.tree_layout import descend
from grammarspec.kv.batch import BatchKV
from grammarspec.policy.allocation import Cost, drafts_could_pay, finishing_worth, plan_drafts
from grammarspec.policy.step_cost import priced_rows
from proposers.base import Draft, GrammarView
from proposers.tree import EMPTY_TREE, DraftTree

#: The prompt plan's names live in grammarspec.engine.prompt_reading; the server and tests import them from here too.
__all__ = ["run_step", "Phases", "leave", "end_row", "checked_prompt_chunk", "prompt_budget", "prompt_plan"]


def run_step(
    model: torch.nn.Module,
    active: list[Row],
    kv: BatchKV,
    shared: StepResources,
    prompt_chunk: int | None = None,
    *,
    finishing: bool = False,
) -> list[Row]:
    """One decoding step for the rows of ``kv`` (in slot order); returns the rows still in the batch.

    ``prompt_chunk``: the most prompt tokens the step reads for rows that joined
    a busy batch (``None``: :func:`prompt_plan` derives it from the pass cost).
    ``finishing``: the batch ends with its last row (no request waits or may
    join), so the policy values tokens by the finishing time they save
    (:func:`grammarspec.policy.allocation.finishing_worth`).
    """
    config, eos = shared.config, shared.eos
    phases = Phases(shared.clock)
    # (0) Plan: rows joining a busy batch read a chunk of their prompt; the others take a full step.
    plan = prompt_plan(model, active, shared, prompt_chunk)
    prompted = any(row.prompt_length - row.cached > 1 for row in active)  # some row feeds prompt tokens this step
    reading = {id(row): read for row, read in zip(active, plan) if read is not None}
    stepping = [row for row in active if id(row) not in reading]
    # (+) Forced: a grammar that allows exactly one token needs no sampling.
    if not config.record_scores:
        _fill_state_masks(stepping, shared)
        for row in stepping:
            contained(row, "forced tokens", None, _commit_forced, row, shared)
    active = leave(active, kv, shared.started)
    stepping = [row for row in active if id(row) not in reading]  # in slot order, as the forward scores them
    if not stepping:  # only rows reading prompts are left: the next step plans again
        return active
    phases.lap("forced")

    # 1. Propose: a draft tree of up to k levels per row (k leaves room for the token the target adds).  No chain
    # where the loop's record holds drafting at this size and kind of rows (its drafted steps show no gain over its
    # plain ones, or the policy cut what the rows offered; the step is then not priced either), on a probe (the
    # learner's plain step), or where not even drafts that all survive could pay at this batch (the policy would cut
    # every token of them); a row resting after drafts cut to nothing asks for none (grammarspec/policy/adaptive.py).
    asks = [contained(row, "drafting", 0, _ask, row) if row.proposer is not None else 0 for row in stepping]
    kind = rows_kind(stepping) if shared.cost_learner is not None else ""  # the learner's record for these rows
    asking = any(asks)
    # A step that also reads prompts is judged as the batch its forward carries (every active row): such steps
    # teach the learner nothing, so a record of their own stepping rows' size would never form.
    held = asking and not _drafting_pays(shared, len(active), kind)
    priced = asking and (not held or any(_verifies_whole(row) for row in stepping))  # rows never cut draft held too
    cost = _step_cost(model, shared, len(stepping)) if priced else None
    worth = _worth(stepping, cost, finishing and not reading)
    chains = (
        not held
        and cost is not None
        and drafts_could_pay(
            cost, asks, [len(row.pending) for row in stepping], packed=kv.packed, worth=max(worth or [1.0])
        )
    )
    steps = [
        contained(row, "drafting", Step(), _propose, row, k, shared.trees, chains) for row, k in zip(stepping, asks)
    ]
    phases.lap("propose")
    # (policy) One allocation over the batch cuts each chain to what pays at this batch (grammarspec/policy/allocation.py).
    _allocate(stepping, steps, cost, packed=kv.packed, worth=worth)

    # 2. Walk: one mask per scored row; each tree loses its grammar-illegal nodes.  A row that failed (here or
    # in its draft) rides the forward with no tree and its result is dropped: the other rows' layout stands.
    masks = _masks(shared, sum(1 + len(step.tree) for step in steps))
    start = 0
    for row, step in zip(stepping, steps):
        t0 = time.perf_counter()
        step.start = start
        if row.failure is None:
            contained(row, "grammar walk", None, _walk, row, step, masks, eos)
        if row.failure is not None:
            step.tree, step.ends = EMPTY_TREE, []
            masks[start] = -1  # any token: its choice is never committed
        row.state_mask_ready = False
        step.grammar_seconds += time.perf_counter() - t0
        start += 1 + len(step.tree)
    phases.lap("walk")

    # 3. One target forward: every stepping row's pending tokens + tree, every reading row's prompt chunk.
    t0 = time.perf_counter()
    own = dict(zip(map(id, stepping), steps))
    chunks, parents, fed = [], [], []
    for row in active:
        read = reading.get(id(row))
        if read is None:
            step = own[id(row)]
            chunks.append(row.pending + list(step.tree.tokens))
            parents.append(step.tree.parents)
        else:
            chunks.append(row.pending[:read])
            parents.append(())
        fed.append(read)
    logits = kv.forward(
        chunks, parents, width=fold_width(active, chunks, fed), scored=[read is None for read in fed]
    )  # [N, V]: the stepping rows' scored rows
    phases.lap("forward")
    if shared.trace is not None:  # tokens fed by rows whose prompt is not yet in the cache
        prompt_fed = sum(len(c) for row, c in zip(active, chunks) if row.cached < row.prompt_length)

    # 4. Accept: each row's processing for its rows, the target's choices in one transfer, each row descends.
    scores = logits.clone() if config.record_scores else logits
    apply_masks(scores, masks[:start])
    _process(stepping, steps, scores[:start])
    sampled = [_segment(step) for step in steps if step.draft.probs is not None and len(step.tree)]
    choices, dead = choices_and_dead_ends(scores, _greedy_rows(stepping, steps), sampled, shared.generator)
    results = [descend(step.tree, step.ends, choices[step.start : step.start + 1 + len(step.tree)]) for step in steps]
    stuck = [_dead_end(step, result, dead) for step, result in zip(steps, results)]
    results = [(path, None) if dead_end else (path, token) for (path, token), dead_end in zip(results, stuck)]
    verify_seconds = time.perf_counter() - t0
    phases.lap("verify")

    # 5. Commit: matchers, proposers and the KV cache move to the committed tokens together (reading rows keep
    # their chunk).
    t0 = time.perf_counter()
    everyone = [own.get(id(row), Step()) for row in active]
    outcome = iter(results)
    all_results = [next(outcome) if read is None else ([], None) for read in fed]
    committed = commit(active, everyone, all_results, kv, shared, fed)
    for row, dead_end in zip(stepping, stuck):  # it keeps the path it accepted; no token may follow it
        if dead_end and row.finish_reason is None:
            fail(row, "its grammar", _no_token(row, shared))
    if config.record_scores:
        mine = [c for c, read in zip(committed, fed) if read is None]
        record_scores(stepping, steps, results, mine, logits, scores)
    commit_seconds = time.perf_counter() - t0
    phases.lap("commit")

    # 6. Adapt: statistics and the controllers learn what the step cost and brought (and the step cost learner,
    # where the loop has one, what it took).
    for row, step, (path, next_token) in zip(stepping, steps, results):
        if row.failure is None:
            account(row, step, path, next_token, verify_seconds, commit_seconds, shared.started)
        phases.add_to(row.stats.phases)
    for row in active:
        if id(row) in reading:
            row.stats.prompt_passes += 1
    if shared.trace is not None:
        shared.trace.step(steps, results, prompt_fed, len(reading), phases.seconds, kv.last_pass)
    if shared.cost_learner is not None and _teaches_cost(stepping, steps, reading):
        shared.cost_learner.observe(  # the step as the policy priced it, and what it took
            rows=priced_rows([len(chunk) for chunk in chunks], kv.packed),
            batch=len(stepping),
            tokens=sum(len(step.tree) for step in steps),
            drafting=sum(1 for step in steps if len(step.tree)),
            seconds=sum(phases.seconds.values()),
            packed=kv.packed,
            committed=None if prompted else len(stepping) + sum(len(path) for path, _ in results),
            kind=kind,
            refused=cost is not None and any(len(s.offered) for s in steps) and not any(len(s.tree) for s in steps),
        )
    if shared.profile_check is not None and len(active) == 1 and not prompted and not steps[0].is_tree:
        # a lone row's pass, as a profile times one: the pass cost's check (grammarspec/policy/cost.py) reads its seconds
        shared.profile_check.observe(len(chunks[0]), phases.seconds["forward"] + phases.seconds["verify"])
    if shared.on_step is not None:
        shared.on_step(active, kv)
    return active


def _teaches_cost(stepping: Sequence[Row], steps: Sequence[Step], reading: dict[int, int]) -> bool:
    """Whether a cost learner learns from the step: a row could draft (the policy priced the step), no prompt
    chunk was read and no token tree verified (their cost is not the policy's choice)."""
    if reading or any(step.is_tree for step in steps):
        return False
    return any(row.proposer is not None for row in stepping)


def leave(active: list[Row], kv: BatchKV, started: float) -> list[Row]:
    """Finished rows (failed ones too) leave the batch (their slots are freed); returns the rest in their new slot
    order.  The rows that stay keep their slots' columns and positions."""
    now = time.perf_counter()
    keep = []
    for slot, row in enumerate(active):
        if row.finish_reason is None:
            keep.append(slot)
        else:
            end_row(row, now - started)
    if keep and len(keep) < len(active):  # the last rows keep their cache (a caller's prompt cache stays whole)
        return [active[slot] for slot in kv.select(keep)]
    return [active[slot] for slot in keep]


def end_row(row: Row, seconds: float) -> None:
    """The row ended: its proposer hears its last committed tokens (a conversation keeps it for the next turn)
    and its statistics are closed.  Changes the row and its proposer."""
    contained(row, "proposer update", None, tell, row)
    finish(row, seconds)


def _walk(row: Row, step: Step, masks: torch.Tensor, eos: frozenset[int]) -> None:
    """The row's tree loses its grammar-illegal nodes; its mask rows are filled from ``step.start`` on (the state's
    mask from the forced check where it is still current).  Changes ``step`` and ``masks``."""
    root = row.state_mask if row.state_mask_ready else None
    step.tree, step.ends = prune_and_fill_masks(row.matcher, masks, step.start, step.tree, eos, root)


class Phases:
    """Seconds per phase of one step by ``clock`` (a lap timer: each lap ends the named phase).  Bookkeeping only."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.seconds: dict[str, float] = {}
        self._clock = clock
        self._last = clock()

    def lap(self, name: str) -> None:
        now = self._clock()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._last
        self._last = now

    def add_to(self, totals: dict[str, float]) -> None:
        for name, seconds in self.seconds.items():
            totals[name] = totals.get(name, 0.0) + seconds


def _masks(shared: StepResources, rows: int) -> torch.Tensor:
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
    a step (:func:`grammarspec.engine.processing.prefix_tensors`), so one copy to the device serves them all.
    Processing is each row's own: where it raises, that row fails alone (its rows keep
    their masked scores, and its choice is never committed) -- a shared call that raises
    is run again row by row.  A ``generate`` call's ``logits_processor=`` serves all its
    rows, so one that raises on every row fails every row, and the call.
    """
    first = active[0].processing
    if isinstance(first, LogitsPipeline) and first.batch_key is not None:
        if all(isinstance(r.processing, LogitsPipeline) and r.processing.batch_key == first.batch_key for r in active):
            if first.is_identity:  # greedy with no processor: the masked float32 logits are the scores
                return
            try:
                scores[:] = first(scores, [[]] * scores.shape[0])
                return
            except Exception:  # each row's processing on its own rows below: the one that raises fails alone
                pass
    todo = [
        (row, step)
        for row, step in zip(active, steps)
        if not (isinstance(row.processing, LogitsPipeline) and row.processing.is_identity)
    ]
    prefixes = [_prefixes(row, step) for row, step in todo]
    readers = [isinstance(row.processing, LogitsPipeline) and row.processing.reads_prefixes for row, _ in todo]
    flat = [p for rows, reads in zip(prefixes, readers) if reads for p in rows]
    views = iter(prefix_tensors(flat, scores.device) if flat else [])  # every reader's prefixes: one copy a step
    for (row, step), rows, reads in zip(todo, prefixes, readers):
        block = slice(step.start, step.start + 1 + len(step.tree))
        given: list[Any] = [next(views) for _ in rows] if reads else rows
        contained(row, "logits processing", None, _apply, row.processing, scores, block, given)


def _apply(processing: Any, scores: torch.Tensor, block: slice, given: list[Any]) -> None:
    """``processing`` on the rows ``block`` of ``scores`` (changed in place only when it returns)."""
    scores[block] = processing(scores[block], given)


def _prefixes(row: Row, step: Step) -> list[list[int]]:
    """The context each scored row of ``row`` conditions on (root: the row's tokens; node: + its path).

    Only built when the row's processing reads prefixes (a prefix-free pipeline gets empty ones).
    """
    tree = step.tree
    if isinstance(row.processing, LogitsPipeline) and not row.processing.reads_prefixes:
        return [[]] * (1 + len(tree))
    return [list(row.tokens)] + [list(row.tokens) + [tree.tokens[j] for j in tree.path(i)] for i in range(len(tree))]


def _dead_end(step: Step, result: tuple[list[int], int | None], dead: Sequence[bool]) -> bool:
    """Whether the row's next token comes from a scored row that allows no token (its grammar's dead end).

    Only the row the next token is read from can be one: a node whose state allows no token has no kept
    children, so no draft token is compared with a dead row's choice.
    """
    path, token = result
    return token is not None and dead[step.start + (1 + path[-1] if path else 0)]


def _no_token(row: Row, shared: StepResources) -> NoLegalTokenError:
    """The error of a row whose grammar allows no token where the row needs one."""
    text = ""
    if shared.tokenizer is not None and row.generated:
        text = f" ({shared.tokenizer.decode(row.generated[-40:])!r})"
    return NoLegalTokenError(
        f"the grammar allows no token after {len(row.generated)} generated tokens{text}, and the output is not "
        "complete: the grammar backend reached a state it cannot finish (a bug in the backend, or a schema "
        "construct it cannot complete).  Try another grammar_backend ('xgrammar', 'llguidance' or 'outlines'), "
        "or simplify the schema."
    )


def _segment(step: Step) -> Segment:
    """A sampled chain's rows for residual rejection (its bonus row unless its last node ends generation)."""
    n = len(step.tree)
    probs = step.draft.probs
    assert probs is not None
    return Segment(step.start, step.tree.tokens, not step.ends[-1], probs[:n])


def _fill_state_masks(active: Sequence[Row], shared: StepResources) -> None:
    """Each constrained row's mask for its current state, in one batched call per grammar backend.

    :func:`grammars.base.fill_masks` (xgrammar: ``BatchGrammarMatcher``).  The
    forced check reads it, and the walk reuses it as the tree's root row, so
    no state's mask is filled twice.  Changes each row's ``state_mask``.
    """
    pairs = [(row, row.matcher) for row in active if row.matcher is not None and row.finish_reason is None]
    if not pairs:
        return
    t0 = time.perf_counter()
    roots = torch.empty((len(pairs), shared.masks.shape[1]), dtype=torch.int32, device="cpu")  # host, as backends fill
    try:
        fill_masks([matcher for _, matcher in pairs], roots, range(len(pairs)))
    except Exception:  # some row's matcher raised: each fills its own, and the one that raises fails alone
        for i, (row, matcher) in enumerate(pairs):
            contained(row, "grammar mask", None, matcher.fill_mask, roots, i)
    share = (time.perf_counter() - t0) / len(pairs)
    for i, (row, _) in enumerate(pairs):
        row.state_mask, row.state_mask_ready = roots[i : i + 1], row.failure is None
        row.stats.grammar_seconds += share


def _commit_forced(row: Row, shared: StepResources) -> None:
    """Commit every token the grammar forces through :func:`commit` (no target pass; the proposer is told).

    The last check's mask -- the row's state now -- stays in ``row.state_mask`` for the walk.
    """
    while row.matcher is not None and row.finish_reason is None:
        t0 = time.perf_counter()
        if row.state_mask is None:  # on the host, as xgrammar fills it
            row.state_mask = torch.zeros((1, shared.masks.shape[1]), dtype=torch.int32, device="cpu")
        token = forced_token(row.matcher, row.state_mask, filled=row.state_mask_ready)
        row.stats.grammar_seconds += time.perf_counter() - t0
        if token is None:
            row.state_mask_ready = True
            return
        row.state_mask_ready = False
        (count,) = commit([row], [Step()], [([], token)], None, shared)
        row.stats.forced_tokens += count


def _ask(row: Row) -> int:
    """How many draft levels to ask the row's proposer for: its controller's ask, within the row's budget (the
    draft and the target's own token fit in what is left of ``max_new_tokens``).  A row resting after drafts cut
    to nothing wakes where its grammar forces text (jump-forward: what a rest would miss).  Changes the
    controller's rest only."""
    controller = row.controller
    if controller is None:
        return 0
    if controller.resting and row.matcher is not None and row.matcher.forced_text():
        controller.wake()
    budget = row.settings.max_new_tokens - len(row.generated)
    return min(controller.ask(), budget - 1)


def _propose(row: Row, k: int, trees: bool, chains: bool) -> Step:
    """Ask the row's proposer for a draft of up to ``k`` levels (:func:`_ask`): the one place a row's draft
    length is decided.

    A :class:`~proposers.base.TreeDrafter` is asked for a tree when ``trees``
    (the model and cache can run a tree pass, :meth:`BatchKV.supports_trees`);
    anything else drafts a chain, which becomes the one-branch tree.
    ``chains`` False: no chain is drafted unless the row's controller verifies
    its drafts whole (``adaptive=False``): the batch could not pay for one.
    """
    step = Step()
    tree = trees and row.tree_drafter is not None
    if not (chains or tree or _verifies_whole(row)):
        return step
    if row.proposer is not None and k > 0:
        t0 = time.perf_counter()
        tell(row)  # the tokens committed since it last drafted
        view = GrammarView(row.matcher) if row.matcher is not None else None
        if tree:
            assert row.tree_drafter is not None
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


def _verifies_whole(row: Row) -> bool:
    """Whether the row's controller verifies its drafts whole (``adaptive=False``): they are proposed and priced
    even on a held step."""
    return row.controller is not None and not row.controller.adaptive


def _drafting_pays(shared: StepResources, batch: int, kind: str) -> bool:
    """Whether the loop's step cost learner lets a step of ``batch`` rows of ``kind`` draft
    (:meth:`StepCostLearner.drafting_pays`: not while its drafted steps show no gain in tokens a second over plain
    ones); True without one."""
    return shared.cost_learner is None or shared.cost_learner.drafting_pays(batch, kind)


def rows_kind(rows: Sequence[Row]) -> str:
    """What kind of rows step together, for the drafted steps' record: ``constrained`` (every row has a
    grammar), ``free`` (none has) or ``mixed``.  What drafts bring differs most between them.  Pure."""
    constrained = sum(row.matcher is not None for row in rows)
    return "constrained" if constrained == len(rows) else "free" if constrained == 0 else "mixed"


def _worth(stepping: Sequence[Row], cost: Cost | None, finishing: bool) -> list[float] | None:
    """What a committed token of each row is worth to a batch that ends with its last row
    (:func:`grammarspec.policy.allocation.finishing_worth`); ``None`` (each worth one) elsewhere, and where a row's end is not its
    budget: a grammar ends its row when its structure closes, whatever the budget left."""
    if not finishing or cost is None or any(row.matcher is not None for row in stepping):
        return None
    remaining = [row.settings.max_new_tokens - len(row.generated) for row in stepping]
    accepted = [sum(row.stats.accepted.values()) for row in stepping]
    return finishing_worth(remaining, accepted, [row.stats.target_forwards for row in stepping], cost)


def _allocate(
    active: list[Row], steps: list[Step], cost: Cost | None, *, packed: bool, worth: Sequence[float] | None = None
) -> None:
    """Cut each row's chain to its share of one goodput allocation over the batch (:func:`grammarspec.policy.allocation.plan_drafts`)
    priced by ``cost`` (``None``: a probe, every chain is cut to nothing), each row's tokens ``worth`` what
    they save (``None``: one each).

    A proposer's token tree is verified whole; its rows count in the batch's cost, and every token is
    then worth one.  ``packed``: a drafted pass computes exactly its tokens
    (:mod:`grammarspec.kv.packed_attention`); otherwise every row is padded to the widest.  Changes ``steps``.
    """
    chains = [i for i, step in enumerate(steps) if not step.is_tree]
    if not any(len(steps[i].draft) for i in chains):
        return
    pending = [len(active[i].pending) for i in chains]  # each row's own tokens before its draft
    fixed = [len(row.pending) + len(step.tree) for row, step in zip(active, steps) if step.is_tree]
    drafts, controllers = [steps[i].draft for i in chains], [active[i].controller for i in chains]
    if fixed:  # with a tree beside them (every row not in chains), a token is worth one
        worth = None
    if cost is None:
        lengths = [0] * len(chains)  # a probe: the learner needs a plain step now and then to price drafted ones
    elif packed and len(active) > 1:
        lengths = plan_drafts(drafts, controllers, sum(pending) + sum(fixed), cost, worth=worth)
    else:
        lengths = plan_drafts(drafts, controllers, None, cost, pending=pending, fixed=fixed, worth=worth)
    for i, n in zip(chains, lengths):
        offered = len(steps[i].draft)
        steps[i].draft = steps[i].draft.truncate(n)
        steps[i].tree = _chain(steps[i].draft)
        controller = active[i].controller
        if controller is not None:
            controller.allocated(n, offered)


def _step_cost(model: torch.nn.Module, shared: StepResources, batch: int) -> Cost | None:
    """What the policy prices this step by: a replay's modelled cost, the loop's learned one, else the profile;
    ``None`` when the learner asks for a plain step (a probe)."""
    if shared.step_cost is not None:
        return shared.step_cost
    if shared.cost_learner is None:
        return shared.pass_cost.cost()
    return None if shared.cost_learner.wants_plain_step() else shared.cost_learner.cost(batch)


def _greedy_rows(active: Sequence[Row], steps: Sequence[Step]) -> bool | list[bool]:
    """Whether each scored row takes the argmax (its row's setting); one ``bool`` when every row agrees."""
    flags = [row.settings.greedy for row in active]
    if all(flags) or not any(flags):
        return flags[0]
    return [flag for flag, step in zip(flags, steps) for _ in range(1 + len(step.tree))]


def _chain(draft: Draft) -> DraftTree:
    """``draft`` as the one-branch tree (its distributions stay on the step)."""
    return DraftTree(draft.tokens, tuple(range(-1, len(draft) - 1)), draft.sources, draft.kind)
