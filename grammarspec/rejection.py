"""Speculative verification: exact rejection sampling and its greedy twin, for a batch.

Vocabulary (after vLLM's rejection sampler)::

    output tokens = accepted draft tokens + one recovered token   (at the first rejection)
                  | accepted draft tokens + one bonus token       (every draft accepted)
                  | accepted draft tokens                         (no bonus row: grammar ended)

``p_i`` is the target's processed distribution at draft position ``i`` and
``q_i`` the distribution the draft token ``d_i`` was drawn from (a point mass
for deterministic drafts).  Accepting ``d_i`` with probability
``min(1, p_i(d_i) / q_i(d_i))`` and otherwise sampling from
``normalize(max(0, p_i - q_i))`` yields exactly ``p_i`` (Leviathan et al. 2023,
Chen et al. 2023).

Layout: the rows of every request of the batch are stacked into one ``[N, V]``
tensor; :class:`Segment` says which rows belong to which request.  A request
with ``k`` draft tokens owns ``k + 1`` rows (the last is the bonus row) or ``k``
rows when no token may follow its draft.  Every function here is pure, works on
the scores' device and moves data to the host once (the accepted lengths and
the candidate next tokens together).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .sampling import NoLegalTokenError, row_max

__all__ = ["Segment", "target_choices", "verify_greedy", "verify_sampled", "rejection_sample", "greedy_verify"]


@dataclass(frozen=True)
class Segment:
    """The rows of one request: ``start`` in the stacked rows, its draft and whether a bonus row follows."""

    start: int
    draft: tuple[int, ...]
    bonus: bool
    draft_probs: torch.Tensor | None = None  # [len(draft), V], or None for a deterministic draft

    @property
    def rows(self) -> int:
        return len(self.draft) + int(self.bonus)


def target_choices(
    scores: torch.Tensor,
    greedy: bool,
    sampled: Sequence[Segment] = (),
    generator: torch.Generator | None = None,
) -> list[int]:
    """The target's choice at every scored row ``[N]``: the one host transfer of a step.

    ``scores``: processed ``[N, V]``.  Greedy: the argmax of each row.  Sampled:
    one draw from each row's distribution ``p`` -- except on the rows of
    ``sampled``, the segments of chains drafted with distributions ``q``
    (``draft_probs``), where the choice is the draft token if residual
    rejection accepts it (``u * q(d) < p(d)``) and else a draw from
    ``normalize(max(0, p - q))``.  Either way the choice at a row is
    distributed as ``p``; :func:`grammarspec.tree_layout.descend` follows the
    choices down each row's tree.  A row that allows no token raises
    :class:`~grammarspec.sampling.NoLegalTokenError` (checked inside the same transfer).

    Example: p = [.5, .5] and a draft 1 drawn from q = [0, 1]: accepted with
    probability p(1)/q(1) = .5, otherwise the residual [.5, 0] gives 0.
    """
    n_rows, vocab = scores.shape
    device = scores.device
    if greedy:
        best, choice = row_max(scores)  # the argmax and whether the row has any legal token
        empty = torch.isneginf(best)  # [N]
    else:
        empty = torch.isneginf(scores.amax(dim=-1))  # [N]: a row whose every token is -inf
        probs = torch.where(empty[:, None], torch.ones_like(scores), scores).softmax(dim=-1)  # [N, V]
        dist = probs
        accepted = torch.zeros(n_rows, dtype=torch.bool, device=device)
        tokens = torch.zeros(n_rows, dtype=torch.long, device=device)
        if sampled:
            rows: list[int] = []
            drafted: list[int] = []
            for seg in sampled:
                rows += range(seg.start, seg.start + len(seg.draft))
                drafted += seg.draft
            index = torch.tensor(rows, dtype=torch.long, device=device)
            tokens[index] = torch.tensor(drafted, dtype=torch.long, device=device)
            q = torch.zeros_like(probs)  # [N, V]: the draft distributions, 0 elsewhere
            q[index] = torch.cat([seg.draft_probs for seg in sampled if seg.draft_probs is not None]).to(
                device=device, dtype=probs.dtype
            )
            p_d = probs.gather(1, tokens[:, None])[:, 0]  # [N]
            q_d = q.gather(1, tokens[:, None])[:, 0]
            u = torch.rand(n_rows, generator=generator, device=generator.device if generator else device)
            accepted = u.to(device=device, dtype=probs.dtype) * q_d < p_d  # q >= p: always accept when u < p/q
            accepted &= q_d > 0
            residual = (probs - q).clamp_min_(0.0)
            total = residual.sum(dim=-1, keepdim=True)
            dist = torch.where(total > 0, residual / total.clamp_min(1e-30), probs)
        choice = torch.where(accepted, tokens, _multinomial(dist, generator))
    host = torch.stack([choice, empty.long()]).tolist()  # the one host transfer
    if any(host[1]):
        raise NoLegalTokenError(f"rows {[i for i, e in enumerate(host[1]) if e]} allow no token")
    return host[0]


def verify_greedy(scores: torch.Tensor, segments: Sequence[Segment]) -> list[tuple[int, int | None]]:
    """Accept while the processed argmax equals the draft; ``(num_accepted, next_token)`` per segment.

    ``scores``: processed ``[N, V]``.  ``next_token`` is the argmax at the first
    mismatch (or after the draft), ``None`` when all were accepted and no bonus row was given.
    """
    best = row_max(scores)[1].tolist()  # [N]: the one host transfer
    out = []
    for seg in segments:
        rows = best[seg.start : seg.start + seg.rows]
        n = next((i for i, token in enumerate(seg.draft) if rows[i] != token), len(seg.draft))
        out.append((n, rows[n] if n < len(rows) else None))
    return out


def verify_sampled(
    probs: torch.Tensor, segments: Sequence[Segment], generator: torch.Generator | None = None
) -> list[tuple[int, int | None]]:
    """Exact rejection sampling for every segment; ``(num_accepted, next_token)`` per segment.

    ``probs``: the target's processed distributions ``[N, V]`` (rows sum to 1).
    A candidate next token is drawn for every row from its residual
    ``normalize(max(0, p - q))`` (``q = 0`` on bonus rows, so that is ``p``); each
    segment uses the candidate of its first rejected row.  Drawing candidates
    that end up unused changes no probability: every draw is independent.

    Example: p = [.5, .5], deterministic draft d = 1 -> accepted with
    probability p(1) = .5; on rejection the residual max(0, p - onehot(1)) =
    [.5, 0] always gives token 0 -- overall token 1 with probability .5.
    """
    n_rows, vocab = probs.shape
    device = probs.device
    tokens = torch.zeros(n_rows, dtype=torch.long, device=device)  # [N]: each row's draft token (0 on bonus rows)
    is_draft = torch.zeros(n_rows, dtype=torch.bool, device=device)
    for seg in segments:
        if seg.draft:
            tokens[seg.start : seg.start + len(seg.draft)] = torch.tensor(seg.draft, dtype=torch.long, device=device)
            is_draft[seg.start : seg.start + len(seg.draft)] = True
    q = torch.zeros_like(probs)  # [N, V]: the draft distributions (one-hot for deterministic drafts)
    q[is_draft] = torch.nn.functional.one_hot(tokens[is_draft], vocab).to(probs.dtype)
    for seg in segments:
        if seg.draft and seg.draft_probs is not None:
            q[seg.start : seg.start + len(seg.draft)] = seg.draft_probs.to(device=device, dtype=probs.dtype)
    p_d = probs.gather(1, tokens[:, None])[:, 0]  # [N]
    q_d = q.gather(1, tokens[:, None])[:, 0]
    u = torch.rand(n_rows, generator=generator, device=generator.device if generator else device, dtype=probs.dtype)
    accepted = (u.to(device) * q_d < p_d) & is_draft  # q >= p: always accept when u < p/q
    residual = (probs - q).clamp_min_(0.0)
    total = residual.sum(dim=-1, keepdim=True)
    dist = torch.where(total > 0, residual / total.clamp_min(1e-30), probs)
    candidates = _multinomial(dist, generator)  # [N]
    host = torch.stack([accepted.long(), candidates]).tolist()  # the one host transfer
    out = []
    for seg in segments:
        flags = host[0][seg.start : seg.start + len(seg.draft)]
        n = next((i for i, ok in enumerate(flags) if not ok), len(seg.draft))
        out.append((n, host[1][seg.start + n] if n < seg.rows else None))
    return out


def _multinomial(dist: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row of ``dist`` ``[N, V]`` -> int64 ``[N]`` (the generator may live on another device)."""
    if generator is not None and generator.device != dist.device:
        return torch.multinomial(dist.to(generator.device), 1, generator=generator)[:, 0].to(dist.device)
    return torch.multinomial(dist, 1, generator=generator)[:, 0]


# -- one request (the vocabulary of the tests and of single-draft callers) ----------------


def rejection_sample(
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None = None,
) -> tuple[int, int | None]:
    """Verify one draft; returns ``(num_accepted, next_token)``.

    ``target_probs``: ``[k+1, V]`` (or ``[k, V]`` when no bonus token may follow).
    ``draft_tokens``: int64 ``[k]``.  ``draft_probs``: ``[k, V]``, or ``None`` for a deterministic draft.
    """
    k = draft_tokens.shape[0]
    assert target_probs.dim() == 2 and target_probs.shape[0] in (k, k + 1), (
        f"target_probs must be [k+1, V] or [k, V] for k={k}, got {tuple(target_probs.shape)}"
    )
    if draft_probs is not None:
        assert draft_probs.shape == (k, target_probs.shape[1]), "draft_probs must be [k, V]"
        if k and bool((draft_probs[torch.arange(k, device=draft_probs.device), draft_tokens] <= 0).any()):
            raise ValueError("a draft token has zero probability under its own draft distribution")
    seg = Segment(0, tuple(draft_tokens.tolist()), target_probs.shape[0] == k + 1, draft_probs)
    return verify_sampled(target_probs, [seg], generator)[0]


def greedy_verify(target_scores: torch.Tensor, draft_tokens: torch.Tensor) -> tuple[int, int | None]:
    """Greedy twin of :func:`rejection_sample` for one draft (``target_scores`` processed ``[k+1 or k, V]``)."""
    k = draft_tokens.shape[0]
    seg = Segment(0, tuple(draft_tokens.tolist()), target_scores.shape[0] == k + 1)
    return verify_greedy(target_scores, [seg])[0]
