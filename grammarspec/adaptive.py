"""One request's part in the drafting policy: how much to ask its proposer for, and its calibration.

The draft length itself is not decided here: every step, one allocation over
the whole batch (:func:`grammarspec.policy.allocate`, the rule and a worked
example in :mod:`grammarspec.policy`) cuts each row's draft to what pays at
the current batch, from the pass cost model and each row's calibrated
estimates.  A row may get no draft tokens; that replaces the old on/off switch.

This holder keeps, per request:

* the cap ``k_max`` and what to ask the proposer for::

      ask = k_max                                   cheap drafters (k_min = k_max)
      ask = clamp(last_allocation + 1, k_min, k_max)  otherwise (a draft model pays per token)

  so a drafter whose every token costs a model pass is asked for one token
  more than the policy last admitted, and grows by one a step while the
  policy keeps admitting all of it;
* the :class:`grammarspec.policy.Calibration` of its drafts' survival.

``adaptive=False`` fixes the draft length at ``k_max``: the row's drafts are
verified whole (the allocation takes them as forced).  Pure Python, no clocks.
"""

from __future__ import annotations

from proposers.base import Draft

from .policy import Calibration

__all__ = ["AdaptiveController"]


class AdaptiveController:
    """Per-request cap, ask and calibration for the batch drafting policy.

    >>> c = AdaptiveController(k_min=1, k_max=8)
    >>> c.ask()  # nothing admitted yet: one more than that
    1
    >>> c.allocated(1); c.ask()
    2
    >>> c.allocated(0); c.k, c.speculate, c.ask()
    (0, False, 1)

    ``allocated`` and ``record`` change state; ``ask`` and ``estimates`` do not.
    """

    def __init__(
        self, k_min: int = 1, k_max: int = 16, *, adaptive: bool = True, calibration: Calibration | None = None
    ) -> None:
        if not 1 <= k_min <= k_max:
            raise ValueError(f"need 1 <= k_min <= k_max, got k_min={k_min}, k_max={k_max}")
        self.k_min, self.k_max, self.adaptive = k_min, k_max, adaptive
        #: Draft tokens the policy admitted last step (``k_max`` before the first).
        self.k: int = k_max if not adaptive else 0
        #: Whether the last step verified any draft token of this row.
        self.speculate: bool = True
        #: The survival records; ``calibration=``: ones carried over (a conversation's earlier turns), updated in place.
        self.calibration = calibration if calibration is not None else Calibration()
        self.speculative_steps = 0
        self.plain_steps = 0

    def ask(self) -> int:
        """How many tokens to ask the proposer for this step.  Does not change state."""
        if not self.adaptive:
            return self.k_max
        return min(max(self.k + 1, self.k_min), self.k_max)

    def estimates(self, draft: Draft) -> list[float]:
        """Calibrated chance, per token of ``draft``, that it survives given the ones before did."""
        return self.calibration.estimate(draft)

    def allocated(self, k: int) -> None:
        """The policy admitted ``k`` draft tokens of this row this step.  Changes state."""
        self.k, self.speculate = k, k > 0

    def record(self, draft: Draft, num_accepted: int) -> None:
        """A verified step: ``draft`` reached the target, ``num_accepted`` of it was accepted.  Changes state."""
        if len(draft):
            self.speculative_steps += 1
            self.calibration.update(draft, num_accepted)
        else:
            self.plain_steps += 1

    def __repr__(self) -> str:
        return f"AdaptiveController(k={self.k}, k_max={self.k_max}, adaptive={self.adaptive})"
