"""What the decoding loop is handed to price its passes: the target's pass cost, and a check of it.

The loop (:mod:`grammarspec.engine`) never measures a cost itself.  Its
owner -- ``generate`` and :class:`grammarspec.Conversation`
(:mod:`grammarspec.api`), the server (:mod:`grammarspec.serve.engine`) --
hands it a :class:`PassCostSource`: the profiled one of
:class:`grammarspec.drafting.cost_model.ProfiledCost`, or a fixed curve
(:class:`FixedCost`).  The loop asks it for the :class:`~proposers.cost.PassCost`
only where a step is priced (a row offers drafts, a prompt joins a busy batch,
a proposer sizes its choices by it), so a call that never drafts never
profiles; and, before a call whose rows draft on it, for a :class:`PassCheck`
that reads the passes the call times.  Pure: types and a fixed curve, no
clocks, no disk, no model runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from proposers.cost import PassCost

__all__ = ["Clock", "FixedCost", "PassCheck", "PassCostSource", "prior_cost"]

#: Seconds from an arbitrary start, never falling (``time.perf_counter``; tests give a fake one).
Clock = Callable[[], float]


def prior_cost() -> PassCost:
    """The CPU prior the loop prices passes by where nothing is measured (``GRAMMARSPEC_PASS_COST=prior``): draft
    lengths that never depend on the machine.  A new one each call.  Pure.

    >>> prior_cost().cost(1), round(prior_cost().cost(2), 2)
    (1.0, 1.42)
    """
    return PassCost(prior_weight=8.0)


class PassCheck(Protocol):
    """Reads the passes a loop timed against the cost it drafts by (a lone row's, as a profile times one)."""

    def observe(self, rows: int, seconds: float) -> None:
        """One timed pass of a lone row: ``rows`` rows (its pending tokens and draft), ``seconds`` its forward and
        verification.  May change state."""
        ...


class PassCostSource(Protocol):
    """The target's pass cost as one decoding call reads it: one curve for the whole call."""

    def cost(self) -> PassCost:
        """The pass cost model (the same object within a call; it may be measured at first use)."""
        ...

    def checked(self, clock: Clock) -> PassCheck | None:
        """Before a call whose rows draft on :meth:`cost`: the cost ready for the whole call, and the check of it
        against the passes this call times by ``clock`` (``None``: nothing to check)."""
        ...


@dataclass(frozen=True)
class FixedCost:
    """A pass cost that is what it is: nothing measured, nothing checked (the prior by default).

    >>> source = FixedCost()
    >>> source.cost() is source.cost(), source.checked(lambda: 0.0)
    (True, None)
    """

    pass_cost: PassCost = field(default_factory=prior_cost)

    def cost(self) -> PassCost:
        return self.pass_cost

    def checked(self, clock: Clock) -> PassCheck | None:
        return None
