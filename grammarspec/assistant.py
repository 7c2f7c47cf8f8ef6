"""``assistant=`` -> a proposer, draft models included.

:func:`proposers.presets.resolve_assistant` knows the presets and the pure
drafters; this adds the one drafter that runs a model.  Each draft model gets
the target row's processing, sampling mode and generator, so its distributions
are processed exactly as the target's.
"""

from __future__ import annotations

from typing import Any

import torch

from proposers.base import Proposer
from proposers.presets import resolve_assistant as resolve_pure

from .draft_model import DraftModelProposer, Processing
from .sampling import SamplingParams

__all__ = ["resolve_assistant"]


def resolve_assistant(
    assistant: Any,
    draft_model: Any = None,
    *,
    sampling: SamplingParams | None = None,
    processing: Processing | None = None,
    generator: torch.Generator | None = None,
    vocab_size: int | None = None,
) -> Proposer | None:
    """Fresh proposer objects for ``assistant`` (see :func:`proposers.presets.resolve_assistant`)."""

    def make_draft(model: Any) -> Proposer:
        return DraftModelProposer(model, sampling=sampling, processing=processing, generator=generator,
                                  vocab_size=vocab_size)  # fmt: skip

    return resolve_pure(assistant, draft_model, make_draft=make_draft)
