"""Sampling primitives: the grammar mask, probabilities and draws.

The generation settings themselves (temperature, top-k, top-p, repetition
penalty, ...) are applied by :mod:`grammarspec.engine.processing` with transformers'
own processors, identically to the target and every draft model -- the
condition for exactness; it is the one processing pipeline.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = [
    "SamplingParams",
    "unpack_bitmask",
    "apply_bitmask",
    "probabilities",
    "sample",
    "row_max",
    "NoLegalTokenError",
]

#: A stateless Hugging Face logits processor: (input_ids [1, L], scores [1, V]) -> scores.
LogitsProcessorFn = Callable[[torch.LongTensor, torch.FloatTensor], torch.FloatTensor]

_BITS = torch.arange(32, dtype=torch.int32, device="cpu")


class NoLegalTokenError(RuntimeError):
    """A row's grammar allows no token where the row needs one (a dead end): the decoding loop ends that row
    alone with ``finish_reason="error"`` (:mod:`grammarspec.engine.isolation`)."""


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen.  ``do_sample=False`` is greedy (masked argmax).

    ``temperature == 0`` with ``do_sample=True`` means greedy, as in vLLM and
    the OpenAI API.  ``top_k=0`` and ``top_p=1.0`` switch those filters off;
    ``top_p=0`` keeps only the most probable token.
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 switches it off), got {self.top_k}")
        if not 0.0 <= self.top_p <= 1.0:
            raise ValueError(f"top_p must be in [0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return not self.do_sample or self.temperature == 0.0


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 ``[n, ceil(V/32)]`` bitmask -> bool ``[n, V]`` (True = legal)."""
    bits = (bitmask.unsqueeze(-1) >> _BITS.to(bitmask.device)) & 1  # [n, W, 32]
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor | None) -> torch.Tensor:
    """Grammar mask: float32 copy of ``logits`` ``[n, V]`` with illegal tokens at ``-inf``.

    ``bitmask``: int32 ``[n, ceil(V/32)]`` or ``None`` (unconstrained).  Does not modify ``logits``.
    """
    assert logits.dim() == 2, f"logits must be [n, V], got {tuple(logits.shape)}"
    scores = logits.float().clone()
    if bitmask is not None:
        assert bitmask.shape[0] == scores.shape[0], "one bitmask row per logits row"
        scores.masked_fill_(~unpack_bitmask(bitmask, scores.shape[-1]), float("-inf"))
    return scores


def row_max(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's largest score and its first index: ``scores.max(dim=-1)``, the same values, faster on a CPU.

    On a CPU ``torch.max(dim=-1)`` (and ``argmax``) walks a row element by
    element: 0.67 ms for 16 rows of 49,152 scores on one core, against
    0.06 ms for numpy's vectorized ``argmax`` over the same memory (no copy).
    numpy's ``argmax``, like ``torch.max``, returns the first maximal index,
    the first NaN where there is one, and 0 for a row of ``-inf``.  Other
    devices and dtypes numpy lacks (bfloat16) call ``torch.max``.  Pure.

    >>> row_max(torch.tensor([[0.0, 2.0, 2.0], [float("-inf")] * 3]))
    (tensor([2., -inf]), tensor([1, 0]))
    """
    if scores.device.type != "cpu" or scores.dtype not in (torch.float32, torch.float64, torch.float16):
        best, index = scores.max(dim=-1)
        return best, index
    index = torch.from_numpy(scores.detach().numpy().argmax(axis=-1))
    return scores.gather(-1, index[:, None])[:, 0], index


def probabilities(scores: torch.Tensor) -> torch.Tensor:
    """Processed scores ``[n, V]`` -> probabilities; a row with no legal token raises."""
    empty = torch.isneginf(scores).all(dim=-1)
    if bool(empty.any()):
        raise NoLegalTokenError(f"rows {empty.nonzero().flatten().tolist()} allow no token")
    return scores.softmax(dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of ``probs`` ``[n, V]`` -> int64 ``[n]``."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
