"""The curve a profile's timed passes are fitted to: the line, its table and the rounding.  Pure.

The rule.  ``t[n]`` is a pass of ``n`` rows, made rising (:func:`rising`:
the least-squares monotone fit of ``t[n] / t[1]``,
:func:`proposers.cost.monotone_table`; a pass is never cheaper than a
smaller one).  The unit is a plain step of the loop, ``t[1] + h`` (``h``: the
loop's host seconds a step spends whatever its rows).  With
``y[n] = (t[n] + h) / (t[1] + h)`` for ``n > 1``, fit
``y = base + per_row * max(n, min_rows)`` by least squares (``per_row >= 0``,
``base > 0``) for each measured ``min_rows`` and keep the one with the lowest
squared error (the smallest on near-ties).  ``base`` and ``per_row`` are then
rounded to 2 significant digits (``per_row`` at least 0.001 plain steps a
row) so that profiles repeated on one machine give the same curve as often as
possible.  The points ``y[n]`` themselves, rounded alike, are kept as the
curve's table (:func:`proposers.cost.monotone_table`): the cost is read from
them, and the line serves beyond the widest measured pass.  The drafted
pass's extra terms (:mod:`grammarspec.drafting.pass_profile`) are rounded
alike (0 stays 0).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from proposers.cost import PassCost, monotone_table

__all__ = ["fit_pass_cost", "measured_points", "rising", "two_digits", "with_terms"]


def fit_pass_cost(medians: Mapping[int, float], overhead: float = 0.0) -> PassCost:
    """The :class:`PassCost` of measured ``rows -> seconds`` (1 row included), by the module's rule.  Pure.

    ``overhead``: the loop's host seconds a step spends whatever its rows (``h``), added to every pass.

    >>> c = fit_pass_cost({1: 0.085, 2: 0.12, 4: 0.12, 8: 0.13, 16: 0.146, 32: 0.176})
    >>> c.base, c.per_row, c.min_rows
    (1.3, 0.023, 4)
    >>> c = fit_pass_cost({1: 0.01, 2: 0.01, 8: 0.01, 32: 0.01, 64: 0.012})  # flat to 32 rows: a GPU
    >>> c.base, c.per_row, c.min_rows, c.cost(32), round(c.cost(64), 2)
    (0.8, 0.0062, 32, 1.0, 1.2)
    >>> c = fit_pass_cost({1: 0.06, 2: 0.063, 3: 0.06, 4: 0.1, 8: 0.13, 16: 0.2, 32: 0.22, 64: 0.23})  # a CPU
    >>> round(c.cost(2), 2), round(c.cost(4), 2), round(c.base + c.per_row * 2, 2)  # the table; the line's 2 rows
    (1.05, 1.7, 1.69)
    >>> round(fit_pass_cost({1: 0.06, 16: 0.2}, overhead=0.04).cost(16), 2)  # (0.2 + 0.04) / (0.06 + 0.04)
    2.4
    """
    if overhead < 0:
        raise ValueError(f"fit_pass_cost needs overhead >= 0 seconds, got {overhead}")
    unit = medians[1] + overhead
    points = [(n, (seconds + overhead) / unit) for n, seconds in sorted(medians.items()) if n > 1]
    best: tuple[float, float, float, int] | None = None  # (error, base, per_row, min_rows)
    for min_rows in sorted(medians):
        xs, ys = [float(max(n, min_rows)) for n, _ in points], [y for _, y in points]
        base, per_row = _line(xs, ys)
        error = sum((base + per_row * x - y) ** 2 for x, y in zip(xs, ys))
        if best is None or error < best[0] - 1e-9:
            best = (error, base, per_row, min_rows)
    assert best is not None, "fit_pass_cost needs 1 and a larger row count"
    _, base, per_row, min_rows = best
    table = {n: max(1.0, two_digits(y)) for n, y in points}
    return PassCost(max(two_digits(base), 0.01), max(two_digits(per_row), 0.001), min_rows, table=table)


def _line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares ``y = base + per_row * x`` with ``per_row >= 0`` and ``base > 0``."""
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    per_row = max(0.0, sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread) if spread else 0.0
    base = mean_y - per_row * mean_x
    if base <= 0.0:  # through the smallest allowed base instead
        base = 0.01
        per_row = max(0.0, sum(x * (y - base) for x, y in zip(xs, ys)) / sum(x * x for x in xs))
    return base, per_row


def two_digits(value: float) -> float:
    """``value`` rounded to 2 significant digits (0 stays 0)."""
    if value <= 0.0:
        return 0.0
    return round(value, 1 - math.floor(math.log10(value)))


def rising(seconds: Mapping[int, float]) -> dict[int, float]:
    """``rows -> seconds`` made rising: the least-squares monotone fit of each point's ratio to the 1-row one
    (:func:`proposers.cost.monotone_table`; no pass is cheaper than a smaller one).  Pure.

    >>> rising({1: 0.01, 2: 0.009, 4: 0.02, 8: 0.018, 16: 0.03})
    {1: 0.01, 2: 0.01, 4: 0.019, 8: 0.019, 16: 0.03}
    """
    unit = seconds[1]
    table = monotone_table({n: s / unit for n, s in seconds.items() if n > 1})
    return {n: round(unit * ratio, 9) for n, ratio in table}


def measured_points(cost: PassCost) -> dict[int, float]:
    """``cost``'s measured points beyond one row (none for a bare line)."""
    return {rows: value for rows, value in cost.table or [] if rows > 1}


def with_terms(line: PassCost, switch: float, per_token: float, per_draft_row: float) -> PassCost:
    """The fitted ``line`` (and its table) with the drafted pass's extra terms."""
    return PassCost(
        line.base,
        line.per_row,
        line.min_rows,
        switch=switch,
        per_token=per_token,
        per_draft_row=per_draft_row,
        table=measured_points(line),
    )
