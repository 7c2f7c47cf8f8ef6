"""Pearson's chi-square goodness-of-fit without SciPy.

Bins with an expected count below 5 are pooled into one, as the test requires.
The p-value uses the regularised upper incomplete gamma function, computed by
its series / continued fraction (Numerical Recipes), accurate far beyond what
the tests need.
"""

from __future__ import annotations

import math

import torch


def chi_square_statistic(observed: torch.Tensor, expected: torch.Tensor) -> tuple[float, int]:
    """``(statistic, degrees of freedom)`` after pooling bins with expected < 5."""
    observed, expected = observed.double().flatten(), expected.double().flatten()
    assert observed.shape == expected.shape
    assert abs(float(observed.sum() - expected.sum())) < 1e-6 * float(expected.sum()) + 1e-6, (
        f"totals differ: observed {float(observed.sum())}, expected {float(expected.sum())}"
    )
    small = expected < 5
    obs = torch.cat([observed[~small], observed[small].sum().reshape(1)])
    exp = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    if float(exp[-1]) == 0.0:
        if float(obs[-1]) > 0:  # mass where the target has none: impossible outcome observed
            return math.inf, max(1, len(obs) - 2)
        obs, exp = obs[:-1], exp[:-1]
    stat = float(((obs - exp) ** 2 / exp).sum())
    return stat, max(1, len(obs) - 1)


def chi_square_pvalue(observed: torch.Tensor, expected: torch.Tensor) -> float:
    stat, dof = chi_square_statistic(observed, expected)
    if math.isinf(stat):
        return 0.0
    return _gamma_q(dof / 2.0, stat / 2.0)


def _gamma_q(a: float, x: float) -> float:
    """Regularised upper incomplete gamma Q(a, x)."""
    if x <= 0:
        return 1.0
    if x < a + 1:  # series for P, then Q = 1 - P
        term = total = 1.0 / a
        n = a
        for _ in range(10_000):
            n += 1
            term *= x / n
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(-x + a * math.log(x) - math.lgamma(a)))
    b = x + 1 - a  # continued fraction for Q
    c = 1 / 1e-300
    d = 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1e-300 if abs(d) < 1e-300 else d
        c = b + an / c
        c = 1e-300 if abs(c) < 1e-300 else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return math.exp(-x + a * math.log(x) - math.lgamma(a)) * h
