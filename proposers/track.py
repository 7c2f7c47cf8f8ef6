"""How a request's drafts have been doing: the one online acceptance estimator, and the hold-back schedule.

:class:`Calibration` records what draft tokens survived verification, by
source, and turns a proposer's estimates into survival probabilities.  The
drafting policy (:mod:`grammarspec.policy.allocation`) keeps one per request and sizes
every step's drafts from it; :class:`proposers.compose.CompositeProposer`
keeps one per follower and kind of draft to choose among its followers'
drafts and to hold back a draft not worth a pass of its own.
:class:`HoldBack` lets such a held-back draft through now and then, so its
record can recover.  Pure Python, no clocks.
"""

from __future__ import annotations

from collections.abc import Sequence

from .backoff import Backoff
from .base import Draft

__all__ = ["Calibration", "HoldBack", "survival"]


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


class Calibration:
    """What a request's draft tokens survived, by source: turns a proposer's estimates into probabilities.

    A token is filed under ``(source, opens, bin)``: the proposer that drafted
    it, whether it opens that proposer's run in the draft (a new guess, right
    or wrong as a whole; the tokens after it mostly follow), and the bin of
    its own ``Draft.confidence`` (``None`` or negative: no estimate, bin -1).  Each
    record starts from ``prior_weight`` pseudo-observations at the proposer's
    estimate (``default_open`` / ``default_follow`` without one) and counts
    the tokens that reached verification (every token up to the first
    rejected one); with each one, older counts fade by ``decay`` and the
    prior by ``prior_fade``, so a record rests on evidence as soon as it has
    some: a source that never survives goes to 0 within a few observations,
    not to the prior's share.

    Acceptance starts from evidence, not hope: without an estimate a new guess
    is expected to survive ``default_open`` = 0.2 of the time, so a row drafts
    where even that pays (a flat GPU curve, a cheap batch) and stays plain
    where it does not, until its own record says otherwise.  A row that
    drafts nothing still gathers evidence: its controller judges the first
    token it was offered against the target's own choice
    (:meth:`grammarspec.policy.adaptive.AdaptiveController.record`).  Evidence from
    other requests of the same kind of traffic starts a request through
    :meth:`seeded_from`; :meth:`absorb` gathers it.

    >>> c = Calibration()
    >>> d = Draft(tokens=(1, 2, 3), sources=("lookup",) * 3)
    >>> [round(x, 2) for x in c.estimate(d)]
    [0.2, 0.8, 0.8]
    >>> for _ in range(20):
    ...     c.update(d, 3)  # every token accepted
    >>> round(c.estimate(d)[0], 2), round(c.expected(d), 2)
    (1.0, 3.0)

    ``update`` and ``absorb`` change state; ``estimate``, ``expected`` and ``seeded_from`` do not.
    """

    def __init__(
        self,
        *,
        prior_weight: float = 2.0,
        decay: float = 0.97,
        bins: int = 8,
        default_open: float = 0.2,
        default_follow: float = 0.8,
        prior_fade: float = 0.5,
    ) -> None:
        if prior_weight <= 0 or not 0 < decay <= 1 or not 0 < prior_fade <= 1 or bins < 1:
            raise ValueError("Calibration needs prior_weight > 0, 0 < decay <= 1, 0 < prior_fade <= 1 and bins >= 1")
        if not (0.0 <= default_open <= 1.0 and 0.0 <= default_follow <= 1.0):
            raise ValueError("Calibration needs default_open and default_follow between 0 and 1")
        self.prior_weight, self.decay, self.bins = prior_weight, decay, bins
        self.default_open, self.default_follow, self.prior_fade = default_open, default_follow, prior_fade
        self._counts: dict[tuple[str, bool, int], list[float]] = {}  # key -> [survived, seen]: this request's own
        self._seed: dict[tuple[str, bool, int], list[float]] = {}  # the same, carried from other requests
        self._prior: dict[tuple[str, bool, int], float] = {}  # key -> what is left of prior_weight (absent: all)
        self._audit = [0.0, 0.0]  # [survived, expected] of the tokens a policy chose by these estimates, faded

    @classmethod
    def seeded_from(cls, recent: Calibration, weight: float = 8.0) -> Calibration:
        """A new request's record that starts from ``recent``'s evidence, at most ``weight`` observations a key.

        ``recent``: what requests of the same kind of traffic survived (a
        server keeps one per kind, gathered with :meth:`absorb`).  Each of its
        records is scaled down to at most ``weight`` observations, so the new
        request's own evidence soon outweighs it; the seed fades like the
        request's own counts and is never passed on by :meth:`absorb`.  Same
        settings as ``recent``.  Does not change ``recent``.

        >>> recent = Calibration()
        >>> d = Draft(tokens=(1,), sources=("lookup",))
        >>> for _ in range(40):
        ...     recent.update(d, 0)  # this kind of traffic never keeps a lookup
        >>> fresh = Calibration.seeded_from(recent)
        >>> round(Calibration().estimate(d)[0], 2), round(fresh.estimate(d)[0], 2)
        (0.2, 0.0)
        """
        if weight <= 0:
            raise ValueError(f"seeded_from needs weight > 0, got {weight}")
        out = cls(
            prior_weight=recent.prior_weight,
            decay=recent.decay,
            bins=recent.bins,
            default_open=recent.default_open,
            default_follow=recent.default_follow,
            prior_fade=recent.prior_fade,
        )
        for key, (survived, seen) in recent._evidence().items():
            scale = min(1.0, weight / seen) if seen > 0 else 0.0
            out._seed[key] = [survived * scale, seen * scale]
            out._prior[key] = out.prior_weight * out.prior_fade ** (seen * scale)  # as after that many observations
        survived, expected = recent._audit
        scale = min(1.0, weight / expected) if expected > 0 else 0.0
        out._audit = [survived * scale, expected * scale]
        return out

    def absorb(self, other: Calibration) -> None:
        """Add ``other``'s own evidence (not its seed), as if observed after this record's.  Changes state.

        Each record here first fades by ``decay`` once per observation
        ``other`` made of that key, so a record gathered over many requests
        follows the recent ones.
        """
        for key, (survived, seen) in other._counts.items():
            counts = self._counts.setdefault(key, [0.0, 0.0])
            fade = self.decay**seen
            counts[0], counts[1] = counts[0] * fade + survived, counts[1] * fade + seen
        survived, expected = other._audit
        fade = self.decay**expected
        self._audit = [self._audit[0] * fade + survived, self._audit[1] * fade + expected]

    def _evidence(self) -> dict[tuple[str, bool, int], list[float]]:
        """Own counts plus the seed, per key."""
        out = {key: list(counts) for key, counts in self._seed.items()}
        for key, (survived, seen) in self._counts.items():
            counts = out.setdefault(key, [0.0, 0.0])
            counts[0] += survived
            counts[1] += seen
        return out

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
            seed_survived, seed_seen = self._seed.get(key, (0.0, 0.0))
            weight = self._prior.get(key, self.prior_weight)
            out.append((survived + seed_survived + weight * prior) / (seen + seed_seen + weight))
        return out

    def expected(self, draft: Draft) -> float:
        """Expected accepted tokens of ``draft`` verified whole: its survivals summed.  Does not change state."""
        return sum(survival(self.estimate(draft)))

    def audit(self, estimate: float, survived: bool) -> None:
        """A policy admitted a draft by these estimates: the first token it chose (past any forced ones) was
        estimated to survive with ``estimate`` and ``survived`` or not.  Changes state.

        A policy that admits the drafts whose estimates look best among many
        admits, on average, ones whose estimates are too high (the winner's
        curse: every estimate is noisy, and the noise that raised it got it
        chosen), even where each record is calibrated over all tokens.
        :meth:`bias` says by how much.  One observation per draft, whatever
        its length: the tokens after the first mostly stand or fall with it,
        so a long confident draft that fails at once is one wrong guess.
        Weighed by its length, one such draft would pull a row's bias near
        0.2, and a row that then drafts nothing is never audited again, so
        it would stay there for the rest of the request.
        """
        if not 0.0 <= estimate <= 1.0:
            raise ValueError(f"audit needs an estimate between 0 and 1, got {estimate}")
        survived_sum, expected_sum = self._audit
        self._audit = [survived_sum * self.decay + float(survived), expected_sum * self.decay + estimate]

    def bias(self) -> float:
        """Survived against expected, over the first tokens a policy chose by these estimates (:meth:`audit`),
        with ``prior_weight`` drafts that survived as expected: 1.0 before any audit.  Does not change state.

        >>> c = Calibration()
        >>> for _ in range(30):
        ...     c.audit(estimate=0.8, survived=False)  # the chosen first tokens never survive
        >>> c.bias() < 0.3, Calibration().bias()
        (True, 1.0)
        >>> c = Calibration()
        >>> c.audit(estimate=0.95, survived=False)  # one confident wrong guess
        >>> round(c.bias(), 2)
        0.68
        """
        survived, expected = self._audit
        return (survived + self.prior_weight) / (expected + self.prior_weight)

    def update(self, draft: Draft, num_accepted: int) -> None:
        """``draft`` was verified and its first ``num_accepted`` tokens accepted.  Changes state."""
        if not 0 <= num_accepted <= len(draft):
            raise ValueError(f"num_accepted ({num_accepted}) must be between 0 and the draft's {len(draft)} tokens")
        for j, (key, _) in enumerate(self._keys(draft)[: num_accepted + 1]):
            counts = self._counts.setdefault(key, [0.0, 0.0])
            counts[0] = counts[0] * self.decay + float(j < num_accepted)
            counts[1] = counts[1] * self.decay + 1.0
            self._prior[key] = self._prior.get(key, self.prior_weight) * self.prior_fade
            seed = self._seed.get(key)
            if seed is not None:
                seed[0], seed[1] = seed[0] * self.decay, seed[1] * self.decay


class HoldBack:
    """When a draft below the bar is verified anyway: after ``wait`` held back; a failed probe doubles the wait
    (:class:`proposers.backoff.Backoff`, up to ``max_wait``), an accepted one starts it again.

    >>> h = HoldBack(wait=2, max_wait=8)
    >>> [h.admit() for _ in range(3)]
    [False, False, True]
    >>> h.verified(accepted=False); h.wait
    4
    >>> h.verified(accepted=True); h.wait  # not a probe: the wait stays
    4

    ``admit`` and ``verified`` change state.
    """

    def __init__(self, wait: int = 4, max_wait: int = 64) -> None:
        if not 0 <= wait <= max_wait:
            raise ValueError(f"HoldBack needs 0 <= wait <= max_wait, got wait={wait}, max_wait={max_wait}")
        self._backoff = Backoff(wait, max_wait)
        self.skipped = 0  # drafts held back since the last one verified
        self._probing = False

    @property
    def wait(self) -> int:
        """Drafts held back before the next probe."""
        return self._backoff.wait

    def admit(self) -> bool:
        """Whether a draft below the bar goes through now as a probe (counts one held back if not)."""
        if self.skipped >= self.wait:
            self._probing = True
            return True
        self.skipped += 1
        return False

    def verified(self, accepted: bool) -> None:
        """A draft of this record reached the target; ``accepted``: any of its tokens was accepted."""
        if self._probing:
            if accepted:
                self._backoff.succeeded()
            else:
                self._backoff.failed()
            self._probing = False
        self.skipped = 0
