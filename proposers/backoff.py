"""The one doubling back-off: a wait that doubles after each failure, up to a ceiling, and starts again after a success.

Three schedules wait this way: :class:`proposers.track.HoldBack` (how many
held-back drafts before one goes through as a probe), the drafting
controller's rest (:class:`grammarspec.policy.adaptive.AdaptiveController`:
steps without asking the proposer after a draft cut to nothing) and the step
cost learner's exploring steps (:class:`grammarspec.policy.step_cost.StepCostLearner`:
held steps before one drafts anyway).  Each counts its own steps; the wait
they count to is this.  Pure Python, no clocks, imports nothing.
"""

from __future__ import annotations

__all__ = ["Backoff"]


class Backoff:
    """A wait of ``first`` (at most ``most``), doubled by :meth:`failed` up to ``most``, back to ``first`` by
    :meth:`succeeded`.

    >>> b = Backoff(1, 8)
    >>> waits = []
    >>> for _ in range(5):
    ...     b.failed()
    ...     waits.append(b.wait)
    >>> waits
    [2, 4, 8, 8, 8]
    >>> b.succeeded(); b.wait
    1
    >>> b.start_at(20); b.wait  # a wait carried from elsewhere, kept within the ceiling
    8
    >>> z = Backoff(0, 0); z.failed(); z.wait  # a ceiling of 0: never waits
    0

    ``failed``, ``succeeded`` and ``start_at`` change state.
    """

    __slots__ = ("first", "most", "wait")

    def __init__(self, first: int, most: int) -> None:
        if not 0 <= first <= most:
            raise ValueError(f"Backoff needs 0 <= first <= most, got first={first}, most={most}")
        self.first, self.most, self.wait = first, most, first

    def failed(self) -> None:
        """The wait ended in a failure: the next one is twice as long, at most ``most``."""
        self.wait = min(2 * self.wait, self.most)

    def succeeded(self) -> None:
        """A success: the next wait is ``first`` again."""
        self.wait = self.first

    def start_at(self, wait: int) -> None:
        """Take ``wait`` as the wait now (at most ``most``), as if failures had doubled it there."""
        self.wait = min(max(wait, 0), self.most)

    def __repr__(self) -> str:
        return f"Backoff(wait={self.wait}, first={self.first}, most={self.most})"
