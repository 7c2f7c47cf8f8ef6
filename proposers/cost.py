"""What a verification pass costs, in plain (1-row) decoding steps: one model per target.

``rows`` is every token row one target forward pass computes, over the whole
batch.  A plain step at batch ``B`` is a pass of ``B`` rows.  On a small model
most of a pass is fixed cost (weights are read once whatever the rows), so::

    cost(1)    = 1                                  (a plain step at batch 1: the unit)
    cost(rows) = base + per_row * max(rows, min_rows)   for rows > 1

A pass that verifies drafts pays two more terms, both in plain steps
(:meth:`PassCost.drafted`):

* ``switch``, once per step when any row drafts at batch 2 or more: the change
  of path from the mask-free decode call to ragged rows under an attention mask
  (position ids, the mask built and read by every attention layer);
* ``per_token``, per draft token: the host work the token adds beyond its row
  of the forward (drafting it, the grammar walk's mask fill, accept and rollback);
* ``per_draft_row``, per row that drafts beyond the first, in a packed pass
  (:mod:`grammarspec.kv.packed_attention`): single-token rows attend in one call
  per layer, but each row verifying a draft attends in a call of its own, so
  the same draft tokens cost more spread over many rows than in one chain.

The prior (``PassCost()``) is a CPU-shaped line with no ``switch``, ``per_token``
or ``per_draft_row``, for draft lengths that never depend on the machine; the HF loop
profiles every term once per model, device, dtype and thread count
(:mod:`grammarspec.drafting.pass_profile`), and BENCHMARKS.md records what was measured.
On a GPU a pass stays near one plain step up to tens of rows
(:func:`flat_until` models such a curve) and the host terms are what a draft
token costs.

A profiled curve also keeps its measured points (``table``: rows -> plain
steps, made monotone): :meth:`PassCost.cost` interpolates between them and
follows the line only beyond the last.  Real curves are not lines where it
matters most: on a CPU a pass of 2 or 3 rows may cost little more than one
row while 4 rows cost much more (the matrix kernels change shape), and a
line fitted over 1 to 64 rows prices the short draft of a lone request
several times too high.

:meth:`PassCost.update` learns the line from measured passes: the seconds of
1-row passes set the unit (an exponential average; before any is seen, the
first wider pass sets it from the prior's shape, so a batch that never runs a
1-row pass still learns), and each wider pass adds the point
``(max(rows, min_rows), seconds / unit)`` to a weighted least-squares line
whose two prior points (at ``min_rows`` and 16 rows) never fade, so the line
stays defined when every pass has the same width.  Older measurements fade
by ``decay`` per update.  Pure Python, no clocks: the caller times the passes.

Who uses it: the drafting policy (:mod:`grammarspec.policy.allocation`) sizes every
step's drafts over the whole batch, with the curve profiled once per model
(never updated); the vLLM proposer feeds its own measured passes;
:class:`proposers.compose.CompositeProposer` verifies a cheap draft alone only
when its expected accepted tokens reach :meth:`PassCost.break_even`, on the
curve the loop hands it; ``tools/replay_bench.py`` models seconds with the
prior, a profiled curve or a GPU curve.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["PassCost", "PRIOR_BASE", "PRIOR_PER_ROW", "PRIOR_MIN_ROWS", "flat_until", "monotone_table"]

PRIOR_BASE = 1.3
PRIOR_PER_ROW = 0.03
PRIOR_MIN_ROWS = 4


class PassCost:
    """Relative cost of a verification pass of ``rows`` rows against a 1-row step (learned per model).

    >>> c = PassCost()
    >>> c.cost(1), round(c.cost(2), 2), round(c.cost(17), 2)
    (1.0, 1.42, 1.81)
    >>> round(c.break_even(17), 2)  # a 16-token draft must bring 0.81 accepted tokens to pay
    0.81
    >>> c.update(1, 0.1)  # a plain step took 100 ms: the unit
    True
    >>> for _ in range(50):
    ...     _ = c.update(9, 0.3)  # 9-row passes take 3 plain steps here
    >>> round(c.cost(9), 1)  # near 3: the prior points hold it back a little
    2.8

    ``switch``, ``per_token`` and ``per_draft_row``: the drafted pass's extra
    terms (module docstring), fixed; :meth:`drafted` adds them.

    ``update`` and the constructor change state; ``cost``, ``drafted``,
    ``break_even`` and ``share`` do not.
    """

    def __init__(
        self,
        base: float = PRIOR_BASE,
        per_row: float = PRIOR_PER_ROW,
        min_rows: int = PRIOR_MIN_ROWS,
        *,
        switch: float = 0.0,
        per_token: float = 0.0,
        per_draft_row: float = 0.0,
        table: Mapping[int, float] | None = None,
        prior_weight: float = 2.0,
        decay: float = 0.95,
        unit_alpha: float = 0.2,
    ) -> None:
        if base <= 0 or per_row < 0 or min_rows < 1:
            raise ValueError(f"PassCost needs base > 0, per_row >= 0, min_rows >= 1; got {base}, {per_row}, {min_rows}")
        if switch < 0 or per_token < 0 or per_draft_row < 0:
            raise ValueError(
                f"PassCost needs switch, per_token and per_draft_row >= 0; got {switch}, {per_token}, {per_draft_row}"
            )
        self.switch, self.per_token, self.per_draft_row = switch, per_token, per_draft_row
        #: Measured ``(rows, plain steps)`` points, rising, beginning at ``(1, 1.0)``; ``None``: the line alone.
        self.table: list[tuple[int, float]] | None = monotone_table(table) if table else None
        if not 0 < decay <= 1 or not 0 < unit_alpha <= 1 or prior_weight <= 0:
            raise ValueError("PassCost needs 0 < decay <= 1, 0 < unit_alpha <= 1 and prior_weight > 0")
        self.base, self.per_row, self.min_rows = base, per_row, min_rows
        self.decay, self.unit_alpha = decay, unit_alpha
        self.unit_seconds: float | None = None  # average seconds of a 1-row pass, once measured (or inferred)
        self._unit_measured = False  # whether a 1-row pass set the unit (an inferred one is replaced)
        # Weighted least-squares sums over (x, y) = (rows, cost in plain steps): prior points + faded data.
        xs = (float(min_rows), 16.0)
        self._prior = [
            prior_weight * 2,
            sum(xs) * prior_weight,
            sum(x * x for x in xs) * prior_weight,
            sum(base + per_row * x for x in xs) * prior_weight,
            sum(x * (base + per_row * x) for x in xs) * prior_weight,
        ]
        self._data = [0.0] * 5

    def cost(self, rows: int) -> float:
        """A pass over ``rows`` rows, in plain steps (1.0 for one row or fewer).  Does not change state."""
        if rows <= 1:
            return 1.0
        if self.table is not None:
            for (r0, c0), (r1, c1) in zip(self.table, self.table[1:]):
                if rows <= r1:
                    return c0 + (c1 - c0) * (rows - r0) / (r1 - r0)
            last_rows, last_cost = self.table[-1]
            return last_cost + self.per_row * (rows - last_rows)  # beyond the table: the line's slope
        return max(1.0, self.base + self.per_row * max(rows, self.min_rows))

    def __call__(self, rows: int) -> float:
        """:meth:`cost`: a :class:`PassCost` serves wherever a bare curve ``cost(rows)`` is asked for."""
        return self.cost(rows)

    def drafted(self, rows: int, tokens: int, batch: int = 1, drafting: int = 1) -> float:
        """A pass over ``rows`` rows verifying ``tokens`` draft tokens of ``drafting`` rows of a batch of ``batch``.

        In plain steps: ``cost(rows)``, plus ``per_token`` a draft token, plus
        ``switch`` when any row drafts at ``batch >= 2`` (a chain at batch 1
        keeps the mask-free call), plus ``per_draft_row`` for each drafting row
        beyond the first.  Does not change state.

        >>> c = PassCost(1.2, 0.02, 4, switch=0.1, per_token=0.01, per_draft_row=0.05)
        >>> c.drafted(4, 0, batch=4), round(c.drafted(8, 4, batch=4), 2), round(c.drafted(5, 4), 2)
        (1.28, 1.5, 1.34)
        >>> round(c.drafted(8, 4, batch=4, drafting=4), 2)  # the same 4 tokens on 4 rows: 3 more calls a layer
        1.65
        """
        if tokens <= 0:
            return self.cost(rows)
        if batch <= 1:
            return self.cost(rows) + self.per_token * tokens
        spread = self.per_draft_row * max(0, drafting - 1)
        return self.cost(rows) + self.per_token * tokens + self.switch + spread

    def break_even(self, rows: int) -> float:
        """Accepted draft tokens a pass over ``rows`` rows must bring to beat plain steps.

        The pass commits ``accepted + 1`` tokens for ``cost(rows)`` plain
        steps, which commit one each.  Does not change state.
        """
        return self.cost(rows) - 1.0

    def share(self, rows: int) -> float:
        """Each draft token's share of what a pass over ``rows`` rows costs beyond a plain step.

        ``PassCost().share(17)`` is about 0.05.  Does not change state.
        """
        return self.break_even(rows) / max(1, rows - 1)

    def update(self, rows: int, seconds: float) -> bool:
        """Learn from one measured pass over ``rows`` rows that took ``seconds``.  Changes state.

        Returns whether the model changed.  A wider pass seen before any
        1-row pass sets the unit from the current line (``seconds / cost(rows)``)
        and teaches nothing else; later ones move the line.  The first
        measured 1-row pass replaces an inferred unit.
        """
        if rows < 1 or not seconds > 0:
            raise ValueError(f"a measured pass needs rows >= 1 and seconds > 0, got rows={rows}, seconds={seconds}")
        if rows == 1:
            unit = self.unit_seconds if self._unit_measured else None
            self.unit_seconds = seconds if unit is None else unit + self.unit_alpha * (seconds - unit)
            self._unit_measured = True
            return True
        if self.unit_seconds is None:
            self.unit_seconds = seconds / self.cost(rows)
            return True
        self.table = None  # measured passes teach the line; a profiled table gives way to it
        x, y = float(max(rows, self.min_rows)), seconds / self.unit_seconds
        self._data = [s * self.decay for s in self._data]
        for i, term in enumerate((1.0, x, x * x, y, x * y)):
            self._data[i] += term
        w, sx, sxx, sy, sxy = (p + d for p, d in zip(self._prior, self._data))
        det = w * sxx - sx * sx
        if det <= 1e-12:  # pragma: no cover - the two prior points keep it positive
            return False
        self.per_row = max(0.0, (w * sxy - sx * sy) / det)
        self.base = max(1e-6, (sy - self.per_row * sx) / w)
        return True


def monotone_table(table: Mapping[int, float]) -> list[tuple[int, float]]:
    """``table``'s points as a rising curve from ``(1, 1.0)``: the least-squares monotone fit of its costs.  Pure.

    Timings are noisy, and a pass of more rows never costs less, so
    neighbouring points that fall are pooled to their mean (pool adjacent
    violators); no point is below one plain step.

    >>> monotone_table({2: 1.05, 3: 0.95, 4: 1.7, 8: 2.2})
    [(1, 1.0), (2, 1.025), (3, 1.025), (4, 1.7), (8, 2.2)]
    """
    points = sorted((int(rows), max(1.0, float(cost))) for rows, cost in table.items() if rows > 1)
    blocks: list[list[float]] = []  # [sum, count] of each pooled run
    for _, cost in points:
        blocks.append([cost, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    costs = [total / count for total, count in blocks for _ in range(int(count))]
    return [(1, 1.0)] + [(rows, round(cost, 4)) for (rows, _), cost in zip(points, costs)]


def flat_until(
    rows: int, per_row: float = 0.01, *, switch: float = 0.0, per_token: float = 0.0, per_draft_row: float = 0.0
) -> PassCost:
    """A fixed cost curve that stays at one plain step up to ``rows`` rows, then grows ``per_row`` a row.

    What a small model on a GPU looks like (a pass is bound by reading the
    weights until the batch fills the chip).  ``switch``, ``per_token`` and
    ``per_draft_row``: the drafted pass's extra terms (:meth:`PassCost.drafted`).  For replays and
    tests; it learns like any other :class:`PassCost` if updated.

    >>> gpu = flat_until(64)
    >>> gpu.cost(2), gpu.cost(64), round(gpu.cost(114), 2)
    (1.0, 1.0, 1.5)
    """
    if rows < 2 or not 0 < per_row * rows < 1:
        raise ValueError(f"flat_until needs rows >= 2 and 0 < per_row * rows < 1, got rows={rows}, per_row={per_row}")
    return PassCost(
        1.0 - per_row * rows, per_row, rows, switch=switch, per_token=per_token, per_draft_row=per_draft_row
    )
