"""One request's part in the drafting policy: how much to ask its proposer for, and its calibration.

The draft length itself is not decided here: every step, one allocation over
the whole batch (:func:`grammarspec.policy.allocation.allocate`, the rule and a worked
example in :mod:`grammarspec.policy.allocation`) cuts each row's draft to what pays at
the current batch, from the pass cost model and each row's calibrated
estimates.  A row may get no draft tokens; that replaces the old on/off switch.

This holder keeps, per request:

* the cap ``k_max`` and what to ask the proposer for::

      ask = k_max                                   cheap drafters (k_min = k_max)
      ask = min(2 * last_allocation + 2, k_max)     cheap, after the policy cut the last draft inside
      ask = clamp(last_allocation + 1, k_min, k_max)  otherwise (a draft model pays per token)

  so a drafter whose every token costs a model pass is asked for one token
  more than the policy last admitted, and grows by one a step while the
  policy keeps admitting all of it.  A cheap drafter's tokens cost host time
  to plan (the pass cost's ``per_token``): where the batch's pass cost cut its
  last draft after ``n > 0`` tokens, planning ``k_max`` would mostly be thrown
  away, so it is asked for twice that and two more;
* a rest after a draft cut to nothing: the row's proposer is not asked for
  the next 1 step, then 2, 4, ... up to ``max_rest`` while its drafts keep
  being cut to nothing, and the rest starts again at 1 once any token is
  admitted (:class:`proposers.backoff.Backoff`).  Proposing, the allocation and the walk are host work that a
  draft cut whole never repays, and where the batch's cost or the row's
  estimates cut every draft (free text in a busy server) it is a few percent
  of every step.  The first token of each draft that is asked for is still
  judged (:meth:`AdaptiveController.record`), so the row's records follow
  its proposer between rests, and a row whose grammar forces text wakes
  (:meth:`AdaptiveController.wake`: the loop checks while it rests).  A
  server's new request starts from the rest the last finished request of its
  kind of traffic ended with (:attr:`AdaptiveController.rest`,
  :meth:`AdaptiveController.rest_from`): where that request's drafts were
  being cut whole, the new one first asks after that many steps;
* the :class:`grammarspec.policy.allocation.Calibration` of its drafts' survival.

``adaptive=False`` fixes the draft length at ``k_max``: the row's drafts are
verified whole (the allocation takes them as forced).  Pure Python, no clocks.
"""

from __future__ import annotations

from grammarspec.policy.allocation import Calibration, forced_lead
from proposers.backoff import Backoff
from proposers.base import Draft, Proposer, members

__all__ = ["AdaptiveController", "k_min"]


def k_min(proposer: Proposer, k_max: int) -> int:
    """The floor of what a row's proposer is asked for (:meth:`AdaptiveController.ask`).

    A drafter that runs a model pays a draft pass per token, so its ask may
    shrink to 1 and grow again one token a step.  Cheap drafters stop on their
    own when they run out of evidence, so ``k_max`` is only their cap: they are
    asked for all of it, and the batch's allocation cuts what does not pay.
    """
    from proposers.compose import is_model_proposer

    return 1 if any(is_model_proposer(member) for member in members(proposer)) else k_max


class AdaptiveController:
    """Per-request cap, ask and calibration for the batch drafting policy.

    >>> c = AdaptiveController(k_min=1, k_max=8)
    >>> c.ask()  # nothing admitted yet: one more than that
    1
    >>> c.allocated(1); c.ask()
    2
    >>> c.allocated(0); c.k, c.speculate, c.ask()
    (0, False, 1)
    >>> cheap = AdaptiveController(k_min=16, k_max=16)
    >>> cheap.allocated(3, offered=16); cheap.ask()  # cut inside: the batch's cost binds
    8
    >>> cheap.allocated(8, offered=8); cheap.ask()  # all of it admitted: the cap again
    16
    >>> cheap.allocated(0, offered=16); cheap.record(Draft(), 0); cheap.ask()  # cut to nothing: the next step rests
    0
    >>> cheap.record(Draft(), 0); cheap.ask()  # that step is recorded: asked again
    16

    ``allocated`` and ``record`` change state; ``ask`` and ``estimates`` do not.
    """

    def __init__(
        self,
        k_min: int = 1,
        k_max: int = 16,
        *,
        adaptive: bool = True,
        calibration: Calibration | None = None,
        max_rest: int = 32,
    ) -> None:
        if not 1 <= k_min <= k_max:
            raise ValueError(f"need 1 <= k_min <= k_max, got k_min={k_min}, k_max={k_max}")
        if max_rest < 0:
            raise ValueError(f"need max_rest >= 0 steps, got {max_rest}")
        self.k_min, self.k_max, self.adaptive, self.max_rest = k_min, k_max, adaptive, max_rest
        self._rest = Backoff(min(1, max_rest), max_rest)  # steps to rest after the next draft cut to nothing
        self._rest_until = 0  # the proposer is not asked while fewer steps than this are recorded
        #: Draft tokens the policy admitted last step (``k_max`` before the first).
        self.k: int = k_max if not adaptive else 0
        #: Whether the last step verified any draft token of this row.
        self.speculate: bool = True
        #: Whether the policy cut the last draft after some but not all of its tokens.
        self.cut: bool = False
        #: The survival records; ``calibration=``: ones carried over (a conversation's earlier turns), updated in place.
        self.calibration = calibration if calibration is not None else Calibration()
        self.speculative_steps = 0
        self.plain_steps = 0

    def ask(self) -> int:
        """How many tokens to ask the proposer for this step.  Does not change state."""
        if not self.adaptive:
            return self.k_max
        if self.resting:
            return 0
        if self.k_min < self.k_max:  # every drafted token costs a draft model pass
            return min(max(self.k + 1, self.k_min), self.k_max)
        return min(2 * self.k + 2, self.k_max) if self.cut else self.k_max

    @property
    def resting(self) -> bool:
        """Whether the row rests its proposer this step (its last drafts were cut to nothing)."""
        return self.adaptive and self.speculative_steps + self.plain_steps < self._rest_until

    @property
    def rest(self) -> int:
        """The steps the row would rest after its next draft cut to nothing (1 once a token was admitted)."""
        return self._rest.wait

    def rest_from(self, rest: int) -> None:
        """Start as a row that ended resting ``rest`` steps (a finished request of the same kind of traffic):
        rest the first ``rest - 1`` steps (none for 1), and take the next rest from there.  Changes state."""
        if not self.adaptive or rest <= 1:
            return
        self._rest.start_at(rest)
        self._rest_until = self.speculative_steps + self.plain_steps + self._rest.wait - 1

    def wake(self) -> None:
        """End the rest now (text the grammar forces is near-certain drafting, whatever the last drafts did); the
        next rest is as long as it would have been.  Changes state."""
        self._rest_until = 0

    def estimates(self, draft: Draft) -> list[float]:
        """Calibrated chance, per token of ``draft``, that it survives given the ones before did."""
        return self.calibration.estimate(draft)

    def allocated(self, k: int, offered: int | None = None) -> None:
        """The policy admitted ``k`` of the ``offered`` draft tokens of this row this step.  Changes state.

        ``offered=None``: the draft was verified whole (a tree).
        """
        self.k, self.speculate = k, k > 0
        self.cut = offered is not None and 0 < k < offered
        if offered and not k:  # rest the steps after this one (it is recorded after this call)
            self._rest_until = self.speculative_steps + self.plain_steps + 1 + self._rest.wait
            self._rest.failed()
        elif k:
            self._rest.succeeded()

    def record(
        self, draft: Draft, num_accepted: int, offered: Draft | None = None, next_token: int | None = None
    ) -> None:
        """A verified step: ``draft`` reached the target, ``num_accepted`` of it was accepted.  Changes state.

        ``offered``: the draft before the policy cut it (``draft`` is its
        verified prefix) and ``next_token`` the target's own token after the
        accepted ones.  When every verified token was accepted and ``offered``
        goes on, its next token is judged too: a deterministic draft's token
        survives exactly when the target's choice there equals it (greedy, or
        drawn: the same draw), and the target made that choice at that very
        position.  Without it a source the policy stops admitting is never
        observed again, and its estimate stays low for the rest of the request
        (and, carried, of the conversation) however well it would do.  A draft
        with distributions (a draft model) is accepted by residual rejection,
        not by equality, so it is judged on its verified tokens only.
        """
        n = len(draft)
        if n:
            self.speculative_steps += 1
        else:
            self.plain_steps += 1
        lead = forced_lead(draft)
        if self.adaptive and n > lead:  # the first token the policy chose by the estimates: did it survive?
            self.calibration.audit(self.calibration.estimate(draft)[lead], num_accepted > lead)
        if (
            offered is not None
            and next_token is not None
            and offered.probs is None
            and num_accepted == n
            and len(offered) > n
            and offered.tokens[:n] == draft.tokens
        ):
            draft, num_accepted = offered.truncate(n + 1), n + int(offered.tokens[n] == next_token)
        if len(draft):
            self.calibration.update(draft, num_accepted)

    def __repr__(self) -> str:
        return f"AdaptiveController(k={self.k}, k_max={self.k_max}, adaptive={self.adaptive})"
