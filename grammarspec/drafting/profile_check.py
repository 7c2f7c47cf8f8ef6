"""Whether a pass-cost profile still describes this machine: its curve checked against the passes the loop times.

A profile (:mod:`grammarspec.drafting.pass_profile`) is measured once and kept on
disk; measured while the machine was busy, it prices wide passes several
times too high (or everything too slow) for as long as it is kept.  The
decoding loop times every step's forward and verification, which is what
the profile's curve prices: a lone row's pass of ``n`` rows (its pending
tokens and its draft) is predicted to take ``t[n] = unit * cost(n) - h``
seconds (:meth:`Measured.predicted_pass_seconds`).  A :class:`ProfileCheck`
keeps the ratio of each timed pass to that prediction, the last ``window``
of them in each bin of rows by powers of two (1, 2-3, 4-7, 8-15, ...), and
once a bin holds ``steps`` of them compares the bins' medians:

* the shape: the largest bin's median over the smallest's beyond
  ``tolerance``.  The drafting policy reads only the curve's ratios between
  widths; load that is there now slows every width about alike and cancels
  in this ratio, while a profile that a burst of load hit on some widths
  does not;
* the level: every bin's median below ``1 / tolerance``, every pass that
  many times faster than profiled: the profile was measured while something
  else ran (another process only ever slows a pass, so passes slower than
  profiled across the board are a busy machine now and say nothing against
  the curve).  Where the policy never drafts (a busy profile can price every
  draft out), the 1-row bin is all the loop sees, and this is the test that
  can fail.

Medians of ratios, over a window that moves: the odd slow step (a page
fault, another process's burst) moves no median, and a change of load ages
out.  The default tolerance, a factor of 2, is far above the step-to-step
noise of a median of ``steps`` passes and far below the errors of a profile
measured busy (a 12-row pass priced at 7 plain steps that costs 1.35).

Only a lone row's steps are checked (a batch's rows are ragged, which the
one-sequence passes of the profile do not time), and only where the loop
prices drafts by the profile alone (``generate``, :class:`grammarspec.Conversation`;
a server learns its step cost from its steps, :mod:`grammarspec.policy.step_cost`).
What happens on a disagreement is the owner's (:func:`grammarspec.drafting.cost_model.checked_cost_model`:
a notice, and the profile measured again before the next call).  Pure
Python, no clocks: the loop times the passes.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable

from grammarspec.drafting.pass_profile import Measured

__all__ = ["ProfileCheck"]


class ProfileCheck:
    """A profile's predictions against the passes a loop timed (the module's rule).

    ``on_disagree(reason)`` is called once, with a sentence saying what
    disagreed, the first time the check does; the check then stops
    collecting (``reason`` keeps the sentence).  ``observe`` changes state.

    >>> from proposers.cost import PassCost
    >>> measured = Measured(PassCost(1.0, 0.5, 1, table={4: 3.0}), step_seconds=0.01, overhead_seconds=0.0)
    >>> check = ProfileCheck(measured, steps=4)
    >>> for _ in range(4):  # 1-row passes as profiled; 4-row ones take 1.2 plain steps, not 3
    ...     check.observe(1, 0.01)
    ...     check.observe(4, 0.012)
    >>> check.reason
    'passes of 4-7 rows took 0.40x the profiled time, passes of 1 row 1.00x'
    """

    def __init__(
        self,
        measured: Measured,
        *,
        steps: int = 16,
        window: int = 64,
        tolerance: float = 2.0,
        on_disagree: Callable[[str], None] | None = None,
    ) -> None:
        if measured.step_seconds is None:
            raise ValueError("ProfileCheck needs a measured profile (its step_seconds), not the prior")
        if steps < 1 or window < steps or not tolerance > 1.0:
            raise ValueError(
                f"ProfileCheck needs 1 <= steps <= window and tolerance > 1; got {steps}, {window}, {tolerance}"
            )
        self.measured, self.steps, self.window, self.tolerance = measured, steps, window, tolerance
        self.on_disagree = on_disagree
        self.reason: str | None = None
        self.passes = 0  # passes observed
        self._ratios: dict[int, deque[float]] = {}  # bin (floor(log2 rows)) -> the last ratios to the prediction

    def observe(self, rows: int, seconds: float) -> None:
        """Learn from one timed pass of a lone row: ``rows`` rows (its pending tokens and draft), ``seconds`` its
        forward and verification.  Changes state (and calls ``on_disagree`` once, when the check first fails)."""
        predicted = self.measured.predicted_pass_seconds(rows)
        if self.reason is not None or rows < 1 or not seconds > 0 or not predicted or predicted <= 0:
            return
        self.passes += 1
        level = int(math.log2(rows))
        ratios = self._ratios.setdefault(level, deque(maxlen=self.window))
        ratios.append(seconds / predicted)
        if len(ratios) >= self.steps:
            self.reason = self._disagreement()
            if self.reason is not None and self.on_disagree is not None:
                self.on_disagree(self.reason)

    def medians(self) -> dict[str, float]:
        """Each bin's median ratio of timed to profiled seconds, by its rows (``"4-7"``), where the bin holds
        ``steps`` passes.  Pure."""
        return {_rows(level): median for level, median in self._medians().items()}

    def _medians(self) -> dict[int, float]:
        return {level: statistics.median(r) for level, r in sorted(self._ratios.items()) if len(r) >= self.steps}

    def _disagreement(self) -> str | None:
        """The sentence of the module's rule that fails, or ``None``.  Pure."""
        medians = self._medians()
        low, high = min(medians, key=medians.__getitem__), max(medians, key=medians.__getitem__)
        if medians[high] > self.tolerance * medians[low]:
            wide, narrow = max(low, high), min(low, high)
            return (
                f"passes of {_said(wide)} took {medians[wide]:.2f}x the profiled time, "
                f"passes of {_said(narrow)} {medians[narrow]:.2f}x"
            )
        if medians[high] * self.tolerance < 1.0:
            return f"every pass timed took at most {medians[high]:.2f}x the profiled time (passes of {_said(high)})"
        return None


def _rows(level: int) -> str:
    low, high = 1 << level, (2 << level) - 1
    return str(low) if low == high else f"{low}-{high}"


def _said(level: int) -> str:
    return "1 row" if level == 0 else f"{_rows(level)} rows"
