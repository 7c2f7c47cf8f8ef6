"""Per-request proposal length and the decision to speculate at all.

Proposal length, after SGLang's ``adaptive_spec_params``::

    k = clamp(round(ema_accepted) + 1, k_min, k_max)

where ``ema_accepted`` is an exponential moving average (weight ``alpha``)
of the draft tokens accepted per speculative step whose draft filled the
proposal length (``proposed >= k``).  A shorter draft was cut by its
proposer, not by ``k`` (deterministic drafters stop where they run out of
guesses), so it says nothing about ``k`` and is left out.  A step that
accepts all ``k`` drafts pushes ``k`` up by one; a run of rejections pulls
it down.

* warm-up: the first ``warmup`` speculative steps only feed the average;
  ``k`` stays at ``k_init``;
* interval: afterwards ``k`` is recomputed every ``interval`` speculative steps;
* hysteresis: ``k`` moves only when ``ema_accepted + 1`` lies more than
  ``hysteresis`` beyond the rounding boundary of the current ``k``, so an
  average hovering around ``x.5`` does not flip ``k`` back and forth.

On/off, from costs measured online (seconds per committed token)::

    cost_speculative = EMA(seconds) / EMA(tokens committed)   over speculative steps
    cost_plain       = EMA(seconds)                           over plain steps (one token each)

(averages with the slower weight ``cost_alpha``; a ratio of averages, so a
burst of long accepted runs counts by the tokens it brought).

Once both are known (``min_samples`` each), speculation switches off while
``cost_speculative > cost_plain * (1 + margin)``.  After ``probe_after``
plain steps it switches back on to probe: the speculative cost is measured
afresh and judged again after ``min_samples`` steps.  A probe that fails
doubles the wait (up to ``max_probe_after``); one that succeeds resets it.
When the plain cost is unknown and speculation is doing poorly (fewer than
``calibrate_below`` tokens committed per step), one plain step is requested
to measure it.

A step that verified no draft tokens is a plain step: report it with
:meth:`record_plain_step`.  Switching off only changes how tokens are
computed, never which tokens come out.
"""

from __future__ import annotations

__all__ = ["AdaptiveController"]


class AdaptiveController:
    """Chooses ``k`` and whether to speculate, for one request.  Pure Python, no clocks.

    Read :attr:`k` and :attr:`speculate` before each step; report the step
    with :meth:`record_speculative_step` or :meth:`record_plain_step` (both
    change state and return whether ``k`` or ``speculate`` changed).
    ``k`` starts at ``k_init`` (default ``k_max``).  ``adaptive=False`` fixes
    ``k`` and never switches speculation off.

    With cheap deterministic proposers only, a high ``k_min`` (about
    ``k_max / 2``) suits them: they stop by themselves where their guesses
    end, and an extra verified token costs little.  With a draft model every
    drafted token costs a draft forward pass: ``k_min = 1``.
    """

    def __init__(
        self,
        k_min: int = 1,
        k_max: int = 16,
        *,
        k_init: int | None = None,
        adaptive: bool = True,
        alpha: float = 0.3,
        warmup: int = 2,
        interval: int = 1,
        hysteresis: float = 0.2,
        cost_alpha: float = 0.1,
        min_samples: int = 8,
        margin: float = 0.05,
        probe_after: int = 16,
        max_probe_after: int = 128,
        calibrate_below: float = 2.0,
    ) -> None:
        if not 1 <= k_min <= k_max:
            raise ValueError(f"need 1 <= k_min <= k_max, got k_min={k_min}, k_max={k_max}")
        if not 0.0 < alpha <= 1.0 or not 0.0 < cost_alpha <= 1.0:
            raise ValueError(f"alpha and cost_alpha must be in (0, 1], got {alpha} and {cost_alpha}")
        if interval < 1 or warmup < 0 or min_samples < 1 or probe_after < 1:
            raise ValueError("interval, min_samples and probe_after must be >= 1 and warmup >= 0")
        self.k_min, self.k_max = k_min, k_max
        self.adaptive = adaptive
        self.alpha, self.warmup, self.interval, self.hysteresis = alpha, warmup, interval, hysteresis
        self.cost_alpha = cost_alpha
        self.min_samples, self.margin = min_samples, margin
        self.probe_after, self.max_probe_after = probe_after, max_probe_after
        self.calibrate_below = calibrate_below
        start = k_max if k_init is None else k_init
        #: Current proposal length.
        self.k: int = start if not adaptive else min(max(start, k_min), k_max)
        #: Whether the next step should speculate.
        self.speculate: bool = True
        self.ema_accepted: float | None = None
        self.ema_committed: float | None = None
        self.cost_plain: float | None = None
        self._spec_seconds: float | None = None  # EMA of seconds per speculative step
        self._spec_tokens: float | None = None  # EMA of tokens committed per speculative step
        self.speculative_steps = 0
        self.plain_steps = 0
        self._spec_samples = 0  # speculative cost samples since the last (re)start
        self._plain_samples = 0
        self._plain_run = 0  # plain steps since speculation was switched off
        self._wait = probe_after  # plain steps before the next probe
        self._probing = False
        self._calibrating = False

    # -- inputs ---------------------------------------------------------------

    def record_speculative_step(
        self, proposed: int, accepted: int, seconds: float, committed: int | None = None
    ) -> bool:
        """A verified step: ``proposed`` drafts, ``accepted`` of them, ``seconds`` of draft + verify work.

        ``committed``: tokens committed by the step (default ``accepted + 1``:
        the accepted drafts plus the target's own token).  Returns whether
        ``k`` or ``speculate`` changed.
        """
        if not 0 <= accepted <= proposed:
            raise ValueError(f"accepted ({accepted}) must be between 0 and proposed ({proposed})")
        committed = accepted + 1 if committed is None else committed
        self.speculative_steps += 1
        # A draft shorter than k was cut by its proposer: it says nothing about k.
        informative = proposed >= self.k
        if informative:
            self.ema_accepted = _ema(self.ema_accepted, accepted, self.alpha)
        self.ema_committed = _ema(self.ema_committed, committed, self.alpha)
        self._spec_seconds = _ema(self._spec_seconds, seconds, self.cost_alpha)
        self._spec_tokens = _ema(self._spec_tokens, committed, self.cost_alpha)
        self._spec_samples += 1
        if not self.adaptive:
            return False
        before = (self.k, self.speculate)
        if informative:
            self._update_k()
        self._judge()
        return (self.k, self.speculate) != before

    def record_plain_step(self, seconds: float) -> bool:
        """A step without drafts that committed one token in ``seconds``.  Returns whether anything changed."""
        self.plain_steps += 1
        self.cost_plain = _ema(self.cost_plain, seconds, self.cost_alpha)
        self._plain_samples += 1
        if not self.adaptive:
            return False
        before = self.speculate
        if self._calibrating:
            self._calibrating = False
            self.speculate = True
        elif not self.speculate:
            self._plain_run += 1
            if self._plain_run >= self._wait:  # probe again
                self.speculate = True
                self._probing = True
                self._spec_samples = 0
                self._spec_seconds = self._spec_tokens = None
        return self.speculate != before

    @property
    def cost_speculative(self) -> float | None:
        """Seconds per committed token while speculating (``None`` until measured)."""
        if self._spec_seconds is None or not self._spec_tokens:
            return None
        return self._spec_seconds / self._spec_tokens

    # -- rules ----------------------------------------------------------------

    def _update_k(self) -> None:
        if self.speculative_steps <= self.warmup or (self.speculative_steps - self.warmup) % self.interval:
            return
        assert self.ema_accepted is not None
        desired = self.ema_accepted + 1.0
        if desired >= self.k + 0.5 + self.hysteresis or desired < self.k - 0.5 - self.hysteresis:
            self.k = min(max(int(desired + 0.5), self.k_min), self.k_max)

    def _judge(self) -> None:
        cost = self.cost_speculative
        if self._spec_samples < self.min_samples or cost is None:
            return
        if self.cost_plain is None or self._plain_samples < 1:
            if self.ema_committed is not None and self.ema_committed < self.calibrate_below:
                self._calibrating = True  # measure one plain step
                self.speculate = False
            return
        if cost > self.cost_plain * (1.0 + self.margin):
            if self._probing:
                self._wait = min(self._wait * 2, self.max_probe_after)
            self._probing = False
            self.speculate = False
            self._plain_run = 0
        elif self._probing:
            self._probing = False
            self._wait = self.probe_after

    def __repr__(self) -> str:
        return (
            f"AdaptiveController(k={self.k}, speculate={self.speculate}, ema_accepted={self.ema_accepted}, "
            f"cost_speculative={self.cost_speculative}, cost_plain={self.cost_plain})"
        )


def _ema(previous: float | None, value: float, alpha: float) -> float:
    return float(value) if previous is None else (1.0 - alpha) * previous + alpha * float(value)
