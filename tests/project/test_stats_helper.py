import math

import torch

from tests.scipy_free_stats import chi_square_pvalue, chi_square_statistic, chi_square_survival


def test_chi_square_survival_known_values():
    # the 5% critical values of the chi-square table; dof 2 at x -> exp(-x / 2)
    for statistic, dof in ((3.841459, 1), (5.991465, 2), (18.307038, 10), (124.342113, 100)):
        assert abs(chi_square_survival(statistic, dof) - 0.05) < 1e-6, (statistic, dof)
    assert abs(chi_square_survival(3.0, 2) - math.exp(-1.5)) < 1e-12
    assert chi_square_survival(0.0, 3) == 1.0 and chi_square_survival(math.inf, 3) == 0.0


def test_pooling_and_impossible_outcomes():
    stat, dof = chi_square_statistic(torch.tensor([50.0, 50.0, 1.0]), torch.tensor([50.0, 51.0, 0.0]))
    assert dof == 1 and stat > 0
    assert chi_square_pvalue(torch.tensor([100.0, 0.0, 1.0]), torch.tensor([101.0, 0.0, 0.0])) == 0.0


def test_the_pvalue_tells_a_fit_from_a_misfit():
    expected = torch.tensor([250.0, 250.0, 250.0, 250.0])
    assert chi_square_pvalue(torch.tensor([260.0, 240.0, 255.0, 245.0]), expected) > 0.5
    assert chi_square_pvalue(torch.tensor([330.0, 170.0, 250.0, 250.0]), expected) < 1e-6
