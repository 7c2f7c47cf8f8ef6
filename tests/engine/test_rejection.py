"""The rejection sampler and its greedy twin, as pure functions on tiny tensors."""

import pytest
import torch

from grammarspec.engine.rejection import greedy_verify, rejection_sample
from tests.scipy_free_stats import chi_square_pvalue


def _first_token_distribution(p, q, draft_token, n, seed=0, k=1):
    """Empirical distribution of the first output token of a 1-token draft."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(p.shape[-1])
    target = torch.stack([p, p])  # [k+1, V]
    for _ in range(n):
        if q is None:
            draft = torch.tensor([draft_token])
            probs = None
        else:
            draft = torch.multinomial(q, 1, generator=g)
            probs = q[None]
        accepted, nxt = rejection_sample(target, draft, probs, g)
        counts[int(draft[0]) if accepted else nxt] += 1
    return counts


def test_point_mass_draft_worked_example():
    # p = [.5, .5], deterministic draft d = 1: token 1 exactly half the time.
    p = torch.tensor([0.5, 0.5])
    counts = _first_token_distribution(p, None, 1, 20_000)
    assert chi_square_pvalue(counts, p * 20_000) > 1e-3


@pytest.mark.parametrize("seed", [0, 1])
def test_sampled_draft_recovers_target(seed):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(6, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(6, generator=g) * 2, -1)
    counts = _first_token_distribution(p, q, None, 20_000, seed=seed)
    assert chi_square_pvalue(counts, p * 20_000) > 1e-3


def test_a_wrong_distribution_is_detected():
    """The statistic has power: drawing straight from q instead of p fails."""
    g = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(6, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(6, generator=g) * 2, -1)
    counts = torch.bincount(torch.multinomial(q, 20_000, replacement=True, generator=g), minlength=6).float()
    assert chi_square_pvalue(counts, p * 20_000) < 1e-6


def test_all_accepted_takes_bonus_from_last_row():
    p = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    assert rejection_sample(p, torch.tensor([1]), None) == (1, 2)


def test_no_bonus_row_returns_none():
    p = torch.tensor([[0.0, 1.0, 0.0]])
    assert rejection_sample(p, torch.tensor([1]), None) == (1, None)


def test_rejected_point_mass_never_resamples_the_draft_token():
    p = torch.tensor([[0.6, 0.4, 0.0], [1.0, 0.0, 0.0]])
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        n, nxt = rejection_sample(p, torch.tensor([1]), None, g)
        assert (n, nxt) in {(1, 0), (0, 0)}


def test_zero_draft_probability_is_refused():
    p = torch.tensor([[0.5, 0.5], [0.5, 0.5]])
    q = torch.tensor([[1.0, 0.0]])
    with pytest.raises(ValueError, match="zero probability"):
        rejection_sample(p, torch.tensor([1]), q)


def test_empty_draft_samples_from_target():
    p = torch.tensor([[0.0, 0.0, 1.0]])
    assert rejection_sample(p, torch.tensor([], dtype=torch.long), None) == (0, 2)


def test_greedy_verify_worked_examples():
    scores = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 1.0], [0.0, 0.0, 9.0]])
    assert greedy_verify(scores, torch.tensor([1, 0])) == (2, 2)  # all match, bonus = argmax row 2
    assert greedy_verify(scores, torch.tensor([1, 2])) == (1, 0)  # mismatch at 1 -> argmax there
    assert greedy_verify(scores[:2], torch.tensor([1, 0])) == (2, None)  # no bonus row
    assert greedy_verify(scores[:1], torch.tensor([], dtype=torch.long)) == (0, 1)


@pytest.mark.parametrize("width", [7, 513, 49152, 50001])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 40])
def test_row_max_equals_torch_max_with_ties_nans_and_empty_rows(rows, width, dtype):
    from grammarspec.engine.sampling import row_max

    g = torch.Generator().manual_seed(rows * 100_003 + width)
    scores = torch.randint(-3, 4, (rows, width), generator=g).to(dtype)  # many ties
    scores[:, ::3] = float("-inf")
    scores[0] = float("-inf")  # a row with no legal token
    if rows > 2:
        scores[1, width // 2] = scores[1, width // 3] = float("nan")  # the first NaN wins
        scores[2, -1] = 10.0  # the maximum at the very end
    best, index = row_max(scores)
    want_best, want_index = scores.max(dim=-1)
    assert torch.equal(index, want_index)
    assert torch.equal(best.nan_to_num(nan=123.0), want_best.nan_to_num(nan=123.0))
