"""How many draft tokens each row verifies this step: one allocation over the whole batch, by goodput.

The rule (SmartSpec's goodput, done exactly).  Row ``r`` offers a draft whose
token ``j`` survives verification, given that the tokens before it did, with
probability ``p[r][j]`` (:class:`Calibration`: the proposer's own estimate,
calibrated online, and scaled by how the first tokens of the drafts the policy
chose by those estimates really fared: choosing the best-looking of many noisy
estimates chooses high ones, :meth:`Calibration.bias`).  Admitting its first ``k`` tokens brings, in expectation,
``1 + S[r][1] + ... + S[r][k]`` committed tokens, ``S[r][j] = p[r][1] * ... * p[r][j]``
(the target's own token always comes).  Goodput is expected tokens per unit of
batch time::

    goodput = (B + sum of admitted S[r][j])
              / (cost(rows) + per_token * slots + switch + per_draft_row * (drafting rows - 1))

in plain steps (:class:`proposers.cost.PassCost`): ``cost(rows)`` is the
forward over the rows the pass really computes, ``per_token`` the host work
of each admitted draft token (drafting, the grammar walk, verification),
``switch`` the change from the mask-free decode call to masked ragged rows,
paid once when any row drafts at batch 2 or more, and ``per_draft_row`` (a
packed pass only) the attention call of its own that each further drafting
row takes in every layer.

A token is worth one where a freed slot serves the next request (a server).
In a batch that ends with its last row (``generate`` on B prompts) a token
is worth the finishing time it saves (:func:`finishing_worth`): a slot of
row ``r`` brings ``worth[r] * S``, more on the row likely to end the batch,
less on rows that end sooner on their own.

The rows a pass computes depend on its shape.  The HF loop pads every row to
the widest (:meth:`grammarspec.kv.batch.BatchKV.forward`): ``rows = B * max_r(pending[r] + k[r])``,
so one long draft widens every row of the batch.  For each width the
allocation takes the admissible (row, position) slots in order of ``worth * S``
(highest first; ``S`` never rises along a row, so a row's slots come in
prefix order) while they raise the goodput, and keeps the best width (the
narrowest on ties).  A packed pass (vLLM: ``rows = base_rows + sum(k)``)
takes the best prefix of all slots in that order, a row's first slot
paying ``per_draft_row`` as well (so a few rows drafting long can beat many
rows drafting one token each).  ``k = 0`` for a row is an
ordinary outcome; so is ``k = 0`` for every row (a plain step).
Grammar-forced leading tokens (``forced[r]``) are always taken: they count in
the rows and the tokens, never in the order.

Worked example, packed, the CPU prior (``cost(1) = 1``, ``cost(rows) = 1.3 + 0.03 * max(rows, 4)``)::

    batch 1:  p = [[0.9, 0.9, 0.5]]     S = 0.9, 0.81, 0.405
        k=0: 1 / 1.00 = 1.00   k=1: 1.9 / 1.42 = 1.34   k=2: 2.71 / 1.42 = 1.91
        k=3: 3.115 / 1.42 = 2.19            -> k = 3

Padded, batch 16, one pending token each, every row ``p = [0.9, 0.5]``: the
plain step computes 16 rows (16 / 1.78 = 8.99), width 2 computes 32 (30.4 /
2.26 = 13.5), width 3 computes 48 (37.6 / 2.74 = 13.7): ``k = 2`` each.  With
a single row offering those tokens and the others nothing, width 2 costs the
same 32 rows for one token's 0.9: 16.9 / 2.26 = 7.5, so no row drafts.

On a curve that stays flat to 64 rows (a GPU, :func:`proposers.cost.flat_until`)
every slot with ``S`` above ``goodput * per_token`` pays until the pass passes
64 rows, so the same estimates give longer drafts.  The HF loop's curve
(:func:`grammarspec.drafting.cost_model.batch_cost_model`, handed to the loop
by its caller: :mod:`grammarspec.policy.cost`) is profiled once per model,
device, dtype and thread count at first use
(:mod:`grammarspec.drafting.pass_profile`) and fixed within a call, so draft
lengths do not drift within one; between calls it is measured again where the
passes the loop timed disagree with it
(:func:`grammarspec.drafting.cost_model.checked_cost_model`);
``GRAMMARSPEC_PASS_COST=prior`` keeps the CPU prior above, for draft lengths
that never depend on the machine.  Only which tokens are *verified* changes,
never how they are verified: the output distribution is untouched.  Pure: no
clocks, no disk, no model runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from grammarspec.policy.step_cost import StepCost
from proposers.base import Draft
from proposers.cost import PassCost
from proposers.track import Calibration, survival

__all__ = [
    "allocate",
    "Calibration",
    "Cost",
    "drafts_could_pay",
    "finishing_worth",
    "forced_lead",
    "plan_drafts",
    "survival",
]

Cost = PassCost | StepCost | Callable[[int], float]
#: The proposer whose leading tokens a draft always verifies: jump-forward, text the grammar forces.
FORCED_SOURCE = "jump_forward"


def allocate(
    estimates: Sequence[Sequence[float]],
    cost: Cost,
    base_rows: int | None = None,
    forced: Sequence[int] | None = None,
    *,
    pending: Sequence[int] | None = None,
    fixed: Sequence[int] = (),
    worth: Sequence[float] | None = None,
) -> list[int]:
    """Draft tokens to verify per row: the goodput-best admissible slots.  Pure.

    ``estimates[r][j]``: row ``r``'s token ``j`` survives given the ones before
    did (its offered draft is ``len(estimates[r])`` long).  ``cost``: a
    :class:`~proposers.cost.PassCost` or a learned :class:`~grammarspec.policy.step_cost.StepCost`
    (its ``switch``, ``per_token`` and ``per_draft_row`` count),
    or ``cost(rows)`` alone, any unit.  ``forced[r]``: leading tokens of row
    ``r`` always taken.  The pass's shape, one of:

    * ``base_rows``: packed, ``rows = base_rows + admitted tokens``
      (``base_rows``: every row's pending tokens; the batch size for a plain step);
    * ``pending[r]``: padded, each row's own tokens before its draft;
      ``fixed``: the widths of the batch's other rows (a tree verified whole);
      every row is computed at the widest width.

    ``worth[r]``: what a committed token of row ``r`` is worth against one
    of a plain step (default 1: a server's freed slot serves the next
    request; :func:`finishing_worth` for a batch that ends with its last
    row); a slot brings ``worth[r] * S``.

    See the module docstring for the rule and worked examples.

    >>> from proposers.cost import PassCost
    >>> allocate([[0.9, 0.9, 0.5]], PassCost(), base_rows=1)
    [3]
    >>> allocate([[0.9, 0.5]] * 16, PassCost(), pending=[1] * 16)[0], allocate([[0.9, 0.2]] * 16, PassCost(), 16)[0]
    (2, 1)
    >>> allocate([[0.9, 0.5]] + [[]] * 15, PassCost(), pending=[1] * 16)[0]  # one row alone widens all 16
    0
    >>> allocate([[0.2, 0.9]], PassCost(), base_rows=1)  # 0.2 + 0.18 cannot pay 0.42
    [0]
    >>> allocate([[0.8, 0.8]] * 8, PassCost(), 8, worth=[6.9] + [0.16] * 7)  # a static batch: its last row pays
    [2, 0, 0, 0, 0, 0, 0, 0]
    """
    forced = list(forced) if forced is not None else [0] * len(estimates)
    if len(forced) != len(estimates):
        raise ValueError(f"allocate got {len(forced)} forced counts for {len(estimates)} rows: pass one per row")
    if (base_rows is None) == (pending is None):
        raise ValueError("allocate needs the pass's shape: base_rows (packed) or pending (padded), not both")
    worth = list(worth) if worth is not None else [1.0] * len(estimates)
    if len(worth) != len(estimates) or min(worth, default=0.0) < 0.0:
        raise ValueError(f"allocate needs one worth >= 0 per row, got {worth}")
    forward, switch, per_token, per_draft_row = _terms(cost)
    lengths = [min(max(f, 0), len(e)) for f, e in zip(forced, estimates)]
    tokens = float(len(estimates) + len(fixed))
    slots: list[tuple[float, int, int]] = []  # (-worth * S, position, row)
    for r, row in enumerate(estimates):
        s = [worth[r] * x for x in survival(row)]
        tokens += sum(s[: lengths[r]])
        slots += [(-s[j], j, r) for j in range(lengths[r], len(row)) if s[j] > 0.0]
    slots.sort()
    batch = len(estimates) + len(fixed)
    if pending is None:
        assert base_rows is not None
        if base_rows < 0:
            raise ValueError(f"allocate needs base_rows >= 0, got {base_rows}")
        chosen = _packed(
            slots,
            tokens,
            base_rows,
            lengths,
            forward,
            switch if batch > 1 else 0.0,
            per_token,
            per_draft_row if batch > 1 else 0.0,
        )
    else:
        if len(pending) != len(estimates) or min(pending, default=1) < 1:
            raise ValueError(f"allocate needs one pending count >= 1 per row, got {list(pending)}")
        chosen = _padded(slots, tokens, pending, lengths, fixed, forward, switch if batch > 1 else 0.0, per_token)
    for _, _, r in chosen:
        lengths[r] += 1
    return lengths


def _terms(cost: Cost) -> tuple[Callable[[int], float], float, float, float]:
    """``(cost(rows), switch, per_token, per_draft_row)`` of a :class:`PassCost` or a learned
    :class:`~grammarspec.policy.step_cost.StepCost`, or of a bare curve (no extra terms)."""
    if isinstance(cost, (PassCost, StepCost)):
        return cost.cost, cost.switch, cost.per_token, cost.per_draft_row
    return cost, 0.0, 0.0, 0.0


def _packed(
    slots: list[tuple[float, int, int]],
    tokens: float,
    rows: int,
    lengths: Sequence[int],
    forward: Callable[[int], float],
    switch: float,
    per_token: float,
    per_draft_row: float,
) -> list[tuple[float, int, int]]:
    """The goodput-best prefix of ``slots`` (ordered by what each brings) when each one adds a row to the pass
    (``lengths``: the tokens each row has taken already) and each further drafting row ``per_draft_row``."""
    drafting = {r for r, k in enumerate(lengths) if k}
    drafted = sum(lengths)

    def spent() -> float:
        if not drafted:
            return forward(rows)
        return forward(rows + drafted) + per_token * drafted + switch + per_draft_row * (len(drafting) - 1)

    best, best_n = tokens / spent(), 0
    for n, (neg, _, r) in enumerate(slots, start=1):
        tokens -= neg
        drafted += 1
        drafting.add(r)
        goodput = tokens / spent()
        if goodput > best * (1 + 1e-12):
            best, best_n = goodput, n
    return slots[:best_n]


def _padded(
    slots: list[tuple[float, int, int]],
    tokens: float,
    pending: Sequence[int],
    lengths: Sequence[int],
    fixed: Sequence[int],
    forward: Callable[[int], float],
    switch: float,
    per_token: float,
) -> list[tuple[float, int, int]]:
    """The goodput-best slots when every row of the pass is computed at the widest row's width.

    At a width ``w`` a slot at position ``j`` of row ``r`` fits when ``pending[r] + j < w``,
    and the forward costs ``cost(B * w)`` whatever fits; the best prefix of the fitting
    slots in the order of what they bring is kept (beyond the first, a slot's only cost is
    ``per_token``, so the goodput rises to one peak and falls).  The best width wins, the narrowest on ties.
    """
    batch = len(pending) + len(fixed)
    taken = sum(lengths)
    narrowest = max([p + k for p, k in zip(pending, lengths)] + list(fixed))
    widest = max([narrowest] + [pending[r] + j + 1 for _, j, r in slots])
    best, best_width, best_n = -1.0, narrowest, 0
    for width in range(narrowest, widest + 1):
        base = forward(batch * width)
        goodput = tokens / (base + (switch + per_token * taken if taken else 0.0))
        if goodput > best * (1 + 1e-12):
            best, best_width, best_n = goodput, width, 0
        gained, n, last = tokens, 0, 0.0
        for neg, j, r in slots:
            if pending[r] + j >= width:
                continue
            gained, n = gained - neg, n + 1
            goodput = gained / (base + switch + per_token * (taken + n))
            if n > 1 and goodput <= last * (1 + 1e-12):
                break  # past the peak: S only falls, so no later slot raises the goodput at this width
            last = goodput
            if goodput > best * (1 + 1e-12):
                best, best_width, best_n = goodput, width, n
    fits = [slot for slot in slots if pending[slot[2]] + slot[1] < best_width]
    return fits[:best_n]


#: Passes of no accepted draft a row's record starts from (:func:`finishing_worth`): a lucky first pass or two
#: does not yet make a row look fast.
FINISHING_PRIOR_PASSES = 4


def finishing_worth(
    remaining: Sequence[int], accepted: Sequence[int], passes: Sequence[int], cost: Cost
) -> list[float]:
    """What a committed token of each row is worth in a batch that ends with its last row.  Pure.

    A server's freed slot serves the next request, so every token there is
    worth one (:func:`allocate`'s default).  A static batch (``generate`` on B
    prompts, nothing waiting) ends when its last row does: a token that
    brings a row that ends sooner nearer its end only lets it leave sooner,
    which saves the plain step curve's marginal row ``beta = cost(B) - cost(B - 1)``
    a step; the rest of a step, ``alpha = cost(B) - beta * B``, is saved
    only by tokens of the row that ends the batch.

    Which row that is, each row's record says: ``remaining[r]`` tokens left
    before its budget ends it, ``accepted[r]`` draft tokens accepted in
    ``passes[r]`` passes so far, so ``g = accepted / (passes + FINISHING_PRIOR_PASSES)``
    a pass and about ``n = remaining / (1 + g)`` passes to go.  Taking each
    pass's accepted count as geometric (variance ``g * (1 + g)``), a row's
    passes to go vary by ``sd = sqrt(n * g * (1 + g)) / (1 + g)``; every row
    within two standard deviations of the difference (``2 * sqrt(sd_r^2 + sd_last^2)``)
    of the row with the most passes to go may end the batch, and those
    candidates share ``alpha`` equally.  In tokens of a plain step
    (``B / cost(B)`` a unit of cost)::

        worth[r] = B / cost(B) * (beta + alpha / candidates if r is a candidate else beta)

    Where every row is a candidate (rows with the same record, as at the
    first step, or drafts that still part them widely) each token is worth
    one, as on a server; at batch 1, and on a curve through the origin
    (``alpha <= 0``), too.  Rows that end sooner on their own (end of text, a
    grammar's end) make the other rows' worth pessimistic: the loop uses it
    for free-text rows only.

    >>> from proposers.cost import PassCost
    >>> finishing_worth([96] * 4, [0] * 4, [0] * 4, PassCost())  # the same record: any of them may end the batch
    [1.0, 1.0, 1.0, 1.0]
    >>> w = finishing_worth([70] + [60] * 7, [0] + [12] * 7, [26] * 8, PassCost())  # only the first row gains nothing
    >>> [round(x, 2) for x in w]
    [6.91, 0.16, 0.16, 0.16, 0.16, 0.16, 0.16, 0.16]
    >>> finishing_worth([70] + [68] * 7, [1] * 8, [26] * 8, PassCost())  # 2 behind, as fast: either may end it
    [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    """
    batch = len(remaining)
    if not len(accepted) == len(passes) == batch:
        raise ValueError(
            f"finishing_worth got {len(accepted)} accepted counts and {len(passes)} pass counts for {batch} rows: "
            "pass one of each per row"
        )
    if batch < 2:
        return [1.0] * batch
    forward = _terms(cost)[0]
    plain = forward(batch)
    beta = max(0.0, plain - forward(batch - 1))
    alpha = plain - beta * batch
    if alpha <= 0.0 or plain <= 0.0:
        return [1.0] * batch
    gains = [max(a, 0) / (max(p, 0) + FINISHING_PRIOR_PASSES) for a, p in zip(accepted, passes)]
    togo = [max(left, 0) / (1.0 + g) for left, g in zip(remaining, gains)]
    var = [n * g / (1.0 + g) for n, g in zip(togo, gains)]  # (n * g * (1 + g)) / (1 + g)^2
    last = max(range(batch), key=togo.__getitem__)
    candidates = [togo[r] + 2.0 * math.sqrt(var[r] + var[last]) >= togo[last] for r in range(batch)]
    if all(candidates):
        return [1.0] * batch
    share = alpha / sum(candidates)
    scale = batch / plain
    return [scale * (beta + share) if candidate else scale * beta for candidate in candidates]


def drafts_could_pay(
    cost: Cost, asks: Sequence[int], pending: Sequence[int], *, packed: bool, worth: float = 1.0
) -> bool:
    """Whether any drafts of at most ``asks[r]`` tokens on row ``r`` could raise this step's goodput, even if
    every one of their tokens survived.  Pure.

    The ceiling of what :func:`allocate` could admit, checked before anything
    is proposed: where not even certain tokens pay (a steep curve at a large
    batch, host work per token above what a row's share of the pass costs),
    proposing them is host work for drafts the allocation would cut.  It
    leaves out ``per_draft_row``, so it stays a bound.  ``pending[r]``: row
    ``r``'s own tokens before its draft; ``packed``: the pass computes exactly
    its tokens (at batch 2 or more), else every row at the widest width;
    ``worth``: the most a draft token is worth (:func:`finishing_worth`).

    A pass over ``rows`` rows costs a piecewise-linear curve, so on each piece
    the goodput of ``n`` certain tokens, ``(B + n) / (cost(base + n) + per_token * n + switch)``,
    is a ratio of lines in ``n``, monotone: its best is at a piece's end.  The
    packed check reads those ends (every ``n`` for a curve of unknown shape);
    the padded one each width with one token or all that fit in it.

    >>> from proposers.cost import PassCost
    >>> drafts_could_pay(PassCost(), [16], [1], packed=True)  # a lone row: certain tokens always pay on the prior
    True
    >>> dear = PassCost(per_token=0.5)  # half a plain step of host work a token: more than a row's share at 16
    >>> drafts_could_pay(dear, [16] * 16, [1] * 16, packed=True), drafts_could_pay(dear, [16] * 2, [1] * 2, packed=True)
    (False, True)
    """
    if len(asks) != len(pending):
        raise ValueError(f"drafts_could_pay got {len(asks)} asks for {len(pending)} rows: pass one per row")
    forward, switch, per_token, _ = _terms(cost)
    batch, total = len(asks), sum(max(a, 0) for a in asks)
    if total <= 0:
        return False
    switch = switch if batch > 1 else 0.0

    def pays(tokens: float, rows: int, drafted: int) -> bool:
        return tokens / (forward(rows) + switch + per_token * drafted) > plain * (1 + 1e-12)

    if packed and batch > 1:
        base = sum(pending)
        plain = batch / forward(base)
        return any(pays(batch + worth * n, base + n, n) for n in _curve_ends(cost, base, total))
    narrowest = max(pending)
    plain = batch / forward(batch * narrowest)
    widest = max(p + max(a, 0) for p, a in zip(pending, asks))
    for width in range(narrowest, widest + 1):  # a width's forward is paid whatever fits: 1 or all its tokens
        n = sum(min(max(a, 0), max(0, width - p)) for p, a in zip(pending, asks))
        if n and (pays(batch + worth, batch * width, 1) or pays(batch + worth * n, batch * width, n)):
            return True
    return False


def _curve_ends(cost: Cost, base: int, total: int) -> list[int]:
    """Draft token counts ``1..total`` at which the pass ``base + n`` ends a linear piece of ``cost``'s curve
    (every count for a bare curve of unknown shape)."""
    curve = cost.curve if isinstance(cost, StepCost) else cost
    if not isinstance(curve, PassCost):
        return list(range(1, total + 1))
    knots = [rows for rows, _ in curve.table] if curve.table is not None else [curve.min_rows]
    return sorted({1, total} | {rows - base for rows in knots if 1 <= rows - base <= total})


def plan_drafts(
    drafts: Sequence[Draft],
    controllers: Sequence[Any],
    base_rows: int | None,
    cost: Cost,
    forced_source: str = FORCED_SOURCE,
    *,
    pending: Sequence[int] | None = None,
    fixed: Sequence[int] = (),
    worth: Sequence[float] | None = None,
) -> list[int]:
    """The loop's one call: how many tokens of each row's draft this step verifies.  Pure.

    ``controllers[r]``: row ``r``'s :class:`grammarspec.policy.adaptive.AdaptiveController`
    (``None``, or ``adaptive=False``: its draft is verified whole).  A draft's
    leading tokens from ``forced_source`` (jump-forward: text the grammar
    forces) are always taken: the grammar forces their text, if not its
    split, and they are how a cold row gathers evidence.  Every other token
    is admitted by :func:`allocate`, with the pass's shape (``base_rows``, or
    ``pending`` and ``fixed``), ``cost`` and what each row's tokens are
    ``worth`` as it takes them, on the row's
    estimates scaled down by how the first tokens of the drafts they chose
    before really fared (:meth:`Calibration.bias`, on the first token past the
    forced ones: every later survival with it, so the order of the row's slots
    is kept).  Never
    up: a bias above 1 is the records catching up with a proposer that
    improved, which they do on their own.
    """
    estimates, forced = [], []
    for draft, controller in zip(drafts, controllers):
        if controller is None or not controller.adaptive:
            estimates.append([1.0] * len(draft))
            forced.append(len(draft))
            continue
        p = controller.estimates(draft)
        lead = forced_lead(draft, forced_source)
        if lead < len(p):  # what the tokens this row's estimates chose really survived, against what they expected
            p[lead] *= min(1.0, controller.calibration.bias())
        estimates.append(p)
        forced.append(lead)
    return allocate(estimates, cost, base_rows, forced, pending=pending, fixed=fixed, worth=worth)


def forced_lead(draft: Draft, forced_source: str = FORCED_SOURCE) -> int:
    """How many of ``draft``'s leading tokens come from ``forced_source`` (text the grammar forces).  Pure."""
    lead = 0
    while lead < len(draft) and draft.sources and draft.sources[lead] == forced_source:
        lead += 1
    return lead
