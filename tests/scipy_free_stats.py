"""Pearson's chi-square goodness-of-fit without SciPy.

Bins with an expected count below 5 are pooled into one, as the test requires.
The p-value is the chi-square survival function, the regularised upper
incomplete gamma function ``Q(dof / 2, statistic / 2)``:
``torch.special.gammaincc`` in float64.
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


def chi_square_survival(statistic: float, dof: int) -> float:
    """``P(X >= statistic)`` for ``X`` chi-square with ``dof`` degrees of freedom.

    >>> round(chi_square_survival(3.841459, 1), 6)
    0.05
    """
    if math.isinf(statistic):
        return 0.0
    a = torch.tensor(dof / 2.0, dtype=torch.float64)
    return float(torch.special.gammaincc(a, torch.tensor(statistic / 2.0, dtype=torch.float64)))


def chi_square_pvalue(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """The goodness-of-fit p-value of ``observed`` counts against ``expected`` ones (same total)."""
    return chi_square_survival(*chi_square_statistic(observed, expected))
