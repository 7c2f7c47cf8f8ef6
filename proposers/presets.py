"""``assistant=`` -> a proposer: presets, lists, draft models.

``resolve_assistant`` accepts what users pass as ``assistant=``:

* ``None`` or ``"none"``: no speculation (unless a draft model is given);
* a preset name: ``"auto"`` (jump-forward + schema n-gram + prompt lookup,
  plus drafts from earlier outputs when a shared
  :class:`~proposers.suffix_index.SuffixIndex` is given, plus the draft model
  when one is given; one
  :class:`~proposers.text.SplitPreferences` shared by all, taught by the
  composite), ``"prompt_lookup"``,
  ``"schema_ngram"``, ``"jump_forward"``, ``"draft_model"``;
* a :class:`~proposers.base.Proposer` (returned as is);
* a Hugging Face model (a draft model sharing the tokenizer);
* a list of any of these (combined by :class:`~proposers.compose.CompositeProposer`).

Every call builds fresh proposer objects for presets and models, so two
requests never share per-request state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import Proposer
from .compose import CompositeProposer
from .jump_forward import JumpForwardProposer
from .prompt_lookup import PromptLookupProposer
from .schema_ngram import SchemaNgramProposer
from .suffix import SuffixProposer
from .suffix_index import SuffixIndex
from .text import SplitPreferences

__all__ = ["PRESETS", "resolve_assistant"]

#: Preset names accepted by ``assistant=``.
PRESETS = ("auto", "prompt_lookup", "schema_ngram", "jump_forward", "draft_model", "none")

_SINGLE: dict[str, Callable[[], Proposer]] = {
    "prompt_lookup": PromptLookupProposer,
    "schema_ngram": SchemaNgramProposer,
    "jump_forward": JumpForwardProposer,
}


#: Turns a Hugging Face draft model into its proposer (the runtime's ``DraftModelProposer``).
MakeDraft = Callable[[Any], Proposer]


def resolve_assistant(
    assistant: Any,
    draft_model: Any = None,
    *,
    make_draft: MakeDraft | None = None,
    suffix_index: SuffixIndex | None = None,
) -> Proposer | None:
    """The proposer for ``assistant`` (``None``: decode without speculation).

    ``draft_model``: a Hugging Face model used by ``"auto"`` and
    ``"draft_model"`` (and on its own when ``assistant`` is ``None``);
    ``make_draft`` turns a model into a proposer (models run in the runtime
    package: :func:`grammarspec.drafting.assistant.draft_maker` makes one).
    ``suffix_index``: an index of earlier outputs shared with other requests;
    ``"auto"`` then drafts from it too (:class:`~proposers.suffix.SuffixProposer`).
    Raises ``ValueError`` for an unknown preset name and ``TypeError`` for
    anything that is not an accepted kind, saying what is accepted.
    """
    if assistant is None:
        return _draft_model(draft_model, make_draft) if draft_model is not None else None
    if isinstance(assistant, str):
        return _preset(assistant, draft_model, make_draft, suffix_index)
    if isinstance(assistant, (list, tuple)):
        members = [
            p
            for item in assistant
            for p in _members(resolve_assistant(item, draft_model, make_draft=make_draft, suffix_index=suffix_index))
        ]
        if not members:
            return None
        if len(members) == 1:
            return members[0]
        return CompositeProposer(members, name="+".join(p.name for p in members))
    if _is_model(assistant):
        return _draft_model(assistant, make_draft)
    if isinstance(assistant, Proposer):
        return assistant
    raise TypeError(
        f"assistant= got a {type(assistant).__name__}; pass a preset name ({', '.join(map(repr, PRESETS))}), "
        "a proposer (with name, start, propose and commit), a Hugging Face draft model, or a list of these"
    )


def _preset(
    name: str, draft_model: Any, make_draft: MakeDraft | None, suffix_index: SuffixIndex | None
) -> Proposer | None:
    key = name.strip().lower()
    if key == "none":
        return None
    if key in _SINGLE:
        return _SINGLE[key]()
    if key == "draft_model":
        if draft_model is None:
            raise ValueError(
                "assistant='draft_model' needs a draft model: pass the model itself as assistant=..., "
                "or give it as assistant_model=..."
            )
        return _draft_model(draft_model, make_draft)
    if key == "auto":
        splits = SplitPreferences()  # one per request: the composite learns it, the members read it
        members: list[Proposer] = [
            JumpForwardProposer(splits=splits),
            SchemaNgramProposer(splits=splits),
            PromptLookupProposer(),
        ]
        if suffix_index is not None and suffix_index.max_bytes > 0:
            members.append(SuffixProposer(suffix_index))
        if draft_model is not None:
            members.append(_draft_model(draft_model, make_draft))
        return CompositeProposer(members, name="auto", splits=splits)
    raise ValueError(f"unknown assistant preset {name!r}; choose one of {', '.join(map(repr, PRESETS))}")


def _members(proposer: Proposer | None) -> list[Proposer]:
    if proposer is None:
        return []
    if isinstance(proposer, CompositeProposer):
        return list(proposer.proposers)
    return [proposer]


def _is_model(value: Any) -> bool:
    """A Hugging Face (or any torch) causal LM, without importing transformers."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    return isinstance(value, torch.nn.Module) and hasattr(value, "config")


def _draft_model(model: Any, make_draft: MakeDraft | None) -> Proposer:
    if not _is_model(model):
        raise TypeError(f"the draft model must be a Hugging Face model, got a {type(model).__name__}")
    if make_draft is None:
        raise TypeError(
            "a draft model runs in the runtime package: pass make_draft=grammarspec.drafting.assistant.draft_maker() "
            "(grammarspec.generate does), or use grammarspec.generate"
        )
    return make_draft(model)
