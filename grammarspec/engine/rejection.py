"""Speculative verification: exact rejection sampling and its greedy twin, one rule for a batch.

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
rows when no token may follow its draft.  :func:`target_choices` is the one
rule the decoding loop uses: pure, on the scores' device, one host transfer;
:func:`verify_chain` runs one chain through it (and
:func:`grammarspec.engine.tree_layout.descend`) for tests and single-draft callers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from grammarspec.engine.sampling import NoLegalTokenError, row_max
from grammarspec.kv.host_values import to_device

__all__ = ["Segment", "target_choices", "choices_and_dead_ends", "verify_chain", "rejection_sample", "greedy_verify"]


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
    greedy: bool | Sequence[bool],
    sampled: Sequence[Segment] = (),
    generator: torch.Generator | None = None,
) -> list[int]:
    """:func:`choices_and_dead_ends`, raising :class:`~grammarspec.engine.sampling.NoLegalTokenError` where a row allows
    no token (single-draft callers and tests, where that row is the whole call)."""
    choices, dead = choices_and_dead_ends(scores, greedy, sampled, generator)
    if any(dead):
        raise NoLegalTokenError(f"rows {[i for i, e in enumerate(dead) if e]} allow no token")
    return choices


def choices_and_dead_ends(
    scores: torch.Tensor,
    greedy: bool | Sequence[bool],
    sampled: Sequence[Segment] = (),
    generator: torch.Generator | None = None,
) -> tuple[list[int], list[bool]]:
    """The target's choice at every scored row ``[N]``: the one host transfer of a step.

    ``scores``: processed ``[N, V]``.  ``greedy``: for every row, or one flag
    per row (a batch mixing greedy and sampled requests).  Greedy: the argmax of each row.  Sampled:
    one draw from each row's distribution ``p`` -- except on the rows of
    ``sampled``, the segments of chains drafted with distributions ``q``
    (``draft_probs``), where the choice is the draft token if residual
    rejection accepts it (``u * q(d) < p(d)``) and else a draw from
    ``normalize(max(0, p - q))``.  Either way the choice at a row is
    distributed as ``p``; :func:`grammarspec.engine.tree_layout.descend` follows the
    choices down each row's tree.  Also returns, read in the same transfer,
    whether each row allows no token at all (a dead end: its choice means
    nothing).  Such a row is drawn for as if it allowed every token, so the
    generator advances exactly as for any other row -- on a CPU each row's
    draw takes one uniform and ``V`` exponentials whatever its values, on an
    accelerator each call advances the generator by a fixed offset -- and the
    other rows' draws do not depend on whether some row reached a dead end.

    Example: p = [.5, .5] and a draft 1 drawn from q = [0, 1]: accepted with
    probability p(1)/q(1) = .5, otherwise the residual [.5, 0] gives 0.
    """
    n_rows, vocab = scores.shape
    device = scores.device
    mixed = isinstance(greedy, Sequence)
    if mixed:
        assert len(greedy) == n_rows, f"{len(greedy)} greedy flags for {n_rows} rows"  # type: ignore[arg-type]
    if not mixed and greedy:
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
            index, drafted_tokens = to_device([rows, drafted], device)  # one copy, the host's own integers
            tokens[index] = drafted_tokens
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
        if mixed:  # the greedy rows take their argmax (a draw was made for them too: draws are independent)
            (flags,) = to_device([[int(g) for g in greedy]], device)  # type: ignore[union-attr]
            flags = flags != 0
            choice = torch.where(flags, row_max(scores)[1].to(device), choice)
    host = torch.stack([choice, empty.long()]).tolist()  # the one host transfer
    return host[0], [bool(e) for e in host[1]]


def _multinomial(dist: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row of ``dist`` ``[N, V]`` -> int64 ``[N]`` (the generator may live on another device)."""
    if generator is not None and generator.device != dist.device:
        return torch.multinomial(dist.to(generator.device), 1, generator=generator)[:, 0].to(dist.device)
    return torch.multinomial(dist, 1, generator=generator)[:, 0]


# -- one drafted chain through the loop's own path (the vocabulary of the tests) ----------------


def verify_chain(
    scores: torch.Tensor,
    draft: Sequence[int],
    *,
    greedy: bool,
    draft_probs: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[int, int | None]:
    """Verify one drafted chain as the decoding loop does; returns ``(num_accepted, next_token)``.

    ``scores``: processed ``[k+1, V]``, or ``[k, V]`` when no token may follow
    the draft (``next_token`` is then ``None`` once all ``k`` are accepted).
    ``draft_probs``: ``[k, V]`` when the draft was sampled, else ``None``.
    Exactly the loop's path: :func:`target_choices` then
    :func:`grammarspec.engine.tree_layout.descend`.
    """
    from grammarspec.engine.tree_layout import descend
    from proposers.tree import DraftTree

    k = len(draft)
    assert scores.dim() == 2 and scores.shape[0] in (k, k + 1) and scores.shape[0] > 0, (
        f"scores must be [k+1, V] or [k, V] for k={k}, got {tuple(scores.shape)}"
    )
    bonus = scores.shape[0] == k + 1
    if not bonus:  # the loop scores a row after the last node too, and never reads it when that node ends generation
        scores = torch.cat([scores, scores[-1:]])
    tree = DraftTree(tuple(draft), tuple(range(-1, k - 1)))
    sampled = [Segment(0, tree.tokens, bonus, draft_probs)] if draft_probs is not None and k else []
    choices = target_choices(scores, greedy, sampled, generator)
    path, next_token = descend(tree, [False] * (k - 1) + [not bonus] if k else [], choices)
    return len(path), next_token


def rejection_sample(
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None = None,
) -> tuple[int, int | None]:
    """:func:`verify_chain` for sampling, from the target's probabilities ``[k+1 or k, V]``.

    ``draft_tokens``: int64 ``[k]``.  ``draft_probs``: ``[k, V]``, or ``None`` for a deterministic draft.
    """
    k = draft_tokens.shape[0]
    if draft_probs is not None:
        assert draft_probs.shape == (k, target_probs.shape[1]), "draft_probs must be [k, V]"
        if k and bool((draft_probs[torch.arange(k, device=draft_probs.device), draft_tokens] <= 0).any()):
            raise ValueError("a draft token has zero probability under its own draft distribution")
    draft = draft_tokens.tolist()
    return verify_chain(target_probs.log(), draft, greedy=False, draft_probs=draft_probs, generator=generator)


def greedy_verify(target_scores: torch.Tensor, draft_tokens: torch.Tensor) -> tuple[int, int | None]:
    """:func:`verify_chain` for greedy decoding (``target_scores`` processed ``[k+1 or k, V]``)."""
    return verify_chain(target_scores, draft_tokens.tolist(), greedy=True)
