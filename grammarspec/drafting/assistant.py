"""The runtime's half of ``assistant=``: the one drafter that runs a model.

:func:`proposers.presets.resolve_assistant` is the one resolver of
``assistant=`` values (presets, proposers, lists, draft models); it stays
below the runtime and so cannot build a draft model's proposer itself.
:func:`draft_maker` gives it the runtime's way, as its ``make_draft=``.  Each
draft model gets the target row's processing, sampling mode and generator, so
its distributions are processed exactly as the target's::

    resolve_assistant("auto", draft_model, make_draft=draft_maker(sampling=params))
"""

from __future__ import annotations

from typing import Any

import torch

from grammarspec.drafting.draft_model import DraftModelProposer, Processing
from grammarspec.engine.sampling import SamplingParams
from proposers.base import Proposer
from proposers.presets import MakeDraft

__all__ = ["draft_maker"]


def draft_maker(
    *,
    sampling: SamplingParams | None = None,
    processing: Processing | None = None,
    generator: torch.Generator | None = None,
    vocab_size: int | None = None,
) -> MakeDraft:
    """How a Hugging Face draft model becomes its proposer, for :func:`proposers.presets.resolve_assistant`."""

    def make_draft(model: Any) -> Proposer:
        return DraftModelProposer(
            model, sampling=sampling, processing=processing, generator=generator, vocab_size=vocab_size
        )

    return make_draft
