"""Speculative verification: exact rejection sampling and its greedy twin.

Vocabulary (after vLLM's rejection sampler)::

    output tokens = accepted draft tokens + one recovered token   (at the first rejection)
                  | accepted draft tokens + one bonus token       (every draft accepted)
                  | accepted draft tokens                         (no bonus row: grammar ended)

``p_i`` is the target's processed distribution at draft position ``i`` and
``q_i`` the distribution the draft token ``d_i`` was drawn from (a point mass
for deterministic drafts).  Accepting ``d_i`` with probability
``min(1, p_i(d_i) / q_i(d_i))`` and otherwise sampling from
``normalize(max(0, p_i - q_i))`` yields exactly ``p_i`` (Leviathan et al. 2023,
Chen et al. 2023).  Both functions are pure.
"""

from __future__ import annotations

import torch

__all__ = ["rejection_sample", "greedy_verify"]


def rejection_sample(
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None = None,
) -> tuple[int, int | None]:
    """Verify a draft against the target; returns ``(num_accepted, next_token)``.

    ``target_probs``: ``[k+1, V]`` (or ``[k, V]`` when no bonus token may follow
    the draft, e.g. its last token ends the grammar).
    ``draft_tokens``: int64 ``[k]``.
    ``draft_probs``: ``[k, V]``, or ``None`` for a deterministic draft.
    ``next_token`` is the recovered or bonus token, ``None`` only when every
    draft token was accepted and no bonus row was given.

    Example: p = [.5, .5], deterministic draft d = 1 -> accepted with
    probability p(1) = .5; on rejection the residual max(0, p - onehot(1)) =
    [.5, 0] always gives token 0 -- overall token 1 with probability .5.
    """
    k = draft_tokens.shape[0]
    assert target_probs.dim() == 2 and target_probs.shape[0] in (k, k + 1), (
        f"target_probs must be [k+1, V] or [k, V] for k={k}, got {tuple(target_probs.shape)}"
    )
    if k:
        rows = torch.arange(k)
        p = target_probs[rows, draft_tokens]  # [k]
        if draft_probs is None:
            q = torch.ones_like(p)
        else:
            assert draft_probs.shape == (k, target_probs.shape[1]), "draft_probs must be [k, V]"
            q = draft_probs[rows, draft_tokens]
            if bool((q <= 0).any()):
                raise ValueError("a draft token has zero probability under its own draft distribution")
        u = torch.rand(k, generator=generator, dtype=p.dtype)
        accepted = u * q < p  # q >= p: always accept when u < p/q
        rejected = (~accepted).nonzero()
        n = int(rejected[0]) if rejected.numel() else k
    else:
        n = 0
    if n < k:  # first rejection at n: sample from the residual
        residual = target_probs[n].clone()
        if draft_probs is None:
            residual[draft_tokens[n]] = 0.0
        else:
            residual = (residual - draft_probs[n]).clamp_min_(0.0)
        total = residual.sum()
        dist = residual / total if total > 0 else target_probs[n]
        return n, int(torch.multinomial(dist, 1, generator=generator))
    if target_probs.shape[0] == k:
        return k, None
    return k, int(torch.multinomial(target_probs[k], 1, generator=generator))


def greedy_verify(target_scores: torch.Tensor, draft_tokens: torch.Tensor) -> tuple[int, int | None]:
    """Greedy twin: accept while the masked argmax equals the draft.

    ``target_scores``: processed (masked) ``[k+1, V]`` or ``[k, V]``;
    ``draft_tokens``: int64 ``[k]``.  Returns ``(num_accepted, next_token)``
    where ``next_token`` is the masked argmax at the first mismatch (or after
    the draft), ``None`` when all were accepted and no bonus row was given.
    """
    k = draft_tokens.shape[0]
    best = target_scores.argmax(dim=-1)  # [k+1] or [k]
    mismatch = (best[:k] != draft_tokens).nonzero()
    n = int(mismatch[0]) if mismatch.numel() else k
    if n < best.shape[0]:
        return n, int(best[n])
    return n, None
