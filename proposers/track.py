"""How well one proposer's drafts have been doing in this request.

Acceptance of cheap drafts is bimodal: the guess is right and a long run is
accepted, or it is wrong at its first token.  A :class:`Track` therefore keeps
two averages -- how often the first token is accepted (``hit``) and how many
tokens an accepted run holds (``run``) -- and expects
``hit * min(len(draft), run)`` accepted tokens from a draft.

A draft costs a wider verification pass than a plain step
(:class:`proposers.cost.PassCost`: about 1.4-1.8 plain steps at 2-16 rows on
CPU), so a draft expected to bring fewer accepted tokens than the pass costs
beyond a plain step is not worth verifying (:meth:`Track.worth`).  When a
track's expectation falls below that,
the composite stops asking for its drafts, and lets one through every
``wait`` steps to probe; a failed probe doubles the wait, a hit resets it.
Pure Python, no clocks.
"""

from __future__ import annotations

from .cost import PassCost

__all__ = ["Track"]


class Track:
    """Per-request acceptance record of one proposer's drafts (of one kind).

    >>> t = Track()
    >>> t.expected(8)  # the prior: half the drafts hit, runs of 4
    2.0
    >>> for _ in range(6):
    ...     t.update(shown=8, accepted=0)
    >>> round(t.expected(8), 2)
    0.24
    """

    def __init__(
        self,
        *,
        hit: float = 0.5,
        run: float = 4.0,
        alpha: float = 0.3,
        wait: int = 4,
        max_wait: int = 64,
        cost: PassCost | None = None,
    ) -> None:
        self.hit, self.run, self.alpha = hit, run, alpha
        self.cost = cost if cost is not None else PassCost()
        self.first_wait, self.max_wait = wait, max_wait
        self.wait = wait
        self.skipped = 0  # drafts held back since the last one verified
        self._probing = False

    def expected(self, length: int) -> float:
        """Expected accepted tokens of a draft of ``length`` tokens."""
        return self.hit * min(float(length), self.run) if length > 0 else 0.0

    def worth(self, length: int, floor: float | None = None) -> bool:
        """Whether a draft of ``length`` tokens is expected to pay for its pass.  Does not change state.

        Its expected accepted tokens must reach ``floor``; by default what a
        pass over ``length + 1`` rows costs beyond a plain step
        (:meth:`PassCost.break_even`).

        >>> t = Track()
        >>> t.worth(8), t.worth(8, floor=2.5)
        (True, False)
        """
        threshold = self.cost.break_even(length + 1) if floor is None else floor
        return length > 0 and self.expected(length) >= threshold

    def update(self, shown: int, accepted: int) -> None:
        """A verified draft: ``shown`` tokens reached the target, ``accepted`` of them were accepted."""
        if shown <= 0:
            return
        self.hit += self.alpha * (float(accepted > 0) - self.hit)
        if accepted > 0:
            # A fully accepted draft was cut by its length, not by the target: count one more.
            self.run += self.alpha * (accepted + (accepted == shown) - self.run)
        if self._probing:
            self.wait = self.first_wait if accepted else min(2 * self.wait, self.max_wait)
            self._probing = False
        self.skipped = 0

    def admit(self) -> bool:
        """Whether a draft below the threshold may go through as a probe (counts a skip if not)."""
        if self.skipped >= self.wait:
            self._probing = True
            return True
        self.skipped += 1
        return False
