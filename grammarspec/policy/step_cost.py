"""What a step of this loop really costs, learned from the steps it runs: the drafting policy's cost for a server.

The profile (:mod:`grammarspec.drafting.pass_profile`) prices a pass from forwards
timed once, on their own.  A busy loop's drafted step pays more than those
show: ragged rows whose masks and positions are built every step, the host
work of every row, copies the device must wait for.  Where the profile
misses that, the policy admits drafts that do not pay (or refuses ones
that would).  A :class:`StepCostLearner` fits the seconds of the steps the
loop really takes::

    seconds = u * curve(rows) + h * B + s * switched + p * k + q * spread + a * k_alone

``rows``: what the forward computes, counted as the policy counts it
(:func:`priced_rows`); ``B``: the rows that stepped; ``switched``: 1 when a
row drafted at batch 2 or more; ``k``: the draft tokens verified at batch 2
or more, ``k_alone`` at batch 1 (a lone row's chain takes the model's own
causal pass over its cache, not the packed rows, and costs another amount a
token); ``spread``: the drafting rows beyond the first on the packed path;
``curve``: the profile's.  The fit is least squares over the measured steps, each
weighing 1 and fading by ``decay`` a step, beside pseudo-steps that the
profile prices (a grid of batch sizes, plain and drafted, weighing
``prior_weight`` in all; they hold each term's ratio to the unit, so the
measured steps alone set the seconds) that never fade: before evidence, and for any term
the recent steps do not exercise (no row drafted for a while), the profile
holds, so a server that stopped drafting because drafts cost too much tries
again once its evidence has faded.  Terms come out at 0 or above.  Where
every step drafts, no fit can tell the unit from the drafted terms (each
step pays both), so the learner asks the loop for a plain step now and then
(:meth:`StepCostLearner.wants_plain_step`: a probe).

:meth:`StepCostLearner.cost` gives the policy the fitted model in the unit
``u``: ``cost(rows) = curve(rows) + (h / u) * B``, ``switch = s / u``,
``per_token = p / u`` (``a / u`` at batch 1), ``per_draft_row = q / u`` (:class:`StepCost`).  On a
flat curve with cheap drafted steps (a GPU) the fit stays flat and drafts
stay long; where drafted steps cost several plain ones the switch term says
so and the policy drafts only what pays.

A model of a step's cost prices what it can see, and the survival the
policy expects of the slots it admits runs high (it admits the best-looking
of many noisy estimates).  So the learner also keeps the outcome: per batch
size and kind of rows (constrained, free or both: what drafts bring differs
most between them), the tokens per second each drafted step and each plain
step committed (faded means and variances).  Unless the drafted steps there
show a gain -- their mean beats the plain steps' by more than the standard
error of the difference --, it holds drafting off
(:meth:`StepCostLearner.drafting_pays`): a draft that only breaks even at
its own step still pays for host work, for joins it moves out of step and
for the noise in its record.  A hold keeps an exploring step whose drafts
keep the drafted record current: the first after ``explore_every`` held
steps, each later one after twice as many as the one before, up to
``explore_most`` (:class:`proposers.backoff.Backoff`; an exploring step that
loses is the hold's own cost, and traffic that no draft survives would pay
it for as long as it lasts).  A
busy server whose drafts do not pay, however that arises, stops paying for
them; rows of another kind start their own record.  Where the policy itself
keeps cutting what the rows offer, drafted steps are too rare to make a
record at all, yet every step still prices its batch and asks proposers for
drafts it then cuts: so the learner also counts, per batch size and kind,
the steps that offered drafts and had every one cut, and holds (with the
same exploring steps) once those outnumber the drafted steps
``refusals`` to one (the hold then skips the pricing and the proposing, and
an exploring step asks again).  That count fades only as steps that offered
drafts come in, so a hold lasts until exploring steps see drafts admitted,
not until enough held steps have gone by.

Steps that read prompt chunks or verify token trees teach nothing (their
cost is not the policy's to choose).  Drafting policy only: which tokens are
verified, never how, so greedy outputs are unchanged and sampled ones keep
their distribution; but draft lengths, and with them which random numbers a
seeded sample draws, then depend on measured times, which is why
``grammarspec.generate`` keeps the fixed profile and the server learns.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from proposers.backoff import Backoff
from proposers.cost import PassCost

__all__ = ["STEP_COSTS", "StepCost", "StepCostLearner", "priced_rows"]

#: What a server's drafting policy prices a step by: ``learned``, the seconds of its own steps, starting from the
#: profile (:class:`StepCostLearner`); ``profile``, the profiled pass cost alone (draft lengths that do not depend
#: on timing).
STEP_COSTS = ("learned", "profile")

#: Batch sizes and (draft tokens, drafting rows) of the profile's pseudo-steps.
_PRIOR_BATCHES = (1, 2, 4, 8, 16)
_PRIOR_DRAFTS = ((0, 0), (1, 1), (4, 1), (4, 4))
#: The fitted terms: unit, per stepping row, switch, per draft token, per drafting row, per draft token alone.
_TERMS = 6
#: Observed steps are added to the normal equations in blocks of at most this many (one matrix product a block).
_FOLD_AT = 64


@dataclass(frozen=True)
class StepCost:
    """A step's cost as the policy reads it (:func:`grammarspec.policy.allocation.allocate`), in plain 1-row steps.

    >>> c = StepCost(PassCost(), batch_share=0.1, batch=4, switch=2.0, per_token=0.01, per_draft_row=0.0)
    >>> round(c.cost(4), 2), round(c.cost(8), 2)  # the line, plus 0.1 for each of the 4 rows stepping
    (1.82, 1.94)
    """

    curve: PassCost
    batch_share: float  # host seconds of each stepping row, in the unit
    batch: int
    switch: float
    per_token: float
    per_draft_row: float

    def cost(self, rows: int) -> float:
        """A pass over ``rows`` rows of a step of ``batch`` rows, in the unit.  Pure."""
        return self.curve.cost(rows) + self.batch_share * self.batch

    def __call__(self, rows: int) -> float:
        return self.cost(rows)


def _mean_var(sums: Sequence[float]) -> tuple[float, float]:
    """The mean and variance of values from their (faded) count (above 0), sum and sum of squares.  Pure.

    >>> _mean_var([2.0, 6.0, 20.0])
    (3.0, 1.0)
    """
    count, total, squares = sums
    mean = total / count
    return mean, max(squares / count - mean * mean, 0.0)


def priced_rows(tokens: Sequence[int], packed: bool) -> int:
    """The rows a forward over rows feeding ``tokens[r]`` tokens computes, as the policy prices them: every
    token on the packed path (batch 2 or more), else every row at the widest row's width.  Pure.

    >>> priced_rows([1, 3, 1], packed=True), priced_rows([1, 3, 1], packed=False), priced_rows([4], packed=True)
    (5, 9, 4)
    """
    if packed and len(tokens) > 1:
        return sum(tokens)
    return len(tokens) * max(tokens, default=0)


class StepCostLearner:
    """The step cost of one loop (or one server, across its loops), learned from its measured steps.

    ``profile``: the target's profiled :class:`~proposers.cost.PassCost`
    (:func:`grammarspec.drafting.cost_model.batch_cost_model`), or a function giving it
    (called when first needed); its curve prices the
    forward's rows and its terms, as ratios to the unit, are the prior.
    Until ``warmup`` steps are measured :meth:`cost` is the profile's.  The fit is solved when read, and
    :meth:`cost` solves it again only once ``refit_every`` steps came in since (a constrained least-squares
    solve is a few small matrix solves; a busy loop's every step observes, and the fit fades over about
    ``1 / (1 - decay)`` steps, so a fit a few steps old prices the same).  ``clock``: what the loop
    times the steps it teaches by (:func:`grammarspec.engine.decoding.decode_batch` reads it; the learner itself reads
    no clock, it is handed seconds).  ``observe`` changes state;
    ``cost`` and ``terms`` change only that cache of the fit.

    >>> learner = StepCostLearner(PassCost(switch=0.1), warmup=2)
    >>> for _ in range(60):  # plain steps of 4 rows at 10 ms a unit; drafted ones cost 5 units more
    ...     learner.observe(rows=4, batch=4, tokens=0, drafting=0, seconds=0.01 * PassCost().cost(4))
    ...     learner.observe(rows=6, batch=4, tokens=2, drafting=1, seconds=0.01 * (PassCost().cost(6) + 5))
    >>> c = learner.cost(4)  # what the drafted step costs beyond the plain one: 5.06 measured, 0.16 profiled
    >>> round(float(c.cost(6) + c.switch + 2 * c.per_token - c.cost(4)), 1)
    5.0
    """

    def __init__(
        self,
        profile: PassCost | Callable[[], PassCost],
        *,
        prior_weight: float = 1.0,
        decay: float = 0.99,
        warmup: int = 8,
        probe_every: int = 50,
        explore_every: int = 16,
        explore_most: int = 256,
        min_outcomes: float = 8.0,
        refusals: float = 8.0,
        refit_every: int = 8,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if prior_weight <= 0 or not 0 < decay <= 1 or warmup < 1 or probe_every < 1:
            raise ValueError("StepCostLearner needs prior_weight > 0, 0 < decay <= 1, warmup >= 1 and probe_every >= 1")
        if refit_every < 1:
            raise ValueError(f"StepCostLearner needs refit_every >= 1 steps, got {refit_every}")
        if explore_every < 1 or explore_most < explore_every or min_outcomes <= 0 or refusals < 1:
            raise ValueError(
                "StepCostLearner needs 1 <= explore_every <= explore_most, min_outcomes > 0 and refusals >= 1"
            )
        self._profile, self.prior_weight, self.decay, self.warmup = profile, prior_weight, decay, warmup
        self.probe_every, self.explore_every, self.min_outcomes = probe_every, explore_every, min_outcomes
        self.explore_most, self.refusals = explore_most, refusals
        self.refit_every = refit_every
        #: what the loop times the steps it teaches by (seconds; tests give a fake clock)
        self.clock = clock
        self.holds = 0  # steps held plain: drafted steps showed no gain, or the policy cut what rows offered
        #: (batch size, kind of rows) -> [steps, sum of rates, sum of squared rates] of plain steps, then of drafted
        #: ones (a step's rate: the tokens it committed a second; each sum faded by ``decay`` as its kind comes in),
        #: then the steps whose offered drafts were all cut (faded by ``decay`` as steps that offered drafts come in:
        #: cut ones and drafted ones; a step that offered none, a held one, says nothing about what drafts get)
        self._outcomes: dict[tuple[int, str], list[float]] = {}
        #: (batch size, kind of rows) held -> the held steps before its next exploring step (doubled after each
        #: one, up to ``explore_most``), and the steps held since its last
        self._held: dict[tuple[int, str], Backoff] = {}
        self._held_steps: dict[tuple[int, str], int] = {}
        self.steps = 0  # steps observed
        self.probes = 0  # plain steps asked for (wants_plain_step)
        self._since_plain = 0  # steps observed since the last one that verified no draft
        self._plain_seen = False  # whether any observed step verified no draft
        self._xtx = np.zeros((_TERMS, _TERMS))
        self._xty = np.zeros(_TERMS)
        self._prior: np.ndarray | None = None  # the profile's pseudo-steps, once the profile is known
        self._theta: np.ndarray | None = None  # u, h, s, p, q, a in seconds; None until first solved
        self._unfitted = 0  # steps observed since the fit was last solved
        self._unfolded: list[tuple[int, int, int, int, bool, float]] = []  # observed, not yet in _xtx / _xty

    @property
    def profile(self) -> PassCost:
        """The profiled cost (a factory given to the constructor is called once, at first need)."""
        if not isinstance(self._profile, PassCost):
            self._profile = self._profile()
        return self._profile

    def observe(
        self,
        *,
        rows: int,
        batch: int,
        tokens: int,
        drafting: int,
        seconds: float,
        packed: bool = True,
        committed: int | None = None,
        kind: str = "",
        refused: bool = False,
    ) -> None:
        """Learn from one measured step: ``rows`` computed (:func:`priced_rows`), ``batch`` rows stepping (of
        ``kind``, as :meth:`drafting_pays` is asked),
        ``tokens`` draft tokens verified on ``drafting`` rows, ``packed`` whether a drafted pass packs its rows;
        ``seconds`` the whole step; ``committed`` the tokens it committed (the rows' own and the accepted
        drafts; ``None``: no outcome kept, as for a step that also read a prompt, whose time is not a decoding
        step's); ``refused``: rows offered drafts and the policy cut every one.  Changes state."""
        if batch < 1 or rows < 1 or not seconds > 0:
            return
        if committed is not None:
            outcome = self._outcomes.setdefault((batch, kind), [0.0] * 7)
            at, rate = (3 if tokens > 0 else 0), committed / seconds
            for i, value in enumerate((1.0, rate, rate * rate)):
                outcome[at + i] = outcome[at + i] * self.decay + value
            if tokens > 0 or refused:  # only steps that offered drafts say what drafts get
                outcome[6] = outcome[6] * self.decay + (0.0 if tokens > 0 else 1.0)
        self.steps += 1
        self._since_plain = self._since_plain + 1 if tokens > 0 else 0
        self._plain_seen = self._plain_seen or tokens <= 0
        self._unfolded.append((rows, batch, tokens, drafting, packed, seconds))
        if len(self._unfolded) >= _FOLD_AT:
            self._fold()
        self._unfitted += 1

    def wants_plain_step(self) -> bool:
        """Whether the next step should verify no draft (a probe): ``probe_every`` steps in a row drafted (or,
        before any plain step was seen, the ``warmup`` steps).

        Without plain steps a fit cannot tell the unit from the drafted
        terms (every step pays both), and a server whose every step drafts
        would never learn that drafting costs more than it brings.  A probe
        costs at most one step's drafts in ``probe_every``.  Changes state
        (counts the probe) when it answers yes.
        """
        limit = self.probe_every if self._plain_seen else self.warmup
        if self.steps < self.warmup or self._since_plain < limit:
            return False
        self.probes += 1
        self._since_plain = 0
        return True

    def drafting_pays(self, batch: int, kind: str = "") -> bool:
        """Whether a step of ``batch`` rows of ``kind`` may draft: no, once both plain and drafted steps of that
        size and kind number ``min_outcomes`` (faded), unless the drafted steps' mean tokens a second beat the
        plain steps' by more than the standard error of that difference (a gain shown, not a tie: drafting
        that only breaks even still pays for the host work, the joins it moves and the noise around it); no
        either, while drafted steps are too few to judge, once the steps whose offered drafts the policy cut
        number ``min_outcomes`` and ``refusals`` times the drafted ones (the policy itself says drafts do not
        pay there); except an exploring step: the first after ``explore_every`` held steps, each later one
        after twice the held steps of the one before, up to ``explore_most``.  A size whose record is too thin
        to judge either way takes the verdict of the nearest size of the same kind whose record can (the larger
        on a tie): sizes the loop seldom steps at, such as a batch draining at the end of a run, or that never
        teach (steps that also read prompts), would otherwise draft on hope; its held steps explore on its own
        schedule, so its own record still forms.  Changes state (counts the holds)."""
        key = (batch, kind)
        judge = key if self._judges(key) else self._nearest_judge(batch, kind)
        if judge is None:
            return True
        outcome = self._outcomes[judge]
        if outcome[3] < self.min_outcomes:  # judged by the refusals alone
            if outcome[6] < self.refusals * outcome[3]:
                return True
            return self._hold(key)
        (plain, plain_var), (drafted, drafted_var) = _mean_var(outcome[:3]), _mean_var(outcome[3:6])
        if drafted - plain > math.sqrt(plain_var / outcome[0] + drafted_var / outcome[3]):
            self._held.pop(key, None)
            self._held_steps.pop(key, None)
            return True
        return self._hold(key)

    def _judges(self, key: tuple[int, str]) -> bool:
        """Whether the record of ``key`` can judge drafting there: plain and drafted steps both number
        ``min_outcomes``, or drafted ones fewer and the steps whose drafts were all cut that many.  Pure."""
        outcome = self._outcomes.get(key)
        if outcome is None:
            return False
        if outcome[3] < self.min_outcomes:
            return outcome[6] >= self.min_outcomes
        return outcome[0] >= self.min_outcomes

    def _nearest_judge(self, batch: int, kind: str) -> tuple[int, str] | None:
        """The key of the nearest batch size of ``kind`` (the larger on a tie) whose record judges, or ``None``.
        Pure."""
        sizes = [size for size, of in self._outcomes if of == kind and size != batch and self._judges((size, of))]
        if not sizes:
            return None
        return min(sizes, key=lambda size: (abs(size - batch), -size)), kind

    def _hold(self, key: tuple[int, str]) -> bool:
        """A held step (False), or the exploring step its schedule is due (True).  Changes state."""
        schedule = self._held.setdefault(key, Backoff(self.explore_every, self.explore_most))
        self._held_steps[key] = self._held_steps.get(key, 0) + 1
        if self._held_steps[key] >= schedule.wait:
            self._held_steps[key] = 0
            schedule.failed()  # still held: the next exploring step waits twice as long
            return True
        self.holds += 1
        return False

    def outcomes(self) -> dict[tuple[int, str], dict[str, float | None]]:
        """Per batch size and kind of rows: the mean tokens a second of plain and drafted steps (``None`` without
        any), the faded counts of each and of the steps whose offered drafts were all cut.  Pure."""
        out = {}
        for key, outcome in sorted(self._outcomes.items()):
            plain = _mean_var(outcome[:3])[0] if outcome[0] else None
            drafted = _mean_var(outcome[3:6])[0] if outcome[3] else None
            out[key] = {
                "plain": plain,
                "drafted": drafted,
                "plain_steps": outcome[0],
                "drafted_steps": outcome[3],
                "refused_steps": outcome[6],
            }
        return out

    def cost(self, batch: int) -> PassCost | StepCost:
        """The cost the policy reads for a step of ``batch`` rows: the profile until ``warmup`` steps are in.
        Solves the fit when it is ``refit_every`` steps old (or was never solved)."""
        theta = self._fit(self.refit_every)
        if theta is None:
            return self.profile
        u, h, s, p, q, a = theta
        return StepCost(self.profile, h / u, batch, s / u, (a if batch <= 1 else p) / u, q / u)

    def terms(self) -> dict[str, Any]:
        """The fitted terms in the unit (``unit_ms``: the unit's milliseconds), beside the profile's, as of the
        last step observed."""
        prior = {"switch": self.profile.switch, "per_token": self.profile.per_token}
        prior["per_draft_row"] = self.profile.per_draft_row
        theta = self._fit(1)
        if theta is None:
            return {"steps": self.steps, "learned": False, "holds": self.holds, "profile": prior}
        u, h, s, p, q, a = (float(v) for v in theta)
        fitted = {"unit_ms": 1000 * u, "per_batch_row": h / u, "switch": s / u, "per_token": p / u}
        fitted |= {"per_draft_row": q / u, "per_token_alone": a / u}
        out = {"steps": self.steps, "probes": self.probes, "holds": self.holds, "learned": True, **fitted}
        return out | {"profile": prior}

    # --- the fit ---------------------------------------------------------------------------------

    def _fit(self, stale: int) -> np.ndarray | None:
        """The fitted terms (``None`` before ``warmup`` steps), solved again if ``stale`` steps came in since."""
        if self.steps < self.warmup:
            return None
        if self._theta is None or self._unfitted >= stale:
            self._fold()
            self._solve()
            self._unfitted = 0
        return self._theta

    def _features(self, rows: int, batch: int, tokens: int, drafting: int, packed: bool) -> np.ndarray:
        switched = 1.0 if tokens > 0 and batch > 1 else 0.0
        spread = float(max(0, drafting - 1)) if packed and batch > 1 and tokens > 0 else 0.0
        tokens = max(tokens, 0)
        together, alone = (float(tokens), 0.0) if batch > 1 else (0.0, float(tokens))
        return np.array([self.profile.cost(rows), float(batch), switched, together, spread, alone])

    def _prior_rows(self, weight: float) -> np.ndarray:
        """The profile's pseudo-steps as rows of the normal equations, ``weight`` in all.

        Each says: this step costs what the profile prices it at, in the
        unit ``u`` whatever ``u`` is (``x . theta = u * price(x)``, a
        homogeneous row ``x - price(x) * e_u``), so the prior holds the terms'
        ratios to the unit and the measured steps alone set the seconds.
        """
        profile = self.profile
        relative = np.array([1.0, 0.0, profile.switch, profile.per_token, profile.per_draft_row, profile.per_token])
        points = []
        for batch in _PRIOR_BATCHES:
            for tokens, drafting in _PRIOR_DRAFTS:
                if drafting > batch:
                    continue
                x = self._features(batch + tokens, batch, tokens, drafting, True)
                x[0] -= float(x @ relative)  # x . theta - u * price(x)
                points.append(x / np.linalg.norm(x))  # each pseudo-step weighs alike, whatever its size
        z = np.array(points)
        return weight / len(points) * z.T @ z

    def _fold(self) -> None:
        """Add the steps observed since the last fold to the normal equations, each faded as if added in turn
        (the oldest by ``decay`` once per later step).  Changes state."""
        if not self._unfolded:
            return
        x = np.array([self._features(*step[:5]) for step in self._unfolded])  # [n, terms]
        y = np.array([step[5] for step in self._unfolded])
        n = len(self._unfolded)
        weights = self.decay ** np.arange(n - 1, -1, -1, dtype=float)  # the newest weighs 1
        fade = self.decay**n
        self._xtx = self._xtx * fade + (x * weights[:, None]).T @ x
        self._xty = self._xty * fade + (weights * y) @ x
        self._unfolded = []

    def _solve(self) -> None:
        """Least squares with every term but the unit at 0 or above: a term the unconstrained fit puts below 0
        is held at 0 and the rest fitted again (at most once per term)."""
        if self._prior is None:
            self._prior = self._prior_rows(self.prior_weight)
        a, b = self._prior + self._xtx, self._xty
        free = list(range(_TERMS))
        while True:
            theta = np.zeros(_TERMS)
            theta[free] = np.linalg.lstsq(a[np.ix_(free, free)], b[free], rcond=None)[0]
            negative = [i for i in free[1:] if theta[i] < 0]
            if not negative:
                break
            free.remove(min(negative, key=lambda i: theta[i]))
        theta[0] = max(float(theta[0]), 1e-12)
        self._theta = theta
