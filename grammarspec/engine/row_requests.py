"""One request row of the decoding loop, built one way for ``grammarspec.generate`` and the server.

A row carries everything that is its own: the prompt, the grammar state, the
drafter and its controller, the processing (Hugging Face's processors for the
row's resolved ``GenerationConfig``: temperature, top-k, top-p, penalties,
...) and its :class:`~grammarspec.engine.rows.RowSettings` (greedy or sampled,
``max_new_tokens``, stop strings).  Rows with different settings decode in one
batch; each gets the output it would get alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import GenerationConfig

from grammarspec.drafting.assistant import draft_maker
from grammarspec.drafting.draft_model import DraftModelProposer
from grammarspec.engine.decoding import logits_width
from grammarspec.engine.processing import build_pipeline
from grammarspec.engine.rows import RowRequest, RowSettings
from grammarspec.engine.sampling import SamplingParams
from grammarspec.kv.cache import logits_device
from grammarspec.policy.adaptive import AdaptiveController, k_min
from grammarspec.policy.allocation import Calibration
from proposers.base import Request, members
from proposers.presets import resolve_assistant
from proposers.suffix_index import SuffixIndex

__all__ = ["DEFAULT_MAX_DRAFT", "k_min", "row_request"]

#: Longest proposal by default: verifying 16 tokens costs ~1.7x one step on CPU.
DEFAULT_MAX_DRAFT = 16


def row_request(
    model: torch.nn.Module,
    prompt: Sequence[int],
    config: GenerationConfig,
    *,
    max_new_tokens: int,
    eos: Sequence[int],
    stop_strings: Sequence[str] = (),
    compiled: Any = None,
    schema: Any = None,
    tokenizer: Any = None,
    assistant: Any = None,
    assistant_model: Any = None,
    processors: Sequence[Any] = (),
    generator: torch.Generator | None = None,
    max_draft_tokens: int = DEFAULT_MAX_DRAFT,
    adaptive: bool = True,
    calibration: Calibration | None = None,
    documents: Sequence[str] = (),
    suffix_index: SuffixIndex | None = None,
) -> RowRequest:
    """The row of one prompt.  ``config`` is resolved (:func:`grammarspec.settings.resolve_config`).

    ``compiled``: the row's compiled grammar (``None``: unconstrained) and
    ``schema`` its JSON schema, read by schema drafters; ``assistant`` /
    ``assistant_model``: as :func:`grammarspec.generate` takes them (the row gets
    fresh proposer objects; a draft model drafts with this row's processing);
    ``calibration``: survival records to start from (updated in place);
    ``documents``: earlier JSON documents of the conversation, for the drafter;
    ``suffix_index``: earlier outputs shared with other rows (``"auto"`` drafts from it and adds to it).
    Starts the proposer on the prompt; changes nothing else.
    """
    greedy = not config.do_sample
    sampling = SamplingParams(do_sample=not greedy)
    vocab = logits_width(model)
    pipeline = build_pipeline(
        config,
        prompt_length=len(prompt),
        eos_token_ids=eos,
        processors=processors,
        max_length=len(prompt) + max_new_tokens,
        device=logits_device(model),
    )
    make_draft = draft_maker(sampling=sampling, processing=pipeline, generator=generator, vocab_size=vocab)
    proposer = resolve_assistant(assistant, assistant_model, make_draft=make_draft, suffix_index=suffix_index)
    for member in members(proposer) if proposer is not None else []:
        if isinstance(member, DraftModelProposer):  # one passed in: it drafts with this row's processing
            member.bind(sampling=sampling, processing=pipeline, generator=generator, vocab_size=vocab)
    controller = None
    if proposer is not None:
        controller = AdaptiveController(
            k_min=k_min(proposer, max_draft_tokens), k_max=max_draft_tokens, adaptive=adaptive, calibration=calibration
        )
        proposer.start(
            Request(prompt_ids=tuple(prompt), tokenizer=tokenizer, schema=schema, documents=tuple(documents))
        )
    matcher = compiled.matcher(max_rollback=max_draft_tokens + 1) if compiled is not None else None
    settings = RowSettings(max_new_tokens, greedy, tuple(stop_strings))
    return RowRequest(list(prompt), matcher, proposer, controller, pipeline, settings)
