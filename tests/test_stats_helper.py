import math

import torch

from scipy_free_stats import _gamma_q, chi_square_pvalue, chi_square_statistic


def test_gamma_q_known_values():
    # chi-square survival: dof 1 at 3.841 -> 0.05; dof 10 at 18.307 -> 0.05; dof 2 at x -> exp(-x/2)
    assert abs(_gamma_q(0.5, 3.841459 / 2) - 0.05) < 1e-5
    assert abs(_gamma_q(5.0, 18.307038 / 2) - 0.05) < 1e-5
    assert abs(_gamma_q(1.0, 3.0 / 2) - math.exp(-1.5)) < 1e-12


def test_pooling_and_impossible_outcomes():
    stat, dof = chi_square_statistic(torch.tensor([50.0, 50.0, 1.0]), torch.tensor([50.0, 51.0, 0.0]))
    assert dof == 1 and stat > 0
    assert chi_square_pvalue(torch.tensor([100.0, 0.0, 1.0]), torch.tensor([101.0, 0.0, 0.0])) == 0.0
