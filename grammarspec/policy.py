"""How many draft tokens each row verifies this step: one allocation over the whole batch, by goodput.

The rule (SmartSpec's goodput, done exactly).  Row ``r`` offers a draft whose
token ``j`` survives verification, given that the tokens before it did, with
probability ``p[r][j]`` (:class:`Calibration`: the proposer's own estimate,
calibrated online).  Admitting its first ``k`` tokens brings, in expectation,
``1 + S[r][1] + ... + S[r][k]`` committed tokens, ``S[r][j] = p[r][1] * ... * p[r][j]``
(the target's own token always comes).  The pass verifies
``rows = base_rows + sum(k_r)`` rows and costs ``cost(rows)`` (a
:class:`proposers.cost.PassCost`).  Goodput is expected tokens per unit of
batch time::

    goodput = (B + sum of admitted S[r][j]) / cost(base_rows + admitted slots)

The (row, position) slots are taken in order of ``S`` (highest first; ``S``
never rises along a row, so a row's slots come in prefix order), and the
allocation is the prefix of that order with the highest goodput (the
shortest on ties).  ``k = 0`` for a row is an ordinary outcome; so is ``k = 0``
for every row (a plain step).  Grammar-forced leading tokens (``forced[r]``)
are always taken: they count in the rows and the tokens, never in the order.

Worked example, the CPU prior (``cost(1) = 1``, ``cost(rows) = 1.3 + 0.03 * max(rows, 4)``)::

    batch 1:  p = [[0.9, 0.9, 0.5]]     S = 0.9, 0.81, 0.405
        k=0: 1 / 1.00 = 1.00   k=1: 1.9 / 1.42 = 1.34   k=2: 2.71 / 1.42 = 1.91
        k=3: 3.115 / 1.42 = 2.19            -> k = 3
    batch 16: every row p = [0.9, 0.5], one pending token each (base_rows = 16)
        plain: 16 / 1.78 = 8.99;  the 16 first slots (S = 0.9): 30.4 / 2.26 = 13.5
        then the 16 second slots (S = 0.45): 37.6 / 2.74 = 13.7   -> k = 2 each
        with p = [0.9, 0.2] instead, the second slots bring 2.9 for 0.48: 33.3 / 2.74 = 12.1
                                                                   -> k = 1 each

On a curve that stays flat to 64 rows (a GPU, :func:`proposers.cost.flat_until`)
every slot with ``S > 0`` pays until the pass passes 64 rows, so the same
estimates give longer drafts.  The HF loop's curve (:func:`batch_cost_model`) is
profiled once per model, device, dtype and thread count at first use
(:mod:`grammarspec.pass_profile`) and fixed afterwards, so draft lengths do not
drift within a process; ``GRAMMARSPEC_PASS_COST=prior`` keeps the CPU prior
above, for draft lengths that never depend on the machine.  Only which tokens
are *verified* changes, never how they are verified: the output distribution
is untouched.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from proposers.base import Draft
from proposers.cost import PassCost

__all__ = ["allocate", "Calibration", "batch_cost_model", "survival"]


def survival(p: Sequence[float]) -> list[float]:
    """``S[j] = p[0] * ... * p[j]``: the chance that the first ``j + 1`` draft tokens all survive.

    >>> [round(s, 3) for s in survival([0.9, 0.9, 0.5])]
    [0.9, 0.81, 0.405]
    """
    out, s = [], 1.0
    for value in p:
        s *= min(max(float(value), 0.0), 1.0)
        out.append(s)
    return out


def allocate(
    estimates: Sequence[Sequence[float]],
    cost: Callable[[int], float],
    base_rows: int,
    forced: Sequence[int] | None = None,
) -> list[int]:
    """Draft tokens to verify per row: the goodput-best prefix of all (row, position) slots.  Pure.

    ``estimates[r][j]``: row ``r``'s token ``j`` survives given the ones before
    did (its offered draft is ``len(estimates[r])`` long).  ``cost(rows)``: a
    pass over ``rows`` rows, any unit.  ``base_rows``: rows the pass computes
    anyway (every row's pending tokens; the batch size for a plain step).
    ``forced[r]``: leading tokens of row ``r`` always taken.  See the module
    docstring for the rule and a worked example.

    >>> from proposers.cost import PassCost
    >>> allocate([[0.9, 0.9, 0.5]], PassCost().cost, base_rows=1)
    [3]
    >>> allocate([[0.9, 0.5]] * 16, PassCost().cost, base_rows=16)[0], allocate([[0.9, 0.2]] * 16, PassCost().cost, 16)[0]
    (2, 1)
    >>> allocate([[0.2, 0.9]], PassCost().cost, base_rows=1)  # 0.2 + 0.18 cannot pay 0.42
    [0]
    """
    forced = list(forced) if forced is not None else [0] * len(estimates)
    if len(forced) != len(estimates):
        raise ValueError(f"allocate got {len(forced)} forced counts for {len(estimates)} rows: pass one per row")
    if base_rows < 0:
        raise ValueError(f"allocate needs base_rows >= 0, got {base_rows}")
    lengths = [min(max(f, 0), len(e)) for f, e in zip(forced, estimates)]
    tokens = float(len(estimates))
    slots: list[tuple[float, int, int]] = []  # (-S, position, row)
    for r, row in enumerate(estimates):
        s = survival(row)
        tokens += sum(s[: lengths[r]])
        slots += [(-s[j], j, r) for j in range(lengths[r], len(row)) if s[j] > 0.0]
    slots.sort()
    rows = base_rows + sum(lengths)
    best, best_n = tokens / cost(rows), 0
    for n, (neg, _, _) in enumerate(slots, start=1):
        tokens -= neg
        goodput = tokens / cost(rows + n)
        if goodput > best * (1 + 1e-12):
            best, best_n = goodput, n
    for _, _, r in slots[:best_n]:
        lengths[r] += 1
    return lengths


class Calibration:
    """What this request's draft tokens survived, by source: turns a proposer's estimates into probabilities.

    A token is filed under ``(source, opens, bin)``: the proposer that drafted
    it, whether it opens that proposer's run in the draft (a new guess, right
    or wrong as a whole; the tokens after it mostly follow), and the bin of
    its own ``Draft.confidence`` (``None`` or negative: no estimate, bin -1).  Each
    record starts from ``prior_weight`` pseudo-observations at the proposer's
    estimate (``default_open`` / ``default_follow`` without one) and counts
    the tokens that reached verification (every token up to the first
    rejected one); older counts fade by ``decay``.

    >>> c = Calibration()
    >>> d = Draft(tokens=(1, 2, 3), sources=("lookup",) * 3)
    >>> [round(x, 2) for x in c.estimate(d)]
    [0.5, 0.8, 0.8]
    >>> for _ in range(20):
    ...     c.update(d, 0)  # every first token rejected
    >>> round(c.estimate(d)[0], 2)
    0.06

    ``update`` changes state; ``estimate`` does not.
    """

    def __init__(
        self,
        *,
        prior_weight: float = 2.0,
        decay: float = 0.97,
        bins: int = 8,
        default_open: float = 0.5,
        default_follow: float = 0.8,
    ) -> None:
        if prior_weight <= 0 or not 0 < decay <= 1 or bins < 1:
            raise ValueError("Calibration needs prior_weight > 0, 0 < decay <= 1 and bins >= 1")
        self.prior_weight, self.decay, self.bins = prior_weight, decay, bins
        self.default_open, self.default_follow = default_open, default_follow
        self._counts: dict[tuple[str, bool, int], list[float]] = {}  # key -> [survived, seen]

    def _keys(self, draft: Draft) -> list[tuple[tuple[str, bool, int], float]]:
        sources = draft.sources or ("draft",) * len(draft)
        out = []
        for j, source in enumerate(sources):
            opens = j == 0 or sources[j - 1] != source
            raw = draft.confidence[j] if draft.confidence is not None else None
            if raw is None or raw < 0:
                key, prior = (source, opens, -1), self.default_open if opens else self.default_follow
            else:
                raw = min(max(float(raw), 0.0), 1.0)
                key, prior = (source, opens, min(int(raw * self.bins), self.bins - 1)), raw
            out.append((key, prior))
        return out

    def estimate(self, draft: Draft) -> list[float]:
        """Per token of ``draft``: the chance it survives given the ones before did.  Does not change state."""
        out = []
        for key, prior in self._keys(draft):
            survived, seen = self._counts.get(key, (0.0, 0.0))
            out.append((survived + self.prior_weight * prior) / (seen + self.prior_weight))
        return out

    def update(self, draft: Draft, num_accepted: int) -> None:
        """``draft`` was verified and its first ``num_accepted`` tokens accepted.  Changes state."""
        if not 0 <= num_accepted <= len(draft):
            raise ValueError(f"num_accepted ({num_accepted}) must be between 0 and the draft's {len(draft)} tokens")
        for j, (key, _) in enumerate(self._keys(draft)[: num_accepted + 1]):
            counts = self._counts.setdefault(key, [0.0, 0.0])
            counts[0] = counts[0] * self.decay + float(j < num_accepted)
            counts[1] = counts[1] * self.decay + 1.0


_COST_MODELS: dict[tuple[Any, ...], PassCost] = {}
PASS_COST_ENV = "GRAMMARSPEC_PASS_COST"
_PASS_COST_MODES = ("profile", "prior")


def batch_cost_model(model: Any) -> PassCost:
    """The pass cost model of ``model`` on its device, dtype and this process's thread count.

    ``$GRAMMARSPEC_PASS_COST`` chooses it: ``profile`` (the default) times a
    few passes once per such key at first use
    (:func:`grammarspec.pass_profile.profile_pass_cost`) and keeps the curve on
    disk for the next process (:func:`grammarspec.pass_profile.stored_profile`); ``prior`` takes the
    CPU prior :class:`PassCost`, for draft lengths that never depend on the
    machine.  Either way one :class:`PassCost` per key for the life of the
    process, fixed afterwards: the HF loop does not teach it measured times (a
    timing-dependent cost would make draft lengths, and so seeded samples and
    floating-point ties, drift within a process); the vLLM proposer teaches
    its own.  Raises ``ValueError`` for any other value.  Does not change
    state beyond creating (and profiling) the model on first use.
    """
    import torch

    mode = os.environ.get(PASS_COST_ENV, "profile").strip().lower() or "profile"
    if mode not in _PASS_COST_MODES:
        raise ValueError(
            f"{PASS_COST_ENV}={os.environ[PASS_COST_ENV]!r}: expected one of {', '.join(_PASS_COST_MODES)}"
        )
    try:
        parameter = next(model.parameters())
        device, dtype = str(parameter.device), str(parameter.dtype)
    except (AttributeError, StopIteration, TypeError):
        device, dtype = "unknown", "unknown"
    config = getattr(model, "config", None)
    name = getattr(config, "name_or_path", "") or ""  # an unnamed model (built in code) is only itself
    key = (mode, name or type(model).__name__, id(model) if not name else None, device, dtype,
           torch.get_num_threads())  # fmt: skip
    found = _COST_MODELS.get(key)
    if found is None:
        if mode == "profile":
            from .pass_profile import profile_pass_cost, stored_profile

            if name and device != "unknown":  # a named model: one profile per machine, kept on disk
                where = torch.cuda.get_device_name(parameter.device) if parameter.device.type == "cuda" else device
                label = f"{name}|{where}|{dtype}|threads={torch.get_num_threads()}|torch={torch.__version__}"
                found = _COST_MODELS[key] = stored_profile(model, label)
            else:
                found = _COST_MODELS[key] = profile_pass_cost(model)
        else:
            found = _COST_MODELS[key] = PassCost(prior_weight=8.0)
    return found


def plan_drafts(drafts: Sequence[Draft], controllers: Sequence[Any], base_rows: int,
                cost: Callable[[int], float], forced_source: str = "jump_forward") -> list[int]:  # fmt: skip
    """The loop's one call: how many tokens of each row's draft this step verifies.  Pure.

    ``controllers[r]``: row ``r``'s :class:`grammarspec.adaptive.AdaptiveController`
    (``None``, or ``adaptive=False``: its draft is verified whole).  A draft's
    leading tokens from ``forced_source`` (jump-forward: text the grammar
    forces) are always taken; every other token is admitted by :func:`allocate`.
    Calibrating them like any source instead (the grammar forces their text,
    not its split) was measured and dropped: on SmolLM2 at batch 8 it cut the
    tails of forced text and lost 6% of the tokens per pass (3.45 -> 3.25,
    BENCHMARKS.md, stop 15) for no pass saved at batch 1.
    """
    estimates, forced = [], []
    for draft, controller in zip(drafts, controllers):
        if controller is None or not controller.adaptive:
            estimates.append([1.0] * len(draft))
            forced.append(len(draft))
            continue
        estimates.append(controller.estimates(draft))
        lead = 0
        while lead < len(draft) and draft.sources and draft.sources[lead] == forced_source:
            lead += 1
        forced.append(lead)
    return allocate(estimates, cost, base_rows, forced)
